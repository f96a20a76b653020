//! The bubblewrap provider.
//!
//! State directory layout:
//!
//! * `provider.key`: the Ed25519 seed ([`crate::identity`]), `0600`;
//! * `fences/<lease>`: the highest fenced generation ([`crate::fence`]);
//! * `instances/<lease>-<generation>/`: `instance.json` (the request, written
//!   and fsynced before anything starts, so a crash always leaves a trace to
//!   destroy), `run/` (bound at `/.lc/run` inside; the supervisor's socket
//!   `supervisor.sock`), `bwrap.log` (bubblewrap's and the supervisor's own
//!   stderr);
//! * `workspaces/<id>/`: the workspace trees, bound read-write at `/workspace`;
//! * the runtime store ([`crate::runtime`]) in its own directory.
//!
//! An instance is `bwrap ... -- /.lc/supervisor --socket ... -- ARGV`:
//! every namespace unshared (`--unshare-all`, the network shared back only
//! when the shape has it), a user namespace with uid and gid 1000 inside,
//! every capability dropped, `--die-with-parent` (a dead provider takes its
//! instances with it), `--new-session` (no terminal to inject into), a tmpfs
//! root remounted read-only after setup, the runtime's tree bound read-only
//! (the `base` runtime: the host's `/usr` plus `/bin`, `/lib`, `/lib64`,
//! `/sbin` as symlinks into it; an imported tree: each top-level entry
//! bound read-only, the reserved names `proc`, `dev`, `tmp`, `workspace`
//! and `.lc` left to the provider), `/proc`, a minimal `/dev`, a tmpfs
//! `/tmp`, the workspace at `/workspace`, the supervisor binary read-only at
//! `/.lc/supervisor`, and a clean environment. bubblewrap's own init is PID 1
//! of the instance's PID namespace and reaps orphans; the supervisor is its
//! only child (PID 2) and a child subreaper for the command's processes.
//! The supervisor binary runs inside the runtime's tree, so a tree runtime
//! needs the C library the supervisor was linked against (the `base`
//! runtime has the host's).
//!
//! Limits: the bwrap process joins the instance's cgroups
//! ([`crate::cgroup`]) and sets its rlimits between fork and exec, so the
//! whole instance runs inside them. rlimits are only ever lowered, never
//! above the current hard limit (raising needs `CAP_SYS_RESOURCE`).
//!
//! Destroy(L, G) persists the fence first, then kills and removes every
//! instance of L with a generation `<= G` (every process in its cgroups,
//! `SIGKILL` until empty), then removes their directories (workspaces
//! stay). Mutations are serialized by one lock; each is bounded.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use lc_core::evidence::{Envelope, InstanceState, Statement, sign};
use lc_core::manifest::{EntryType, Manifest};
use lc_core::page::{
    PAGES_PER_REQUEST_MAX, Page, SPOOL_BYTES_DEFAULT, SocketRequest, SocketResponse,
};
use lc_core::{Generation, ProviderId, SandboxLeaseId};

use crate::cgroup::{CgroupRoot, InstanceCgroup, Limits};
use crate::fence::Fences;
use crate::runtime::{RuntimeRoot, RuntimeStore};
use crate::{AllocateRequest, Allocation, Provider, ProviderError, identity, socket};

/// The uid and gid of the command inside an instance.
pub const SANDBOX_UID: u32 = 1000;

/// The socket path inside the instance.
const SOCKET_IN_SANDBOX: &str = "/.lc/run/supervisor.sock";

/// The longest unix socket path (`sun_path` less its NUL).
const SOCKET_PATH_BYTES_MAX: usize = 107;

/// The most instances one destroy inspects for a lease: far above the
/// generations a lease ever reaches on one provider.
const INSTANCES_SCANNED_MAX: usize = 100_000;

/// The most bytes of `bwrap.log` quoted in a start failure.
const LOG_TAIL_BYTES_MAX: usize = 2048;

/// Top-level names of a runtime tree the provider mounts itself.
const RESERVED_TOP: [&str; 5] = ["proc", "dev", "tmp", "workspace", ".lc"];

/// The rlimits of every instance (each also capped at the current hard limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlimitPolicy {
    /// `RLIMIT_NOFILE` soft and hard.
    pub nofile: u64,
    /// `RLIMIT_CORE` soft and hard, bytes (0: no core dumps).
    pub core_bytes: u64,
    /// `RLIMIT_FSIZE` soft and hard: the largest file an instance writes, bytes.
    pub fsize_bytes: u64,
}

impl Default for RlimitPolicy {
    /// 1024 files, no core dumps, files up to 4 GiB.
    fn default() -> RlimitPolicy {
        RlimitPolicy {
            nofile: 1024,
            core_bytes: 0,
            fsize_bytes: 4 << 30,
        }
    }
}

/// How a [`BwrapProvider`] is set up.
#[derive(Debug, Clone)]
pub struct BwrapConfig {
    /// The provider's id, in its evidence.
    pub provider_id: ProviderId,
    /// The state directory (see the module docs).
    pub state_dir: PathBuf,
    /// The runtime store's directory.
    pub runtime_dir: PathBuf,
    /// The `lc-supervisor` binary bound into every instance.
    pub supervisor_bin: PathBuf,
    /// The bubblewrap binary.
    pub bwrap_bin: PathBuf,
    /// Where cgroups are mounted (`/sys/fs/cgroup`).
    pub cgroup_mount: PathBuf,
    /// The provider's parent group name (`little-compute`).
    pub cgroup_parent: String,
    /// The supervisor's spool bound, bytes.
    pub spool_bytes_max: u64,
    /// The rlimits.
    pub rlimits: RlimitPolicy,
    /// How long allocate waits for the supervisor's socket.
    pub start_wait_max: Duration,
}

impl BwrapConfig {
    /// The defaults for `provider_id` with state in `state_dir`: runtimes in
    /// `state_dir/runtimes`, `/usr/bin/bwrap`, `/sys/fs/cgroup`, parent
    /// group `little-compute`, the default spool and rlimits, 10 s to start.
    pub fn new(provider_id: ProviderId, state_dir: &Path, supervisor_bin: &Path) -> BwrapConfig {
        BwrapConfig {
            provider_id,
            state_dir: state_dir.to_owned(),
            runtime_dir: state_dir.join("runtimes"),
            supervisor_bin: supervisor_bin.to_owned(),
            bwrap_bin: PathBuf::from("/usr/bin/bwrap"),
            cgroup_mount: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "little-compute".to_owned(),
            spool_bytes_max: SPOOL_BYTES_DEFAULT,
            rlimits: RlimitPolicy::default(),
            start_wait_max: Duration::from_secs(10),
        }
    }
}

/// What `instance.json` holds: the request an instance was allocated for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct InstanceRecord {
    lease_id: i64,
    generation: i64,
    exec_id: i64,
    attempt: i32,
    runtime: String,
    shape: String,
    command: Vec<String>,
    workspace_id: i64,
}

impl InstanceRecord {
    fn of(req: &AllocateRequest) -> InstanceRecord {
        InstanceRecord {
            lease_id: req.lease_id.0,
            generation: req.generation.0,
            exec_id: req.exec_id.0,
            attempt: req.attempt.0,
            runtime: req.runtime.to_hex(),
            shape: req.shape.name.to_owned(),
            command: req.command.argv().to_vec(),
            workspace_id: req.workspace_id.0,
        }
    }
}

/// The bubblewrap provider; see the module docs.
pub struct BwrapProvider {
    cfg: BwrapConfig,
    key: SigningKey,
    fences: Fences,
    runtimes: RuntimeStore,
    cgroups: CgroupRoot,
    /// Serializes allocate and destroy.
    lock: tokio::sync::Mutex<()>,
}

fn instance_name(lease_id: i64, generation: i64) -> String {
    format!("{lease_id}-{generation}")
}

fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::io(what, e)
}

fn check_ids(lease_id: SandboxLeaseId, generation: Generation) -> Result<(), ProviderError> {
    if lease_id.0 < 1 || generation.0 < 1 {
        return Err(ProviderError::InvalidRequest {
            detail: format!("lease {lease_id} generation {generation}: both must be >= 1"),
        });
    }
    Ok(())
}

/// Sets the policy's rlimits on the calling process, never above the
/// current hard limits. Async-signal-safe (getrlimit/setrlimit only).
fn apply_rlimits(p: RlimitPolicy) -> std::io::Result<()> {
    for (res, want) in [
        (libc::RLIMIT_NOFILE, p.nofile),
        (libc::RLIMIT_CORE, p.core_bytes),
        (libc::RLIMIT_FSIZE, p.fsize_bytes),
    ] {
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write only `cur`.
        if unsafe { libc::getrlimit(res, &mut cur) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let v = want.min(cur.rlim_max);
        let new = libc::rlimit {
            rlim_cur: v,
            rlim_max: v,
        };
        if unsafe { libc::setrlimit(res, &new) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl BwrapProvider {
    /// Opens (creating if needed) the provider's state: its key, fences,
    /// instance and workspace directories, the runtime store, and detects
    /// the cgroup version.
    ///
    /// # Errors
    /// [`ProviderError::Io`] for an unusable state directory, key, cgroup
    /// mount, supervisor binary, or a state path too long for a unix socket.
    pub fn open(cfg: BwrapConfig) -> Result<BwrapProvider, ProviderError> {
        for d in ["instances", "workspaces"] {
            let p = cfg.state_dir.join(d);
            std::fs::create_dir_all(&p).map_err(|e| io(p.display(), e))?;
        }
        let key = identity::load_or_create(&cfg.state_dir.join(identity::KEY_FILE))?;
        let fences = Fences::open(&cfg.state_dir.join("fences"))?;
        let runtimes =
            RuntimeStore::open(&cfg.runtime_dir).map_err(|e| io(cfg.runtime_dir.display(), e))?;
        let cgroups = CgroupRoot::detect(&cfg.cgroup_mount, &cfg.cgroup_parent)?;
        if !cfg.supervisor_bin.is_file() {
            return Err(io(
                cfg.supervisor_bin.display(),
                "the supervisor binary does not exist",
            ));
        }
        if !cfg.bwrap_bin.is_file() {
            return Err(io(cfg.bwrap_bin.display(), "bubblewrap does not exist"));
        }
        // The longest socket path: the largest lease and generation.
        let longest = cfg
            .state_dir
            .join("instances")
            .join(instance_name(i64::MAX, i64::MAX))
            .join("run/supervisor.sock");
        if longest.as_os_str().len() > SOCKET_PATH_BYTES_MAX {
            return Err(io(
                cfg.state_dir.display(),
                format!(
                    "state directory path too long for a unix socket (at most {SOCKET_PATH_BYTES_MAX} bytes below it)"
                ),
            ));
        }
        Ok(BwrapProvider {
            cfg,
            key,
            fences,
            runtimes,
            cgroups,
            lock: tokio::sync::Mutex::new(()),
        })
    }

    /// The runtime store the provider runs instances from.
    pub fn runtimes(&self) -> &RuntimeStore {
        &self.runtimes
    }

    /// The provider's configuration.
    pub fn config(&self) -> &BwrapConfig {
        &self.cfg
    }

    /// The host directory of workspace `id`.
    pub fn workspace_dir(&self, id: lc_core::WorkspaceId) -> PathBuf {
        self.cfg.state_dir.join("workspaces").join(id.0.to_string())
    }

    /// The cgroups of an instance (whether or not they exist).
    pub fn instance_cgroup(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> InstanceCgroup {
        self.cgroups
            .instance(&instance_name(lease_id.0, generation.0))
    }

    fn instance_dir(&self, lease_id: i64, generation: i64) -> PathBuf {
        self.cfg
            .state_dir
            .join("instances")
            .join(instance_name(lease_id, generation))
    }

    fn read_record(&self, dir: &Path) -> Result<Option<InstanceRecord>, ProviderError> {
        let p = dir.join("instance.json");
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| io(p.display(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(p.display(), e)),
        }
    }

    fn state_of(&self, lease_id: i64, generation: i64) -> InstanceState {
        if !self.instance_dir(lease_id, generation).exists() {
            return InstanceState::Absent;
        }
        let cg = self.cgroups.instance(&instance_name(lease_id, generation));
        if cg.pids().is_empty() {
            InstanceState::Exited
        } else {
            InstanceState::Running
        }
    }

    fn bwrap_args(
        &self,
        req: &AllocateRequest,
        root: &RuntimeRoot,
        workspace: &Path,
        run: &Path,
    ) -> Result<Vec<String>, ProviderError> {
        let p = |p: &Path| p.to_string_lossy().into_owned();
        let mut a: Vec<String> = Vec::new();
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        push(&["--unshare-all"]);
        if req.shape.network {
            push(&["--share-net"]);
        }
        push(&[
            "--unshare-user",
            "--uid",
            &SANDBOX_UID.to_string(),
            "--gid",
            &SANDBOX_UID.to_string(),
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "--setenv",
            "HOME",
            "/workspace",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--tmpfs",
            "/",
        ]);
        match root {
            RuntimeRoot::HostUsr => {
                push(&["--ro-bind", "/usr", "/usr"]);
                for (link, target) in [
                    ("/bin", "usr/bin"),
                    ("/lib", "usr/lib"),
                    ("/lib64", "usr/lib64"),
                    ("/sbin", "usr/sbin"),
                ] {
                    push(&["--symlink", target, link]);
                }
            }
            RuntimeRoot::Tree(tree) => {
                let manifest = self.runtimes.manifest(&req.runtime).ok_or_else(|| {
                    ProviderError::UnknownRuntime {
                        digest: req.runtime.to_hex(),
                    }
                })?;
                let Manifest::Tree { entries } = manifest else {
                    return Err(ProviderError::UnknownRuntime {
                        digest: req.runtime.to_hex(),
                    });
                };
                for e in entries
                    .iter()
                    .filter(|e| !e.path.contains('/') && !RESERVED_TOP.contains(&e.path.as_str()))
                {
                    let dest = format!("/{}", e.path);
                    match e.entry_type {
                        EntryType::Symlink => {
                            push(&["--symlink", e.target.as_deref().unwrap_or(""), &dest])
                        }
                        EntryType::Dir | EntryType::File => {
                            push(&["--ro-bind", &p(&tree.join(&e.path)), &dest])
                        }
                    }
                }
            }
        }
        push(&[
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            &p(workspace),
            "/workspace",
            "--ro-bind",
            &p(&self.cfg.supervisor_bin),
            "/.lc/supervisor",
            "--bind",
            &p(run),
            "/.lc/run",
            "--remount-ro",
            "/",
            "--chdir",
            "/workspace",
            "--",
            "/.lc/supervisor",
            "--socket",
            SOCKET_IN_SANDBOX,
            "--spool-bytes",
            &self.cfg.spool_bytes_max.to_string(),
            "--",
        ]);
        a.extend(req.command.argv().iter().cloned());
        Ok(a)
    }

    async fn start(&self, req: &AllocateRequest, dir: &Path) -> Result<(), ProviderError> {
        let root =
            self.runtimes
                .resolve(&req.runtime)
                .ok_or_else(|| ProviderError::UnknownRuntime {
                    digest: req.runtime.to_hex(),
                })?;
        let workspace = self.workspace_dir(req.workspace_id);
        std::fs::create_dir_all(&workspace).map_err(|e| io(workspace.display(), e))?;
        let run = dir.join("run");
        std::fs::create_dir_all(&run).map_err(|e| io(run.display(), e))?;
        let args = self.bwrap_args(req, &root, &workspace, &run)?;
        let cg = self.cgroups.create(
            &instance_name(req.lease_id.0, req.generation.0),
            Limits {
                memory_bytes: req.shape.memory_bytes,
                pids_max: req.shape.pids_max,
                cpu_shares: req.shape.cpu_shares,
            },
        )?;
        let procs: Vec<CString> = cg.procs_paths()?;
        let log_path = dir.join("bwrap.log");
        let log = std::fs::File::create(&log_path).map_err(|e| io(log_path.display(), e))?;
        let log2 = log.try_clone().map_err(|e| io(log_path.display(), e))?;
        let mut cmd = tokio::process::Command::new(&self.cfg.bwrap_bin);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(false);
        let rl = self.cfg.rlimits;
        // SAFETY: the closure only calls open/write/close (join_self) and
        // getrlimit/setrlimit, all async-signal-safe; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                InstanceCgroup::join_self(&procs)?;
                apply_rlimits(rl)
            });
        }
        let mut child = cmd.spawn().map_err(|e| ProviderError::StartFailed {
            detail: format!("bwrap: {e}"),
        })?;
        let socket = run.join("supervisor.sock");
        let t = Instant::now();
        // Bounded by start_wait_max.
        loop {
            if socket.exists() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read(&log_path).unwrap_or_default();
                let tail = &log[log.len().saturating_sub(LOG_TAIL_BYTES_MAX)..];
                return Err(ProviderError::StartFailed {
                    detail: format!(
                        "bwrap exited with {status}: {}",
                        String::from_utf8_lossy(tail).trim_end()
                    ),
                });
            }
            if t.elapsed() > self.cfg.start_wait_max {
                return Err(ProviderError::StartFailed {
                    detail: format!(
                        "the supervisor's socket did not appear within {:?}",
                        self.cfg.start_wait_max
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The outer bwrap process is our child: reap it when it ends.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(())
    }

    /// Kills and removes the instance `(lease_id, generation)`; returns
    /// whether it existed.
    fn remove_instance(&self, lease_id: i64, generation: i64) -> Result<bool, ProviderError> {
        let dir = self.instance_dir(lease_id, generation);
        let cg = self.cgroups.instance(&instance_name(lease_id, generation));
        let existed = dir.exists() || cg.exists();
        cg.kill_and_remove()?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(dir.display(), e)),
        }
        Ok(existed)
    }

    /// The generations of `lease_id` with an instance directory here.
    fn generations_of(&self, lease_id: i64) -> Result<Vec<i64>, ProviderError> {
        let dir = self.cfg.state_dir.join("instances");
        let prefix = format!("{lease_id}-");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir)
            .map_err(|e| io(dir.display(), e))?
            .take(INSTANCES_SCANNED_MAX)
        {
            let e = e.map_err(|e| io(dir.display(), e))?;
            if let Some(g) = e
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|g| g.parse::<i64>().ok())
            {
                out.push(g);
            }
        }
        Ok(out)
    }

    fn signed(&self, s: Statement) -> Envelope {
        sign(&s, &self.key)
    }

    fn socket_of(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<PathBuf, ProviderError> {
        check_ids(lease_id, generation)?;
        let dir = self.instance_dir(lease_id.0, generation.0);
        if !dir.join("instance.json").exists() {
            return Err(ProviderError::NoInstance {
                lease_id: lease_id.0,
                generation: generation.0,
            });
        }
        Ok(dir.join("run/supervisor.sock"))
    }
}

#[async_trait]
impl Provider for BwrapProvider {
    fn id(&self) -> &ProviderId {
        &self.cfg.provider_id
    }

    fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    async fn allocate(&self, req: AllocateRequest) -> Result<Allocation, ProviderError> {
        check_ids(req.lease_id, req.generation)?;
        if req.workspace_id.0 < 1 {
            return Err(ProviderError::InvalidRequest {
                detail: format!("workspace {} must be >= 1", req.workspace_id),
            });
        }
        let _guard = self.lock.lock().await;
        let (l, g) = (req.lease_id.0, req.generation.0);
        let fenced_through = self.fences.get(l)?;
        if fenced_through >= g {
            return Err(ProviderError::Fenced {
                lease_id: l,
                generation: g,
                fenced_through,
            });
        }
        let dir = self.instance_dir(l, g);
        let record = InstanceRecord::of(&req);
        if let Some(existing) = self.read_record(&dir)? {
            if existing != record {
                return Err(ProviderError::AllocationConflict {
                    lease_id: l,
                    generation: g,
                });
            }
            return Ok(Allocation {
                lease_id: req.lease_id,
                generation: req.generation,
                state: self.state_of(l, g),
                created: false,
            });
        }
        if self.runtimes.resolve(&req.runtime).is_none() {
            return Err(ProviderError::UnknownRuntime {
                digest: req.runtime.to_hex(),
            });
        }
        // A directory without a record is a start that never completed.
        self.remove_instance(l, g)?;
        std::fs::create_dir_all(&dir).map_err(|e| io(dir.display(), e))?;
        let rec_path = dir.join("instance.json");
        let bytes = serde_json::to_vec(&record).map_err(|e| io(rec_path.display(), e))?;
        std::fs::write(&rec_path, bytes)
            .and_then(|()| std::fs::File::open(&rec_path)?.sync_all())
            .map_err(|e| io(rec_path.display(), e))?;
        if let Err(e) = self.start(&req, &dir).await {
            // Nothing of a failed start stays: no process, group or directory.
            let _ = self.remove_instance(l, g);
            return Err(e);
        }
        Ok(Allocation {
            lease_id: req.lease_id,
            generation: req.generation,
            state: self.state_of(l, g),
            created: true,
        })
    }

    async fn destroy(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        check_ids(lease_id, generation)?;
        let _guard = self.lock.lock().await;
        let (l, g) = (lease_id.0, generation.0);
        self.fences.raise(l, g)?;
        let mut existed = false;
        let mut gens = self.generations_of(l)?;
        if !gens.contains(&g) {
            gens.push(g);
        }
        for gen_ in gens.into_iter().filter(|x| *x <= g) {
            // Blocks this task for at most the kill bound.
            let removed = self.remove_instance(l, gen_)?;
            existed |= removed;
        }
        let provider_id = self.cfg.provider_id.as_str().to_owned();
        Ok(self.signed(if existed {
            Statement::Fence {
                provider_id,
                lease_id: l,
                generation: g,
            }
        } else {
            Statement::Absence {
                provider_id,
                lease_id: l,
                generation: g,
            }
        }))
    }

    async fn observe(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        check_ids(lease_id, generation)?;
        Ok(self.signed(Statement::Observation {
            provider_id: self.cfg.provider_id.as_str().to_owned(),
            lease_id: lease_id.0,
            generation: generation.0,
            state: self.state_of(lease_id.0, generation.0),
        }))
    }

    async fn pages(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<Page>, ProviderError> {
        let sock = self.socket_of(lease_id, generation)?;
        if !sock.exists() {
            // The supervisor finished (its terminal page was acknowledged).
            return Ok(Vec::new());
        }
        let max = max.min(PAGES_PER_REQUEST_MAX as usize) as u32;
        match socket::call(sock, SocketRequest::Pages { after_seq, max }).await? {
            SocketResponse::Pages(p) => Ok(p),
            SocketResponse::Error { code } => {
                Err(ProviderError::SupervisorUnavailable { detail: code })
            }
            SocketResponse::Acked { .. } => Err(ProviderError::SupervisorUnavailable {
                detail: "an ack answer to a pages request".into(),
            }),
        }
    }

    async fn ack(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        through_seq: i64,
    ) -> Result<(), ProviderError> {
        let sock = self.socket_of(lease_id, generation)?;
        if !sock.exists() {
            // The supervisor exits only after its terminal page was acknowledged.
            return Ok(());
        }
        match socket::call(sock.clone(), SocketRequest::Ack { through_seq }).await {
            Ok(SocketResponse::Acked { .. }) => Ok(()),
            Ok(SocketResponse::Error { code }) if code == "ack_ahead" => {
                Err(ProviderError::InvalidRequest {
                    detail: format!("ack through {through_seq} is ahead of the spool"),
                })
            }
            Ok(other) => Err(ProviderError::SupervisorUnavailable {
                detail: format!("{other:?}"),
            }),
            // The supervisor may exit right after answering the terminal ack.
            Err(_) if !sock.exists() => Ok(()),
            Err(e) => Err(e),
        }
    }
}
