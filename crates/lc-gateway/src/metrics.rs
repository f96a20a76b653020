//! The gateway's counters and gauges, rendered in the Prometheus text
//! format. No label comes from input, so the series are fixed.
//!
//! The ACK latency is measured on the process's monotonic clock, from the
//! moment a page was read from the spool to the moment the supervisor was
//! told to drop it: telemetry only, never used for any decision.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Steps taken (counter).
pub const STEPS: &str = "lc_gateway_steps_total";
/// Steps whose first reading of the cut was uncertain (counter): nothing
/// was claimed, taken over or released in them.
pub const STEPS_UNCERTAIN: &str = "lc_gateway_steps_uncertain_total";
/// Execs this gateway owns now (gauge).
pub const OWNED_EXECS: &str = "lc_gateway_owned_execs";
/// Ownerships taken from an expired or released owner (counter).
pub const TAKEOVERS: &str = "lc_gateway_takeovers_total";
/// Ownerships taken of execs no gateway owned before (counter).
pub const CLAIMS: &str = "lc_gateway_claims_total";
/// Writes the store or the supervisor refused because this gateway no
/// longer owns the exec (counter).
pub const STALE_REFUSED: &str = "lc_gateway_stale_refused_total";
/// Pages whose metadata is committed but not yet acked, over the owned
/// execs at the last step (gauge).
pub const PENDING_PAGES: &str = "lc_gateway_pending_pages";
/// Pages held in the spools of the owned execs' supervisors, at the last
/// sample (gauge).
pub const SPOOL_PAGES: &str = "lc_gateway_spool_pages";
/// Bytes held in those spools, at the last sample (gauge).
pub const SPOOL_BYTES: &str = "lc_gateway_spool_bytes";
/// Pages whose ACK result this gateway committed (counter).
pub const PAGES_ACKED: &str = "lc_gateway_pages_acked_total";
/// Bytes of those pages (counter).
pub const BYTES_ACKED: &str = "lc_gateway_bytes_acked_total";
/// Corrupt sink blobs replaced by a put (counter).
pub const SINK_REPLACED: &str = "lc_gateway_sink_replaced_total";
/// Leases released after their terminal page was acked (counter).
pub const RELEASES: &str = "lc_gateway_releases_total";
/// Inputs delivered to supervisors whose `send` receipt this gateway
/// committed (counter).
pub const INPUTS_SENT: &str = "lc_gateway_inputs_sent_total";
/// Bytes of those inputs (counter).
pub const INPUT_BYTES_SENT: &str = "lc_gateway_input_bytes_sent_total";
/// Provider calls that did not answer within the gateway's bound (counter;
/// each is also a failure).
pub const PROVIDER_TIMEOUTS: &str = "lc_gateway_provider_timeouts_total";
/// Hibernations whose quiescence this gateway committed (counter).
pub const HIBERNATED: &str = "lc_gateway_hibernated_total";
/// Hibernations whose snapshot the provider refused, recorded by this
/// gateway (the exec ended `snapshot_refused`; counter).
pub const HIBERNATIONS_REFUSED: &str = "lc_gateway_hibernations_refused_total";
/// Resumes this gateway prepared (a new Reservation and Lease; counter).
pub const RESUMES_PREPARED: &str = "lc_gateway_resumes_prepared_total";
/// Resumes this gateway committed (the receipt; counter).
pub const RESUMES_COMMITTED: &str = "lc_gateway_resumes_committed_total";
/// Resumes this gateway prepared whose Lease was released unattached
/// because the provider refused the restore (counter).
pub const RESUMES_REFUSED: &str = "lc_gateway_resumes_refused_total";
/// Per-exec step failures (counter).
pub const FAILURES: &str = "lc_gateway_failures_total";
/// Sum of ACK latencies, nanoseconds (with [`ACK_LATENCY_COUNT`]).
pub const ACK_LATENCY_SUM: &str = "lc_gateway_ack_latency_ns_sum";
/// Supervisor ACKs measured.
pub const ACK_LATENCY_COUNT: &str = "lc_gateway_ack_latency_ns_count";

/// The registry; every value starts at 0.
#[derive(Debug, Default)]
pub struct GatewayMetrics {
    steps: AtomicU64,
    steps_uncertain: AtomicU64,
    owned_execs: AtomicU64,
    takeovers: AtomicU64,
    claims: AtomicU64,
    stale_refused: AtomicU64,
    pending_pages: AtomicU64,
    spool_pages: AtomicU64,
    spool_bytes: AtomicU64,
    pages_acked: AtomicU64,
    bytes_acked: AtomicU64,
    sink_replaced: AtomicU64,
    releases: AtomicU64,
    inputs_sent: AtomicU64,
    input_bytes_sent: AtomicU64,
    hibernated: AtomicU64,
    hibernations_refused: AtomicU64,
    resumes_prepared: AtomicU64,
    resumes_committed: AtomicU64,
    resumes_refused: AtomicU64,
    failures: AtomicU64,
    provider_timeouts: AtomicU64,
    ack_latency_ns_sum: AtomicU64,
    ack_latency_count: AtomicU64,
}

/// A snapshot of every value, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetricsSnapshot {
    /// [`STEPS`].
    pub steps: u64,
    /// [`STEPS_UNCERTAIN`].
    pub steps_uncertain: u64,
    /// [`OWNED_EXECS`].
    pub owned_execs: u64,
    /// [`TAKEOVERS`].
    pub takeovers: u64,
    /// [`CLAIMS`].
    pub claims: u64,
    /// [`STALE_REFUSED`].
    pub stale_refused: u64,
    /// [`PENDING_PAGES`].
    pub pending_pages: u64,
    /// [`SPOOL_PAGES`].
    pub spool_pages: u64,
    /// [`SPOOL_BYTES`].
    pub spool_bytes: u64,
    /// [`PAGES_ACKED`].
    pub pages_acked: u64,
    /// [`BYTES_ACKED`].
    pub bytes_acked: u64,
    /// [`SINK_REPLACED`].
    pub sink_replaced: u64,
    /// [`RELEASES`].
    pub releases: u64,
    /// [`INPUTS_SENT`].
    pub inputs_sent: u64,
    /// [`INPUT_BYTES_SENT`].
    pub input_bytes_sent: u64,
    /// [`HIBERNATED`].
    pub hibernated: u64,
    /// [`HIBERNATIONS_REFUSED`].
    pub hibernations_refused: u64,
    /// [`RESUMES_PREPARED`].
    pub resumes_prepared: u64,
    /// [`RESUMES_COMMITTED`].
    pub resumes_committed: u64,
    /// [`RESUMES_REFUSED`].
    pub resumes_refused: u64,
    /// [`FAILURES`].
    pub failures: u64,
    /// [`PROVIDER_TIMEOUTS`].
    pub provider_timeouts: u64,
    /// [`ACK_LATENCY_SUM`].
    pub ack_latency_ns_sum: u64,
    /// [`ACK_LATENCY_COUNT`].
    pub ack_latency_count: u64,
}

fn add(a: &AtomicU64, n: u64) {
    // Counters saturate instead of wrapping.
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

impl GatewayMetrics {
    pub(crate) fn step(&self, certain: bool) {
        add(&self.steps, 1);
        if !certain {
            add(&self.steps_uncertain, 1);
        }
    }
    pub(crate) fn set_owned(&self, n: usize) {
        self.owned_execs
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    pub(crate) fn set_pending(&self, n: u64) {
        self.pending_pages.store(n, Ordering::Relaxed);
    }
    pub(crate) fn set_spool(&self, pages: u64, bytes: u64) {
        self.spool_pages.store(pages, Ordering::Relaxed);
        self.spool_bytes.store(bytes, Ordering::Relaxed);
    }
    pub(crate) fn takeover(&self) {
        add(&self.takeovers, 1);
    }
    pub(crate) fn claim(&self) {
        add(&self.claims, 1);
    }
    pub(crate) fn stale_refused(&self) {
        add(&self.stale_refused, 1);
    }
    pub(crate) fn acked(&self, pages: u64, bytes: u64) {
        add(&self.pages_acked, pages);
        add(&self.bytes_acked, bytes);
    }
    pub(crate) fn sink_replaced(&self) {
        add(&self.sink_replaced, 1);
    }
    pub(crate) fn release(&self) {
        add(&self.releases, 1);
    }
    pub(crate) fn input_sent(&self, bytes: u64) {
        add(&self.inputs_sent, 1);
        add(&self.input_bytes_sent, bytes);
    }
    pub(crate) fn hibernated(&self) {
        add(&self.hibernated, 1);
    }
    pub(crate) fn hibernation_refused(&self) {
        add(&self.hibernations_refused, 1);
    }
    pub(crate) fn resume_prepared(&self) {
        add(&self.resumes_prepared, 1);
    }
    pub(crate) fn resume_committed(&self) {
        add(&self.resumes_committed, 1);
    }
    pub(crate) fn resume_refused(&self) {
        add(&self.resumes_refused, 1);
    }
    pub(crate) fn failure(&self) {
        add(&self.failures, 1);
    }
    pub(crate) fn provider_timeout(&self) {
        add(&self.provider_timeouts, 1);
    }
    pub(crate) fn ack_latency(&self, d: std::time::Duration) {
        add(
            &self.ack_latency_ns_sum,
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        );
        add(&self.ack_latency_count, 1);
    }

    /// Every value now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            steps: g(&self.steps),
            steps_uncertain: g(&self.steps_uncertain),
            owned_execs: g(&self.owned_execs),
            takeovers: g(&self.takeovers),
            claims: g(&self.claims),
            stale_refused: g(&self.stale_refused),
            pending_pages: g(&self.pending_pages),
            spool_pages: g(&self.spool_pages),
            spool_bytes: g(&self.spool_bytes),
            pages_acked: g(&self.pages_acked),
            bytes_acked: g(&self.bytes_acked),
            sink_replaced: g(&self.sink_replaced),
            releases: g(&self.releases),
            inputs_sent: g(&self.inputs_sent),
            input_bytes_sent: g(&self.input_bytes_sent),
            hibernated: g(&self.hibernated),
            hibernations_refused: g(&self.hibernations_refused),
            resumes_prepared: g(&self.resumes_prepared),
            resumes_committed: g(&self.resumes_committed),
            resumes_refused: g(&self.resumes_refused),
            failures: g(&self.failures),
            provider_timeouts: g(&self.provider_timeouts),
            ack_latency_ns_sum: g(&self.ack_latency_ns_sum),
            ack_latency_count: g(&self.ack_latency_count),
        }
    }

    /// The Prometheus text exposition of every value.
    pub fn render(&self) -> String {
        const W: &str = "writing to a String never fails";
        let s = self.snapshot();
        let rows: [(&str, &str, &str, u64); 24] = [
            (STEPS, "counter", "Steps taken.", s.steps),
            (
                STEPS_UNCERTAIN,
                "counter",
                "Steps whose reading of the cut was uncertain (nothing claimed, taken over or released).",
                s.steps_uncertain,
            ),
            (
                OWNED_EXECS,
                "gauge",
                "Execs this gateway owns.",
                s.owned_execs,
            ),
            (
                TAKEOVERS,
                "counter",
                "Ownerships taken from an expired or released owner.",
                s.takeovers,
            ),
            (
                CLAIMS,
                "counter",
                "Ownerships taken of execs no gateway owned before.",
                s.claims,
            ),
            (
                STALE_REFUSED,
                "counter",
                "Writes refused because this gateway no longer owns the exec.",
                s.stale_refused,
            ),
            (
                PENDING_PAGES,
                "gauge",
                "Pages committed but not yet acked, over the owned execs.",
                s.pending_pages,
            ),
            (
                SPOOL_PAGES,
                "gauge",
                "Pages held in the owned execs' spools, at the last sample.",
                s.spool_pages,
            ),
            (
                SPOOL_BYTES,
                "gauge",
                "Bytes held in the owned execs' spools, at the last sample.",
                s.spool_bytes,
            ),
            (
                PAGES_ACKED,
                "counter",
                "Pages whose ACK result this gateway committed.",
                s.pages_acked,
            ),
            (
                BYTES_ACKED,
                "counter",
                "Bytes of the pages this gateway acked.",
                s.bytes_acked,
            ),
            (
                SINK_REPLACED,
                "counter",
                "Corrupt sink blobs replaced by a put.",
                s.sink_replaced,
            ),
            (
                RELEASES,
                "counter",
                "Leases released after their terminal page was acked.",
                s.releases,
            ),
            (
                INPUTS_SENT,
                "counter",
                "Inputs delivered to supervisors whose send receipt this gateway committed.",
                s.inputs_sent,
            ),
            (
                INPUT_BYTES_SENT,
                "counter",
                "Bytes of the inputs this gateway delivered.",
                s.input_bytes_sent,
            ),
            (
                HIBERNATED,
                "counter",
                "Hibernations whose quiescence this gateway committed.",
                s.hibernated,
            ),
            (
                HIBERNATIONS_REFUSED,
                "counter",
                "Hibernations whose snapshot the provider refused (the exec ended snapshot_refused).",
                s.hibernations_refused,
            ),
            (
                RESUMES_PREPARED,
                "counter",
                "Resumes this gateway prepared (a new Reservation and Lease).",
                s.resumes_prepared,
            ),
            (
                RESUMES_COMMITTED,
                "counter",
                "Resumes this gateway committed.",
                s.resumes_committed,
            ),
            (
                RESUMES_REFUSED,
                "counter",
                "Resumes this gateway prepared whose restore the provider refused.",
                s.resumes_refused,
            ),
            (FAILURES, "counter", "Per-exec step failures.", s.failures),
            (
                PROVIDER_TIMEOUTS,
                "counter",
                "Provider calls that did not answer within the gateway's bound.",
                s.provider_timeouts,
            ),
            (
                ACK_LATENCY_SUM,
                "counter",
                "Sum of spool-read-to-supervisor-ACK latencies, nanoseconds (monotonic clock, telemetry only).",
                s.ack_latency_ns_sum,
            ),
            (
                ACK_LATENCY_COUNT,
                "counter",
                "Supervisor ACKs whose latency was measured.",
                s.ack_latency_count,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, v) in rows {
            writeln!(out, "# HELP {name} {help}").expect(W);
            writeln!(out, "# TYPE {name} {kind}").expect(W);
            writeln!(out, "{name} {v}").expect(W);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_value_exactly() {
        let m = GatewayMetrics::default();
        m.set_owned(3);
        m.stale_refused();
        m.stale_refused();
        m.acked(4, 1000);
        m.input_sent(6);
        m.provider_timeout();
        m.hibernated();
        m.hibernation_refused();
        m.hibernation_refused();
        m.hibernation_refused();
        m.resume_prepared();
        m.resume_prepared();
        m.resume_committed();
        m.resume_refused();
        m.ack_latency(std::time::Duration::from_nanos(1500));
        let text = m.render();
        for line in [
            "lc_gateway_owned_execs 3",
            "lc_gateway_stale_refused_total 2",
            "lc_gateway_pages_acked_total 4",
            "lc_gateway_bytes_acked_total 1000",
            "lc_gateway_ack_latency_ns_sum 1500",
            "lc_gateway_ack_latency_ns_count 1",
            "lc_gateway_takeovers_total 0",
            "lc_gateway_inputs_sent_total 1",
            "lc_gateway_input_bytes_sent_total 6",
            "lc_gateway_provider_timeouts_total 1",
            "lc_gateway_hibernated_total 1",
            "lc_gateway_hibernations_refused_total 3",
            "lc_gateway_resumes_prepared_total 2",
            "lc_gateway_resumes_committed_total 1",
            "lc_gateway_resumes_refused_total 1",
            "# TYPE lc_gateway_owned_execs gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
