//! Qualification of the holder's guarantee, measured from outside the
//! service: **no lease is reclaimed, and no holder is told
//! `lease_reclaimable`, before `granted_ttl + reclaim_grace` of real time
//! has passed since the client sent the request that granted or renewed
//! it.**
//!
//! Everything is real: a PostgreSQL server, the sampler process
//! (`tollgate-safetime run`) at its default interval (1 s) and at a long one
//! (4 s, gap bound 5 s), and `tollgate serve --clock safe-cut` in a process
//! of its own (this test binary re-executed as the `tollgate` command line,
//! see [`serve_child`]; the binary has its own `main`, `harness = false`,
//! so that no test entry point is needed for the child) with its reclaim
//! worker, driven over
//! loopback HTTP. The only clock the assertions read is this process's
//! monotonic clock: each request's send instant is taken *before* it is
//! sent, and each outcome's instant *after* its answer arrived, so every
//! measured interval is at most the real one the service had.
//!
//! Leases are acquired one every `spacing`, so their requests fall at every
//! phase of the sampler's publish interval (a request just before a publish
//! reads the stalest cut). Each lease's reclaim is seen by polling the
//! leases table every 10 ms; half of the leases are renewed once and then
//! probed with one release each, at offsets around the renewed TTL, and a
//! refusal of the probe (`lease_reclaimable`, or `lease_not_active` when
//! the worker was first) counts as the holder being told its lease is gone.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::SamplerProc;

const ADMIN: &str = "tgadm1-holder-time-admin-token-0123";
/// The variable that turns this test binary into `tollgate serve`.
const CHILD_ARGS: &str = "TOLLGATE_HOLDER_TIME_SERVE_ARGS";
/// Separates the arguments in [`CHILD_ARGS`].
const SEP: char = '\u{1f}';

/// The two configurations, run in order; a panic in one is reported and
/// fails the binary after the other has run. With [`CHILD_ARGS`] set, this
/// binary is instead the `tollgate` command line ([`serve_child`]). Plain
/// positional arguments filter the configurations by name, as libtest's do.
fn main() -> std::process::ExitCode {
    if let Ok(args) = std::env::var(CHILD_ARGS) {
        serve_child(&args);
        return std::process::ExitCode::SUCCESS;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let cases: [(&str, fn()); 2] = [
        (
            "default_interval_grace_zero_pg15",
            default_interval_grace_zero_pg15,
        ),
        (
            "long_interval_positive_grace_pg18",
            long_interval_positive_grace_pg18,
        ),
    ];
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, case) in cases {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        println!("test {name} ...");
        match std::panic::catch_unwind(case) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(name);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        ran - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// Runs `case` on a two-thread runtime, as the other qualification tests do.
fn block_on(case: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(case);
}

/// `tollgate` with the arguments in `args` (separated by [`SEP`]), exactly
/// as the binary's `main` runs it.
fn serve_child(args: &str) {
    use clap::Parser as _;
    let cli = tollgate_server::cli::Cli::parse_from(
        std::iter::once("tollgate".to_owned()).chain(args.split(SEP).map(str::to_owned)),
    );
    tollgate_server::cli::init_logging(cli.log_format, cli.log_level.clone(), tracing::Level::INFO);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(tollgate_server::cli::run(cli.command));
    if let Err(e) = code {
        panic!("tollgate serve failed: {e}");
    }
}

/// A running `tollgate serve`; killed on drop.
struct Serve {
    child: Child,
    url: String,
    log: std::path::PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn start(args: &[&str], tag: &str) -> Serve {
        use std::io::{BufRead, BufReader};
        let log = std::env::temp_dir().join(format!(
            "tollgate-holder-time-{}-{tag}.log",
            std::process::id()
        ));
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        for (k, _) in std::env::vars() {
            if k.starts_with("TOLLGATE_") || k == "DATABASE_URL" {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .env(CHILD_ARGS, args.join(&SEP.to_string()))
            .env("TOLLGATE_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start tollgate serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("tollgate listening on ") {
                    let _ = tx.send(url.to_owned());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "tollgate serve did not start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Serve { child, url, log }
    }
}

/// One HTTP answer: status and JSON body.
struct Answer {
    status: u16,
    body: Value,
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("HTTP request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("HTTP body");
        Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }
}

/// One configuration of the measurement.
struct Setup {
    major: u32,
    tag: &'static str,
    /// `tollgate-safetime run` settings beyond the defaults.
    sampler: &'static [&'static str],
    /// The service's `--safetime-gap-max` (the sampler's `--gap-max`).
    gap_max: &'static str,
    grace: &'static str,
    grace_ms: u64,
    /// The TTL every acquire and renewal asks for.
    ttl: &'static str,
    ttl_ms: u64,
    leases: usize,
    spacing: Duration,
}

/// A lease the client holds, with its request's send instant.
struct Held {
    capability: String,
    sent: Instant,
    granted_ttl_ms: u64,
    /// The renewal's send instant and granted TTL, for the probed leases.
    renewed: Option<(Instant, u64)>,
}

fn iso_ms(v: &Value) -> u64 {
    let d: jiff::SignedDuration = v.as_str().expect("an ISO 8601 duration").parse().unwrap();
    u64::try_from(d.as_millis()).unwrap()
}

async fn measure(setup: Setup) {
    let server =
        tollgate_pg_harness::PgServer::start_dedicated_with(support::binaries(setup.major))
            .unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let sampler = SamplerProc::start_with(db.url(), setup.tag, setup.sampler);

    let secret = std::env::temp_dir().join(format!(
        "tollgate-holder-time-{}-{}.key",
        std::process::id(),
        setup.tag
    ));
    std::fs::write(&secret, [7u8; 32]).unwrap();
    let secret = secret.to_string_lossy().into_owned();
    let max_ttl = "PT1M";
    let serve = Serve::start(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN,
            "--database-url",
            db.url(),
            "--secret-file",
            &secret,
            "--clock",
            "safe-cut",
            "--safetime-gap-max",
            setup.gap_max,
            "--max-ttl",
            max_ttl,
            "--reclaim-grace",
            setup.grace,
            "--reclaim-interval",
            "PT0.02S",
        ],
        setup.tag,
    );
    let client = Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        base: serve.url.clone(),
    };
    let created = client
        .call(
            "POST",
            "/v1/accounts",
            ADMIN,
            Some(json!({"name": "holder"})),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let account = created.body["account_id"].as_i64().unwrap();
    let key = created.body["api_key"].as_str().unwrap().to_owned();
    let dep = client
        .call(
            "POST",
            &format!("/v1/accounts/{account}/deposits"),
            ADMIN,
            Some(json!({"units": 1_000})),
        )
        .await;
    assert_eq!(dep.status, 200, "{}", dep.body);

    let acquire_path = format!("/v1/accounts/{account}/leases");
    let acquire_body = json!({"units": 1, "ttl": setup.ttl});
    // Wait for a certain cut: the first accepted acquire is measured too.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut held: BTreeMap<i64, Held> = BTreeMap::new();
    let mut order: Vec<i64> = Vec::new();
    let acquire = async |held: &mut BTreeMap<i64, Held>, order: &mut Vec<i64>| {
        let sent = Instant::now();
        let a = client
            .call("POST", &acquire_path, &key, Some(acquire_body.clone()))
            .await;
        if a.status == 503 && held.is_empty() {
            assert_eq!(a.body["code"], json!("time_uncertain"), "{}", a.body);
            return false;
        }
        assert_eq!(a.status, 201, "{}", a.body);
        // The time the holder is told it has from the request: the TTL.
        assert_eq!(a.body["expires_in"], a.body["granted_ttl"], "{}", a.body);
        let id = a.body["lease_id"].as_i64().unwrap();
        order.push(id);
        held.insert(
            id,
            Held {
                capability: a.body["capability"].as_str().unwrap().to_owned(),
                sent,
                granted_ttl_ms: iso_ms(&a.body["granted_ttl"]),
                renewed: None,
            },
        );
        true
    };
    while !acquire(&mut held, &mut order).await {
        assert!(Instant::now() < deadline, "the cut never became certain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One acquire every `spacing`, so requests meet every phase of the
    // publish interval; every other lease is renewed `RENEW_AFTER` ticks
    // after its acquire (well inside its TTL), so renewals do too. Each
    // renewed lease is probed with one release at an offset after its
    // renewal's send spread over [owed - 1.2 s, owed + 1.8 s), owed being
    // `granted_ttl + grace` (the defect told holders up to about one
    // interval early). The leases table is polled every 10 ms throughout.
    const RENEW_AFTER: usize = 10;
    let renewals = (setup.leases - 1) / 2;
    let mut pg = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(db.url()).await.unwrap()
    };
    let mut reclaimed_seen: BTreeMap<i64, Instant> = BTreeMap::new();
    let mut told: Vec<(i64, Duration, u64, String)> = Vec::new();
    let mut probes: Vec<(Instant, i64)> = Vec::new();
    let mut released = 0usize;
    let mut tick = 0usize;
    let mut next_tick = Instant::now() + setup.spacing;
    let end = Instant::now()
        + setup.spacing * u32::try_from(setup.leases + RENEW_AFTER).unwrap()
        + Duration::from_millis(setup.ttl_ms * 2 + setup.grace_ms + 8_000);
    loop {
        let now = Instant::now();
        let ticking = tick <= setup.leases + RENEW_AFTER;
        if !ticking && probes.is_empty() && reclaimed_seen.len() + released == held.len() {
            break;
        }
        assert!(now < end, "timed out; service log: {}", serve.log.display());
        if ticking && now >= next_tick {
            tick += 1;
            next_tick += setup.spacing;
            if held.len() < setup.leases {
                acquire(&mut held, &mut order).await;
            }
            if let Some(renew_of) = tick.checked_sub(RENEW_AFTER)
                && renew_of % 2 == 1
                && let Some(id) = order.get(renew_of).copied()
            {
                let h = held.get_mut(&id).unwrap();
                let sent = Instant::now();
                let r = client
                    .call(
                        "POST",
                        &format!("/v1/leases/{id}/renew"),
                        &h.capability,
                        Some(json!({"ttl": setup.ttl})),
                    )
                    .await;
                assert_eq!(r.status, 200, "renew {id}: {}", r.body);
                let ttl_ms = iso_ms(&r.body["granted_ttl"]);
                assert!(iso_ms(&r.body["expires_in"]) >= ttl_ms, "{}", r.body);
                h.renewed = Some((sent, ttl_ms));
                let k = u64::try_from(probes.len() + told.len() + released).unwrap();
                let lead = Duration::from_millis(ttl_ms + setup.grace_ms)
                    .saturating_sub(Duration::from_millis(1_200))
                    + Duration::from_millis(3_000 * k / u64::try_from(renewals).unwrap());
                probes.push((sent + lead, id));
            }
        }
        probes.sort_by_key(|p| std::cmp::Reverse(p.0));
        while let Some(&(due, id)) = probes.last()
            && due <= Instant::now()
        {
            probes.pop();
            let h = &held[&id];
            let (sent, ttl_ms) = h.renewed.unwrap();
            let r = client
                .call(
                    "POST",
                    &format!("/v1/leases/{id}/release"),
                    &h.capability,
                    None,
                )
                .await;
            let after = Instant::now();
            match r.status {
                200 => released += 1,
                409 => told.push((
                    id,
                    after - sent,
                    ttl_ms + setup.grace_ms,
                    r.body["code"].as_str().unwrap_or("?").to_owned(),
                )),
                other => panic!("release {id}: {other} {}", r.body),
            }
        }
        let rows: Vec<(i64,)> =
            sqlx::query_as("SELECT lease_id FROM tollgate_leases WHERE state = 'reclaimed'")
                .fetch_all(&mut pg)
                .await
                .unwrap();
        let after = Instant::now();
        for (id,) in rows {
            reclaimed_seen.entry(id).or_insert(after);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Every reclaim, against the later of its acquire and its renewal.
    let mut early = Vec::new();
    let mut margins = Vec::new();
    for (id, h) in &held {
        let Some(seen) = reclaimed_seen.get(id) else {
            continue;
        };
        let (from, ttl_ms) = match h.renewed {
            Some((sent, ttl)) => (sent, ttl),
            None => (h.sent, h.granted_ttl_ms),
        };
        let owed = Duration::from_millis(ttl_ms + setup.grace_ms);
        let elapsed = *seen - from;
        margins.push(elapsed.as_secs_f64() - owed.as_secs_f64());
        if elapsed < owed {
            early.push(format!(
                "lease {id}: reclaimed {elapsed:?} after the send, owed {owed:?}"
            ));
        }
    }
    for (id, elapsed, owed_ms, code) in &told {
        let owed = Duration::from_millis(*owed_ms);
        margins.push(elapsed.as_secs_f64() - owed.as_secs_f64());
        if *elapsed < owed {
            early.push(format!(
                "lease {id}: told {code} {elapsed:?} after the renewal was sent, owed {owed:?}"
            ));
        }
    }
    let min_margin = margins.iter().copied().fold(f64::INFINITY, f64::min);
    eprintln!(
        "holder time [{}]: {} leases, {} reclaims seen, {} probes refused, {} early; \
         least margin over the guarantee {:.3} s",
        setup.tag,
        held.len(),
        reclaimed_seen.len(),
        told.len(),
        early.len(),
        min_margin
    );
    assert!(
        early.is_empty(),
        "{} of {} outcomes came before granted_ttl + grace of client time:\n{}\nservice log: {}",
        early.len(),
        margins.len(),
        early.join("\n"),
        serve.log.display()
    );
    drop(serve);
    drop(sampler);
}

/// The sampler at its defaults (1 s interval, 5 s gap bound), grace zero.
fn default_interval_grace_zero_pg15() {
    block_on(measure(Setup {
        major: 15,
        tag: "default15",
        sampler: &["--stable-observations", "2", "--recovery-grace", "1s"],
        gap_max: "PT5S",
        grace: "PT0S",
        grace_ms: 0,
        ttl: "PT3S",
        ttl_ms: 3_000,
        leases: 40,
        spacing: Duration::from_millis(70),
    }));
}

/// A long interval (4 s, gap bound 5 s) and a positive grace.
fn long_interval_positive_grace_pg18() {
    block_on(measure(Setup {
        major: 18,
        tag: "long18",
        sampler: &[
            "--interval",
            "4s",
            "--gap-max",
            "5s",
            "--stable-observations",
            "1",
            "--recovery-grace",
            "1s",
        ],
        gap_max: "PT5S",
        grace: "PT2S",
        grace_ms: 2_000,
        ttl: "PT3S",
        ttl_ms: 3_000,
        leases: 40,
        spacing: Duration::from_millis(110),
    }));
}
