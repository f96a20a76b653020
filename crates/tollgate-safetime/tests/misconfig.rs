//! Qualification: a misconfigured sampler says what is wrong with a stable
//! code and does not pretend it lost a leadership it never had. On
//! PostgreSQL 15 (the misconfigurations are the server's plain SQLSTATEs,
//! the same on every version).
//!
//! * A database without migration 0018: `status` exits 1 with
//!   `schema_missing`; `run` takes the lock, fails to load the policy, logs
//!   "cannot take safe-time leadership" with `schema_missing` and backs off
//!   exponentially (100, 200, 400, 800 ms, ...), never "leadership lost",
//!   and releases the lock between attempts.
//! * A database URL that does not parse: every command exits 2 with
//!   `invalid_url`, and the URL is not repeated.
//! * A login role without the grants of `tollgate_sampler`: `status`,
//!   `policy seal` and `run` fail with `permission_denied`; once the role
//!   is granted, the running sampler wins at its next attempt.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};
use support::SamplerProc;
use tollgate_pg_harness::PgServer;

const NEVER_WON: &str = "cannot take safe-time leadership";

/// The back-off each failed attempt logs before sleeping it: 100 ms doubled
/// up to the 5 s ceiling (`RETRY_BACKOFF_START`, `DEFAULT_RECONNECT_MAX`),
/// in `Duration`'s `Debug` form.
const BACKOFFS: &[&str] = &[
    "100ms", "200ms", "400ms", "800ms", "1.6s", "3.2s", "5s", "5s",
];

/// Runs `tollgate-safetime <args>` against `url` to completion.
fn safetime(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"))
        .args(args)
        .arg("--database-url")
        .arg(url)
        .env_remove("TOLLGATE_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run tollgate-safetime")
}

/// The `key=value` field of one log line (values with spaces are quoted and
/// not needed here).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split(' ').next()
}

/// The log's "cannot take safe-time leadership" lines, each checked to
/// carry `code`, `step` and its hint exactly once (in `hint=`, not also in
/// `error=`); returns the back-off each one logged.
fn never_won_backoffs(log: &str, code: &str, step: &str) -> Vec<String> {
    let hint = match code {
        "schema_missing" => "run `tollgate migrate` against this database",
        "permission_denied" => "GRANT tollgate_sampler TO <role>",
        other => panic!("no hint known for {other}"),
    };
    log.lines()
        .filter(|l| l.contains(NEVER_WON))
        .map(|l| {
            assert!(l.contains(&format!("code=\"{code}\"")), "{l}");
            assert!(l.contains(&format!("step=\"{step}\"")), "{l}");
            let at = l.find(" hint=\"").unwrap_or_else(|| panic!("no hint: {l}"));
            assert!(l[at..].contains(hint), "{l}");
            assert_eq!(l.matches(hint).count(), 1, "{l}");
            field(l, "backoff")
                .unwrap_or_else(|| panic!("no backoff: {l}"))
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn an_unmigrated_database_is_schema_missing_and_the_sampler_backs_off_without_a_loss() {
    let server = PgServer::start_dedicated_with(support::binaries(15)).unwrap();
    let db = server.fresh_database().await;

    let out = safetime(db.url(), &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("(code schema_missing)"), "{err}");
    assert!(err.contains("run `tollgate migrate`"), "{err}");
    assert!(err.contains("SQLSTATE 42P01"), "{err}");
    assert!(out.stdout.is_empty());

    // FAST polls the lock every 100 ms: the old loop retried at that rate.
    let started = Instant::now();
    let sampler = SamplerProc::start(db.url(), "misconfig-unmigrated");
    // At least 2 s, and until the second attempt (100 ms after the first)
    // is in the log, however slow the host is to start the process.
    let deadline = started + Duration::from_secs(30);
    loop {
        let n = sampler.log_text().matches(NEVER_WON).count();
        if n >= 2 && started.elapsed() >= Duration::from_secs(2) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", sampler.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = sampler.log_text();
    let window = started.elapsed();
    let backoffs = never_won_backoffs(&log, "schema_missing", "loading the horizon policy");
    // Attempt k (from 1) starts after the first k - 1 back-offs in all
    // (100, 200, 400, 800, 1600, 3200, 5000, ... ms): within `window` of the
    // spawn, at most the attempts whose start fits.
    let window_ms = window.as_millis();
    let mut slept_ms = 0_u128;
    let mut fit = 0_usize;
    for k in 0..64_u32 {
        if slept_ms > window_ms {
            break;
        }
        fit += 1;
        slept_ms += (100_u128 << k.min(20)).min(5_000);
    }
    assert!(
        (2..=fit).contains(&backoffs.len()),
        "{} attempts in {window:?} (at most {fit} fit): {log}",
        backoffs.len()
    );
    assert!(backoffs.len() <= BACKOFFS.len(), "{log}");
    assert_eq!(backoffs, BACKOFFS[..backoffs.len()], "{log}");
    assert!(!log.contains("leadership lost"), "{log}");
    assert!(!log.contains("leadership won"), "{log}");

    // Between attempts the lock is free, so a healthy sampler could lead;
    // this connection takes it and the misconfigured one becomes a standby.
    let mut other = PgConnection::connect(db.url()).await.unwrap();
    support::take_lock(&mut other, "the misconfigured sampler keeps the lock").await;
    let log_path = sampler.log.clone();
    assert_eq!(sampler.terminate(), Some(0));
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(!log.contains("leadership lost"), "{log}");
    assert!(!log.contains("leadership won"), "{log}");
    assert!(log.contains("safe-time sampler stopped"), "{log}");
}

#[tokio::test]
async fn a_database_url_that_does_not_parse_exits_2_with_invalid_url() {
    let url = "postgres://[bad";
    for args in [
        &["status"][..],
        &["run"],
        &["evidence"],
        &["policy", "show"],
        &[
            "policy",
            "seal",
            "--horizon-ms",
            "1000",
            "--sealed-by",
            "ops",
        ],
    ] {
        let out = safetime(url, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("(code invalid_url)"), "{args:?}: {err}");
        assert!(!err.contains("[bad"), "{args:?} repeats the URL: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[tokio::test]
async fn a_role_without_the_sampler_grants_is_permission_denied_until_granted() {
    let server = PgServer::start_dedicated_with(support::binaries(15)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let mut owner = PgConnection::connect(db.url()).await.unwrap();
    sqlx::query("CREATE ROLE tg_ungranted LOGIN PASSWORD 'change-me'")
        .execute(&mut owner)
        .await
        .unwrap();
    let url = db.url().replacen("postgres@", "tg_ungranted:change-me@", 1);
    assert_ne!(url, db.url(), "the test URL names the postgres user");

    // Migration 0018 grants SELECT on the cut and the policy, and EXECUTE
    // on observe, claim and publish, to tollgate_sampler only; sealing is
    // the owner's.
    for (args, sqlstate_text) in [
        (
            &["status"][..],
            "permission denied for table tollgate_safetime",
        ),
        (
            &["policy", "show"],
            "permission denied for table tollgate_safetime_policy",
        ),
        (
            &[
                "policy",
                "seal",
                "--horizon-ms",
                "1000",
                "--sealed-by",
                "ops",
            ],
            "permission denied for function tollgate_safetime_seal_policy",
        ),
    ] {
        let out = safetime(&url, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("(code permission_denied)"), "{args:?}: {err}");
        assert!(err.contains(sqlstate_text), "{args:?}: {err}");
        assert!(err.contains("(SQLSTATE 42501)"), "{args:?}: {err}");
        assert!(
            err.contains("grants of role tollgate_sampler"),
            "{args:?}: {err}"
        );
    }

    let sampler = SamplerProc::start(&url, "misconfig-ungranted");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sampler.log_text().contains(NEVER_WON) {
        assert!(
            Instant::now() < deadline,
            "no refusal in 30 s: {}",
            sampler.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::query("GRANT tollgate_sampler TO tg_ungranted")
        .execute(&mut owner)
        .await
        .unwrap();
    // The next attempt comes within the 5 s back-off ceiling.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sampler.log_text().contains("safe-time leadership won") {
        assert!(
            Instant::now() < deadline,
            "not won in 30 s: {}",
            sampler.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = sampler.log_text();
    let backoffs = never_won_backoffs(&log, "permission_denied", "loading the horizon policy");
    assert!(!backoffs.is_empty());
    assert!(backoffs.len() <= BACKOFFS.len(), "{log}");
    assert_eq!(backoffs, BACKOFFS[..backoffs.len()], "{log}");
    assert!(!log.contains("leadership lost"), "{log}");
    assert!(log.contains("safe-time leadership won epoch=1 "), "{log}");
    assert_eq!(sampler.terminate(), Some(0));
}

/// A negative number is the value of its flag, not another flag: clap
/// passes `--horizon-ms -1` through, and the command refuses it as usage
/// (exit 2) before it connects anywhere.
#[test]
fn a_negative_horizon_is_a_usage_error() {
    let out = safetime(
        "postgres://nobody@127.0.0.1:1/none",
        &["policy", "seal", "--horizon-ms", "-1", "--sealed-by", "ops"],
    );
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ),
        (
            Some(2),
            "tollgate-safetime: --horizon-ms must be 1..=3153600000000 (100 years), got -1"
        )
    );
    assert!(out.stdout.is_empty());
}

/// A horizon beyond 100 years, control characters in `--sealed-by` and a
/// `--standby-poll` beyond an hour are usage errors, refused before
/// connecting.
#[test]
fn seal_and_standby_bounds_are_usage_errors() {
    check(
        NOWHERE,
        &[
            "policy",
            "seal",
            "--horizon-ms",
            "9223372036854775807",
            "--sealed-by",
            "ops",
        ],
        2,
        "tollgate-safetime: --horizon-ms must be 1..=3153600000000 (100 years), got \
         9223372036854775807",
    );
    check(
        NOWHERE,
        &[
            "policy",
            "seal",
            "--horizon-ms",
            "86400000",
            "--sealed-by",
            "ops\u{7}",
        ],
        2,
        "tollgate-safetime: --sealed-by must not contain control characters, got '\\u{7}' at \
         character 4",
    );
    check(
        NOWHERE,
        &["run", "--standby-poll", "2h"],
        2,
        "tollgate-safetime: --standby-poll must be at most PT1H, got PT2H",
    );
}

/// Runs `tollgate-safetime <args>` against `url` and checks its exit code
/// and its whole standard error; it must print nothing on standard output.
fn check(url: &str, args: &[&str], code: i32, stderr: &str) {
    let out = safetime(url, args);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ),
        (Some(code), stderr),
        "{args:?}"
    );
    assert!(out.stdout.is_empty(), "{args:?}");
}

/// No database listens there: every case must be refused before
/// connecting.
const NOWHERE: &str = "postgres://nobody@127.0.0.1:1/none";

/// A negative duration or count is the value of its flag (clap does not
/// take `-1s` for a flag) and reaches the command's own check: exit 2 with
/// the flag and the value in ISO 8601; an unsigned count gets clap's range
/// message.
#[test]
fn negative_values_reach_the_checks_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["status", "--gap-max", "-1s"],
            "tollgate-safetime: --gap-max must be positive, got -PT1S",
        ),
        (
            &["run", "--interval", "-1s"],
            "tollgate-safetime: --interval must be positive, got -PT1S",
        ),
        (
            &["run", "--gap-max", "-1s"],
            "tollgate-safetime: --gap-max must be positive, got -PT1S",
        ),
        (
            &["run", "--round-trip-max", "-PT1S"],
            "tollgate-safetime: --round-trip-max must be positive, got -PT1S",
        ),
        (
            &["run", "--recovery-grace", "-1ns"],
            "tollgate-safetime: --recovery-grace must be positive, got -PT0.000000001S",
        ),
        (
            &["run", "--standby-poll", "-1s"],
            "tollgate-safetime: --standby-poll must be positive, got -PT1S",
        ),
        (
            &["run", "--drift-ppm", "-1"],
            "error: invalid value '-1' for '--drift-ppm <DRIFT_PPM>': -1 is not in \
             0..=4294967295\n\nFor more information, try '--help'.",
        ),
        (
            &["run", "--stable-observations", "-1"],
            "error: invalid value '-1' for '--stable-observations <STABLE_OBSERVATIONS>': \
             -1 is not in 0..=4294967295\n\nFor more information, try '--help'.",
        ),
        (
            &["evidence", "--limit", "-5"],
            "tollgate-safetime: --limit must be in 1..=1000, got -5",
        ),
        (
            &["evidence", "--limit=-5"],
            "tollgate-safetime: --limit must be in 1..=1000, got -5",
        ),
    ];
    for (args, stderr) in cases {
        check(NOWHERE, args, 2, stderr);
    }
}

/// Every bound is exact and checked before connecting: one past it exits
/// 2 with the value and the bound (the caps of `SafeTimeConfig::new`:
/// gap bound and recovery grace at most PT1H, at most 10000 stable
/// observations; `--limit` in 1..=1000). At the bound, the command goes
/// on to connect (and fails there, exit 1: nothing listens).
#[test]
fn upper_bounds_exit_2_before_connecting() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["status", "--gap-max", "PT1H0.000000001S"],
            "tollgate-safetime: --gap-max must be at most PT1H, got PT1H0.000000001S",
        ),
        (
            &["status", "--gap-max", "1000000000000s"],
            "tollgate-safetime: --gap-max must be at most PT1H, got PT277777777H46M40S",
        ),
        (
            &["run", "--gap-max", "1000000000000s"],
            "tollgate-safetime: --gap-max must be at most PT1H, got PT277777777H46M40S",
        ),
        (
            &["run", "--recovery-grace", "10000000000000s"],
            "tollgate-safetime: --recovery-grace must be at most PT1H, got PT2777777777H46M40S",
        ),
        (
            &["run", "--stable-observations", "4294967295"],
            "tollgate-safetime: --stable-observations must be at most 10000, got 4294967295",
        ),
        (
            &["run", "--stable-observations", "10001"],
            "tollgate-safetime: --stable-observations must be at most 10000, got 10001",
        ),
        (
            &["evidence", "--limit", "0"],
            "tollgate-safetime: --limit must be in 1..=1000, got 0",
        ),
        (
            &["evidence", "--limit", "1001"],
            "tollgate-safetime: --limit must be in 1..=1000, got 1001",
        ),
    ];
    for (args, stderr) in cases {
        check(NOWHERE, args, 2, stderr);
    }
    for args in [
        &["status", "--gap-max", "PT1H"][..],
        &["evidence", "--limit", "1"],
        &["evidence", "--limit", "1000"],
    ] {
        let out = safetime(NOWHERE, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("tollgate-safetime: database error: cannot connect: "),
            "{args:?}: {err}"
        );
        assert!(
            err.trim_end().ends_with("(code backend)"),
            "{args:?}: {err}"
        );
    }
}

/// A URL of another scheme is `invalid_url` (exit 2) for every command,
/// before connecting (sqlx alone would read `mysql://` as PostgreSQL
/// settings, and `run` would retry it for ever); no part of it is echoed.
#[test]
fn a_database_url_of_another_scheme_exits_2_with_invalid_url() {
    let expected = "tollgate-safetime: invalid database URL: the URL must start with \
                    postgres:// or postgresql:// (the URL is not repeated here) (code invalid_url)";
    for url in [
        "mysql://u:s3cret@h/db",
        "postgre://u:s3cret@h/db",
        "u:s3cret@h/db",
    ] {
        for args in [
            &["status"][..],
            &["run"],
            &["evidence"],
            &["policy", "show"],
            &[
                "policy",
                "seal",
                "--horizon-ms",
                "1000",
                "--sealed-by",
                "ops",
            ],
        ] {
            check(url, args, 2, expected);
        }
    }
}

/// A sampler whose log cannot be written (stderr on a full disk) keeps
/// running rather than dying of a panic in the logger, and stops cleanly
/// on SIGTERM.
#[test]
fn an_unwritable_log_does_not_kill_the_sampler() {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" run --database-url postgres://nobody@127.0.0.1:1/none 2>/dev/full")
        .arg(env!("CARGO_BIN_EXE_tollgate-safetime"))
        .env_remove("TOLLGATE_DATABASE_URL")
        .stdin(Stdio::null())
        .spawn()
        .expect("run tollgate-safetime");
    // It logs a failed connect at once and retries (100 ms, 200 ms, ...).
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(child.try_wait().expect("try_wait"), None, "still running");
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
    assert_eq!(child.wait().expect("wait").code(), Some(0));
}

/// A database that accepts connections but never answers (a frozen server;
/// here a listener that never reads) does not hang a one-shot command: it
/// gives up after `--command-timeout` with exit 1.
#[test]
fn a_silent_database_does_not_hang_a_command() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = silent.local_addr().expect("addr").port();
    let url = format!("postgres://nobody@127.0.0.1:{port}/none");
    for args in [&["status"][..], &["evidence"], &["policy", "show"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"))
            .args(args)
            .args(["--command-timeout", "1s", "--database-url", &url])
            .env_remove("TOLLGATE_DATABASE_URL")
            .output()
            .expect("run tollgate-safetime");
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim_end()
            ),
            (
                Some(1),
                "tollgate-safetime: database error: the database did not answer within PT1S \
                 (code backend)"
            ),
            "{args:?}"
        );
    }
    let out = safetime(&url, &["status", "--command-timeout", "0s"]);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ),
        (
            Some(2),
            "tollgate-safetime: --command-timeout must be in 1s..=1h, got PT0S"
        )
    );
    drop(silent);
}

/// Runs `tollgate-safetime status` with no database URL and the log
/// environment `env`, returning its exit code and standard error.
fn status_with_log_env(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"));
    cmd.arg("status")
        .env_remove("TOLLGATE_DATABASE_URL")
        .env_remove("TOLLGATE_LOG_LEVEL")
        .env_remove("TOLLGATE_LOG")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run tollgate-safetime");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
    )
}

/// The log setting has `tollgate`'s grammar and alias: directives and `off`
/// are accepted (the command goes on to its own check, here the missing
/// URL, exit 2), a value that is neither is warned about and the default
/// applies, and the former `TOLLGATE_LOG` is read with the same
/// deprecation warning `tollgate` prints.
#[test]
fn the_log_setting_has_the_grammar_and_alias_of_tollgate() {
    let missing = "tollgate-safetime: --database-url (or TOLLGATE_DATABASE_URL) is required";
    for spec in ["info,tollgate_pg=debug", "off", "warn", "safetime_pg=trace"] {
        assert_eq!(
            status_with_log_env(&[("TOLLGATE_LOG_LEVEL", spec)]),
            (Some(2), missing.to_string()),
            "{spec}"
        );
    }
    assert_eq!(
        status_with_log_env(&[("TOLLGATE_LOG_LEVEL", "loud")]),
        (
            Some(2),
            format!(
                "warning: --log-level (or TOLLGATE_LOG_LEVEL) \"loud\" is neither a level \
                 (error, warn, info, debug, trace, off) nor target=level directives; \
                 logging at info\n{missing}"
            )
        )
    );
    assert_eq!(
        status_with_log_env(&[("TOLLGATE_LOG", "debug")]),
        (
            Some(2),
            format!(
                "warning: TOLLGATE_LOG is deprecated; set TOLLGATE_LOG_LEVEL (or \
                 --log-level) instead, the name both tollgate and tollgate-safetime read\n\
                 {missing}"
            )
        )
    );
}

/// A duration that is neither ISO 8601 nor the friendly format is refused
/// in the flag's terms with the accepted forms, by the same checker and in
/// the same words as `tollgate`'s (`--ttl: ...`), for every duration flag
/// and before connecting; no parser internals leak.
#[test]
fn unreadable_durations_are_refused_in_the_flags_terms() {
    let forms = "is not an ISO 8601 or friendly duration: write e.g. PT30S, PT0.000000001S, \
                 30s, 1h 30m or 250ms";
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["run", "--gap-max", "10 parsecs"],
            "--gap-max",
            "10 parsecs",
        ),
        (&["run", "--interval", ""], "--interval", ""),
        (
            &["run", "--round-trip-max", "soon"],
            "--round-trip-max",
            "soon",
        ),
        (
            &["run", "--recovery-grace", "5 sec later"],
            "--recovery-grace",
            "5 sec later",
        ),
        (
            &["run", "--standby-poll", "often"],
            "--standby-poll",
            "often",
        ),
        (
            &["status", "--gap-max", "10 parsecs"],
            "--gap-max",
            "10 parsecs",
        ),
        (
            &["status", "--recovery-grace", "x"],
            "--recovery-grace",
            "x",
        ),
        (
            &["status", "--command-timeout", "forever"],
            "--command-timeout",
            "forever",
        ),
    ];
    for (args, flag, value) in cases {
        check(
            NOWHERE,
            args,
            2,
            &format!("tollgate-safetime: {flag}: {value:?} {forms}"),
        );
    }
    // Settings judged together are named by their flags too.
    check(
        NOWHERE,
        &["run", "--interval", "10s", "--gap-max", "5s"],
        2,
        "tollgate-safetime: --interval (PT10S) must be below --gap-max (PT5S)",
    );
    check(
        NOWHERE,
        &["run", "--drift-ppm", "100001"],
        2,
        "tollgate-safetime: --drift-ppm must be at most 100000, got 100001",
    );
}

/// The help names the migration the sampler needs, not a schema version
/// that later migrations outdate.
#[test]
fn the_help_names_the_migration_the_sampler_needs() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"))
        .arg("--help")
        .env_clear()
        .output()
        .expect("run tollgate-safetime");
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains(
            "PostgreSQL URL of the Tollgate database, migrated with `tollgate migrate` (the \
             sampler needs migration 0018, safe time, or later)"
        ),
        "{help}"
    );
    assert!(!help.contains("schema 18"), "{help}");
}
