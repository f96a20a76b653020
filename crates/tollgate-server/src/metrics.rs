//! A small registry of counters, rendered in the Prometheus text format at
//! `GET /metrics`.
//!
//! Label values come only from bounded sets (matched route templates, HTTP
//! methods and statuses, error codes, fixed outcomes), never from request
//! input, so the number of series is bounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Requests served, by method, route template and status.
pub const HTTP_REQUESTS: &str = "tollgate_http_requests_total";
/// Error responses, by problem code.
pub const ERRORS: &str = "tollgate_errors_total";
/// Reclaim passes, by outcome (`ok`, `error`).
pub const RECLAIM_PASSES: &str = "tollgate_reclaim_passes_total";
/// Leases settled by reclaim.
pub const RECLAIM_LEASES: &str = "tollgate_reclaim_leases_total";
/// Units charged by reclaim.
pub const RECLAIM_UNITS: &str = "tollgate_reclaim_units_total";

const HELP: &[(&str, &str)] = &[
    (
        HTTP_REQUESTS,
        "HTTP requests served, by method, route template and status.",
    ),
    (ERRORS, "Error responses, by problem code."),
    (RECLAIM_PASSES, "Reclaim passes, by outcome."),
    (RECLAIM_LEASES, "Leases settled by reclaim."),
    (RECLAIM_UNITS, "Units charged by reclaim."),
];

type Key = (&'static str, Vec<(&'static str, String)>);

/// The registry; see the module docs.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Key, u128>>,
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Adds `by` to the counter `name` with `labels`.
    pub fn add(&self, name: &'static str, labels: &[(&'static str, &str)], by: u128) {
        let key = (
            name,
            labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect(),
        );
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let v = c.entry(key).or_insert(0);
        *v = v.saturating_add(by);
    }

    /// Adds one.
    pub fn inc(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        self.add(name, labels, 1);
    }

    /// The current value of a counter (0 if never touched).
    pub fn get(&self, name: &'static str, labels: &[(&'static str, &str)]) -> u128 {
        let key: Key = (
            name,
            labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect(),
        );
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&key).copied().unwrap_or(0)
    }

    /// The Prometheus text exposition of every counter. Every declared
    /// counter appears (without labels at 0 when never touched).
    pub fn render(&self) -> String {
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for (name, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let mut any = false;
            for ((n, labels), v) in c.iter() {
                if n != name {
                    continue;
                }
                any = true;
                if labels.is_empty() {
                    let _ = writeln!(out, "{name} {v}");
                } else {
                    let l: Vec<String> = labels
                        .iter()
                        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                        .collect();
                    let _ = writeln!(out, "{name}{{{}}} {v}", l.join(","));
                }
            }
            if !any && matches!(*name, RECLAIM_LEASES | RECLAIM_UNITS) {
                let _ = writeln!(out, "{name} 0");
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
