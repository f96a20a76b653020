//! The admission rate window while the cut is uncertain: a window cannot
//! be judged on an uncertain cut, so admission is refused
//! `time_uncertain` (never counted into a window it may not lie in), and
//! once certain the window is judged on the cut, not on database time
//! that a step moved past the window's end.

use jiff::{SignedDuration, Timestamp};
use lc_core::rate::AdmissionRate;
use lc_core::{ControlStore, CutReading, ExecRecord, LcError, TenantId};
use lc_pg::{LcConfig, LcStore};

use super::support::{api_key_of, config, op, snapshot, store_on};
use super::{Fixture, RETRY_AFTER_S, req};

/// The probe's rate: one admission per minute.
const WINDOW: SignedDuration = SignedDuration::from_secs(60);

/// A second store on the scenario's database whose tenant may admit one
/// exec per [`WINDOW`], and that one admission, made on a certain cut
/// before the fault.
pub struct RateProbe {
    store: LcStore,
    tenant: TenantId,
    first: ExecRecord,
}

/// The window's end of `first`: its admission cut + [`WINDOW`].
fn window_end(first: &ExecRecord) -> Timestamp {
    first.admitted_cut + WINDOW
}

/// Opens the probe's store and tenant (2 units) and admits its one exec
/// at `at` (certain).
pub async fn start(f: &Fixture, at: CutReading) -> RateProbe {
    assert!(at.certain);
    let store = store_on(
        &f.db,
        LcConfig {
            admission_rate: AdmissionRate::new(1, WINDOW).unwrap(),
            ..config()
        },
    )
    .await;
    let tenant = store
        .create_tenant(&op("rate-t", "rate-t"), at, "rate", Some(2), &api_key_of)
        .await
        .unwrap()
        .tenant_id;
    let first = store
        .admit_exec(
            &op("rate-1", "rate-1"),
            at,
            tenant,
            &req("small", &["true"]),
        )
        .await
        .unwrap();
    assert_eq!(first.admitted_cut, at.cut);
    RateProbe {
        store,
        tenant,
        first,
    }
}

impl RateProbe {
    /// On `u` (uncertain): a second admission is `time_uncertain`; a
    /// replay of the first admission's key returns its record (a replay
    /// admits nothing, so it needs no certain cut) and counts nothing.
    /// Nothing is written.
    pub async fn while_uncertain(&self, f: &Fixture, u: CutReading) {
        assert!(!u.certain);
        let before = snapshot(&f.db.url).await;
        assert_eq!(
            self.store
                .admit_exec(
                    &op("rate-2", "rate-2"),
                    u,
                    self.tenant,
                    &req("small", &["echo", "2"])
                )
                .await
                .unwrap_err(),
            LcError::TimeUncertain {
                retry_after_s: RETRY_AFTER_S,
            }
        );
        let replay = self
            .store
            .admit_exec(
                &op("rate-1", "rate-1"),
                u,
                self.tenant,
                &req("small", &["true"]),
            )
            .await
            .unwrap();
        assert_eq!(
            (replay.exec_id, replay.admitted_cut),
            (self.first.exec_id, self.first.admitted_cut)
        );
        assert_eq!(snapshot(&f.db.url).await, before);
    }

    /// On `c` (certain, and short of the first admission's window end,
    /// though database time may have passed it): a second admission is
    /// `rate_limited` with exactly the whole seconds left in the window,
    /// and the first admission's key replays its record without counting
    /// again. Nothing is written.
    pub async fn once_certain(&self, f: &Fixture, c: CutReading) {
        assert!(c.certain);
        let end = window_end(&self.first);
        assert!(c.cut < end, "the cut {} passed the window end {end}", c.cut);
        let before = snapshot(&f.db.url).await;
        let wait_ns = u128::try_from(end.duration_since(c.cut).as_nanos()).unwrap();
        let retry_after_s = u64::try_from(wait_ns.div_ceil(1_000_000_000)).unwrap();
        assert_eq!(
            self.store
                .admit_exec(
                    &op("rate-2", "rate-2"),
                    c,
                    self.tenant,
                    &req("small", &["echo", "2"])
                )
                .await
                .unwrap_err(),
            LcError::RateLimited {
                admissions_max: 1,
                window: WINDOW,
                retry_after_s,
            }
        );
        let replay = self
            .store
            .admit_exec(
                &op("rate-1", "rate-1"),
                c,
                self.tenant,
                &req("small", &["true"]),
            )
            .await
            .unwrap();
        assert_eq!(
            (replay.exec_id, replay.admitted_cut),
            (self.first.exec_id, self.first.admitted_cut)
        );
        assert_eq!(snapshot(&f.db.url).await, before);
        let t = self.store.tenant(self.tenant).await.unwrap();
        assert_eq!((t.available, t.held), (1, 1));
    }
}
