//! A small registry of counters and gauges, rendered in the Prometheus text
//! format at `GET /metrics`.
//!
//! Label values come only from bounded sets (matched route templates, HTTP
//! methods and statuses, problem codes, fixed operation names, the
//! [`clock::UncertainReason`] codes), never from request input, so the
//! number of series is bounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use clock::SafeTimeStatus;

/// Requests served, by method, route template and status.
pub const HTTP_REQUESTS: &str = "lc_http_requests_total";
/// Error responses, by problem code (the connection layer's included).
pub const ERRORS: &str = "lc_errors_total";
/// Admissions refused because the safe expiry cut was uncertain.
pub const ADMISSIONS_PAUSED: &str = "lc_admissions_paused_total";
/// 1 when the last reading of the cut was certain, else 0.
pub const SAFETIME_CERTAIN: &str = "lc_safetime_certain";

const COUNTERS: &[(&str, &str)] = &[
    (
        HTTP_REQUESTS,
        "HTTP requests served, by method, route template and status.",
    ),
    (
        ERRORS,
        "Error responses, by problem code (the connection layer's refusals included).",
    ),
    (
        ADMISSIONS_PAUSED,
        "Exec admissions refused because the safe expiry cut was uncertain.",
    ),
];

type Key = (&'static str, Vec<(&'static str, String)>);

/// The registry; see the module docs.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<Key, u128>>,
    certain: Mutex<Option<bool>>,
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    (
        name,
        labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect(),
    )
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Adds one to the counter `name` with `labels`.
    pub fn inc(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let v = c.entry(key(name, labels)).or_insert(0);
        *v = v.saturating_add(1);
    }

    /// The current value of a counter (0 if never touched).
    pub fn get(&self, name: &'static str, labels: &[(&'static str, &str)]) -> u128 {
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        c.get(&key(name, labels)).copied().unwrap_or(0)
    }

    /// Sets [`SAFETIME_CERTAIN`] from a fresh reading's status.
    pub fn set_safe_time(&self, status: &SafeTimeStatus) {
        *self.certain.lock().unwrap_or_else(|p| p.into_inner()) = Some(status.is_certain());
    }

    /// The Prometheus text exposition: every declared counter (an
    /// unlabelled one at 0 when never touched), then the certainty gauge
    /// once a reading set it.
    pub fn render(&self) -> String {
        const W: &str = "writing to a String never fails";
        let mut out = String::new();
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        for (name, help) in COUNTERS {
            writeln!(out, "# HELP {name} {help}").expect(W);
            writeln!(out, "# TYPE {name} counter").expect(W);
            let mut any = false;
            for ((n, labels), v) in c.iter().filter(|((n, _), _)| n == name) {
                any = true;
                let l: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                if l.is_empty() {
                    writeln!(out, "{n} {v}").expect(W);
                } else {
                    writeln!(out, "{n}{{{}}} {v}", l.join(",")).expect(W);
                }
            }
            if !any && *name == ADMISSIONS_PAUSED {
                writeln!(out, "{name} 0").expect(W);
            }
        }
        drop(c);
        if let Some(certain) = *self.certain.lock().unwrap_or_else(|p| p.into_inner()) {
            writeln!(
                out,
                "# HELP {SAFETIME_CERTAIN} 1 when the last reading of the safe expiry cut was certain, else 0."
            )
            .expect(W);
            writeln!(out, "# TYPE {SAFETIME_CERTAIN} gauge").expect(W);
            writeln!(out, "{SAFETIME_CERTAIN} {}", u8::from(certain)).expect(W);
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
    fn renders_counters_exactly() {
        let m = Metrics::new();
        m.inc(
            HTTP_REQUESTS,
            &[("method", "GET"), ("route", "/healthz"), ("status", "200")],
        );
        m.inc(
            HTTP_REQUESTS,
            &[("method", "GET"), ("route", "/healthz"), ("status", "200")],
        );
        m.inc(ERRORS, &[("code", "forbidden")]);
        let text = m.render();
        for line in [
            "lc_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 2",
            "lc_errors_total{code=\"forbidden\"} 1",
            "lc_admissions_paused_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains(SAFETIME_CERTAIN));
    }
}
