//! Table tests of the pure parts: duration parsing, the configuration
//! merge and its validation, secret files, URL redaction.

use std::path::PathBuf;

use clock::ClockKind;
use jiff::SignedDuration;
use tollgate_server::config::{
    self, Config, FileConfig, RawConfig, parse_duration, read_secret_file, redact_url,
};

#[test]
fn durations() {
    for (input, allow_max, expected) in [
        ("PT30.000000001S", false, Some(SignedDuration::new(30, 1))),
        ("30s 1ns", false, Some(SignedDuration::new(30, 1))),
        ("1h", false, Some(SignedDuration::from_hours(1))),
        ("-PT1S", false, Some(SignedDuration::from_secs(-1))),
        ("max", true, Some(SignedDuration::MAX)),
        ("MAX", true, Some(SignedDuration::MAX)),
        ("max", false, None),
        (
            "PT2562047788015215H30M7.999999999S",
            false,
            Some(SignedDuration::MAX),
        ),
        ("PT2562047788015215H30M8S", false, None),
        ("forever", true, None),
        ("", false, None),
    ] {
        assert_eq!(parse_duration(input, allow_max).ok(), expected, "{input}");
    }
}

fn merge(raw: RawConfig, file: FileConfig, env: Option<&str>) -> Result<Config, String> {
    Config::merge(raw, file, env.map(str::to_string)).map_err(|e| e.to_string())
}

#[test]
fn defaults() {
    let c = merge(RawConfig::default(), FileConfig::default(), None).expect("defaults");
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.database_url, None);
    assert_eq!(c.policy.max_ttl(), SignedDuration::from_hours(1));
    assert_eq!(c.policy.reclaim_grace(), SignedDuration::from_secs(30));
    assert_eq!(c.reclaim_interval, SignedDuration::from_secs(1));
    assert_eq!(c.reclaim_batch, 1000);
    assert!(c.reclaim_worker && c.migrate_on_start);
    assert_eq!(c.admin_token, None);
    assert_eq!(c.clock, ClockKind::System);
    assert_eq!(c.secret_file, None);
    assert_eq!(c.request_timeout, SignedDuration::from_secs(30));
    assert_eq!(c.shutdown_timeout, SignedDuration::from_secs(10));
    assert_eq!(c.safetime_gap_max, SignedDuration::from_secs(5));
    assert_eq!(c.header_read_timeout, SignedDuration::from_secs(10));
    assert_eq!(c.idle_timeout, SignedDuration::from_secs(60));
    assert_eq!(c.connections_max, 512);
}

/// `clock = safe-cut` needs PostgreSQL; its gap bound must be positive; the
/// TOML spelling is the flag's (`safe-cut`, also `safe_cut`), and the
/// rendered configuration reads back.
#[test]
fn safe_cut_clock_settings() {
    let pg = || RawConfig {
        database_url: Some("postgres://h/db".into()),
        ..RawConfig::default()
    };
    let e = merge(
        RawConfig {
            clock: Some(ClockKind::SafeCut),
            ..RawConfig::default()
        },
        FileConfig::default(),
        None,
    )
    .expect_err("memory store");
    assert!(
        e.starts_with(
            "invalid configuration: clock safe-cut reads the safe expiry cut from PostgreSQL"
        ),
        "{e}"
    );
    for (gap, message) in [
        (
            "PT0S",
            "invalid configuration: safetime_gap_max must be positive, got PT0S",
        ),
        (
            "-PT1S",
            "invalid configuration: safetime_gap_max must be positive, got -PT1S",
        ),
        (
            "soon",
            "invalid configuration: safetime_gap_max: \"soon\" is not an ISO 8601",
        ),
        (
            "PT1H0.000000001S",
            "invalid configuration: safetime_gap_max must be at most PT1H, got PT1H0.000000001S",
        ),
    ] {
        let e = merge(
            RawConfig {
                clock: Some(ClockKind::SafeCut),
                safetime_gap_max: Some(gap.into()),
                ..pg()
            },
            FileConfig::default(),
            None,
        )
        .expect_err(gap);
        assert!(e.starts_with(message), "{e}");
    }
    for spelling in ["safe-cut", "safe_cut"] {
        let file: FileConfig = toml::from_str(&format!(
            "clock = \"{spelling}\"\nsafetime_gap_max = \"200ms\"\n"
        ))
        .expect("toml");
        let c = merge(pg(), file, None).expect("valid");
        assert_eq!(c.clock, ClockKind::SafeCut);
        assert_eq!(c.safetime_gap_max, SignedDuration::from_millis(200));
        let text = c.render();
        assert!(text.contains("clock = \"safe-cut\"\n"), "{text}");
        assert!(text.contains("safetime_gap_max = \"PT0.2S\"\n"), "{text}");
        let again: FileConfig =
            toml::from_str(&text.replace("<redacted>", "x")).expect("rendered config parses");
        assert_eq!(again.clock, Some(ClockKind::SafeCut));
    }
}

#[test]
fn precedence_flag_env_file_default() {
    let file = FileConfig {
        database_url: Some("postgres://file/db".into()),
        max_ttl: Some("PT2M".into()),
        reclaim_grace: Some("PT1S".into()),
        clock: Some(ClockKind::Test),
        reclaim_worker: Some(false),
        ..FileConfig::default()
    };
    let c = merge(
        RawConfig::default(),
        file.clone(),
        Some("postgres://env/db"),
    )
    .expect("ok");
    assert_eq!(c.database_url.as_deref(), Some("postgres://env/db"));
    assert_eq!(c.policy.max_ttl(), SignedDuration::from_mins(2));
    assert_eq!(c.clock, ClockKind::Test);
    assert!(!c.reclaim_worker);
    let raw = RawConfig {
        database_url: Some("postgresql://flag/db".into()),
        max_ttl: Some("PT3M".into()),
        ..RawConfig::default()
    };
    let c = merge(raw, file, Some("postgres://env/db")).expect("ok");
    assert_eq!(c.database_url.as_deref(), Some("postgresql://flag/db"));
    assert_eq!(c.policy.max_ttl(), SignedDuration::from_mins(3));
    assert_eq!(c.policy.reclaim_grace(), SignedDuration::from_secs(1));
    // An empty DATABASE_URL counts as unset.
    let c = merge(RawConfig::default(), FileConfig::default(), Some("")).expect("ok");
    assert_eq!(c.database_url, None);
}

#[test]
fn validation_errors() {
    let bad = |raw: RawConfig| merge(raw, FileConfig::default(), None).expect_err("invalid");
    let r = RawConfig::default;
    for (raw, message) in [
        (
            RawConfig {
                reclaim_grace: Some("-PT0.000000001S".into()),
                ..r()
            },
            "invalid configuration: reclaim_grace must be nonnegative",
        ),
        (
            RawConfig {
                max_ttl: Some("PT0S".into()),
                ..r()
            },
            "invalid configuration: max_ttl must be positive",
        ),
        (
            RawConfig {
                max_ttl: Some("-PT1S".into()),
                ..r()
            },
            "invalid configuration: max_ttl must be positive",
        ),
        (
            RawConfig {
                max_ttl: Some("max".into()),
                ..r()
            },
            "invalid configuration: max_ttl: \"max\" is not an ISO 8601 or friendly duration",
        ),
        (
            RawConfig {
                reclaim_interval: Some("PT0S".into()),
                ..r()
            },
            "invalid configuration: reclaim_interval must be positive, got PT0S",
        ),
        (
            RawConfig {
                request_timeout: Some("-PT1S".into()),
                ..r()
            },
            "invalid configuration: request_timeout must be positive, got -PT1S",
        ),
        (
            RawConfig {
                shutdown_timeout: Some("-PT1S".into()),
                ..r()
            },
            "invalid configuration: shutdown_timeout must be nonnegative, got -PT1S",
        ),
        (
            RawConfig {
                reclaim_batch: Some(0),
                ..r()
            },
            "invalid configuration: reclaim_batch: limit must be in 1..=10000, got 0",
        ),
        (
            RawConfig {
                reclaim_batch: Some(10_001),
                ..r()
            },
            "invalid configuration: reclaim_batch: limit must be in 1..=10000, got 10001",
        ),
        (
            RawConfig {
                reclaim_batch: Some(-1),
                ..r()
            },
            "invalid configuration: reclaim_batch: limit must be in 1..=10000, got 0",
        ),
        (
            RawConfig {
                database_url: Some("mysql://h/db".into()),
                ..r()
            },
            "invalid configuration: database_url must be postgres:// or postgresql://, got mysql://",
        ),
        (
            RawConfig {
                database_url: Some("nope".into()),
                ..r()
            },
            "invalid configuration: database_url is not a URL",
        ),
        (
            RawConfig {
                admin_token: Some("short".into()),
                ..r()
            },
            "invalid configuration: admin_token must be at least 16 visible ASCII characters",
        ),
        (
            RawConfig {
                admin_token: Some("sixteen chars ok".into()),
                ..r()
            },
            "invalid configuration: admin_token must be at least 16 visible ASCII characters",
        ),
        (
            RawConfig {
                listen: Some("8080".into()),
                ..r()
            },
            "invalid configuration: listen: \"8080\" is not ADDR:PORT",
        ),
        (
            RawConfig {
                header_read_timeout: Some("PT0S".into()),
                ..r()
            },
            "invalid configuration: header_read_timeout must be positive, got PT0S",
        ),
        (
            RawConfig {
                idle_timeout: Some("-PT1S".into()),
                ..r()
            },
            "invalid configuration: idle_timeout must be positive, got -PT1S",
        ),
        (
            RawConfig {
                connections_max: Some(0),
                ..r()
            },
            "invalid configuration: connections_max: limit must be in 1..=1048576, got 0",
        ),
        (
            RawConfig {
                connections_max: Some(1_048_577),
                ..r()
            },
            "invalid configuration: connections_max: limit must be in 1..=1048576, got 1048577",
        ),
    ] {
        let e = bad(raw);
        assert!(e.starts_with(message), "{e}\nexpected: {message}");
    }
    // The largest grace is valid; so is zero.
    for grace in ["max", "PT0S"] {
        merge(
            RawConfig {
                reclaim_grace: Some(grace.into()),
                ..r()
            },
            FileConfig::default(),
            None,
        )
        .expect(grace);
    }
}

#[test]
fn redaction() {
    assert_eq!(
        redact_url("postgres://tg:hunter2@db:5432/tg?sslmode=disable"),
        "postgres://tg:***@db:5432/tg?sslmode=disable"
    );
    assert_eq!(redact_url("postgres://db/tg"), "postgres://db/tg");
    assert_eq!(redact_url("::"), "<unparseable>");
    let c = merge(
        RawConfig {
            admin_token: Some("a-very-secret-admin-token".into()),
            database_url: Some("postgres://u:pw@h/db".into()),
            ..RawConfig::default()
        },
        FileConfig::default(),
        None,
    )
    .expect("ok");
    let text = c.render();
    assert!(
        !text.contains("a-very-secret") && !text.contains(":pw@"),
        "{text}"
    );
    assert_eq!(format!("{c:?}"), text);
}

fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("tollgate-units-{}-{name}", std::process::id()));
    std::fs::write(&p, contents).expect("write");
    p
}

#[test]
fn secret_files() {
    let ok = temp_file("ok", &[b'k'; 32]);
    let with_newline = temp_file("nl", b"0123456789abcdef0123456789abcdef\r\n");
    let short = temp_file("short", b"0123456789abcdef0123456789abcde\n\n");
    read_secret_file(&ok).expect("32 bytes");
    // The trailing newline is not part of the key: both derive the same
    // capabilities as the bare 32 bytes.
    let bare = temp_file("bare", b"0123456789abcdef0123456789abcdef");
    let a = read_secret_file(&with_newline).expect("trimmed");
    let b = read_secret_file(&bare).expect("bare");
    let id = tollgate::StoreId([1; 16]);
    assert_eq!(
        a.derive(id, tollgate::LeaseId(1)),
        b.derive(id, tollgate::LeaseId(1))
    );
    let e = read_secret_file(&short).expect_err("31 bytes");
    assert!(e.to_string().contains("at least 32 bytes, got 31"), "{e}");
    let e = read_secret_file(&PathBuf::from("/nonexistent/tollgate.key")).expect_err("missing");
    assert!(
        e.to_string()
            .starts_with("invalid configuration: secret_file /nonexistent/tollgate.key")
    );
    let _ = config::DEFAULT_LISTEN;
    for p in [ok, with_newline, short, bare] {
        let _ = std::fs::remove_file(p);
    }
}
