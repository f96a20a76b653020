//! Qualification: the sampler behind a real PgBouncer (Debian package
//! `pgbouncer`, which `scripts/test.sh` installs when missing; these tests
//! fail, never skip, without it). The README says transaction and statement
//! pooling are unsupported and that the sampler's per-sample checks catch
//! them; session pooling is supported.
//!
//! **When transaction pooling moves the sampler.** PgBouncer hands out idle
//! server connections last-in first-out (`server_round_robin = 0`), so a
//! sampler that is PgBouncer's only busy client keeps getting the backend
//! it won the lock on, even in transaction mode, and nothing goes wrong. A
//! statement reaches another backend only when another client's
//! transaction has taken the sampler's backend, or left another one
//! released more recently. The tests make that one move deterministic: a
//! second client X, through the same PgBouncer (`default_pool_size = 2`),
//! holds backend B in an open transaction while the sampler connects, so
//! the sampler gets backend A, wins the lock there and claims epoch 1.
//! Right after one of the sampler's publishes (seen in the database), X
//! commits: B is now the most recently released server, and the sampler's
//! next statement, the observation that starts its next sample (100 ms
//! later), runs on B.
//!
//! **sqlx and PgBouncer 1.18.** sqlx runs every query as a named prepared
//! statement, `sqlx_s_<n>` numbered per connection in first-use order, and
//! prepares it in a round trip of its own (Parse, Describe, Sync) before
//! binding it. PgBouncer 1.18 (Debian 12) does not track prepared
//! statements (1.21's `max_prepared_statements` does), so on B the
//! sampler's observation `sqlx_s_5` does not exist: the sample fails with
//! SQLSTATE 26000 before any leadership check sees it, and leadership ends
//! all the same (`transaction_pooling_without_statement_tracking_fails_the_cached_observation`).
//! To show the check itself, the second test gives B the sampler's
//! prepared statements, as a PgBouncer that tracks them would: X runs the
//! sampler's statements through the same `safetime_pg` functions in the
//! sampler's order (try-lock, backend pid, policy, claim, observe, publish:
//! `crates/safetime-pg/src/sampler.rs`), so sqlx gives them the same names
//! on B. Then the observation runs on B and the sampler's PID check ends
//! leadership; on the way, the database refuses X's claim and publish from
//! B (`not_leader`: B does not hold the lock).
//!
//! Why not `server_round_robin = 1`: it rotates on every transaction, so
//! sqlx's Parse and Bind of one query land on different backends and the
//! sampler fails at its first statements with 26000 or 42P05 (a name left
//! there by its previous connection), in an order that depends on when
//! PgBouncer closes broken server connections and opens new ones; only
//! rarely does the PID check get a turn. Nothing exact can be asserted.
//!
//! After the loss (not asserted here: the tests stop at the first one)
//! dropping the client connection does not end A's session: PgBouncer
//! keeps A idle in its pool, still holding the lock and sqlx's statements,
//! and the sampler's next connections fail on `sqlx_s_1 already exists`
//! until PgBouncer closes those server connections (about 2 s on this
//! machine); then it wins epoch 2 on a new backend.
//!
//! **Session pooling.** The same disturbance changes nothing: each client
//! keeps its backend for its whole session, and the cut becomes certain.
//!
//! The sampler runs with the fast qualification settings but a 2 s
//! recovery grace, so that no cut can be certain before the move (at most
//! about 0.3 s after the claim; the margin is for a loaded machine).
//! Timeouts: 20 s for any wait on the sampler, 10 s for PgBouncer to
//! listen.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use safetime::{UncertainReason, Verdict};
use safetime_pg::CutRow;
use sqlx::{Connection, Executor as _, PgConnection, Row as _};
use support::{CutWatch, SamplerProc};
use tollgate_pg_harness::{DEFAULT_PG_USER, PG_USER_ENV, PgServer, SUPERUSER, TestDb};

/// Where Debian's package `pgbouncer` installs the binary.
const PGBOUNCER_CANDIDATES: [&str; 2] = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"];

/// How long PgBouncer may take to log that it listens.
const BOUNCER_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Free-port picks tried before giving up (another process may take the
/// port between our probe and PgBouncer's bind).
const BOUNCER_PORT_ATTEMPTS: u32 = 5;

/// Bound of every wait on the sampler (a claim, a publish, a loss, a
/// certain cut), in seconds.
const WAIT_SECS: u64 = 20;

/// How often the tests read the cut while timing X's commit. A publish is
/// seen at most this long after it committed, well inside the sampler's
/// 100 ms sleep.
const POLL: Duration = Duration::from_millis(5);

/// Pause between seeing a publish and X's commit: long enough for
/// PgBouncer to have released the sampler's backend after that publish
/// (the commit is visible a little before the sampler's round trip ends),
/// short against the 100 ms until the sampler's next observation.
const AFTER_PUBLISH: Duration = Duration::from_millis(10);

/// What the sampler logs when a leadership term ends; the reason follows.
const LOSS_PREFIX: &str = "safe-time leadership lost; connection dropped reason=";

/// The sampler's reason when its per-sample check finds another backend
/// (`crates/safetime-pg/src/sampler.rs`).
fn pid_check_reason(answered_pid: i32, won_pid: i32) -> String {
    format!(
        "leadership check failed: backend pid {answered_pid} (won as {won_pid}), lock held: false \
         (is the connection going through a transaction-pooling proxy?)"
    )
}

/// The `pgbouncer` binary; panics naming the package when it is missing.
fn pgbouncer_binary() -> PathBuf {
    PGBOUNCER_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "pgbouncer is not installed (looked in {PGBOUNCER_CANDIDATES:?}): install the \
                 Debian package `pgbouncer` (scripts/test.sh installs it when missing)"
            )
        })
}

/// The first line of `pgbouncer --version`, e.g. `PgBouncer 1.18.0`.
fn pgbouncer_version(bin: &Path) -> String {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", bin.display()));
    assert!(out.status.success(), "{} --version failed", bin.display());
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().unwrap_or_default().to_owned()
}

fn id(args: &[&str]) -> String {
    let out = Command::new("id").args(args).output().expect("run id(1)");
    assert!(out.status.success(), "id {args:?} failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// PgBouncer refuses to run as root. As root, run it the way the harness
/// runs PostgreSQL: `setpriv --reuid=<user> --regid=<its gid>
/// --init-groups --pdeathsig=KILL --`, where `<user>` is the harness's
/// account (`TOLLGATE_PG_USER`, default `postgres`). setpriv execs, so
/// the child's pid is PgBouncer's; the death signal follows the forking
/// thread, which is the test's own and outlives the `Bouncer`.
fn bouncer_command(bin: &Path) -> Command {
    if id(&["-u"]) != "0" {
        return Command::new(bin);
    }
    let user = std::env::var(PG_USER_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_PG_USER.to_owned());
    let gid = id(&["-g", &user]);
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={user}"))
        .arg(format!("--regid={gid}"))
        .args(["--init-groups", "--pdeathsig=KILL", "--"])
        .arg(bin);
    cmd
}

/// A PgBouncer for one database of a harness server, listening on
/// 127.0.0.1 on a free port; killed (and its directory removed) on drop.
struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
    version: String,
}

impl Bouncer {
    /// `pool_mode` is `session` or `transaction`; two server connections
    /// at most, reused last-in first-out.
    fn start(tag: &str, pg_port: u16, db: &str, pool_mode: &str) -> Bouncer {
        let bin = pgbouncer_binary();
        let version = pgbouncer_version(&bin);
        // Where the harness makes its servers' directories (reachable by
        // the account PgBouncer runs as). Created by us with the default
        // umask: readable, not writable, by that account, which writes only
        // to the inherited log descriptor.
        let dir = tollgate_pg_harness::base_dir()
            .join(format!("tollgate-pgbouncer-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let users = dir.join("userlist.txt");
        std::fs::write(&users, format!("\"{SUPERUSER}\" \"\"\n")).unwrap();
        // PgBouncer 1.21 added prepared statement tracking
        // (`max_prepared_statements`); 1.18 refuses the setting as unknown.
        // Where it exists it is set to 0, so that every version behaves
        // like Debian 12's 1.18, which the module docs describe.
        let tracking = if version_key(&version) >= (1, 21) {
            "max_prepared_statements = 0\n"
        } else {
            ""
        };
        let log_path = dir.join("pgbouncer.log");
        let mut last_log = String::new();
        for _ in 0..BOUNCER_PORT_ATTEMPTS {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap()
                .port();
            // `extra_float_digits`: sqlx sends it at startup and PgBouncer
            // refuses parameters it does not track unless told to ignore
            // them. `unix_socket_dir =`: TCP only.
            let ini = format!(
                "[databases]\n\
                 {db} = host=127.0.0.1 port={pg_port} dbname={db} user={SUPERUSER}\n\
                 \n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {}\n\
                 pool_mode = {pool_mode}\n\
                 default_pool_size = 2\n\
                 min_pool_size = 0\n\
                 server_round_robin = 0\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 {tracking}",
                users.display()
            );
            let ini_path = dir.join("pgbouncer.ini");
            std::fs::write(&ini_path, ini).unwrap();
            let log = std::fs::File::create(&log_path).unwrap();
            let mut cmd = bouncer_command(&bin);
            cmd.arg(&ini_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
            let listening = format!("listening on 127.0.0.1:{port}");
            let deadline = Instant::now() + BOUNCER_READY_TIMEOUT;
            loop {
                last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
                if last_log.contains(&listening) {
                    return Bouncer {
                        child,
                        dir,
                        port,
                        version,
                    };
                }
                if let Some(status) = child.try_wait().unwrap() {
                    if last_log.contains("Address already in use") {
                        break;
                    }
                    panic!("{version} exited ({status}) before listening; log:\n{last_log}");
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{version} did not listen within {BOUNCER_READY_TIMEOUT:?}; log:\n{last_log}"
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!(
            "{version}: no free port after {BOUNCER_PORT_ATTEMPTS} attempts; last log:\n{last_log}"
        );
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{db}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the sampler's statements, in the sampler's order and through the
/// same functions, on `x` (which must not hold the lock: another session
/// does), so that sqlx prepares them on x's backend under the names the
/// sampler's own connection gives them. Checks on the way that the
/// database refuses a claim and a publish from a backend without the lock.
/// Returns x's backend pid.
async fn prepare_the_sampler_statements(x: &mut PgConnection) -> i32 {
    assert!(
        !safetime_pg::try_lock(x).await.unwrap(),
        "another session holds the lock"
    );
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *x)
        .await
        .unwrap();
    let policy = safetime_pg::load_policy(&mut *x).await.unwrap();
    let err = safetime_pg::claim(x, &policy).await.unwrap_err();
    assert_eq!(err.code(), "not_leader", "{err}");
    let obs = safetime_pg::observe(x).await.unwrap();
    assert_eq!(obs.backend_pid, pid);
    assert!(!obs.lock_held);
    let v = Verdict {
        proposal: obs.db_now,
        uncertain: None,
        anomaly: false,
        clears_quarantine: false,
        publishable: true,
        observed_at: obs.db_now,
    };
    let err = safetime_pg::publish(x, 1, &v).await.unwrap_err();
    assert_eq!(err.code(), "not_leader", "{err}");
    pid
}

/// `(major, minor)` of a `pgbouncer --version` line such as
/// `PgBouncer 1.18.0`.
fn version_key(version: &str) -> (u32, u32) {
    let number = version
        .strip_prefix("PgBouncer ")
        .unwrap_or_else(|| panic!("unexpected pgbouncer --version output {version:?}"));
    let mut parts = number.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => panic!("unexpected pgbouncer --version output {version:?}"),
    }
}

/// `SELECT pg_backend_pid()` as a simple query: no prepared statement, so
/// it does not shift sqlx's statement numbering on `conn`.
async fn backend_pid(conn: &mut PgConnection) -> i32 {
    let row = sqlx::raw_sql("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    row.try_get(0).unwrap()
}

/// Everything one run holds. Fields drop in order: the sampler first, the
/// server last.
struct Run {
    sampler: SamplerProc,
    bouncer: Bouncer,
    /// The second client, through PgBouncer.
    x: PgConnection,
    /// Reads the cut directly from PostgreSQL.
    watch: CutWatch,
    admin: PgConnection,
    db: TestDb,
    _server: PgServer,
    /// The backend the sampler won the lock on (`leader_pid` of epoch 1).
    won_pid: i32,
    /// X's backend, where the sampler's next statement goes after X commits.
    x_pid: i32,
}

/// Starts everything and makes the move described in the module docs:
/// X holds B while the sampler wins on A; X commits right after a publish.
async fn run(pool_mode: &str, prepare_on_b: bool, tag: &str) -> Run {
    let server = PgServer::start_dedicated().unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let bouncer = Bouncer::start(tag, server.port(), db.name(), pool_mode);
    eprintln!("{tag}: {} in {pool_mode} pooling", bouncer.version);

    // The lock is held directly on PostgreSQL while X prepares, so that X
    // never holds it; released before the sampler starts.
    let mut holder = PgConnection::connect(db.url()).await.unwrap();
    assert!(safetime_pg::try_lock(&mut holder).await.unwrap());
    let mut x = PgConnection::connect(&bouncer.url(db.name()))
        .await
        .unwrap();
    let prepared_pid = if prepare_on_b {
        Some(prepare_the_sampler_statements(&mut x).await)
    } else {
        None
    };
    x.execute("BEGIN").await.unwrap();
    let x_pid = backend_pid(&mut x).await;
    if let Some(p) = prepared_pid {
        // X is PgBouncer's only client so far: it stayed on one backend.
        assert_eq!(p, x_pid, "X prepared on the backend it now holds");
    }
    holder.close().await.unwrap();

    let sampler = SamplerProc::start_with(
        &bouncer.url(db.name()),
        tag,
        &support::fast_with_grace("2s"),
    );
    let mut watch = CutWatch::new(db.url()).await;
    let first = watch.until(WAIT_SECS, "epoch 1", |r| r.epoch == 1).await;
    let deadline = Instant::now() + Duration::from_secs(WAIT_SECS);
    loop {
        let r = watch.read().await.unwrap();
        assert!(r.uncertain.is_some(), "certain before the move: {r:?}");
        if r.publish_seq > first.publish_seq {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no publish after the claim within {WAIT_SECS} s; log:\n{}",
            sampler.log_text()
        );
        tokio::time::sleep(POLL).await;
    }
    // The sampler has just published (so its observation and publish are
    // prepared on A) and sleeps for 100 ms.
    tokio::time::sleep(AFTER_PUBLISH).await;
    x.execute("COMMIT").await.unwrap();

    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    let won_pid: i32 = sqlx::query_scalar("SELECT leader_pid FROM tollgate_safetime")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_ne!(won_pid, x_pid, "the sampler did not get X's backend");
    let won = format!("safe-time leadership won epoch=1 backend_pid={won_pid} ");
    assert!(
        sampler.log_text().contains(&won),
        "{won:?} not in the log:\n{}",
        sampler.log_text()
    );
    Run {
        sampler,
        bouncer,
        x,
        watch,
        admin,
        db,
        _server: server,
        won_pid,
        x_pid,
    }
}

impl Run {
    /// Waits for the first end of leadership and returns its reason,
    /// reading the cut meanwhile: until then it is epoch 1 and uncertain.
    async fn first_loss(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(WAIT_SECS);
        loop {
            let r = self.watch.read().await.unwrap();
            assert_eq!(r.epoch, 1, "{r:?}");
            assert!(
                r.uncertain.is_some(),
                "certain under transaction pooling: {r:?}"
            );
            let log = self.sampler.log_text();
            if let Some(reason) = log
                .lines()
                .find_map(|l| l.split_once(LOSS_PREFIX).map(|(_, r)| r.to_owned()))
            {
                return reason;
            }
            assert!(
                Instant::now() < deadline,
                "leadership not lost within {WAIT_SECS} s; sampler log:\n{log}\nPgBouncer log:\n{}",
                self.bouncer.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every row read so far was uncertain.
    fn never_certain(&self) {
        let seen: Vec<&CutRow> = self.watch.seen.iter().map(|(_, r)| r).collect();
        assert!(!seen.is_empty());
        assert!(
            seen.iter().all(|r| r.uncertain.is_some()),
            "a certain cut under transaction pooling: {seen:?}"
        );
    }
}

#[tokio::test]
async fn transaction_pooling_without_statement_tracking_fails_the_cached_observation() {
    let mut r = run("transaction", false, "bouncer-tx-plain").await;
    let reason = r.first_loss().await;
    // The sampler's fifth statement on its connection is the observation;
    // B never prepared it. This is what PgBouncer 1.18 does to any sqlx
    // client whose statement reaches another backend.
    assert_eq!(
        reason,
        "observation failed: database error: prepared statement \"sqlx_s_5\" does not exist \
         (SQLSTATE 26000)",
        "sampler log:\n{}",
        r.sampler.log_text()
    );
    r.never_certain();
    assert_eq!(r.sampler.terminate(), Some(0));
}

#[tokio::test]
async fn transaction_pooling_moves_the_sampler_and_the_pid_check_ends_leadership() {
    let mut r = run("transaction", true, "bouncer-tx-check").await;
    let reason = r.first_loss().await;
    // The observation ran on B (X prepared it there), answered with B's
    // pid and no lock; the sampler dropped the connection at that sample.
    assert_eq!(
        reason,
        pid_check_reason(r.x_pid, r.won_pid),
        "sampler log:\n{}",
        r.sampler.log_text()
    );
    r.never_certain();
    assert_eq!(r.sampler.terminate(), Some(0));
}

#[tokio::test]
async fn session_pooling_keeps_the_sampler_on_its_backend_and_the_cut_becomes_certain() {
    let mut r = run("session", false, "bouncer-session").await;
    let certain = r
        .watch
        .until(WAIT_SECS, "a certain cut", |c| c.uncertain.is_none())
        .await;
    assert_eq!(certain.epoch, 1);
    assert!(!certain.quarantined);
    // Every row before it was epoch 1, uncertain only while recovering
    // from the new epoch.
    for (_, c) in &r.watch.seen {
        assert_eq!(c.epoch, 1);
        assert!(
            matches!(
                c.uncertain,
                None | Some(UncertainReason::NewEpoch | UncertainReason::Recovering)
            ),
            "{c:?}"
        );
    }
    // Still the backend it won on, and X's transaction never moved it.
    let leader: i32 = sqlx::query_scalar("SELECT leader_pid FROM tollgate_safetime")
        .fetch_one(&mut r.admin)
        .await
        .unwrap();
    assert_eq!(leader, r.won_pid);
    let sampler_backends: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2 \
          ORDER BY pid LIMIT 10",
    )
    .bind(r.db.name())
    .bind(safetime_pg::sampler::SAMPLER_APPLICATION_NAME)
    .fetch_all(&mut r.admin)
    .await
    .unwrap();
    assert_eq!(sampler_backends, [r.won_pid]);
    assert_eq!(
        backend_pid(&mut r.x).await,
        r.x_pid,
        "X kept its backend too"
    );
    let log = r.sampler.log_text();
    assert!(!log.contains("safe-time leadership lost"), "{log}");
    assert_eq!(r.sampler.terminate(), Some(0));
}
