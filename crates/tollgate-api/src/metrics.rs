//! A small registry of counters, gauges and one histogram, rendered in the
//! Prometheus text format at `GET /metrics`.
//!
//! Label values come only from bounded sets (matched route templates, HTTP
//! methods and statuses, error codes, fixed outcomes and operations, the
//! eleven [`UncertainReason`] codes), never from request input, so the
//! number of series is bounded.
//!
//! Durations are exported in seconds, rendered exactly from nanoseconds
//! (`13.999999999`, never a rounded float).
//!
//! * Counters: requests, errors, reclaim passes, leases and units, and
//!   [`SAFETIME_PAUSED`]: operations refused or skipped because the safe
//!   expiry cut was uncertain, by operation (`acquire`, `consolidate`,
//!   `reclaim`).
//! * The late-expiry histogram [`RECLAIM_LATE`]: for each reclaimed lease,
//!   how long after `expiry + reclaim_grace` the reclaim happened (the
//!   pass's `now` minus that instant), with buckets
//!   [`LATE_BUCKETS_NS`]. On the safe-cut clock `now` is the cut, so this
//!   includes the cut lag and any pause while the cut was uncertain.
//! * Safe-time gauges (safe-cut clock only, from a fresh reading at each scrape; see
//!   [`Metrics::set_safe_time`]): [`SAFETIME_CERTAIN`],
//!   [`SAFETIME_UNCERTAIN`] (one series per reason code, 1 for the current
//!   one), [`SAFETIME_CUT_LAG`], [`SAFETIME_EPOCH`],
//!   [`SAFETIME_QUARANTINED`], [`SAFETIME_PUBLISH_SEQ`],
//!   [`SAFETIME_POLICY_VERSION`], [`SAFETIME_HORIZON`], and the counter
//!   [`SAFETIME_READ_ERRORS`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use clock::{SafeTimeStatus, UncertainReason};
use jiff::SignedDuration;

/// The `expect` message of every `writeln!` into a `String` (it never fails).
const WRITE_TO_STRING: &str = "writing to a String never fails";

/// Requests served, by method, route template and status.
pub const HTTP_REQUESTS: &str = "tollgate_http_requests_total";
/// Error responses, by problem code, those the connection layer writes
/// outside any route included (`too_many_connections`, `uri_too_long`, ...;
/// [`httpkit::server`]); only those of routes count in [`HTTP_REQUESTS`].
pub const ERRORS: &str = "tollgate_errors_total";
/// Reclaim passes, by outcome (`ok`, `error`; a pass skipped because the
/// cut was uncertain counts in [`SAFETIME_PAUSED`] instead).
pub const RECLAIM_PASSES: &str = "tollgate_reclaim_passes_total";
/// Leases settled by reclaim.
pub const RECLAIM_LEASES: &str = "tollgate_reclaim_leases_total";
/// Units charged by reclaim.
pub const RECLAIM_UNITS: &str = "tollgate_reclaim_units_total";
/// Operations paused by an uncertain safe expiry cut, by `operation`
/// (`acquire`, `consolidate`: refused admissions; `reclaim`: skipped
/// passes).
pub const SAFETIME_PAUSED: &str = "tollgate_safetime_paused_total";
/// The late-expiry histogram (seconds).
pub const RECLAIM_LATE: &str = "tollgate_reclaim_late_seconds";
/// 1 when the last reading of the cut was certain, else 0.
pub const SAFETIME_CERTAIN: &str = "tollgate_safetime_certain";
/// 1 for the reason the cut is uncertain, 0 for the other reasons.
pub const SAFETIME_UNCERTAIN: &str = "tollgate_safetime_uncertain";
/// Database time minus the cut at the last reading, seconds.
pub const SAFETIME_CUT_LAG: &str = "tollgate_safetime_cut_lag_seconds";
/// The sampler's durable epoch.
pub const SAFETIME_EPOCH: &str = "tollgate_safetime_epoch";
/// 1 while the initial quarantine is in force.
pub const SAFETIME_QUARANTINED: &str = "tollgate_safetime_quarantined";
/// Publishes of the cut so far.
pub const SAFETIME_PUBLISH_SEQ: &str = "tollgate_safetime_publish_seq";
/// Version of the sealed horizon policy of the current epoch.
pub const SAFETIME_POLICY_VERSION: &str = "tollgate_safetime_policy_version";
/// The sealed maximum-deadline horizon, seconds.
pub const SAFETIME_HORIZON: &str = "tollgate_safetime_horizon_seconds";
/// Failed reads of the cut since the process started.
pub const SAFETIME_READ_ERRORS: &str = "tollgate_safetime_read_errors_total";

/// The `operation` labels of [`SAFETIME_PAUSED`].
pub const PAUSED_OPERATIONS: [&str; 3] = ["acquire", "consolidate", "reclaim"];

/// Upper bounds of the late-expiry buckets, nanoseconds: 1 ms, 10 ms,
/// 100 ms, 1 s, 10 s, 1 min, 10 min (then `+Inf`). From a reclaim worker's
/// default 1 s interval up to a sampler outage.
pub const LATE_BUCKETS_NS: [i128; 7] = [
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
    60_000_000_000,
    600_000_000_000,
];

const HELP: &[(&str, &str)] = &[
    (
        HTTP_REQUESTS,
        "HTTP requests served, by method, route template and status.",
    ),
    (
        ERRORS,
        "Error responses, by problem code (the connection layer's refusals included).",
    ),
    (RECLAIM_PASSES, "Reclaim passes, by outcome."),
    (RECLAIM_LEASES, "Leases settled by reclaim."),
    (RECLAIM_UNITS, "Units charged by reclaim."),
    (
        SAFETIME_PAUSED,
        "Operations paused because the safe expiry cut was uncertain, by operation.",
    ),
];

const GAUGE_HELP: &[(&str, &str, &str)] = &[
    (
        SAFETIME_CERTAIN,
        "gauge",
        "1 when the last reading of the safe expiry cut was certain, else 0.",
    ),
    (
        SAFETIME_UNCERTAIN,
        "gauge",
        "1 for the reason the safe expiry cut is uncertain, 0 for every other reason.",
    ),
    (
        SAFETIME_CUT_LAG,
        "gauge",
        "Database time minus the safe expiry cut at the last reading, seconds.",
    ),
    (
        SAFETIME_EPOCH,
        "gauge",
        "The safe-time sampler's durable epoch.",
    ),
    (
        SAFETIME_QUARANTINED,
        "gauge",
        "1 while the initial quarantine of the cut is in force.",
    ),
    (
        SAFETIME_PUBLISH_SEQ,
        "gauge",
        "Publishes of the cut so far.",
    ),
    (
        SAFETIME_POLICY_VERSION,
        "gauge",
        "Version of the sealed horizon policy of the current epoch.",
    ),
    (
        SAFETIME_HORIZON,
        "gauge",
        "The sealed maximum-deadline horizon, seconds.",
    ),
    (
        SAFETIME_READ_ERRORS,
        "counter",
        "Failed reads of the safe expiry cut since the process started.",
    ),
];

type Key = (&'static str, Vec<(&'static str, String)>);

/// A gauge value, rendered exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Int(i128),
    SecondsNs(i128),
}

/// The late-expiry histogram's state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Histogram {
    /// Observations at or below each bound of [`LATE_BUCKETS_NS`] (not
    /// cumulative; rendered cumulatively).
    buckets: [u64; 7],
    count: u64,
    sum_ns: i128,
}

/// A snapshot of the late-expiry histogram (`tollgate status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateExpiry {
    /// `(upper bound, cumulative count)` per bucket of [`LATE_BUCKETS_NS`].
    pub buckets: Vec<(SignedDuration, u64)>,
    /// Reclaimed leases observed.
    pub count: u64,
    /// Their lateness summed (saturating at [`SignedDuration::MAX`]).
    pub sum: SignedDuration,
}

/// The registry; see the module docs.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Key, u128>>,
    gauges: Mutex<BTreeMap<Key, Value>>,
    late: Mutex<Histogram>,
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    (
        name,
        labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect(),
    )
}

/// Nanoseconds as exact decimal seconds: `13.999999999`, `600`, `-0.5`.
pub fn seconds(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let abs = ns.unsigned_abs();
    let (whole, frac) = (abs / 1_000_000_000, abs % 1_000_000_000);
    if frac == 0 {
        format!("{sign}{whole}")
    } else {
        let f = format!("{frac:09}");
        format!("{sign}{whole}.{}", f.trim_end_matches('0'))
    }
}

fn labels_text(labels: &[(&'static str, String)], extra: Option<(&str, &str)>) -> String {
    let mut l: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some((k, v)) = extra {
        l.push(format!("{k}=\"{}\"", escape(v)));
    }
    if l.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", l.join(","))
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Adds `by` to the counter `name` with `labels`.
    pub fn add(&self, name: &'static str, labels: &[(&'static str, &str)], by: u128) {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let v = c.entry(key(name, labels)).or_insert(0);
        *v = v.saturating_add(by);
    }

    /// Adds one.
    pub fn inc(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        self.add(name, labels, 1);
    }

    /// The current value of a counter (0 if never touched).
    pub fn get(&self, name: &'static str, labels: &[(&'static str, &str)]) -> u128 {
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&key(name, labels)).copied().unwrap_or(0)
    }

    /// Records one reclaimed lease's lateness in [`RECLAIM_LATE`].
    pub fn observe_late(&self, late_by: SignedDuration) {
        let ns = late_by.as_nanos();
        let mut h = self.late.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = LATE_BUCKETS_NS.iter().position(|b| ns <= *b) {
            h.buckets[i] = h.buckets[i].saturating_add(1);
        }
        h.count = h.count.saturating_add(1);
        h.sum_ns = h.sum_ns.saturating_add(ns);
    }

    /// A snapshot of the late-expiry histogram.
    pub fn late_expiry(&self) -> LateExpiry {
        let h = *self.late.lock().unwrap_or_else(|p| p.into_inner());
        let mut cumulative = 0u64;
        let buckets = LATE_BUCKETS_NS
            .iter()
            .zip(h.buckets)
            .map(|(b, n)| {
                cumulative = cumulative.saturating_add(n);
                (SignedDuration::from_nanos_i128(*b), cumulative)
            })
            .collect();
        LateExpiry {
            buckets,
            count: h.count,
            sum: SignedDuration::try_from_nanos_i128(h.sum_ns).unwrap_or(SignedDuration::MAX),
        }
    }

    /// Replaces the safe-time gauges with what `status` says (the
    /// `/metrics` handler takes a fresh, bounded reading of the cut and
    /// calls this before rendering). Values that need a row (lag, epoch, ...) are left out
    /// while there is none.
    pub fn set_safe_time(&self, status: &SafeTimeStatus) {
        let mut g = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|(name, _), _| !name.starts_with("tollgate_safetime_"));
        let mut set = |name: &'static str, labels: &[(&'static str, &str)], v: Value| {
            g.insert(key(name, labels), v);
        };
        set(
            SAFETIME_CERTAIN,
            &[],
            Value::Int(i128::from(status.is_certain())),
        );
        for r in UncertainReason::ALL {
            let current = !status.read_error && status.uncertain == Some(r);
            set(
                SAFETIME_UNCERTAIN,
                &[("reason", r.code())],
                Value::Int(i128::from(current)),
            );
        }
        set(
            SAFETIME_READ_ERRORS,
            &[],
            Value::Int(i128::from(status.read_errors_total)),
        );
        if let Some(row) = &status.row {
            set(
                SAFETIME_CUT_LAG,
                &[],
                Value::SecondsNs(row.lag().as_nanos()),
            );
            set(SAFETIME_EPOCH, &[], Value::Int(i128::from(row.epoch)));
            set(
                SAFETIME_QUARANTINED,
                &[],
                Value::Int(i128::from(row.quarantined)),
            );
            set(
                SAFETIME_PUBLISH_SEQ,
                &[],
                Value::Int(i128::from(row.publish_seq)),
            );
            set(
                SAFETIME_POLICY_VERSION,
                &[],
                Value::Int(i128::from(row.policy.version())),
            );
            set(
                SAFETIME_HORIZON,
                &[],
                Value::SecondsNs(row.policy.horizon().as_nanos()),
            );
        }
    }

    /// The Prometheus text exposition of every metric. Every declared
    /// counter appears (the unlabelled reclaim counters and the paused
    /// operations at 0 when never touched); the histogram always appears;
    /// gauges appear once set.
    pub fn render(&self) -> String {
        let mut out = String::new();
        {
            let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
            for (name, help) in HELP {
                writeln!(out, "# HELP {name} {help}").expect(WRITE_TO_STRING);
                writeln!(out, "# TYPE {name} counter").expect(WRITE_TO_STRING);
                let mut any = false;
                for ((n, labels), v) in c.iter() {
                    if n != name {
                        continue;
                    }
                    any = true;
                    writeln!(out, "{name}{} {v}", labels_text(labels, None))
                        .expect(WRITE_TO_STRING);
                }
                if !any && matches!(*name, RECLAIM_LEASES | RECLAIM_UNITS) {
                    writeln!(out, "{name} 0").expect(WRITE_TO_STRING);
                }
                if *name == SAFETIME_PAUSED {
                    for op in PAUSED_OPERATIONS {
                        if !c.contains_key(&key(SAFETIME_PAUSED, &[("operation", op)])) {
                            writeln!(out, "{name}{{operation=\"{op}\"}} 0").expect(WRITE_TO_STRING);
                        }
                    }
                }
            }
        }
        {
            let h = *self.late.lock().unwrap_or_else(|p| p.into_inner());
            let name = RECLAIM_LATE;
            writeln!(
                out,
                "# HELP {name} How long after expiry + reclaim_grace each reclaimed lease was reclaimed, seconds."
            ).expect(WRITE_TO_STRING);
            writeln!(out, "# TYPE {name} histogram").expect(WRITE_TO_STRING);
            let mut cumulative = 0u64;
            for (b, n) in LATE_BUCKETS_NS.iter().zip(h.buckets) {
                cumulative = cumulative.saturating_add(n);
                writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", seconds(*b))
                    .expect(WRITE_TO_STRING);
            }
            writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count).expect(WRITE_TO_STRING);
            writeln!(out, "{name}_sum {}", seconds(h.sum_ns)).expect(WRITE_TO_STRING);
            writeln!(out, "{name}_count {}", h.count).expect(WRITE_TO_STRING);
        }
        let g = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        for (name, kind, help) in GAUGE_HELP {
            let series: Vec<_> = g.iter().filter(|((n, _), _)| n == name).collect();
            if series.is_empty() {
                continue;
            }
            writeln!(out, "# HELP {name} {help}").expect(WRITE_TO_STRING);
            writeln!(out, "# TYPE {name} {kind}").expect(WRITE_TO_STRING);
            for ((_, labels), v) in series {
                let v = match v {
                    Value::Int(i) => i.to_string(),
                    Value::SecondsNs(ns) => seconds(*ns),
                };
                writeln!(out, "{name}{} {v}", labels_text(labels, None)).expect(WRITE_TO_STRING);
            }
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_exact() {
        for (ns, want) in [
            (0, "0"),
            (1, "0.000000001"),
            (1_000_000, "0.001"),
            (13_999_999_999, "13.999999999"),
            (600_000_000_000, "600"),
            (-500_000_000, "-0.5"),
            (
                i128::from(i64::MAX) * 1_000_000_000 + 999_999_999,
                "9223372036854775807.999999999",
            ),
        ] {
            assert_eq!(seconds(ns), want);
        }
    }

    #[test]
    fn late_histogram_buckets_at_their_bounds() {
        let m = Metrics::new();
        for ns in [0, 1_000_000, 1_000_001, 600_000_000_000, 600_000_000_001] {
            m.observe_late(SignedDuration::from_nanos(ns));
        }
        let text = m.render();
        for line in [
            "tollgate_reclaim_late_seconds_bucket{le=\"0.001\"} 2",
            "tollgate_reclaim_late_seconds_bucket{le=\"0.01\"} 3",
            "tollgate_reclaim_late_seconds_bucket{le=\"60\"} 3",
            "tollgate_reclaim_late_seconds_bucket{le=\"600\"} 4",
            "tollgate_reclaim_late_seconds_bucket{le=\"+Inf\"} 5",
            "tollgate_reclaim_late_seconds_sum 1200.002000002",
            "tollgate_reclaim_late_seconds_count 5",
            "tollgate_safetime_paused_total{operation=\"acquire\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let snap = m.late_expiry();
        assert_eq!(snap.count, 5);
        assert_eq!(snap.sum, SignedDuration::new(1_200, 2_000_002));
        assert_eq!(
            snap.buckets[0],
            (SignedDuration::from_millis(1), 2),
            "{snap:?}"
        );
        assert_eq!(snap.buckets[6], (SignedDuration::from_secs(600), 4));
    }
}
