//! Real bubblewrap instances on this host (the tests run as root): output
//! bytes, isolation (files, network, signals), memory and pids limits,
//! destroy and fences, evidence, restart, and the HTTP service and client.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lc_core::evidence::{Expected, InstanceState, Statement, verify, verify_signature};
use lc_core::owner::OwnerFence;
use lc_core::page::{ExitStatus, Page, PageKind};
use lc_core::shape::{SMALL, SMALL_NET};
use lc_core::{
    AttemptNo, Command, ExecId, Generation, ProviderId, SandboxLeaseId, Shape, WorkspaceId,
};
use lc_provider::account::SandboxAccount;
use lc_provider::cgroup::CgroupVersion;
use lc_provider::runtime::base_digest;
use lc_provider::{
    AllocateRequest, BwrapConfig, BwrapProvider, HttpProvider, Provider, ProviderError,
    provider_router,
};

/// The owner fence these tests present unless a test is about fences.
const F: OwnerFence = OwnerFence(1);

/// Bound on every wait of these tests.
const DEADLINE: Duration = Duration::from_secs(30);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The `lc-supervisor` binary (`target/<profile>/lc-supervisor`: a
/// workspace test run builds it for its own crate's tests), built fresh
/// with cargo once per process.
fn supervisor_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| built("lc-supervisor", &["-p", "lc-supervisor"]))
        .clone()
}

/// The example `provider_host` as a program (`cargo test --all-targets`
/// builds examples as test harnesses, under other names), built fresh
/// with cargo once per process.
fn provider_host_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        built(
            "examples/provider_host",
            &["-p", "lc-provider", "--example", "provider_host"],
        )
    })
    .clone()
}

/// `target/<profile>/<relative>`, built fresh by `cargo build <args>`.
fn built(relative: &str, args: &[&str]) -> PathBuf {
    tollgate_pg_harness::cargo_built(relative, args)
}

struct Env {
    dir: PathBuf,
    provider: BwrapProvider,
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failed test may leave instances: kill them and remove their groups.
        if let Ok(entries) = std::fs::read_dir(self.dir.join("instances")) {
            for name in entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
            {
                if let Some((l, g)) = name.split_once('-')
                    && let (Ok(l), Ok(g)) = (l.parse(), g.parse())
                {
                    let cg = self
                        .provider
                        .instance_cgroup(SandboxLeaseId(l), Generation(g));
                    let _ = cg.kill_and_remove();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        // The test's parent groups; empty once every instance was destroyed.
        let parent = &self.provider.config().cgroup_parent;
        for c in ["memory", "pids", "cpu", "cpuacct"] {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(parent));
        }
    }
}

/// The test provider's configuration: its own parent cgroup per state
/// directory, so concurrent tests never share a group.
fn config(dir: &Path) -> BwrapConfig {
    let mut cfg = BwrapConfig::new(ProviderId::new("p-test").unwrap(), dir, &supervisor_bin());
    cfg.cgroup_parent = format!(
        "little-compute-test-{}",
        dir.file_name().unwrap().to_str().unwrap()
    );
    cfg
}

fn env() -> Env {
    env_with(|_| {})
}

/// A fresh state directory and a provider on it, its configuration
/// changed by `change`.
fn env_with(change: impl FnOnce(&mut BwrapConfig)) -> Env {
    let dir = fresh_dir();
    let mut cfg = config(&dir);
    change(&mut cfg);
    let provider = BwrapProvider::open(cfg).unwrap();
    Env { dir, provider }
}

fn fresh_dir() -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = PathBuf::from(format!("/tmp/lcp-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `program args` run on the host as the sandbox account `a` (no
/// supplementary group): (exit code, stdout, stderr).
fn as_account(a: &SandboxAccount, program: &str, args: &[&str]) -> (i32, String, String) {
    use std::os::unix::process::CommandExt as _;
    let out = std::process::Command::new(program)
        .args(args)
        .uid(a.uid)
        .gid(a.gid)
        .current_dir("/")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The passwd entry of `name` as `getent` prints it, split at `:`.
fn passwd_entry(name: &str) -> Vec<String> {
    let out = std::process::Command::new("getent")
        .args(["passwd", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "getent passwd {name}: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .split(':')
        .map(str::to_owned)
        .collect()
}

fn req(lease: i64, generation: i64, shape: Shape, argv: &[&str]) -> AllocateRequest {
    AllocateRequest {
        lease_id: SandboxLeaseId(lease),
        generation: Generation(generation),
        exec_id: ExecId(lease),
        attempt: AttemptNo(1),
        runtime: base_digest(),
        shape,
        command: Command::new(argv.iter().map(|s| s.to_string()).collect()).unwrap(),
        workspace_id: WorkspaceId(lease),
        stdin_open: false,
        first_seq: 1,
        first_input_seq: 1,
        restore: None,
    }
}

fn sh(lease: i64, script: &str) -> AllocateRequest {
    req(lease, 1, SMALL, &["sh", "-c", script])
}

/// Reads pages to the terminal one (without acknowledging it).
async fn until_terminal(p: &dyn Provider, lease: i64, generation: i64) -> Vec<Page> {
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let after = all.last().map_or(0, |p| p.seq());
        let got = p
            .pages(SandboxLeaseId(lease), Generation(generation), F, after, 64)
            .await
            .unwrap();
        for (i, pg) in got.iter().enumerate() {
            assert_eq!(pg.seq(), (all.len() + i) as i64 + 1, "seq gap");
        }
        all.extend(got);
        if all.last().is_some_and(|p| p.is_terminal()) {
            return all;
        }
        assert!(
            t.elapsed() < DEADLINE,
            "no terminal page; pages so far {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn stream(pages: &[Page], kind: PageKind) -> String {
    String::from_utf8(
        pages
            .iter()
            .filter(|p| p.kind() == kind)
            .flat_map(|p| p.bytes().to_vec())
            .collect(),
    )
    .unwrap()
}

/// Runs `script` to its terminal page; returns (stdout, stderr, exit).
async fn run(e: &Env, lease: i64, r: AllocateRequest) -> (String, String, ExitStatus) {
    let a = e.provider.allocate(r).await.unwrap();
    assert!(a.created);
    let all = until_terminal(&e.provider, lease, 1).await;
    let exit = all.last().unwrap().exit().unwrap();
    (
        stream(&all, PageKind::Stdout),
        stream(&all, PageKind::Stderr),
        exit,
    )
}

fn expected(lease: i64, generation: i64) -> Expected<'static> {
    Expected {
        provider_id: "p-test",
        lease_id: lease,
        generation,
    }
}

fn pid_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie (state Z) runs nothing; it only waits to be reaped.
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}

#[tokio::test]
async fn output_is_exact_and_destroy_fences_with_evidence() {
    let e = env();
    let (out, err, exit) = run(
        &e,
        1,
        sh(
            1,
            "printf 'hello\\n'; printf 'oops' >&2; id -u; pwd; exit 7",
        ),
    )
    .await;
    assert_eq!(out, "hello\n1000\n/workspace\n");
    assert_eq!(err, "oops");
    assert_eq!(exit, ExitStatus::exited(7));
    // A replay of the same request is the same instance.
    let again = e
        .provider
        .allocate(sh(
            1,
            "printf 'hello\\n'; printf 'oops' >&2; id -u; pwd; exit 7",
        ))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(
        e.provider.allocate(sh(1, "true")).await.unwrap_err().code(),
        "allocation_conflict"
    );
    let key = e.provider.public_key();
    let obs = e
        .provider
        .observe(SandboxLeaseId(1), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&obs, &key, expected(1, 1)).unwrap(),
        Statement::Observation {
            state: InstanceState::Running,
            ..
        }
    ));
    let fence = e
        .provider
        .destroy(SandboxLeaseId(1), Generation(1))
        .await
        .unwrap();
    assert_eq!(
        verify(&fence, &key, expected(1, 1)).unwrap(),
        Statement::Fence {
            provider_id: "p-test".into(),
            lease_id: 1,
            generation: 1
        }
    );
    let absence = e
        .provider
        .destroy(SandboxLeaseId(1), Generation(1))
        .await
        .unwrap();
    assert_eq!(
        verify(&absence, &key, expected(1, 1)).unwrap(),
        Statement::Absence {
            provider_id: "p-test".into(),
            lease_id: 1,
            generation: 1
        }
    );
    let obs = e
        .provider
        .observe(SandboxLeaseId(1), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&obs, &key, expected(1, 1)).unwrap(),
        Statement::Observation {
            state: InstanceState::Absent,
            ..
        }
    ));
    assert_eq!(
        e.provider.allocate(sh(1, "true")).await.unwrap_err(),
        ProviderError::Fenced {
            lease_id: 1,
            generation: 1,
            fenced_through: 1
        }
    );
    assert_eq!(
        e.provider
            .pages(SandboxLeaseId(1), Generation(1), F, 0, 8)
            .await
            .unwrap_err()
            .code(),
        "no_instance"
    );
    // A destroy of an instance never allocated is an absence, and fences it.
    let never = e
        .provider
        .destroy(SandboxLeaseId(99), Generation(3))
        .await
        .unwrap();
    assert!(matches!(
        verify(&never, &key, expected(99, 3)).unwrap(),
        Statement::Absence { .. }
    ));
    assert_eq!(
        e.provider
            .allocate(req(99, 2, SMALL, &["true"]))
            .await
            .unwrap_err()
            .code(),
        "fenced"
    );
    // Another key does not verify the evidence.
    let other = ed25519_dalek::SigningKey::from_bytes(&[9; 32]).verifying_key();
    assert_eq!(
        verify_signature(&fence, &other).unwrap_err().code(),
        "wrong_key"
    );
}

#[tokio::test]
async fn acknowledged_terminal_ends_the_instance() {
    let e = env();
    e.provider.allocate(sh(2, "printf done")).await.unwrap();
    let all = until_terminal(&e.provider, 2, 1).await;
    let last = all.last().unwrap().seq();
    e.provider
        .ack(SandboxLeaseId(2), Generation(2 - 1), F, last)
        .await
        .unwrap();
    let cg = e.provider.instance_cgroup(SandboxLeaseId(2), Generation(1));
    let t = Instant::now();
    while !cg.pids().is_empty() {
        assert!(
            t.elapsed() < DEADLINE,
            "instance processes outlived the terminal ack"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let obs = e
        .provider
        .observe(SandboxLeaseId(2), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&obs, &e.provider.public_key(), expected(2, 1)).unwrap(),
        Statement::Observation {
            state: InstanceState::Exited,
            ..
        }
    ));
    assert_eq!(
        e.provider
            .pages(SandboxLeaseId(2), Generation(1), F, 0, 8)
            .await
            .unwrap(),
        vec![]
    );
    e.provider
        .ack(SandboxLeaseId(2), Generation(1), F, last)
        .await
        .unwrap();
    e.provider
        .destroy(SandboxLeaseId(2), Generation(1))
        .await
        .unwrap();
    assert!(!cg.exists());
}

#[tokio::test]
async fn host_files_outside_the_binds_are_not_readable() {
    let e = env();
    let secret = PathBuf::from(format!("/tmp/lc-secret-{}", std::process::id()));
    std::fs::write(&secret, "host secret\n").unwrap();
    let script = format!(
        "cat {} ; echo rc=$?; ls /etc 2>&1; echo rc=$?; ls /; touch /usr/x 2>/dev/null; echo usr=$?; touch /workspace/w && echo ws=ok",
        secret.display()
    );
    let (out, err, exit) = run(&e, 3, sh(3, &script)).await;
    std::fs::remove_file(&secret).unwrap();
    assert_eq!(
        out,
        "rc=1\nls: cannot access '/etc': No such file or directory\nrc=2\nbin\ndev\nlib\nlib64\nproc\nsbin\ntmp\nusr\nworkspace\nusr=1\nws=ok\n"
    );
    assert_eq!(
        err,
        format!("cat: {}: No such file or directory\n", secret.display())
    );
    assert_eq!(exit, ExitStatus::exited(0));
    // The workspace write landed in the host's workspace directory.
    assert!(e.provider.workspace_dir(WorkspaceId(3)).join("w").is_file());
    e.provider
        .destroy(SandboxLeaseId(3), Generation(1))
        .await
        .unwrap();
}

const CONNECT: &str = "import socket,sys\n\
print(sorted(n for _, n in socket.if_nameindex()))\n\
s = socket.socket()\n\
s.settimeout(5)\n\
try:\n    s.connect(('127.0.0.1', int(sys.argv[1])))\n    print('connected')\n\
except OSError as e:\n    print('refused', e.errno)\n";

#[tokio::test]
async fn no_network_unless_the_shape_has_it() {
    let e = env();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let (out, _, exit) = run(&e, 4, req(4, 1, SMALL, &["python3", "-c", CONNECT, &port])).await;
    // Only the instance's own loopback, where nothing listens.
    assert_eq!(out, "['lo']\nrefused 111\n");
    assert_eq!(exit, ExitStatus::exited(0));
    e.provider
        .destroy(SandboxLeaseId(4), Generation(1))
        .await
        .unwrap();
}

/// What a network shape's command probes: its interfaces (twice: by name
/// index and in `/proc/net/dev`), its own loopback at the port the host's
/// loopback listens on, the host's loopback through the gateway, and a
/// host address that is not loopback.
const NET_PROBE: &str = "import socket, sys\n\
print(sorted(n for _, n in socket.if_nameindex()))\n\
print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n\
def probe(host, port):\n    s = socket.socket()\n    s.settimeout(10)\n    try:\n        s.connect((host, port))\n        print(host, 'connected')\n    except OSError as e:\n        print(host, e.strerror)\n    s.close()\n\
probe('127.0.0.1', int(sys.argv[1]))\n\
probe('10.0.2.2', int(sys.argv[1]))\n\
probe(sys.argv[2], int(sys.argv[3]))\n";

/// The host's first address that is not loopback (`hostname -I`).
fn host_address() -> std::net::IpAddr {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.split_whitespace()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .unwrap_or_else(|| panic!("this host has no IPv4 address but loopback: {text:?}"))
}

/// The pids of `cg` whose command line starts with `prefix`.
fn pids_running(cg: &lc_provider::cgroup::InstanceCgroup, prefix: &[u8]) -> Vec<i32> {
    cg.pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .starts_with(prefix)
        })
        .collect()
}

#[tokio::test]
async fn a_network_shape_has_its_own_namespace_with_outbound_nat_only() {
    let e = env();
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = loopback.local_addr().unwrap().port().to_string();
    let host = host_address();
    let outside = std::net::TcpListener::bind((host, 0)).unwrap();
    let outside_port = outside.local_addr().unwrap().port().to_string();
    let host_text = host.to_string();
    e.provider
        .allocate(req(
            5,
            1,
            SMALL_NET,
            &["python3", "-c", NET_PROBE, &port, &host_text, &outside_port],
        ))
        .await
        .unwrap();
    let cg = e.provider.instance_cgroup(SandboxLeaseId(5), Generation(1));
    // slirp4netns, in the instance's groups, as the sandbox account.
    let slirp = pids_running(&cg, b"/usr/bin/slirp4netns\0");
    assert_eq!(slirp.len(), 1, "{:?}", cg.pids());
    let a = e.provider.sandbox_account().clone();
    assert_eq!(
        credentials(slirp[0])[..2],
        [
            format!("Uid: {0} {0} {0} {0}", a.uid),
            format!("Gid: {0} {0} {0} {0}", a.gid)
        ]
    );
    let all = until_terminal(&e.provider, 5, 1).await;
    // Its own interfaces; the host's loopback is neither its own nor
    // reachable through the gateway; outbound connections leave through
    // the host (here to the host's own address, the only one outside).
    assert_eq!(
        stream(&all, PageKind::Stdout),
        format!(
            "['lo', 'tap0']\n['lo', 'tap0']\n127.0.0.1 Connection refused\n\
             10.0.2.2 Network is unreachable\n{host} connected\n"
        )
    );
    assert_eq!(stream(&all, PageKind::Stderr), "");
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    loopback.set_nonblocking(true).unwrap();
    assert_eq!(
        loopback.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the host's loopback was reached"
    );
    // The connection came from the host itself: slirp4netns's own socket.
    let (_, peer) = outside.accept().unwrap();
    assert_eq!(peer.ip(), host);
    // The terminal ack ends the instance, slirp4netns with it.
    e.provider
        .ack(
            SandboxLeaseId(5),
            Generation(1),
            F,
            all.last().unwrap().seq(),
        )
        .await
        .unwrap();
    let t = Instant::now();
    while !cg.pids().is_empty() || pid_running(slirp[0]) {
        assert!(t.elapsed() < DEADLINE, "left running: {:?}", cg.pids());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    e.provider
        .destroy(SandboxLeaseId(5), Generation(1))
        .await
        .unwrap();
    // A destroy kills it along with the instance.
    e.provider
        .allocate(req(6, 1, SMALL_NET, &["sleep", "300"]))
        .await
        .unwrap();
    let cg = e.provider.instance_cgroup(SandboxLeaseId(6), Generation(1));
    let slirp = pids_running(&cg, b"/usr/bin/slirp4netns\0");
    assert_eq!(slirp.len(), 1, "{:?}", cg.pids());
    e.provider
        .destroy(SandboxLeaseId(6), Generation(1))
        .await
        .unwrap();
    let t = Instant::now();
    while pid_running(slirp[0]) {
        assert!(t.elapsed() < DEADLINE, "slirp4netns outlived destroy");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!cg.exists());
    // Without slirp4netns a network shape does not start, and leaves nothing.
    let mut cfg = config(&e.dir);
    cfg.slirp_bin = PathBuf::from("/nonexistent/slirp4netns");
    let without = BwrapProvider::open(cfg).unwrap();
    assert_eq!(
        without
            .allocate(req(7, 1, SMALL_NET, &["true"]))
            .await
            .unwrap_err(),
        ProviderError::StartFailed {
            detail: "/nonexistent/slirp4netns: No such file or directory (os error 2)".into()
        }
    );
    assert!(!e.dir.join("instances/7-1").exists());
    assert!(
        !without
            .instance_cgroup(SandboxLeaseId(7), Generation(1))
            .exists()
    );
}

#[tokio::test]
async fn memory_limit_is_exact_and_enforced() {
    let e = env();
    let root = lc_provider::cgroup::CgroupRoot::detect(Path::new("/sys/fs/cgroup"), "x").unwrap();
    assert_eq!(root.version(), CgroupVersion::V1);
    e.provider
        .allocate(req(
            6,
            1,
            SMALL,
            &["python3", "-c", "b = b'x' * (400 << 20); print('survived')"],
        ))
        .await
        .unwrap();
    let cg = e.provider.instance_cgroup(SandboxLeaseId(6), Generation(1));
    assert_eq!(
        std::fs::read_to_string(cg.memory_limit_file()).unwrap(),
        "268435456\n"
    );
    assert_eq!(
        std::fs::read_to_string(cg.dirs()[0].join("memory.memsw.limit_in_bytes")).unwrap(),
        "268435456\n"
    );
    let all = until_terminal(&e.provider, 6, 1).await;
    assert_eq!(stream(&all, PageKind::Stdout), "");
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::signaled(9)));
    e.provider
        .destroy(SandboxLeaseId(6), Generation(1))
        .await
        .unwrap();
}

/// Fills the instance's two writable tmpfs mounts and tries a third
/// place, then prints its own `oom_score_adj`.
const FILL: &str = "head -c 400M /dev/zero > /tmp/fill; echo tmp=$?; stat -c %s /tmp/fill; \
head -c 400M /dev/zero > /dev/shm/fill; echo shm=$?; stat -c %s /dev/shm/fill; \
touch /dev/fill; echo dev=$?; cat /proc/self/oom_score_adj";

#[tokio::test]
async fn a_full_tmp_is_the_commands_enospc_and_the_oom_killer_picks_the_command() {
    let e = env();
    // `/tmp` and `/dev/shm` each hold a quarter of small's 256 MiB, so a
    // 400 MiB file is cut at 64 MiB with ENOSPC (their pages count against
    // the instance's memory limit: unbounded, they made the OOM killer
    // take the supervisor), and `/dev` itself is read-only.
    let (out, err, exit) = run(&e, 50, sh(50, &format!("{FILL}; exit 4"))).await;
    assert_eq!(out, "tmp=1\n67108864\nshm=1\n67108864\ndev=1\n1000\n");
    assert_eq!(
        err,
        "head: error writing 'standard output': No space left on device\n\
         head: error writing 'standard output': No space left on device\n\
         touch: cannot touch '/dev/fill': Read-only file system\n"
    );
    assert_eq!(exit, ExitStatus::exited(4));
    // The supervisor, still waiting for its terminal ack, keeps the
    // default score: the command (1000) is always the OOM killer's choice.
    let cg = e
        .provider
        .instance_cgroup(SandboxLeaseId(50), Generation(1));
    let supervisors: Vec<String> = cg
        .pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .starts_with(b"/.lc/supervisor\0")
        })
        .map(|pid| std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap())
        .collect();
    assert_eq!(supervisors, vec!["0\n".to_owned()]);
    e.provider
        .destroy(SandboxLeaseId(50), Generation(1))
        .await
        .unwrap();
    // With both mounts full, a command allocating past what is left of the
    // limit is killed, and the supervisor lives to page its output and its
    // terminal status.
    let hog = format!(
        "{{ {FILL}; }} >/dev/null 2>&1; echo filled; exec python3 -c \"b = b'x' * (400 << 20); print('survived')\""
    );
    let (out, err, exit) = run(&e, 51, sh(51, &hog)).await;
    assert_eq!(out, "filled\n");
    assert_eq!(err, "");
    assert_eq!(exit, ExitStatus::signaled(9));
    e.provider
        .destroy(SandboxLeaseId(51), Generation(1))
        .await
        .unwrap();
}

const FORK_BOMB: &str = "import os, time\n\
n = 0\n\
err = None\n\
while n < 200:\n    try:\n        pid = os.fork()\n    except OSError as e:\n        err = e.errno\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    n += 1\n\
print(n < 64, err, flush=True)\n\
time.sleep(60)\n";

#[tokio::test]
async fn pids_limit_bounds_a_fork_bomb() {
    let e = env();
    e.provider
        .allocate(req(7, 1, SMALL, &["python3", "-c", FORK_BOMB]))
        .await
        .unwrap();
    let cg = e.provider.instance_cgroup(SandboxLeaseId(7), Generation(1));
    assert_eq!(std::fs::read_to_string(cg.pids_max_file()).unwrap(), "64\n");
    let t = Instant::now();
    let out = loop {
        let got = e
            .provider
            .pages(SandboxLeaseId(7), Generation(1), F, 0, 64)
            .await
            .unwrap();
        let out = stream(&got, PageKind::Stdout);
        if !out.is_empty() {
            break out;
        }
        assert!(t.elapsed() < DEADLINE);
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(out, "True 11\n");
    let current: u32 = std::fs::read_to_string(cg.dirs()[1].join("pids.current"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(current <= 64, "{current}");
    // The command waits, so its sleeping children (which would die with it)
    // keep running until destroy kills all of them.
    let pids = cg.pids();
    assert!(pids.len() > 10, "{pids:?}");
    e.provider
        .destroy(SandboxLeaseId(7), Generation(1))
        .await
        .unwrap();
    assert!(!cg.exists());
    for pid in pids {
        let t = Instant::now();
        while pid_running(pid) {
            assert!(t.elapsed() < DEADLINE, "pid {pid} survived destroy");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn host_processes_cannot_be_signalled() {
    let e = env();
    let mut host = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    // A host process of the sandbox account itself: the same host uid as
    // the instance, so only the PID namespace keeps it out of reach.
    let mut same_uid = {
        use std::os::unix::process::CommandExt as _;
        let a = e.provider.sandbox_account();
        std::process::Command::new("sleep")
            .arg("30")
            .uid(a.uid)
            .gid(a.gid)
            .spawn()
            .unwrap()
    };
    // The host's pids are not even named in the instance's PID namespace.
    let script = format!(
        "for pid in {} {}; do kill -9 $pid; echo rc=$?; test -e /proc/$pid; echo visible=$?; done",
        host.id(),
        same_uid.id()
    );
    let (out, err, _) = run(&e, 8, sh(8, &script)).await;
    assert_eq!(out, "rc=1\nvisible=1\nrc=1\nvisible=1\n");
    assert_eq!(err.matches("No such process").count(), 2, "{err}");
    for p in [&mut host, &mut same_uid] {
        assert!(p.try_wait().unwrap().is_none(), "a host process was killed");
        p.kill().unwrap();
        p.wait().unwrap();
    }
    e.provider
        .destroy(SandboxLeaseId(8), Generation(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn destroy_leaves_no_process_and_survives_a_restart() {
    let e = env();
    e.provider
        .allocate(sh(9, "sleep 300 & sleep 300"))
        .await
        .unwrap();
    let cg = e.provider.instance_cgroup(SandboxLeaseId(9), Generation(1));
    let t = Instant::now();
    // bwrap, its init, the supervisor, sh, two sleeps.
    while cg.pids().len() < 5 {
        assert!(t.elapsed() < DEADLINE, "{:?}", cg.pids());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pids = cg.pids();
    let ev = e
        .provider
        .destroy(SandboxLeaseId(9), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&ev, &e.provider.public_key(), expected(9, 1)).unwrap(),
        Statement::Fence { .. }
    ));
    assert!(!cg.exists());
    for d in cg.dirs() {
        assert!(!d.exists(), "{}", d.display());
    }
    for pid in &pids {
        let t = Instant::now();
        while pid_running(*pid) {
            assert!(t.elapsed() < DEADLINE, "pid {pid} survived destroy");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // A restarted provider on the same state keeps its key and its fences.
    let key = e.provider.public_key();
    let again = BwrapProvider::open(config(&e.dir)).unwrap();
    assert_eq!(again.public_key(), key);
    assert_eq!(
        again.allocate(sh(9, "true")).await.unwrap_err().code(),
        "fenced"
    );
    // A later generation of the lease is not fenced.
    let next = again.allocate(req(9, 2, SMALL, &["true"])).await.unwrap();
    assert!(next.created);
    let all = until_terminal(&again, 9, 2).await;
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    let ev = again
        .destroy(SandboxLeaseId(9), Generation(2))
        .await
        .unwrap();
    assert!(verify(&ev, &key, expected(9, 2)).unwrap().proves_gone(2));
}

#[tokio::test]
async fn a_start_failure_leaves_nothing() {
    let e = env();
    let mut r = sh(10, "true");
    r.runtime = lc_core::Digest([7; 32]);
    assert_eq!(
        e.provider.allocate(r).await.unwrap_err().code(),
        "unknown_runtime"
    );
    // A command that does not exist is a running instance whose terminal
    // page says 127.
    let (out, err, exit) = run(&e, 11, req(11, 1, SMALL, &["/nonexistent"])).await;
    assert_eq!(out, "");
    assert!(
        err.starts_with("lc-supervisor: cannot start \"/nonexistent\""),
        "{err}"
    );
    assert_eq!(exit, ExitStatus::exited(127));
    e.provider
        .destroy(SandboxLeaseId(11), Generation(1))
        .await
        .unwrap();
    assert!(!e.dir.join("instances/10-1").exists());
}

#[tokio::test]
async fn not_sent_is_proven_only_for_a_command_never_handed_to_a_supervisor() {
    let e = env();
    let key = e.provider.public_key();
    let (l, g) = (SandboxLeaseId(30), Generation(1));
    // An allocate that fails before bubblewrap: nothing was handed over.
    let mut r = sh(30, "echo ran > /workspace/ran");
    r.runtime = lc_core::Digest([7; 32]);
    assert_eq!(
        e.provider.allocate(r.clone()).await.unwrap_err().code(),
        "unknown_runtime"
    );
    assert!(!e.dir.join("sent/30-1").exists());
    let proof = e.provider.prove_not_sent(l, g).await.unwrap();
    assert_eq!(
        verify(&proof, &key, expected(30, 1)).unwrap(),
        Statement::NotSent {
            provider_id: "p-test".into(),
            lease_id: 30,
            generation: 1,
        }
    );
    // Only that generation: a proof never names another.
    assert_eq!(
        verify(&proof, &key, expected(30, 2)).unwrap_err().code(),
        "evidence_mismatch"
    );
    // The generation is fenced, durably: no later allocate of it starts
    // anything, also after a restart; a second proof is the same one.
    assert_eq!(
        std::fs::read_to_string(e.dir.join("fences/30")).unwrap(),
        "1\n"
    );
    let mut known = sh(30, "echo ran > /workspace/ran");
    known.runtime = base_digest();
    assert_eq!(
        e.provider.allocate(known.clone()).await.unwrap_err(),
        ProviderError::Fenced {
            lease_id: 30,
            generation: 1,
            fenced_through: 1
        }
    );
    let restarted = BwrapProvider::open(config(&e.dir)).unwrap();
    assert_eq!(
        restarted.allocate(known).await.unwrap_err().code(),
        "fenced"
    );
    assert_eq!(restarted.prove_not_sent(l, g).await.unwrap(), proof);
    assert!(!e.dir.join("sent/30-1").exists());
    assert!(!e.dir.join("workspaces/30/ran").exists());

    // After a successful allocate the command was handed over: refused,
    // and the refusal still fences the generation.
    let (l, g) = (SandboxLeaseId(31), Generation(1));
    assert!(
        e.provider
            .allocate(sh(31, "printf hi"))
            .await
            .unwrap()
            .created
    );
    assert!(e.dir.join("sent/31-1").is_file());
    assert_eq!(
        e.provider.prove_not_sent(l, g).await.unwrap_err(),
        ProviderError::CommandSent {
            lease_id: 31,
            generation: 1
        }
    );
    assert_eq!(
        e.provider
            .allocate(sh(31, "printf hi"))
            .await
            .unwrap_err()
            .code(),
        "fenced"
    );
    // The output is still there to read; a destroy does not forget the
    // hand-off, so no proof is signed after it either.
    let all = until_terminal(&e.provider, 31, 1).await;
    assert_eq!(stream(&all, PageKind::Stdout), "hi");
    e.provider.destroy(l, g).await.unwrap();
    assert!(!e.dir.join("instances/31-1").exists());
    assert_eq!(
        e.provider.prove_not_sent(l, g).await.unwrap_err().code(),
        "command_sent"
    );

    // A start that fails after bubblewrap was spawned but before its
    // supervisor answered never released the command: proven not sent.
    let mut cfg = config(&e.dir);
    let fake = e.dir.join("fake-bwrap");
    write_script(&fake, "#!/bin/sh\nexit 1\n");
    cfg.bwrap_bin = fake;
    let failing = BwrapProvider::open(cfg).unwrap();
    assert_eq!(
        failing.allocate(sh(32, "true")).await.unwrap_err().code(),
        "start_failed"
    );
    assert!(!e.dir.join("instances/32-1").exists());
    assert!(!e.dir.join("sent/32-1").exists());
    let proof = failing
        .prove_not_sent(SandboxLeaseId(32), Generation(1))
        .await
        .unwrap();
    assert_eq!(
        verify(&proof, &key, expected(32, 1)).unwrap(),
        Statement::NotSent {
            provider_id: "p-test".into(),
            lease_id: 32,
            generation: 1,
        }
    );
    // An instance started before hand-offs were recorded (its marker
    // removed here) gets its marker when the provider opens.
    assert!(e.provider.allocate(sh(33, "true")).await.unwrap().created);
    std::fs::remove_file(e.dir.join("sent/33-1")).unwrap();
    let reopened = BwrapProvider::open(config(&e.dir)).unwrap();
    assert!(e.dir.join("sent/33-1").is_file());
    assert_eq!(
        reopened
            .prove_not_sent(SandboxLeaseId(33), Generation(1))
            .await
            .unwrap_err()
            .code(),
        "command_sent"
    );
    reopened
        .destroy(SandboxLeaseId(33), Generation(1))
        .await
        .unwrap();
    assert_eq!(
        e.provider
            .prove_not_sent(SandboxLeaseId(0), Generation(1))
            .await
            .unwrap_err()
            .code(),
        "invalid_request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocate_racing_a_not_sent_proof_either_starts_or_is_proven_never_both() {
    let e = env();
    let provider = Arc::new(BwrapProvider::open(config(&e.dir)).unwrap());
    let key = provider.public_key();
    for lease in 40..44 {
        let (p1, p2) = (provider.clone(), provider.clone());
        let alloc = tokio::spawn(async move { p1.allocate(sh(lease, "true")).await });
        let proof = tokio::spawn(async move {
            p2.prove_not_sent(SandboxLeaseId(lease), Generation(1))
                .await
        });
        let (alloc, proof) = (alloc.await.unwrap(), proof.await.unwrap());
        match (alloc, proof) {
            (Ok(a), Err(refused)) => {
                assert!(a.created);
                assert_eq!(
                    refused,
                    ProviderError::CommandSent {
                        lease_id: lease,
                        generation: 1
                    }
                );
            }
            (Err(fenced), Ok(env)) => {
                assert_eq!(
                    fenced,
                    ProviderError::Fenced {
                        lease_id: lease,
                        generation: 1,
                        fenced_through: 1
                    }
                );
                assert_eq!(
                    verify(&env, &key, expected(lease, 1)).unwrap().kind(),
                    "not_sent"
                );
                assert!(!e.dir.join(format!("sent/{lease}-1")).exists());
            }
            other => panic!("lease {lease}: {other:?}"),
        }
        provider
            .destroy(SandboxLeaseId(lease), Generation(1))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_client_is_the_same_provider() {
    let e = env();
    let key = e.provider.public_key();
    let dir = e.dir.clone();
    let provider: Arc<dyn Provider> = Arc::new(BwrapProvider::open(config(&dir)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, provider_router(provider))
            .await
            .unwrap();
    });
    let client = HttpProvider::connect(&url).await.unwrap();
    assert_eq!(client.id().as_str(), "p-test");
    assert_eq!(client.public_key(), key);
    let a = client.allocate(sh(12, "printf 'over http'")).await.unwrap();
    assert!(a.created);
    let inv = client.inventory().await.unwrap();
    assert_eq!(inv.len(), 1);
    assert_eq!(
        (inv[0].lease_id, inv[0].generation, inv[0].exec_id),
        (SandboxLeaseId(12), Generation(1), ExecId(12))
    );
    let all = until_terminal(&client, 12, 1).await;
    assert_eq!(stream(&all, PageKind::Stdout), "over http");
    client
        .ack(SandboxLeaseId(12), Generation(1), F, 1)
        .await
        .unwrap();
    let rest = client
        .pages(SandboxLeaseId(12), Generation(1), F, 0, 64)
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert!(rest[0].is_terminal());
    assert_eq!(
        client
            .ack(SandboxLeaseId(12), Generation(1), F, 50)
            .await
            .unwrap_err()
            .code(),
        "invalid_request"
    );
    let obs = client
        .observe(SandboxLeaseId(12), Generation(1))
        .await
        .unwrap();
    assert!(verify(&obs, &key, expected(12, 1)).is_ok());
    // The command was handed over: no proof, a typed refusal over HTTP.
    assert_eq!(
        client
            .prove_not_sent(SandboxLeaseId(12), Generation(1))
            .await
            .unwrap_err(),
        ProviderError::CommandSent {
            lease_id: 12,
            generation: 1
        }
    );
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/instances/12/1/not_sent"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 409);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(body["code"], "command_sent");
    // A lease never allocated here: the proof, signed and verifying.
    let proof = client
        .prove_not_sent(SandboxLeaseId(13), Generation(2))
        .await
        .unwrap();
    assert_eq!(
        verify(&proof, &key, expected(13, 2)).unwrap(),
        Statement::NotSent {
            provider_id: "p-test".into(),
            lease_id: 13,
            generation: 2,
        }
    );
    let ev = client
        .destroy(SandboxLeaseId(12), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&ev, &key, expected(12, 1)).unwrap(),
        Statement::Fence { .. }
    ));
    assert_eq!(client.inventory().await.unwrap(), vec![]);
    assert_eq!(
        client
            .allocate(sh(12, "printf 'over http'"))
            .await
            .unwrap_err(),
        ProviderError::Fenced {
            lease_id: 12,
            generation: 1,
            fenced_through: 1
        }
    );
    // Bad path ids are coded refusals, not plain-text errors.
    let raw = reqwest::get(format!("{url}/v1/instances/01/1/observation"))
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(body["code"], "invalid_request");
    server.abort();
}

/// Copies host file `from` (following symlinks) to `tree/to`.
fn copy_in(tree: &Path, from: &str, to: &str) {
    let dest = tree.join(to);
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(std::fs::canonicalize(from).unwrap(), &dest).unwrap();
}

#[tokio::test]
async fn an_imported_tree_is_the_instance_root() {
    let e = env();
    // A minimal root: dash and the C library the supervisor and dash need.
    let src = e.dir.join("src-tree");
    copy_in(&src, "/bin/dash", "bin/sh");
    copy_in(
        &src,
        "/lib64/ld-linux-x86-64.so.2",
        "lib64/ld-linux-x86-64.so.2",
    );
    copy_in(
        &src,
        "/lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libc.so.6",
    );
    copy_in(
        &src,
        "/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
    );
    // A reserved top-level name in the tree is not mounted over the provider's.
    std::fs::create_dir_all(src.join("workspace")).unwrap();
    std::fs::write(src.join("workspace/decoy"), "x").unwrap();
    let imported = e
        .provider
        .runtimes()
        .import_dir(&src, lc_provider::runtime::ImportLimits::default())
        .unwrap();
    let mut r = sh(
        13,
        "echo /*; echo /workspace/*; echo x > /bin/y; echo rc=$?",
    );
    r.runtime = imported.digest;
    let (out, err, exit) = run(&e, 13, r).await;
    assert_eq!(
        out,
        "/bin /dev /lib /lib64 /proc /tmp /workspace\n/workspace/*\nrc=2\n"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    assert_eq!(exit, ExitStatus::exited(0));
    e.provider
        .destroy(SandboxLeaseId(13), Generation(1))
        .await
        .unwrap();
}

/// The parent's pid in `/proc/PID/stat`, `None` once `pid` is gone.
fn proc_parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The supervisor's state letter in `/proc/PID/stat` (`T` when stopped),
/// `None` once it is gone.
fn proc_state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_owned)
}

#[tokio::test]
async fn a_command_that_stops_its_supervisor_at_once_cannot_stall_its_start() {
    let e = env();
    // The supervisor is the command's parent (PID 2 of the instance): the
    // command stops it the moment it runs. Its start is already complete
    // then: the handshake was answered before the command was released.
    let (l, g) = (SandboxLeaseId(41), Generation(1));
    let mut created = Vec::new();
    for _ in 0..3 {
        let a = e
            .provider
            .allocate(sh(41, "kill -STOP $PPID; echo never"))
            .await
            .unwrap();
        assert_eq!((a.lease_id, a.generation, a.attachment), (l, g, None));
        created.push(a.created);
    }
    // Repeated allocates answer with the one instance.
    assert_eq!(created, vec![true, false, false]);
    assert!(e.dir.join("sent/41-1").is_file());
    let cg = e.provider.instance_cgroup(l, g);
    // The supervisor's child is named like it until it executes the
    // command: only a supervisor whose parent is none is an instance's.
    let named = pids_running(&cg, b"/.lc/supervisor\0");
    let supervisors: Vec<i32> = named
        .iter()
        .copied()
        .filter(|&pid| proc_parent(pid).is_some_and(|parent| !named.contains(&parent)))
        .collect();
    assert_eq!(
        supervisors.len(),
        1,
        "one instance, started once: {named:?}"
    );
    let t = Instant::now();
    while proc_state(supervisors[0]).as_deref() != Some("T") {
        assert!(
            t.elapsed() < DEADLINE,
            "the command never stopped its supervisor"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A stopped instance is still destroyed whole, and stays proven sent.
    e.provider.destroy(l, g).await.unwrap();
    assert_eq!(cg.pids(), Vec::<i32>::new());
    assert!(!e.dir.join("instances/41-1").exists());
    assert_eq!(
        e.provider.prove_not_sent(l, g).await.unwrap_err(),
        ProviderError::CommandSent {
            lease_id: 41,
            generation: 1
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_allocate_leaves_one_instance_whose_command_runs_once() {
    let e = env();
    // Each allocate is given up after a different time (a caller's
    // timeout), so some stop before the hand-off and some after; the
    // repeated allocate answers with the instance or starts it afresh.
    for (lease, after_ms) in [(43, 0), (44, 2), (45, 10), (46, 30), (47, 100)] {
        let r = sh(lease, "echo x >> /workspace/runs; echo out");
        let _ = tokio::time::timeout(
            Duration::from_millis(after_ms),
            e.provider.allocate(r.clone()),
        )
        .await;
        let a = e.provider.allocate(r).await.unwrap();
        assert_eq!(
            (a.lease_id, a.generation),
            (SandboxLeaseId(lease), Generation(1))
        );
        let all = until_terminal(&e.provider, lease, 1).await;
        assert_eq!(stream(&all, PageKind::Stdout), "out\n", "lease {lease}");
        assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
        assert_eq!(
            std::fs::read_to_string(e.dir.join(format!("workspaces/{lease}/runs"))).unwrap(),
            "x\n",
            "lease {lease}: the command ran once"
        );
        let cg = e
            .provider
            .instance_cgroup(SandboxLeaseId(lease), Generation(1));
        assert_eq!(
            pids_running(&cg, b"/.lc/supervisor\0").len(),
            1,
            "lease {lease}"
        );
        e.provider
            .destroy(SandboxLeaseId(lease), Generation(1))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_runtime_without_a_c_library_fails_its_start_and_is_proven_not_sent() {
    let e = env();
    let key = e.provider.public_key();
    // dash alone: neither the supervisor nor dash can run without the C
    // library and its loader, so no command is ever released.
    let src = e.dir.join("src-no-libc");
    copy_in(&src, "/bin/dash", "bin/sh");
    let imported = e
        .provider
        .runtimes()
        .import_dir(&src, lc_provider::runtime::ImportLimits::default())
        .unwrap();
    let mut r = sh(42, "echo ran > /workspace/ran");
    r.runtime = imported.digest;
    let err = e.provider.allocate(r).await.unwrap_err();
    assert_eq!(err.code(), "start_failed");
    assert!(
        err.to_string()
            .starts_with("instance start failed: bwrap exited with exit status: 1: bwrap: execvp /.lc/supervisor: No such file or directory"),
        "{err}"
    );
    assert!(!e.dir.join("instances/42-1").exists());
    assert!(!e.dir.join("sent/42-1").exists());
    assert!(!e.dir.join("workspaces/42/ran").exists());
    let (l, g) = (SandboxLeaseId(42), Generation(1));
    let proof = e.provider.prove_not_sent(l, g).await.unwrap();
    assert_eq!(
        verify(&proof, &key, expected(42, 1)).unwrap(),
        Statement::NotSent {
            provider_id: "p-test".into(),
            lease_id: 42,
            generation: 1,
        }
    );
}

/// What the command of the socket-hijack test tries: to remove, move or
/// replace its supervisor's socket, to plant files beside it, and to
/// listen where the provider connects (each failure's message is printed).
const HIJACK: &str = r#"
for op in "rm /.lc/run/supervisor.sock" "mv /.lc/run/supervisor.sock /.lc/run/x" \
    "touch /.lc/run/planted" "ln -s /tmp/h /.lc/run/supervisor.sock" "mkdir /.lc/run"; do
  $op; echo "rc=$?"
done
ls -A /.lc
python3 -c '
import socket
for path in ("/.lc/run/supervisor.sock", "/.lc/run/.b", "/.lc/supervisor.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(path)
        s.listen()
        print("listening", path)
    except OSError as e:
        print(path, e.strerror)
'
echo real output
exit 3
"#;

#[tokio::test]
async fn the_command_can_neither_replace_nor_reach_its_supervisor_socket() {
    let e = env();
    let (out, err, exit) = run(&e, 14, sh(14, HIJACK)).await;
    // The socket the provider connects to is not in the sandbox at all:
    // the run directory is not bound, and the root is read-only.
    assert_eq!(
        out,
        "rc=1\nrc=1\nrc=1\nrc=1\nrc=1\nsupervisor\n\
         /.lc/run/supervisor.sock No such file or directory\n\
         /.lc/run/.b No such file or directory\n\
         /.lc/supervisor.sock Read-only file system\n\
         real output\n"
    );
    assert_eq!(
        err,
        "rm: cannot remove '/.lc/run/supervisor.sock': No such file or directory\n\
         mv: cannot stat '/.lc/run/supervisor.sock': No such file or directory\n\
         touch: cannot touch '/.lc/run/planted': No such file or directory\n\
         ln: failed to create symbolic link '/.lc/run/supervisor.sock': No such file or directory\n\
         mkdir: cannot create directory ‘/.lc/run’: Read-only file system\n"
    );
    assert_eq!(exit, ExitStatus::exited(3));
    // On the host the socket is root's, in root's directory: the sandbox
    // account cannot remove or replace it either.
    let run_dir = e.dir.join("instances/14-1/run");
    let sock = run_dir.join("supervisor.sock");
    let a = e.provider.sandbox_account().clone();
    assert_eq!(
        as_account(&a, "rm", &["-f", sock.to_str().unwrap()]),
        (
            1,
            String::new(),
            format!(
                "rm: cannot remove '{}': Permission denied\n",
                sock.display()
            )
        )
    );
    {
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
        let m = std::fs::symlink_metadata(&sock).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!((m.uid(), m.permissions().mode() & 0o7777), (0, 0o600));
        let m = std::fs::symlink_metadata(&run_dir).unwrap();
        assert_eq!((m.uid(), m.permissions().mode() & 0o7777), (0, 0o700));
    }
    // The pages read were the supervisor's; acknowledging the terminal one
    // ends the instance, and the provider then answers without it.
    let all = until_terminal(&e.provider, 14, 1).await;
    let last = all.last().unwrap().seq();
    e.provider
        .ack(SandboxLeaseId(14), Generation(1), F, last)
        .await
        .unwrap();
    assert_eq!(
        e.provider
            .pages(SandboxLeaseId(14), Generation(1), F, 0, 8)
            .await
            .unwrap(),
        vec![]
    );
    let cg = e
        .provider
        .instance_cgroup(SandboxLeaseId(14), Generation(1));
    let t = Instant::now();
    while !cg.pids().is_empty() {
        assert!(
            t.elapsed() < DEADLINE,
            "the instance outlived its terminal ack"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        e.provider
            .pages(SandboxLeaseId(14), Generation(1), F, 0, 8)
            .await
            .unwrap(),
        vec![]
    );
    e.provider
        .ack(SandboxLeaseId(14), Generation(1), F, last)
        .await
        .unwrap();
    e.provider
        .destroy(SandboxLeaseId(14), Generation(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_route_but_identity() {
    let e = env();
    let provider: Arc<dyn Provider> = Arc::new(BwrapProvider::open(config(&e.dir)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let token = "t".repeat(43);
    let router = lc_provider::provider_router_with_token(provider, token.clone());
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    let anonymous = HttpProvider::connect(&url).await.unwrap();
    assert_eq!(anonymous.public_key(), e.provider.public_key());
    assert_eq!(
        anonymous
            .observe(SandboxLeaseId(15), Generation(1))
            .await
            .unwrap_err(),
        ProviderError::Unauthorized
    );
    assert_eq!(
        anonymous.allocate(sh(15, "true")).await.unwrap_err(),
        ProviderError::Unauthorized
    );
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/instances/15/1/destroy"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 401);
    assert_eq!(
        raw.headers()["www-authenticate"],
        "Bearer realm=\"little-compute-provider\""
    );
    let wrong = anonymous.clone().with_token("u".repeat(43));
    assert_eq!(
        wrong
            .destroy(SandboxLeaseId(15), Generation(1))
            .await
            .unwrap_err()
            .code(),
        "unauthorized"
    );
    // Nothing was fenced by the refused destroy.
    let client = anonymous.with_token(token);
    let ev = client
        .observe(SandboxLeaseId(15), Generation(1))
        .await
        .unwrap();
    assert!(verify(&ev, &e.provider.public_key(), expected(15, 1)).is_ok());
    assert!(client.allocate(sh(15, "true")).await.unwrap().created);
    client
        .destroy(SandboxLeaseId(15), Generation(1))
        .await
        .unwrap();
    server.abort();
}

#[tokio::test]
async fn a_killed_provider_takes_its_instances_along_and_a_restart_destroys_them() {
    use std::io::BufRead as _;
    let e = env();
    let host_bin = provider_host_bin();
    let state = e.dir.join("hosted");
    let parent = e.provider.config().cgroup_parent.clone();
    /// Kills the hosting process if the test fails before it does.
    struct Host(std::process::Child);
    impl Drop for Host {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut host = std::process::Command::new(host_bin)
        .arg(&state)
        .arg(&parent)
        .arg(supervisor_bin())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut host = Host(host);
    assert_eq!(line, "ready\n");
    let mut cfg = config(&state);
    cfg.cgroup_parent = parent;
    let hosted = BwrapProvider::open(cfg).unwrap();
    let cg = hosted.instance_cgroup(SandboxLeaseId(1), Generation(1));
    // bubblewrap (outer and init), the supervisor and `sleep`: allocate
    // answers once the command is released, which the supervisor then
    // starts.
    let t = Instant::now();
    while pids_running(&cg, b"sleep\0").len() != 1 {
        assert!(
            t.elapsed() < DEADLINE,
            "the command never started: {:?}",
            cg.pids()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pids = cg.pids();
    assert!(pids.len() >= 4, "{pids:?}");
    // kill -9 of the provider: --die-with-parent kills the whole instance.
    host.0.kill().unwrap();
    host.0.wait().unwrap();
    for pid in &pids {
        let t = Instant::now();
        while pid_running(*pid) {
            assert!(t.elapsed() < DEADLINE, "pid {pid} outlived its provider");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The restarted provider still knows the instance, sees it exited, and
    // its destroy removes what is left and fences the generation.
    assert_eq!(
        hosted
            .pages(SandboxLeaseId(1), Generation(1), F, 0, 8)
            .await
            .unwrap_err(),
        ProviderError::InstanceLost {
            lease_id: 1,
            generation: 1
        }
    );
    assert_eq!(
        hosted
            .ack(SandboxLeaseId(1), Generation(1), F, 1)
            .await
            .unwrap_err()
            .code(),
        "instance_lost"
    );
    let key = hosted.public_key();
    let obs = hosted
        .observe(SandboxLeaseId(1), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&obs, &key, expected(1, 1)).unwrap(),
        Statement::Observation {
            state: InstanceState::Exited,
            ..
        }
    ));
    let ev = hosted
        .destroy(SandboxLeaseId(1), Generation(1))
        .await
        .unwrap();
    assert!(matches!(
        verify(&ev, &key, expected(1, 1)).unwrap(),
        Statement::Fence { .. }
    ));
    assert!(!cg.exists());
    assert_eq!(
        hosted.allocate(sh(1, "true")).await.unwrap_err().code(),
        "fenced"
    );
}

#[tokio::test]
async fn rlimits_and_cpu_shares_are_set() {
    let e = env();
    let (out, _, exit) = run(
        &e,
        16,
        sh(16, "ulimit -Hn; ulimit -Sn; ulimit -c; ulimit -f"),
    )
    .await;
    // dash reports the file size limit in 512-byte blocks: 4 GiB.
    assert_eq!(out, "1024\n1024\n0\n8388608\n");
    assert_eq!(exit, ExitStatus::exited(0));
    let cg = e
        .provider
        .instance_cgroup(SandboxLeaseId(16), Generation(1));
    assert_eq!(
        std::fs::read_to_string(cg.dirs()[2].join("cpu.shares")).unwrap(),
        "512\n"
    );
    e.provider
        .destroy(SandboxLeaseId(16), Generation(1))
        .await
        .unwrap();
}

/// Writes the executable script `text` at `path` from a child process, so
/// this process never holds a descriptor open for writing on it: a command
/// forked meanwhile by another test's thread would inherit such a
/// descriptor, and executing the script would then fail with `ETXTBSY`.
fn write_script(path: &std::path::Path, text: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(path).unwrap(), text);
}

#[tokio::test]
async fn a_bubblewrap_that_fails_leaves_no_instance_group_or_directory() {
    let e = env();
    let mut cfg = config(&e.dir);
    // A "bubblewrap" that says why and fails at once.
    let fake = e.dir.join("fake-bwrap");
    write_script(&fake, "#!/bin/sh\necho 'bwrap: no thanks' >&2\nexit 1\n");
    cfg.bwrap_bin = fake;
    let failing = BwrapProvider::open(cfg).unwrap();
    let err = failing.allocate(sh(17, "true")).await.unwrap_err();
    assert_eq!(err.code(), "start_failed");
    assert_eq!(
        err.to_string(),
        "instance start failed: bwrap exited with exit status: 1: bwrap: no thanks"
    );
    assert!(!e.dir.join("instances/17-1").exists());
    assert!(
        !failing
            .instance_cgroup(SandboxLeaseId(17), Generation(1))
            .exists()
    );
    assert_eq!(failing.inventory().await.unwrap(), vec![]);
    // Not fenced: a retry of the same generation may start it.
    assert!(e.provider.allocate(sh(17, "true")).await.unwrap().created);
    e.provider
        .destroy(SandboxLeaseId(17), Generation(1))
        .await
        .unwrap();
}

/// What the sandboxed program of the identity test prints: its ids and
/// groups, the errno of opening the provider's key (hard-linked into the
/// workspace, so bound into the sandbox), the workspace's mode and owner,
/// and the key's owner and mode as the sandbox sees them; it also writes
/// `/workspace/made`.
const IDENTITY: &str = "import os\n\
print(os.getuid(), os.getgid(), os.geteuid(), os.getgroups())\n\
open('/workspace/made', 'w').write('by the sandbox')\n\
try:\n    open('/workspace/provider.key').read()\n    print('key read')\n\
except OSError as e:\n    print('key', e.errno)\n\
st = os.stat('/workspace')\n\
print('ws', oct(st.st_mode & 0o777), st.st_uid, st.st_gid)\n\
st = os.stat('/workspace/provider.key')\n\
print('key owner', st.st_uid, oct(st.st_mode & 0o777))\n";

#[tokio::test]
async fn the_sandbox_is_the_unprivileged_account_on_the_host() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let e = env();
    let a = e.provider.sandbox_account().clone();
    let entry = passwd_entry("lc-sandbox");
    assert_eq!(a.name, "lc-sandbox");
    assert_eq!(entry[2], a.uid.to_string());
    assert_eq!(entry[3], a.gid.to_string());
    assert_eq!(entry[6], "/usr/sbin/nologin");
    assert!(a.uid != 0 && a.gid != 0, "{a:?}");
    // The provider's key (root, 0600) bound into the sandbox: a hard link
    // of it in the workspace, the same inode.
    let ws = e.provider.workspace_dir(WorkspaceId(18));
    std::fs::create_dir_all(&ws).unwrap();
    let key = e.dir.join("provider.key");
    std::fs::hard_link(&key, ws.join("provider.key")).unwrap();
    let (out, err, exit) = run(&e, 18, req(18, 1, SMALL, &["python3", "-c", IDENTITY])).await;
    // Inside: uid and gid 1000, no group; EACCES on the key, which belongs
    // to a host user the sandbox has no name for (the overflow uid).
    assert_eq!(
        out,
        "1000 1000 1000 []\nkey 13\nws 0o700 1000 1000\nkey owner 65534 0o600\n"
    );
    assert_eq!(err, "");
    assert_eq!(exit, ExitStatus::exited(0));
    // On the host: what the sandbox wrote is the account's, not root's.
    let made = std::fs::metadata(ws.join("made")).unwrap();
    assert_eq!((made.uid(), made.gid()), (a.uid, a.gid));
    assert_eq!(
        std::fs::read_to_string(ws.join("made")).unwrap(),
        "by the sandbox"
    );
    // The modes of the state directory: the sandbox's two directories are
    // the account's 0700; the rest is root's, and only searchable where
    // bubblewrap must pass through.
    let inst = e.dir.join("instances/18-1");
    for (path, uid, mode) in [
        (e.dir.clone(), 0, 0o711),
        (key.clone(), 0, 0o600),
        (e.dir.join("fences"), 0, 0o700),
        (e.dir.join("instances"), 0, 0o711),
        (e.dir.join("workspaces"), 0, 0o711),
        (inst.clone(), 0, 0o711),
        (inst.join("instance.json"), 0, 0o600),
        (inst.join("bwrap.log"), 0, 0o600),
        (inst.join("run"), 0, 0o700),
        (ws.clone(), a.uid, 0o700),
    ] {
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            (m.uid(), m.permissions().mode() & 0o7777),
            (uid, mode),
            "{}",
            path.display()
        );
    }
    // The account itself, on the host, reads none of the provider's state.
    let denied = |p: &Path| format!("cat: {}: Permission denied\n", p.display());
    for p in [
        key.clone(),
        inst.join("instance.json"),
        inst.join("bwrap.log"),
    ] {
        assert_eq!(
            as_account(&a, "cat", &[p.to_str().unwrap()]),
            (1, String::new(), denied(&p)),
        );
    }
    for p in [
        e.dir.clone(),
        e.dir.join("fences"),
        e.dir.join("instances"),
        e.dir.join("workspaces"),
    ] {
        assert_eq!(
            as_account(&a, "ls", &[p.to_str().unwrap()]),
            (
                2,
                String::new(),
                format!(
                    "ls: cannot open directory '{}': Permission denied\n",
                    p.display()
                )
            ),
        );
    }
    e.provider
        .destroy(SandboxLeaseId(18), Generation(1))
        .await
        .unwrap();
}

/// Removes a test account when the test ends, however it ends.
struct TestAccount(String);

impl Drop for TestAccount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[tokio::test]
async fn a_missing_sandbox_account_is_created_and_root_is_refused() {
    use std::os::unix::fs::MetadataExt as _;
    let name = format!("lc-t-{}", std::process::id());
    let guard = TestAccount(name.clone());
    drop(TestAccount(name.clone()));
    assert_eq!(lc_provider::account::lookup(&name).unwrap(), None);
    let e = env_with(|c| c.sandbox_user = name.clone());
    let a = e.provider.sandbox_account().clone();
    let entry = passwd_entry(&name);
    assert_eq!(
        entry,
        [
            name.clone(),
            "x".into(),
            a.uid.to_string(),
            a.gid.to_string(),
            String::new(),
            "/nonexistent".into(),
            "/usr/sbin/nologin".into()
        ]
    );
    // A system account: below Debian's first login uid.
    assert!((1..1000).contains(&a.uid), "{a:?}");
    assert_ne!(a.uid, passwd_entry("lc-sandbox")[2].parse::<u32>().unwrap());
    let (out, _, exit) = run(&e, 19, sh(19, "id -u; id -g; echo x > /workspace/f")).await;
    assert_eq!(out, "1000\n1000\n");
    assert_eq!(exit, ExitStatus::exited(0));
    let f = std::fs::metadata(e.provider.workspace_dir(WorkspaceId(19)).join("f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (a.uid, a.gid));
    e.provider
        .destroy(SandboxLeaseId(19), Generation(1))
        .await
        .unwrap();
    drop(guard);
    assert_eq!(lc_provider::account::lookup(&name).unwrap(), None);
    // Root, and names that are not account names, are refused.
    for (user, detail) in [
        (
            "root",
            "sandbox user \"root\": has uid 0 gid 0: a sandbox never runs as root or group root",
        ),
        (
            "Lc Sandbox",
            "sandbox user \"Lc Sandbox\": want [a-z_][a-z0-9_-]*, at most 32 bytes",
        ),
    ] {
        let dir = fresh_dir();
        let mut cfg = config(&dir);
        cfg.sandbox_user = user.into();
        let err = BwrapProvider::open(cfg).err().unwrap();
        assert_eq!(err.to_string(), format!("provider state: {detail}"));
        assert!(!dir.exists(), "a refused account left {}", dir.display());
    }
}

#[tokio::test]
async fn a_set_id_bubblewrap_and_paths_the_account_cannot_reach_are_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let e = env();
    let a = e.provider.sandbox_account().clone();
    let fake = e.dir.join("suid-bwrap");
    std::fs::copy("/usr/bin/bwrap", &fake).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let mut cfg = config(&e.dir);
    cfg.bwrap_bin = fake.clone();
    assert_eq!(
        BwrapProvider::open(cfg).err().unwrap().to_string(),
        format!(
            "provider state: {}: bubblewrap is set-uid or set-gid: the provider runs it unprivileged, as the sandbox account, and builds no instance through a privileged helper",
            fake.display()
        )
    );
    // A supervisor, and a runtime store, below a directory only root enters.
    let private = e.dir.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sup = private.join("lc-supervisor");
    std::fs::copy(supervisor_bin(), &sup).unwrap();
    let unreachable = |program: &Path, cwd: &Path| {
        format!(
            "provider state: {}: the sandbox account lc-sandbox (uid {}) cannot execute it from {}: Permission denied (os error 13) (it and every directory above it and above {} must be searchable by that account)",
            program.display(),
            a.uid,
            cwd.display(),
            cwd.display()
        )
    };
    let mut cfg = config(&e.dir);
    cfg.supervisor_bin = sup.clone();
    assert_eq!(
        BwrapProvider::open(cfg).err().unwrap().to_string(),
        unreachable(&sup, &e.dir.join("instances"))
    );
    let mut cfg = config(&e.dir);
    cfg.runtime_dir = private.join("runtimes");
    assert_eq!(
        BwrapProvider::open(cfg).err().unwrap().to_string(),
        unreachable(Path::new("/usr/bin/bwrap"), &private.join("runtimes"))
    );
    // A runtime store only root may enter, but the provider's own, is
    // made searchable (not listable) by others.
    let rt = e.dir.join("rt700");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut cfg = config(&e.dir);
    cfg.runtime_dir = rt.clone();
    BwrapProvider::open(cfg).unwrap();
    assert_eq!(
        std::fs::metadata(&rt).unwrap().permissions().mode() & 0o7777,
        0o701
    );
    // A state directory the account owns (it could rename what is in it).
    let theirs = fresh_dir();
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(a.uid), Some(a.gid)).unwrap();
    assert_eq!(
        BwrapProvider::open(config(&theirs))
            .err()
            .unwrap()
            .to_string(),
        format!(
            "provider state: {}: not a directory owned by the provider (uid 0)",
            theirs.display()
        )
    );
    std::fs::remove_dir(&theirs).unwrap();
    // A provider that is not root is refused before it touches anything.
    let host_bin = provider_host_bin();
    let state = fresh_dir();
    let (code, out, err) = as_account(
        &a,
        host_bin.to_str().unwrap(),
        &[
            state.to_str().unwrap(),
            "little-compute-test-unprivileged",
            supervisor_bin().to_str().unwrap(),
        ],
    );
    assert_eq!((code, out.as_str()), (101, ""));
    assert!(
        err.contains("the provider: must run as root: it limits instances through cgroups and starts each as the unprivileged sandbox account"),
        "{err}"
    );
    assert!(!state.exists());
}

/// Served by `lc_provider::http::serve`, the provider's service is held to
/// httpkit's connection layer: at the bound with every connection busy, a
/// new one is answered 503 `too_many_connections` in the provider's
/// problem type while the busy one is still served; a connection that
/// sends no head is closed at the header-read timeout; an unknown route is
/// a problem document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_is_bounded_by_the_connection_layer() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    let e = env();
    let provider: Arc<dyn Provider> = Arc::new(BwrapProvider::open(config(&e.dir)).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let header_read_timeout = Duration::from_millis(500);
    let limits = httpkit::ConnectionLimits {
        connections_max: 1,
        header_read_timeout,
        idle_timeout: Duration::from_secs(30),
    };
    let served = tokio::spawn(lc_provider::http::serve(
        listener,
        provider,
        None,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    let answer = |mut s: TcpStream| async move {
        let mut text = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut text))
            .await
            .expect("answered and closed in time")
            .expect("read");
        text
    };
    // The one connection is busy: the service reads its body (sending
    // `100 Continue` only then) and waits for it.
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(
        b"POST /v1/instances HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
          Content-Type: application/json\r\nContent-Length: 2\r\n\
          Expect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut continued = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), busy.read_exact(&mut continued))
        .await
        .expect("100 Continue in time")
        .unwrap();
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    let refused = answer(TcpStream::connect(addr).await.unwrap()).await;
    let body = r#"{"code":"too_many_connections","detail":"the service is at its connection bound with every connection busy; retry in 1 s","status":503,"title":"Too many connections","type":"urn:little-compute:provider:problem:too_many_connections"}"#;
    assert!(
        refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refused}"
    );
    for line in [
        "content-type: application/problem+json",
        "retry-after: 1",
        "connection: close",
        &format!("content-length: {}", body.len()),
    ] {
        assert!(
            refused.contains(&format!("\r\n{line}\r\n")),
            "{line}: {refused}"
        );
    }
    assert!(refused.ends_with(&format!("\r\n\r\n{body}")), "{refused}");
    // The busy request completes: an empty allocate body is refused.
    busy.write_all(b"{}").await.unwrap();
    let done = answer(busy).await;
    assert!(done.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{done}");
    let (_, json) = done.split_once("\r\n\r\n").unwrap();
    let json: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(json["code"], "invalid_request");
    assert_eq!(json["error"]["code"], "invalid_request");
    // A connection that sends nothing is closed once the head is overdue.
    let t = Instant::now();
    assert_eq!(answer(TcpStream::connect(addr).await.unwrap()).await, "");
    assert!(t.elapsed() >= header_read_timeout, "{:?}", t.elapsed());
    // An unknown route is the provider's problem document, not a bare 404.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /v1/nothing HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let missing = answer(s).await;
    assert!(
        missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
        "{missing}"
    );
    assert!(
        missing.ends_with(r#"{"code":"not_found","detail":"no such resource","status":404,"title":"Not found","type":"urn:little-compute:provider:problem:not_found"}"#),
        "{missing}"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("the server returns")
        .unwrap();
}

/// The `Uid`, `Gid`, `Groups`, `NoNewPrivs` and `CapEff` lines of
/// `/proc/<pid>/status`, in that order (ids as the host sees them).
fn credentials(pid: i32) -> Vec<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    ["Uid:", "Gid:", "Groups:", "NoNewPrivs:", "CapEff:"]
        .iter()
        .map(|k| {
            let line = status.lines().find(|l| l.starts_with(k)).unwrap_or("");
            line.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect()
}

#[tokio::test]
async fn every_process_of_an_instance_is_the_account_on_the_host() {
    let e = env();
    let a = e.provider.sandbox_account().clone();
    e.provider
        .allocate(sh(20, "sleep 300 & sleep 300"))
        .await
        .unwrap();
    let cg = e
        .provider
        .instance_cgroup(SandboxLeaseId(20), Generation(1));
    let t = Instant::now();
    // bwrap, its init, the supervisor, sh, two sleeps.
    while cg.pids().len() < 6 {
        assert!(t.elapsed() < DEADLINE, "{:?}", cg.pids());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (u, g) = (a.uid, a.gid);
    for pid in cg.pids() {
        let creds = credentials(pid);
        // Real, effective, saved and file-system ids: the account's; no
        // supplementary group; no way to gain privileges by exec.
        assert_eq!(
            creds[..4],
            [
                format!("Uid: {u} {u} {u} {u}"),
                format!("Gid: {g} {g} {g} {g}"),
                "Groups:".to_owned(),
                "NoNewPrivs: 1".to_owned(),
            ],
            "pid {pid}"
        );
    }
    // The supervisor and the command hold no capability, even in their
    // own user namespace.
    let children = |pid: i32| -> Vec<i32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    };
    let mut below_init: Vec<i32> = Vec::new();
    for pid in cg.pids() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.starts_with(b"/.lc/supervisor\0") {
            below_init.push(pid);
            below_init.extend(children(pid));
        }
    }
    assert_eq!(below_init.len(), 2, "the supervisor and sh: {below_init:?}");
    // bubblewrap runs with none of the provider's environment (processes
    // of the account may read it); the command with the clean one.
    let environ = |pid: i32| std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let outer: Vec<i32> = cg
        .pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .starts_with(b"/usr/bin/bwrap\0")
        })
        .collect();
    assert_eq!(outer.len(), 2, "bubblewrap and its init: {outer:?}");
    for pid in outer {
        assert_eq!(environ(pid), b"", "pid {pid}");
    }
    // (bubblewrap adds PWD for its --chdir.)
    for pid in &below_init {
        assert_eq!(
            String::from_utf8(environ(*pid)).unwrap(),
            "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin\0HOME=/workspace\0LANG=C.UTF-8\0PWD=/workspace\0",
            "pid {pid}"
        );
    }
    for pid in below_init {
        assert_eq!(credentials(pid)[4], "CapEff: 0000000000000000", "pid {pid}");
    }
    e.provider
        .destroy(SandboxLeaseId(20), Generation(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_command_cannot_talk_to_its_supervisor() {
    // The socket's name is not in the sandbox, and the supervisor (PID 2,
    // the same uid) is not dumpable: the command can neither list its
    // descriptors nor copy one (pidfd_getfd) to accept the provider's
    // connections itself; it inherits no descriptor but its stdio (none
    // of whatever the provider or bubblewrap had open). (Were the socket
    // reached, the supervisor would still close every connection from its
    // own PID namespace unread.)
    let e = env();
    let script = r#"
import ctypes, os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("/.lc/run/supervisor.sock")
    print("connected")
except OSError as e:
    print("connect", e.strerror)
s.close()
argv = open("/proc/2/cmdline").read().split("\0")
print(argv[0], argv[1], argv[3])
try:
    print(os.listdir("/proc/2/fd"))
except OSError as e:
    print("fds", e.strerror)
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(2)
for fd in (int(argv[2]), int(argv[4])):
    r = libc.syscall(438, pidfd, fd, 0)
    print("pidfd_getfd", os.strerror(ctypes.get_errno()) if r < 0 else "copied")
os.close(pidfd)
# Its own descriptors: stdin, stdout, stderr, and the one listing them.
print(sorted(os.listdir("/proc/self/fd"), key=int))
"#;
    let (out, err, exit) = run(&e, 1, req(1, 1, SMALL, &["python3", "-c", script])).await;
    assert_eq!(
        out,
        "connect No such file or directory\n\
         /.lc/supervisor --listen-fd --done-fd\n\
         fds Permission denied\n\
         pidfd_getfd Operation not permitted\n\
         pidfd_getfd Operation not permitted\n\
         ['0', '1', '2', '3']\n"
    );
    assert_eq!(err, "");
    assert_eq!(exit, ExitStatus::exited(0));
}

/// Reads pages with `fence` until the terminal one (without acknowledging).
async fn until_terminal_fenced(p: &dyn Provider, lease: i64, fence: OwnerFence) -> Vec<Page> {
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let after = all.last().map_or(0, |p| p.seq());
        let got = p
            .pages(SandboxLeaseId(lease), Generation(1), fence, after, 64)
            .await
            .unwrap();
        all.extend(got);
        if all.last().is_some_and(|p| p.is_terminal()) {
            return all;
        }
        assert!(t.elapsed() < DEADLINE, "no terminal page; so far {all:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn bytes_of(pages: &[Page], kind: PageKind) -> Vec<u8> {
    pages
        .iter()
        .filter(|p| p.kind() == kind)
        .flat_map(|p| p.bytes().to_vec())
        .collect()
}

/// Through the real bubblewrap provider and its HTTP service: a fence below
/// the highest the supervisor was shown is refused `stale_fence` (409 over
/// HTTP) for pages, ack and cancel, and drops or kills nothing; binary
/// output crosses the JSON form byte-exact; a cancel with the current
/// fence kills the command and everything it started, and the terminal
/// page says signal 9 after every page written before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fences_are_refused_and_cancel_kills_through_http() {
    let e = env();
    let (client, url, server) = served(&e).await;
    let (l, g) = (SandboxLeaseId(21), Generation(1));
    client
        .allocate(sh(
            21,
            "printf '\\377\\000\\300one'; sleep 1000 & exec sleep 1000",
        ))
        .await
        .unwrap();
    let t = Instant::now();
    let s = loop {
        let s = client.spool_status(l, g).await.unwrap().unwrap();
        if s.pages == 1 {
            break s;
        }
        assert!(t.elapsed() < DEADLINE, "no page: {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        (s.bytes, s.bytes_max, s.pages_max, s.highest_fence),
        (
            6,
            lc_core::page::SPOOL_BYTES_DEFAULT,
            lc_core::page::SPOOL_PAGES_DEFAULT,
            0
        )
    );
    let first = client.pages(l, g, OwnerFence(5), 0, 64).await.unwrap();
    assert_eq!(bytes_of(&first, PageKind::Stdout), b"\xff\x00\xc0one");
    let stale = |presented| ProviderError::StaleFence {
        presented,
        highest: 5,
    };
    let err = client.ack(l, g, OwnerFence(4), 1).await.unwrap_err();
    assert_eq!(err, stale(4));
    assert_eq!((err.code(), err.is_transient()), ("stale_fence", false));
    assert_eq!(
        e.provider.ack(l, g, OwnerFence(3), 1).await.unwrap_err(),
        stale(3)
    );
    assert_eq!(
        client.cancel(l, g, OwnerFence(4)).await.unwrap_err(),
        stale(4)
    );
    assert_eq!(
        e.provider
            .pages(l, g, OwnerFence(2), 0, 64)
            .await
            .unwrap_err(),
        stale(2)
    );
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/instances/21/1/ack"))
        .json(&serde_json::json!({ "fence": 4, "through_seq": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 409);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(body["code"], "stale_fence");
    assert_eq!(
        body["error"],
        serde_json::json!({ "code": "stale_fence", "presented": 4, "highest": 5 })
    );
    assert_eq!(
        client.cancel(l, g, OwnerFence(0)).await.unwrap_err().code(),
        "invalid_request"
    );
    // Nothing was dropped or killed by the refused requests.
    let s = client.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!(
        (
            s.pages,
            s.acked_through,
            s.command_exited,
            s.cancelled,
            s.highest_fence
        ),
        (1, 0, false, false, 5)
    );
    assert_eq!(
        client.pages(l, g, OwnerFence(5), 0, 64).await.unwrap(),
        first
    );
    // Cancel with a newer fence: the command and its background child die.
    client.cancel(l, g, OwnerFence(6)).await.unwrap();
    client.cancel(l, g, OwnerFence(6)).await.unwrap();
    let all = until_terminal_fenced(&client, 21, OwnerFence(6)).await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[0], first[0]);
    assert_eq!(all[1].exit(), Some(ExitStatus::signaled(9)));
    let s = client.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!(
        (
            s.terminal_seq,
            s.command_exited,
            s.cancelled,
            s.highest_fence
        ),
        (2, true, true, 6)
    );
    client.ack(l, g, OwnerFence(6), 2).await.unwrap();
    // The supervisor ends once its terminal page is acknowledged; a late
    // cancel is then a no-op.
    let t = Instant::now();
    while client.spool_status(l, g).await.unwrap().is_some() {
        assert!(t.elapsed() < DEADLINE, "the supervisor did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client.cancel(l, g, OwnerFence(6)).await.unwrap();
    client.destroy(l, g).await.unwrap();
    server.abort();
}

/// Inside a real sandbox (the supervisor is PID 2 of its PID namespace):
/// children that outlive the command and hold its stdout open, one in a
/// session of its own, are killed once the command exits, so the terminal
/// page comes with the command's own status; and a small spool
/// (pages and bytes) holds the flood back without losing a byte.
#[tokio::test]
async fn orphans_die_with_the_command_and_a_small_spool_loses_nothing() {
    let e = env_with(|c| {
        c.spool_bytes_max = 65536;
        c.spool_pages_max = 8;
    });
    e.provider
        .allocate(sh(
            22,
            "sleep 1000 & setsid sleep 1000 & head -c 2000000 /dev/zero; echo end; exit 3",
        ))
        .await
        .unwrap();
    let (l, g) = (SandboxLeaseId(22), Generation(1));
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let s = e.provider.spool_status(l, g).await.unwrap().unwrap();
        assert!(s.bytes <= 65536 && s.pages <= 8, "{s:?}");
        let got = e
            .provider
            .pages(l, g, F, all.last().map_or(0, |p| p.seq()), 64)
            .await
            .unwrap();
        all.extend(got);
        if let Some(last) = all.last() {
            if last.is_terminal() {
                break;
            }
            e.provider.ack(l, g, F, last.seq()).await.unwrap();
        }
        assert!(t.elapsed() < DEADLINE, "no terminal page");
    }
    let mut want = vec![0u8; 2_000_000];
    want.extend_from_slice(b"end\n");
    assert_eq!(bytes_of(&all, PageKind::Stdout), want);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(3)));
    for (i, p) in all.iter().enumerate() {
        assert_eq!(p.seq(), i as i64 + 1);
    }
    e.provider
        .ack(l, g, F, all.last().unwrap().seq())
        .await
        .unwrap();
    e.provider.destroy(l, g).await.unwrap();
}

/// Input through the HTTP service into a real sandbox: each input seq is
/// written once, in order, replays answer ok, a gap and a stale fence are
/// refused, and an instance allocated without stdin refuses every input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_reaches_the_command_once_per_seq_through_http() {
    let e = env();
    let (client, _url, server) = served(&e).await;
    let (l, g) = (SandboxLeaseId(23), Generation(1));
    let mut r = req(23, 1, SMALL, &["cat"]);
    r.stdin_open = true;
    client.allocate(r).await.unwrap();
    let f = OwnerFence(3);
    assert_eq!(
        client
            .send(l, g, f, 1, b"in\x00".to_vec(), false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        client
            .send(l, g, f, 1, b"in\x00".to_vec(), false)
            .await
            .unwrap(),
        1
    );
    let gap = client
        .send(l, g, f, 3, b"x".to_vec(), false)
        .await
        .unwrap_err();
    assert_eq!((gap.code(), gap.is_transient()), ("input_refused", false));
    assert!(matches!(gap, ProviderError::InputRefused { ref reason, .. } if reason == "input_gap"));
    assert_eq!(
        client
            .send(l, g, OwnerFence(2), 2, b"x".to_vec(), false)
            .await
            .unwrap_err(),
        ProviderError::StaleFence {
            presented: 2,
            highest: 3
        }
    );
    assert_eq!(
        client
            .send(
                l,
                g,
                f,
                2,
                vec![0; lc_core::page::INPUT_BYTES_MAX + 1],
                false
            )
            .await
            .unwrap_err()
            .code(),
        "invalid_request"
    );
    assert_eq!(
        client
            .send(l, g, f, 2, b"put".to_vec(), true)
            .await
            .unwrap(),
        2
    );
    let all = until_terminal_fenced(&client, 23, f).await;
    assert_eq!(bytes_of(&all, PageKind::Stdout), b"in\x00put");
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    let s = client.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!((s.input_seq, s.highest_fence), (2, 3));
    client.destroy(l, g).await.unwrap();

    let (l2, g2) = (SandboxLeaseId(24), Generation(1));
    client.allocate(sh(24, "exec sleep 1000")).await.unwrap();
    let t = Instant::now();
    while client.spool_status(l2, g2).await.is_err() {
        assert!(t.elapsed() < DEADLINE, "no supervisor");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let closed = client
        .send(l2, g2, f, 1, b"x".to_vec(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(closed, ProviderError::InputRefused { ref reason, .. } if reason == "input_closed"),
        "{closed:?}"
    );
    client.destroy(l2, g2).await.unwrap();
    server.abort();
}

/// Reads pages after `after` with `fence` until the last one (terminal or
/// stopped), without acknowledging; checks the seqs follow `after` without
/// a gap.
async fn until_last(
    p: &dyn Provider,
    lease: i64,
    generation: i64,
    fence: OwnerFence,
    after: i64,
) -> Vec<Page> {
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let from = all.last().map_or(after, |p| p.seq());
        let got = p
            .pages(
                SandboxLeaseId(lease),
                Generation(generation),
                fence,
                from,
                64,
            )
            .await
            .unwrap();
        for (i, pg) in got.iter().enumerate() {
            assert_eq!(pg.seq(), from + 1 + i as i64, "seq gap");
        }
        all.extend(got);
        if all.last().is_some_and(|p| p.is_last()) {
            return all;
        }
        assert!(t.elapsed() < DEADLINE, "no last page; so far {all:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the instance's spool shows `done`.
async fn spool_when(
    p: &dyn Provider,
    lease: i64,
    generation: i64,
    done: impl Fn(&lc_core::page::SpoolStatus) -> bool,
) -> lc_core::page::SpoolStatus {
    let t = Instant::now();
    loop {
        if let Ok(Some(s)) = p
            .spool_status(SandboxLeaseId(lease), Generation(generation))
            .await
            && done(&s)
        {
            return s;
        }
        assert!(t.elapsed() < DEADLINE, "spool never reached the state");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Through the HTTP service into a real sandbox: with first_seq 41 and
/// first_input_seq 5 the pages are 41, 42, ... and the first input is 5; a
/// stop kills the command (`sleep 100`) and whatever it started, and the
/// generation ends with the stopped page (signal 9, the next seq) instead
/// of the terminal page; a stale fence is refused `stale_fence` and kills
/// nothing; a repeated stop answers `already_stopped`; once the stopped
/// page is acknowledged the supervisor finishes and a stop answers
/// `null`. Seqs outside 1..=FIRST_SEQ_MAX are refused before anything
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_the_generation_with_the_stopped_page_and_numbering_starts_at_first_seq() {
    use lc_core::page::StopOutcome;
    let e = env();
    let (client, url, server) = served(&e).await;
    for (first_seq, first_input_seq) in [(0, 1), (1, 0), (lc_core::page::FIRST_SEQ_MAX + 1, 1)] {
        let mut r = sh(31, "true");
        r.first_seq = first_seq;
        r.first_input_seq = first_input_seq;
        let err = client.allocate(r).await.unwrap_err();
        assert_eq!(err.code(), "invalid_request", "{err:?}");
    }
    assert_eq!(
        client
            .observe(SandboxLeaseId(31), Generation(1))
            .await
            .map(|env| verify(&env, &client.public_key(), expected(31, 1)).unwrap()),
        Ok(Statement::Observation {
            provider_id: "p-test".into(),
            lease_id: 31,
            generation: 1,
            state: InstanceState::Absent,
        })
    );
    let (l, g) = (SandboxLeaseId(31), Generation(1));
    let mut r = req(
        31,
        1,
        SMALL,
        &[
            "sh",
            "-c",
            "read x; echo got=$x; sleep 1000 & echo pid=$!; exec sleep 100",
        ],
    );
    r.first_seq = 41;
    r.first_input_seq = 5;
    r.stdin_open = true;
    client.allocate(r).await.unwrap();
    let f = OwnerFence(3);
    let s = spool_when(&client, 31, 1, |_| true).await;
    assert_eq!((s.next_seq, s.acked_through, s.input_seq), (41, 40, 4));
    assert_eq!(
        client
            .send(l, g, f, 5, b"in\n".to_vec(), false)
            .await
            .unwrap(),
        5
    );
    let t = Instant::now();
    let first = loop {
        let got = client.pages(l, g, f, 40, 64).await.unwrap();
        let out = String::from_utf8(bytes_of(&got, PageKind::Stdout)).unwrap();
        if out.contains("pid=") && out.ends_with('\n') {
            assert!(out.starts_with("got=in\npid="), "{out:?}");
            break got;
        }
        assert!(t.elapsed() < DEADLINE, "output so far {out:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(first[0].seq(), 41);
    let s = client.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!(s.next_seq, 41 + first.len() as i64);
    let cg = e.provider.instance_cgroup(l, g);
    assert!(!cg.pids().is_empty());
    // A stale fence stops nothing.
    client.pages(l, g, OwnerFence(4), 40, 1).await.unwrap();
    assert_eq!(
        client.stop(l, g, f).await.unwrap_err(),
        ProviderError::StaleFence {
            presented: 3,
            highest: 4
        }
    );
    let s = client.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!(
        (s.stopped, s.command_exited, s.stopped_seq),
        (false, false, 0)
    );
    let f = OwnerFence(4);
    assert_eq!(
        client.stop(l, g, f).await.unwrap(),
        Some(StopOutcome::Killed)
    );
    assert_eq!(
        client.stop(l, g, f).await.unwrap(),
        Some(StopOutcome::AlreadyStopped)
    );
    let all = until_last(&client, 31, 1, f, 40).await;
    assert_eq!(&all[..first.len()], &first[..]);
    let last = all.last().unwrap();
    let want_seq = 41 + first.len() as i64;
    assert_eq!(all.len(), first.len() + 1);
    assert_eq!(
        (last.seq(), last.kind(), last.bytes().len(), last.exit()),
        (
            want_seq,
            PageKind::Stopped,
            0,
            Some(ExitStatus::signaled(9))
        )
    );
    // Every process of the instance's command is gone; only bubblewrap
    // (its host process and the sandbox's init) and the supervisor are left.
    let s = client.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!(
        (
            s.stopped,
            s.stopped_seq,
            s.terminal_seq,
            s.command_exited,
            s.cancelled
        ),
        (true, want_seq, 0, true, false)
    );
    let mut left: Vec<String> = cg
        .pids()
        .iter()
        .map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .unwrap_or_default()
                .trim_end()
                .to_owned()
        })
        .collect();
    left.sort();
    assert_eq!(left, ["bwrap", "bwrap", "supervisor"]);
    let refused = client
        .send(l, g, f, 6, b"x".to_vec(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ProviderError::InputRefused { ref reason, .. } if reason == "input_closed"),
        "{refused:?}"
    );
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/instances/31/1/stop"))
        .json(&serde_json::json!({ "fence": 2 }))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 409);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(
        body["error"],
        serde_json::json!({ "code": "stale_fence", "presented": 2, "highest": 4 })
    );
    client.ack(l, g, f, want_seq).await.unwrap();
    let t = Instant::now();
    while client.spool_status(l, g).await.unwrap().is_some() {
        assert!(t.elapsed() < DEADLINE, "the supervisor did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.stop(l, g, f).await.unwrap(), None);
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/instances/31/1/stop"))
        .json(&serde_json::json!({ "fence": 4 }))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(
        raw.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({ "outcome": null })
    );
    assert_eq!(
        client
            .stop(SandboxLeaseId(99), g, f)
            .await
            .unwrap_err()
            .code(),
        "no_instance"
    );
    client.destroy(l, g).await.unwrap();
    server.abort();
}

/// A stop after the command exited kills nothing, answers `ended`, and the
/// terminal page stays the generation's last page.
#[tokio::test]
async fn a_stop_after_exit_leaves_the_terminal_page() {
    use lc_core::page::StopOutcome;
    let e = env();
    let (l, g) = (SandboxLeaseId(32), Generation(1));
    e.provider
        .allocate(sh(32, "printf x; exit 6"))
        .await
        .unwrap();
    spool_when(&e.provider, 32, 1, |s| s.terminal_seq == 2).await;
    assert_eq!(
        e.provider.stop(l, g, F).await.unwrap(),
        Some(StopOutcome::Ended)
    );
    let all = until_last(&e.provider, 32, 1, F, 0).await;
    assert_eq!(all.len(), 2);
    assert_eq!(
        (all[1].kind(), all[1].exit()),
        (PageKind::Terminal, Some(ExitStatus::exited(6)))
    );
    let s = e.provider.spool_status(l, g).await.unwrap().unwrap();
    assert_eq!((s.stopped, s.stopped_seq, s.terminal_seq), (false, 0, 2));
    e.provider.destroy(l, g).await.unwrap();
}

/// An HTTP service over a second provider on `e`'s state directory, and a
/// client of it.
async fn served(e: &Env) -> (HttpProvider, String, tokio::task::JoinHandle<()>) {
    let provider: Arc<dyn Provider> = Arc::new(BwrapProvider::open(config(&e.dir)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, provider_router(provider))
            .await
            .unwrap();
    });
    (HttpProvider::connect(&url).await.unwrap(), url, server)
}

/// Waits until the supervisor of (lease, generation) has finished (its
/// last page acknowledged).
async fn finished(p: &dyn Provider, lease: i64, generation: i64) {
    let t = Instant::now();
    while p
        .spool_status(SandboxLeaseId(lease), Generation(generation))
        .await
        .unwrap()
        .is_some()
    {
        assert!(t.elapsed() < DEADLINE, "the supervisor did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The exact output of `seq 1 n`.
fn seq_text(n: u32) -> Vec<u8> {
    (1..=n)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

fn entries_of(m: &lc_core::snapshot::Manifest) -> Vec<(String, u32, String)> {
    use lc_core::snapshot::EntryKind;
    m.entries
        .iter()
        .map(|e| {
            let kind = match &e.kind {
                EntryKind::Dir => "dir".to_owned(),
                EntryKind::File { size, sha256 } => format!("file {size} {}", sha256.to_hex()),
                EntryKind::Symlink { target } => format!("symlink {target}"),
            };
            (e.path.clone(), e.mode, kind)
        })
        .collect()
}

/// Hibernation and resume of one workspace with real instances: a command
/// writes files (modes, symlinks, nested and empty directories), a
/// quiesce before the stop (and before the stopped page is acknowledged)
/// is refused `command_running` and changes nothing; after it the
/// manifest lists exactly those entries, the evidence verifies and names
/// its head, a repeated quiesce (also of a restarted provider, and over
/// HTTP) is byte-identical; generation 2 allocated with the snapshot (a
/// stale file in the workspace directory is gone) sees every file byte for
/// byte, mode for mode, owned by the sandbox uid, its pages continue at
/// first_seq, and its attachment verifies and names the head; its own
/// quiesce names that head as parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiesce_snapshots_the_workspace_and_a_restore_resumes_it_exactly() {
    use lc_core::snapshot::{Entry, Manifest};
    let e = env();
    let (client, _url, server) = served(&e).await;
    let (l, g1, g2) = (SandboxLeaseId(41), Generation(1), Generation(2));
    let script = "mkdir -p a/b/c empty && printf hello > a/b/c/f.txt && printf '\\000\\377bin' > top.bin \
        && seq 1 20000 > big && ln -s a/b/c/f.txt link && ln -s /etc/passwd abs \
        && chmod 640 a/b/c/f.txt && chmod 755 top.bin && chmod 600 big \
        && chmod 750 a && chmod 705 a/b && chmod 700 a/b/c && chmod 711 empty \
        && echo done; exec sleep 100";
    let mut r1 = req(41, 1, SMALL, &["sh", "-c", script]);
    r1.workspace_id = WorkspaceId(41);
    let a1 = e.provider.allocate(r1).await.unwrap();
    assert_eq!(a1.attachment, None);
    let f = OwnerFence(2);
    let t = Instant::now();
    while bytes_of(
        &e.provider.pages(l, g1, f, 0, 64).await.unwrap(),
        PageKind::Stdout,
    ) != b"done\n"
    {
        assert!(t.elapsed() < DEADLINE, "the command never wrote its files");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let running = e.provider.quiesce(l, g1, f).await.unwrap_err();
    assert_eq!(running.code(), "command_running", "{running:?}");
    let s = e.provider.spool_status(l, g1).await.unwrap().unwrap();
    assert_eq!((s.command_exited, s.stopped), (false, false));
    assert_eq!(
        e.provider.quiesce(l, g1, OwnerFence(1)).await.unwrap_err(),
        ProviderError::StaleFence {
            presented: 1,
            highest: 2
        }
    );
    assert_eq!(
        e.provider.stop(l, g1, f).await.unwrap(),
        Some(lc_core::page::StopOutcome::Killed)
    );
    let all = until_last(&e.provider, 41, 1, f, 0).await;
    let last = all.last().unwrap();
    assert_eq!(
        (last.seq(), last.kind(), last.exit()),
        (2, PageKind::Stopped, Some(ExitStatus::signaled(9)))
    );
    let unacked = e.provider.quiesce(l, g1, f).await.unwrap_err();
    assert!(
        matches!(unacked, ProviderError::CommandRunning { ref detail, .. } if detail.contains("acknowledge through seq 2")),
        "{unacked:?}"
    );
    e.provider.ack(l, g1, f, 2).await.unwrap();
    finished(&e.provider, 41, 1).await;

    let q = e.provider.quiesce(l, g1, f).await.unwrap();
    let m = Manifest::from_canonical(&q.manifest).unwrap();
    let hello = lc_core::Digest::of(b"hello");
    let bin = lc_core::Digest::of(b"\x00\xffbin");
    let big_bytes = seq_text(20000);
    let big = lc_core::Digest::of(&big_bytes);
    let want = Manifest::new(
        WorkspaceId(41),
        None,
        vec![
            Entry::dir("a", 0o750),
            Entry::dir("a/b", 0o705),
            Entry::dir("a/b/c", 0o700),
            Entry::file("a/b/c/f.txt", 0o640, 5, hello),
            Entry::symlink("abs", "/etc/passwd"),
            Entry::file("big", 0o600, big_bytes.len() as u64, big),
            Entry::dir("empty", 0o711),
            Entry::symlink("link", "a/b/c/f.txt"),
            Entry::file("top.bin", 0o755, 5, bin),
        ],
    )
    .unwrap();
    assert_eq!(entries_of(&m), entries_of(&want));
    assert_eq!(q.manifest, want.canonical_bytes());
    let head = want.digest().to_hex();
    assert_eq!(
        verify(&q.evidence, &e.provider.public_key(), expected(41, 1)).unwrap(),
        Statement::Quiescence {
            provider_id: "p-test".into(),
            lease_id: 41,
            generation: 1,
            workspace_id: 41,
            head: head.clone(),
        }
    );
    {
        use lc_blob::BlobStore as _;
        assert_eq!(
            e.provider.blobs().get(&big).unwrap(),
            Some(big_bytes.clone())
        );
        assert_eq!(
            e.provider.blobs().get(&hello).unwrap(),
            Some(b"hello".to_vec())
        );
    }
    // Repeated: the same bytes, from this provider, a restarted one, and HTTP.
    assert_eq!(e.provider.quiesce(l, g1, f).await.unwrap(), q);
    let restarted = BwrapProvider::open(config(&e.dir)).unwrap();
    assert_eq!(restarted.quiesce(l, g1, OwnerFence(1)).await.unwrap(), q);
    assert_eq!(client.quiesce(l, g1, f).await.unwrap(), q);
    // Nothing of the instance runs; its workspace stays.
    assert!(e.provider.instance_cgroup(l, g1).pids().is_empty());
    // Its groups are gone, their accounting kept first: the measurement
    // still has the generation's cost, the same from a restarted provider.
    assert!(!e.provider.instance_cgroup(l, g1).exists());
    let key = e.provider.public_key();
    let (cost, externality) = measurement(&e.provider.measure(l, g1).await.unwrap(), &key, 41);
    let cost = cost.expect("the accounting the quiesce kept");
    assert!(cost.peak_memory_bytes > 0, "{cost:?}");
    assert_eq!(
        externality,
        lc_core::observation::ExternalityObservation::no_network_path()
    );
    assert_eq!(
        measurement(&restarted.measure(l, g1).await.unwrap(), &key, 41).0,
        Some(cost)
    );
    assert_eq!(
        verify_signature(
            &e.provider.observe(l, g1).await.unwrap(),
            &e.provider.public_key()
        )
        .unwrap(),
        Statement::Observation {
            provider_id: "p-test".into(),
            lease_id: 41,
            generation: 1,
            state: InstanceState::Exited,
        }
    );
    e.provider.destroy(l, g1).await.unwrap();
    let ws = e.provider.workspace_dir(WorkspaceId(41));
    std::fs::write(ws.join("stale"), b"superseded").unwrap();

    let check = "sha256sum a/b/c/f.txt top.bin big; readlink link abs; \
        stat -c '%n %a %u %F' a a/b a/b/c a/b/c/f.txt big empty top.bin; ls -A; printf x > new";
    let mut r2 = req(41, 2, SMALL, &["sh", "-c", check]);
    r2.workspace_id = WorkspaceId(41);
    r2.first_seq = 3;
    r2.first_input_seq = 1;
    r2.restore = Some(lc_provider::Restore {
        manifest: q.manifest.clone(),
    });
    let a2 = client.allocate(r2.clone()).await.unwrap();
    assert!(a2.created);
    let attachment = a2.attachment.clone().unwrap();
    assert_eq!(
        verify(&attachment, &e.provider.public_key(), expected(41, 2)).unwrap(),
        Statement::Attachment {
            provider_id: "p-test".into(),
            lease_id: 41,
            generation: 2,
            workspace_id: 41,
            head: head.clone(),
            writable: true,
        }
    );
    let mut other = r2.clone();
    other.first_seq = 4;
    assert_eq!(
        e.provider.allocate(other).await.unwrap_err(),
        ProviderError::AllocationConflict {
            lease_id: 41,
            generation: 2
        }
    );
    let replay = e.provider.allocate(r2).await.unwrap();
    assert_eq!(
        (replay.created, replay.attachment),
        (false, Some(attachment))
    );
    let all = until_last(&client, 41, 2, f, 2).await;
    assert_eq!(all[0].seq(), 3);
    let out = String::from_utf8(bytes_of(&all, PageKind::Stdout)).unwrap();
    let want_out = format!(
        "{}  a/b/c/f.txt\n{}  top.bin\n{}  big\na/b/c/f.txt\n/etc/passwd\n\
         a 750 1000 directory\na/b 705 1000 directory\na/b/c 700 1000 directory\n\
         a/b/c/f.txt 640 1000 regular file\nbig 600 1000 regular file\n\
         empty 711 1000 directory\ntop.bin 755 1000 regular file\n\
         a\nabs\nbig\nempty\nlink\ntop.bin\n",
        hello.to_hex(),
        bin.to_hex(),
        big.to_hex()
    );
    assert_eq!(out, want_out);
    assert_eq!(bytes_of(&all, PageKind::Stderr), b"");
    let last = all.last().unwrap();
    assert_eq!(
        (last.kind(), last.exit()),
        (PageKind::Terminal, Some(ExitStatus::exited(0)))
    );
    // The host files are the sandbox account's.
    {
        use std::os::unix::fs::MetadataExt as _;
        let acct = e.provider.sandbox_account();
        let meta = std::fs::symlink_metadata(ws.join("a/b/c/f.txt")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (acct.uid, acct.gid));
    }
    client.ack(l, g2, f, last.seq()).await.unwrap();
    finished(&client, 41, 2).await;
    let q2 = client.quiesce(l, g2, f).await.unwrap();
    let m2 = Manifest::from_canonical(&q2.manifest).unwrap();
    assert_eq!(m2.parent, Some(want.digest()));
    let mut want2 = want.entries.clone();
    want2.push(Entry::file("new", 0o644, 1, lc_core::Digest::of(b"x")));
    assert_eq!(
        entries_of(&m2),
        entries_of(&Manifest::new(WorkspaceId(41), Some(want.digest()), want2).unwrap())
    );
    client.destroy(l, g2).await.unwrap();
    server.abort();
}

/// A restore whose blob is corrupt, or missing, answers `restore_failed`
/// naming the path and digest (over HTTP too) and leaves no instance and
/// no workspace directory; a manifest of another workspace is
/// `invalid_request` and a malformed one `restore_failed`; a workspace
/// holding a fifo is refused `snapshot_refused` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_missing_blob_fails_the_restore_and_leaves_nothing() {
    use lc_core::snapshot::Manifest;
    let e = env();
    let (client, url, server) = served(&e).await;
    let (l, g1) = (SandboxLeaseId(42), Generation(1));
    let mut r1 = req(
        42,
        1,
        SMALL,
        &["sh", "-c", "mkdir d && printf one > d/f && printf two > g"],
    );
    r1.workspace_id = WorkspaceId(42);
    e.provider.allocate(r1).await.unwrap();
    let all = until_last(&e.provider, 42, 1, F, 0).await;
    e.provider
        .ack(l, g1, F, all.last().unwrap().seq())
        .await
        .unwrap();
    finished(&e.provider, 42, 1).await;
    let q = e.provider.quiesce(l, g1, F).await.unwrap();
    let m = Manifest::from_canonical(&q.manifest).unwrap();
    assert_eq!(m.entries.len(), 3);
    e.provider.destroy(l, g1).await.unwrap();
    let one = lc_core::Digest::of(b"one");
    let two = lc_core::Digest::of(b"two");
    std::fs::write(e.provider.blobs().path_of(&one), b"eno").unwrap();
    std::fs::remove_file(e.provider.blobs().path_of(&two)).unwrap();
    let ws = e.provider.workspace_dir(WorkspaceId(42));
    let restore = |generation: i64, manifest: Vec<u8>| {
        let mut r = req(42, generation, SMALL, &["true"]);
        r.workspace_id = WorkspaceId(42);
        r.restore = Some(lc_provider::Restore { manifest });
        r
    };
    let leaves_nothing = |generation: i64| {
        let e = &e;
        let ws = ws.clone();
        async move {
            assert!(!ws.exists(), "a workspace directory was left");
            let left: Vec<_> = std::fs::read_dir(e.dir.join("workspaces"))
                .unwrap()
                .map(|d| d.unwrap().file_name())
                .collect();
            assert!(left.is_empty(), "{left:?}");
            assert!(!e.dir.join(format!("instances/42-{generation}")).exists());
            assert_eq!(
                verify_signature(
                    &e.provider
                        .observe(SandboxLeaseId(42), Generation(generation))
                        .await
                        .unwrap(),
                    &e.provider.public_key()
                )
                .unwrap(),
                Statement::Observation {
                    provider_id: "p-test".into(),
                    lease_id: 42,
                    generation,
                    state: InstanceState::Absent,
                }
            );
        }
    };
    let err = client
        .allocate(restore(2, q.manifest.clone()))
        .await
        .unwrap_err();
    match &err {
        ProviderError::RestoreFailed {
            path,
            digest,
            reason,
            ..
        } => assert_eq!(
            (path.as_str(), digest.as_str(), reason.as_str()),
            ("d/f", one.to_hex().as_str(), "blob_corrupt")
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(err.code(), "restore_failed");
    leaves_nothing(2).await;
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/instances"))
        .json(&lc_provider::http::AllocateBody::of(&restore(
            2,
            q.manifest.clone(),
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 422);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(
        (
            &body["error"]["code"],
            &body["error"]["path"],
            &body["error"]["digest"]
        ),
        (
            &serde_json::json!("restore_failed"),
            &serde_json::json!("d/f"),
            &serde_json::json!(one.to_hex())
        )
    );
    // The corrupt blob put right: the missing one is named next.
    {
        use lc_blob::BlobStore as _;
        e.provider.blobs().put(&one, b"one").unwrap();
    }
    let err = e
        .provider
        .allocate(restore(2, q.manifest.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::RestoreFailed { path, digest, reason, .. }
            if path == "g" && *digest == two.to_hex() && reason == "blob_missing"),
        "{err:?}"
    );
    leaves_nothing(2).await;
    let other = Manifest::new(WorkspaceId(7), None, Vec::new()).unwrap();
    assert_eq!(
        e.provider
            .allocate(restore(2, other.canonical_bytes()))
            .await
            .unwrap_err()
            .code(),
        "invalid_request"
    );
    let mut bad = q.manifest.clone();
    bad.push(b' ');
    let err = e.provider.allocate(restore(2, bad)).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::RestoreFailed { reason, .. } if reason == "manifest_not_canonical" || reason == "manifest_malformed"),
        "{err:?}"
    );
    leaves_nothing(2).await;
    // A restore a crash interrupted leaves its temporary directory; the
    // next open removes it (and nothing else).
    let leftover = e.dir.join("workspaces/.lc-restore-0011223344556677");
    std::fs::create_dir_all(leftover.join("d")).unwrap();
    std::fs::create_dir_all(e.dir.join("workspaces/77")).unwrap();
    drop(BwrapProvider::open(config(&e.dir)).unwrap());
    assert!(!leftover.exists());
    std::fs::remove_dir(e.dir.join("workspaces/77")).unwrap();
    leaves_nothing(2).await;
    // Put right entirely, the restore succeeds.
    {
        use lc_blob::BlobStore as _;
        e.provider.blobs().put(&two, b"two").unwrap();
    }
    let a = e
        .provider
        .allocate(restore(2, q.manifest.clone()))
        .await
        .unwrap();
    assert!(a.attachment.is_some());
    let all = until_last(&e.provider, 42, 2, F, 0).await;
    e.provider
        .ack(
            SandboxLeaseId(42),
            Generation(2),
            F,
            all.last().unwrap().seq(),
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(ws.join("d/f")).unwrap(), b"one");
    e.provider
        .destroy(SandboxLeaseId(42), Generation(2))
        .await
        .unwrap();

    // A fifo cannot be snapshotted.
    let (l3, g3) = (SandboxLeaseId(43), Generation(1));
    e.provider.allocate(sh(43, "mkfifo pipe")).await.unwrap();
    let all = until_last(&e.provider, 43, 1, F, 0).await;
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    e.provider
        .ack(l3, g3, F, all.last().unwrap().seq())
        .await
        .unwrap();
    finished(&e.provider, 43, 1).await;
    let err = e.provider.quiesce(l3, g3, F).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::SnapshotRefused { path, reason, .. } if path == "pipe" && reason == "special_file"),
        "{err:?}"
    );
    assert!(!err.is_transient());
    e.provider.destroy(l3, g3).await.unwrap();
    server.abort();
}

/// The measurement in `envelope`, verified against the provider's key.
fn measurement(
    envelope: &lc_core::evidence::Envelope,
    key: &ed25519_dalek::VerifyingKey,
    lease: i64,
) -> (
    Option<lc_core::observation::CostObservation>,
    lc_core::observation::ExternalityObservation,
) {
    match verify(envelope, key, expected(lease, 1)).unwrap() {
        Statement::Measurement {
            cost, externality, ..
        } => (cost, externality),
        other => panic!("not a measurement: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_measured_from_its_own_accounting_and_unknown_without_it() {
    use lc_core::observation::ExternalityObservation;
    let e = env();
    let key = e.provider.public_key();
    let (l, g) = (SandboxLeaseId(61), Generation(1));
    // Never allocated: nothing to measure, a typed refusal.
    assert_eq!(
        e.provider.measure(l, g).await.unwrap_err(),
        ProviderError::NoInstance {
            lease_id: 61,
            generation: 1
        }
    );
    // A CPU-bound command in a shape without network.
    let a = e
        .provider
        .allocate(sh(
            61,
            "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; printf done",
        ))
        .await
        .unwrap();
    assert!(a.created);
    let all = until_terminal(&e.provider, 61, 1).await;
    assert_eq!(stream(&all, PageKind::Stdout), "done");
    // Acknowledging the terminal page ends the supervisor: nothing of the
    // instance runs any more, so its accounting stays where it is.
    let last = all.last().unwrap().seq();
    e.provider.ack(l, g, F, last).await.unwrap();
    let cg = e.provider.instance_cgroup(l, g);
    let t = Instant::now();
    while !cg.pids().is_empty() {
        assert!(t.elapsed() < DEADLINE, "instance processes {:?}", cg.pids());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = e.provider.measure(l, g).await.unwrap();
    let (cost, externality) = measurement(&first, &key, 61);
    let cost = cost.expect("a live cgroup is measured");
    let kernel = cg.accounting().unwrap();
    assert_eq!(cost.cpu_time_ms, kernel.cpu_time_ns / 1_000_000);
    assert_eq!(cost.peak_memory_bytes, kernel.peak_memory_bytes);
    // 300 000 shell iterations take far more than 50 ms of CPU on any
    // machine, and the group's memory never passed the shape's limit.
    assert!(cost.cpu_time_ms >= 50, "{cost:?}");
    assert!(
        cost.peak_memory_bytes > 0 && cost.peak_memory_bytes <= SMALL.memory_bytes,
        "{cost:?}"
    );
    // No network path: every side effect observed as not happened.
    assert_eq!(externality, ExternalityObservation::no_network_path());
    // Measured again (and over HTTP): the same signed bytes.
    assert_eq!(e.provider.measure(l, g).await.unwrap(), first);
    let (client, _url, server) = served(&e).await;
    assert_eq!(client.measure(l, g).await.unwrap(), first);
    assert_eq!(
        client
            .measure(SandboxLeaseId(62), g)
            .await
            .unwrap_err()
            .code(),
        "no_instance"
    );
    assert_eq!(
        client
            .measure(SandboxLeaseId(0), g)
            .await
            .unwrap_err()
            .code(),
        "invalid_request"
    );
    // The accounting gone (the groups removed under the record, as after a
    // host restart): the cost is unknown, omitted, never zero; what the
    // sandbox proves still holds.
    cg.kill_and_remove().unwrap();
    let (cost, externality) = measurement(&e.provider.measure(l, g).await.unwrap(), &key, 61);
    assert_eq!(cost, None);
    assert_eq!(externality, ExternalityObservation::no_network_path());
    // Destroyed: nothing left to measure.
    e.provider.destroy(l, g).await.unwrap();
    assert_eq!(
        client.measure(l, g).await.unwrap_err(),
        ProviderError::NoInstance {
            lease_id: 61,
            generation: 1
        }
    );
    server.abort();
}

#[tokio::test]
async fn a_network_shape_s_side_effects_are_not_observed() {
    use lc_core::observation::ExternalityObservation;
    let e = env();
    let key = e.provider.public_key();
    let (l, g) = (SandboxLeaseId(63), Generation(1));
    e.provider
        .allocate(req(63, 1, SMALL_NET, &["sleep", "300"]))
        .await
        .unwrap();
    let (cost, externality) = measurement(&e.provider.measure(l, g).await.unwrap(), &key, 63);
    // The sandbox cannot see what went out: every flag unknown.
    assert_eq!(externality, ExternalityObservation::absent());
    assert_eq!(
        serde_json::to_string(&externality).unwrap(),
        "{}".to_owned()
    );
    // The instance runs in its groups: its cost so far is measured (the
    // sandbox and the running command hold memory).
    assert!(cost.is_some_and(|c| c.peak_memory_bytes > 0), "{cost:?}");
    e.provider.destroy(l, g).await.unwrap();
}
