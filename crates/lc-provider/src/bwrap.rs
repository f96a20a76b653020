//! The bubblewrap provider.
//!
//! State directory layout (the provider runs as root; "the account" is the
//! unprivileged sandbox account of [`crate::account`], `lc-sandbox` by
//! default):
//!
//! * the state directory itself: root's, `0711` (the account may pass
//!   through, never list);
//! * `provider.key`: the Ed25519 seed ([`crate::identity`]), root's `0600`;
//! * `fences/<lease>`: the highest fenced generation ([`crate::fence`]),
//!   in root's `0700` directory;
//! * `sent/<lease>-<generation>`: the hand-off marker, in root's `0700`
//!   directory: created and fsynced (with its directory) once that
//!   generation's supervisor has answered the start handshake and before
//!   the provider releases its command, so the supervisor never starts a
//!   command the marker does not record, and a start that failed before
//!   the release (bubblewrap or the supervisor could not run: a runtime
//!   without the C library the supervisor needs) leaves no marker. It outlives the instance (a
//!   failed start and a destroy remove only the instance directory): its
//!   absence is what [`Provider::prove_not_sent`] signs, so it is never
//!   removed. At open every instance with a record gets its marker if it
//!   lacks one (instances started before markers were kept);
//! * `instances/` (root's `0711`) `<lease>-<generation>/` (root's `0711`):
//!   `instance.json` (root's `0600`: the request, written and fsynced
//!   before anything starts, so a crash always leaves a trace to destroy),
//!   `run/` (root's `0700`, not bound into the instance): the supervisor's
//!   listening socket `supervisor.sock` (root's `0600`), bound by the
//!   provider before bubblewrap starts and handed to the supervisor as an
//!   inherited descriptor (`--listen-fd`), and `done` (root's `0600`,
//!   inherited as `--done-fd`), which the supervisor writes once its last
//!   page is acknowledged; the read end of the release pipe is inherited
//!   as `--release-fd` (see *Start order*); `bwrap.log` (root's `0600`: bubblewrap's and the
//!   supervisor's own stderr), `quiesced.json` (root's `0600`, once
//!   quiesced: the manifest and the signed quiescence, answered again to
//!   every repeated quiesce);
//! * `workspaces/` (root's `0711`) `<id>/`: the workspace trees, each the
//!   account's `0700`, bound read-write at `/workspace`;
//! * `blobs/` (or the configured blob directory): the content-addressed
//!   blob store ([`lc_blob::LocalBlobStore`]) of workspace snapshots'
//!   file bytes, root's;
//! * the runtime store ([`crate::runtime`]) in its own directory, which
//!   the provider makes searchable by others when it owns it and they
//!   cannot (bubblewrap binds the trees below it as the account).
//!
//! So the only host directory an instance can write is its workspace, made
//! by the provider for the account (through a descriptor opened without
//! following symlinks); nothing else of the state directory is readable by
//! the account. The command cannot remove, replace or reach the socket the
//! provider talks to (its name is not in the sandbox, the root is
//! read-only), nor take the supervisor's descriptor of it (the supervisor
//! is not dumpable and marks it close-on-exec): whoever answers there is
//! the supervisor.
//!
//! # Start order
//!
//! allocate writes the record, spawns bubblewrap and waits (at most
//! `start_wait_max`) for the supervisor to answer a `status` request on
//! its socket: the start handshake. The supervisor answers before its
//! command exists, since it starts the command only when the provider
//! writes one byte to the release pipe (`--release-fd`). After the answer
//! the provider writes the hand-off marker, then that byte, and allocate
//! returns. So a command cannot stall or fake the handshake (stopping its
//! supervisor later only stalls its own instance, whose Lease then
//! expires), and a start that fails before the release (bubblewrap
//! refused its arguments, the supervisor could not run in the runtime's
//! tree) ends without a marker: its `prove_not_sent` is signed. An
//! allocate abandoned before the marker leaves a record without one: the
//! next allocate of that generation removes it and starts afresh, so a
//! generation never has two instances.
//!
//! # Host identity
//!
//! Every instance runs as the account, never as root. The provider forks
//! the bubblewrap process; between fork and exec the child joins the
//! instance's cgroups and sets its rlimits (both need root), then drops
//! every supplementary group, sets real, effective and saved gid and uid
//! to the account's and sets `no_new_privs` ([`crate::account`]), and only
//! then executes bubblewrap. bubblewrap is not set-uid (a set-id binary is
//! refused at open) and builds the user namespace unprivileged: uid and
//! gid 1000 inside map to the account's uid and gid on the host. A file
//! the sandbox writes into its workspace is owned by the account on the
//! host; every bound host path is accessed with the account's credentials,
//! so a root-owned `0600` file stays unreadable (`EACCES`) even when bound;
//! root-owned files appear inside as the overflow uid 65534. Had bubblewrap
//! run as root, uid 1000 inside would be host root, and every write and
//! every bound path would carry root's credentials. At open the provider
//! checks the account can reach what bubblewrap binds (the supervisor
//! binary, the instance and workspace directories, the runtime store).
//!
//! # What a network shape reaches
//!
//! Its own network namespace with `lo` and `tap0`, NATed by slirp4netns
//! running on the host as the sandbox account ([`crate::slirp`]): outbound
//! TCP and UDP to any address the host itself can reach, the host's own
//! addresses other than loopback included (so a host service that must
//! stay private listens on loopback only, or is firewalled for the
//! sandbox account's uid); DNS through `10.0.2.3`, slirp4netns's forwarder
//! to the host's resolver (the sandbox has no `/etc/resolv.conf` unless its
//! runtime brings one). It cannot reach the host's loopback (not its own
//! `127.0.0.1`, and not through the gateway `10.0.2.2`:
//! `--disable-host-loopback`), another instance (each has its own
//! namespace and nothing listens for it on the host), abstract unix
//! sockets of the host (they belong to the host's network namespace), or
//! be connected to from outside (nothing is forwarded in). No IPv6.
//!
//! All instances share the one account: they are kept apart by their
//! namespaces (none sees another's processes, mounts or network), not by
//! host uids.
//!
//! # Instances
//!
//! An instance is `bwrap ... -- /.lc/supervisor --listen-fd N --done-fd M --release-fd R ... -- ARGV`:
//! every namespace unshared (`--unshare-all`, the network's too: a shape
//! without the network has only its own loopback, a network shape gets
//! outbound-only NAT through slirp4netns, [`crate::slirp`]), a user namespace with uid and gid 1000 inside,
//! every capability dropped, `--die-with-parent` (a dead provider takes its
//! instances with it), `--new-session` (no terminal to inject into), a tmpfs
//! root remounted read-only after setup, the runtime's tree bound read-only
//! (the `base` runtime: the host's `/usr` plus `/bin`, `/lib`, `/lib64`,
//! `/sbin` as symlinks into it; an imported tree: each top-level entry
//! bound read-only, the reserved names `proc`, `dev`, `tmp`, `workspace`
//! and `.lc` left to the provider), `/proc`, a minimal `/dev` (read-only
//! but for its devices and a tmpfs `/dev/shm`), a tmpfs `/tmp` (each tmpfs
//! bounded to [`tmpfs_bytes_max`] of the shape's memory: a full one is the
//! command's `ENOSPC`), the workspace at `/workspace`, the supervisor binary read-only at
//! `/.lc/supervisor`, and a clean environment. Each of these works
//! unprivileged. bubblewrap's own init is PID 1
//! of the instance's PID namespace and reaps orphans; the supervisor is its
//! only child (PID 2) and a child subreaper for the command's processes.
//! The supervisor binary runs inside the runtime's tree, so a tree runtime
//! needs the C library the supervisor was linked against (the `base`
//! runtime has the host's). An imported tree's files are root's on the
//! host, so the sandbox reads what their "other" permission bits allow.
//!
//! Limits: the bwrap process joins the instance's cgroups
//! ([`crate::cgroup`]) and sets its rlimits between fork and exec, so the
//! whole instance runs inside them. rlimits are only ever lowered, never
//! above the current hard limit (raising needs `CAP_SYS_RESOURCE`). When
//! the memory limit is reached the kernel's OOM killer takes the command:
//! the supervisor starts it with `oom_score_adj` 1000 and keeps the
//! default itself, so the supervisor lives to page the command's output
//! and its terminal status (signal 9).
//!
//! Prove-not-sent(L, G) persists the fence first, like destroy, so no
//! later allocate of G can write its hand-off marker; then, under the same
//! lock allocate holds from its fence check through the release of the
//! command, it signs `not_sent` only when that marker does not exist.
//!
//! Quiesce(L, G) asks the supervisor (with the caller's fence) whether the
//! command has ended and its last page is acknowledged (a supervisor that
//! finished has written its done file, which means exactly that), else it
//! refuses `command_running` and changes nothing; then it kills what is
//! left of the instance (its directory and workspace stay), walks the
//! workspace ([`lc_blob::tree::snapshot_tree`], no link followed, every
//! blob put and fsynced first) with the head the generation was restored
//! from as parent, signs `quiescence` and persists the answer before it
//! returns it.
//!
//! Allocate with a restore removes the workspace's old directory (the
//! snapshot supersedes it) and rebuilds the snapshot's tree
//! ([`lc_blob::tree::restore_tree`], all or nothing, every blob's digest and
//! size checked, every entry the account's) before the instance record is
//! written, then starts as usual and signs `attachment` (the head,
//! writable); a replay signs the same statement again (Ed25519 signatures
//! are deterministic, so the envelope is byte-identical).
//!
//! Destroy(L, G) persists the fence first, then kills and removes every
//! instance of L with a generation `<= G` (every process in its cgroups,
//! `SIGKILL` until empty), then removes their directories (workspaces
//! stay). Mutations are serialized by one lock; each is bounded.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lc_blob::LocalBlobStore;
use lc_blob::tree::{TreeError, restore_tree, snapshot_tree};
use lc_core::snapshot::Manifest as SnapshotManifest;
use lc_core::{Digest, WorkspaceId};

use async_trait::async_trait;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use lc_core::evidence::{Envelope, InstanceState, Statement, sign};
use lc_core::manifest::{EntryType, Manifest};
use lc_core::observation::{CostObservation, ExternalityObservation};
use lc_core::owner::OwnerFence;
use lc_core::page::{
    FIRST_SEQ_MAX, INPUT_BYTES_MAX, PAGES_PER_REQUEST_MAX, Page, SPOOL_BYTES_DEFAULT,
    SPOOL_PAGES_DEFAULT, SocketRequest, SocketResponse, SpoolStatus, StopOutcome,
};
use lc_core::{Generation, ProviderId, SandboxLeaseId};

use crate::account::{self, SandboxAccount};
use crate::cgroup::{CgroupRoot, InstanceCgroup, Limits};
use crate::fence::Fences;
use crate::runtime::{RuntimeRoot, RuntimeStore};
use crate::slirp;
use crate::{
    AllocateRequest, Allocation, InstanceSummary, MANIFEST_BYTES_MAX, Provider, ProviderError,
    Quiesced, Restore, identity, socket,
};

/// The uid and gid of the command inside an instance; on the host they are
/// the sandbox account's ([`BwrapProvider::sandbox_account`]).
pub const SANDBOX_UID: u32 = 1000;

/// The supervisor's socket in an instance's `run/` directory.
const SOCKET_FILE: &str = "supervisor.sock";

/// The file in an instance's `run/` directory the supervisor writes (through
/// a descriptor it inherits) once its last page is acknowledged.
const DONE_FILE: &str = "done";

/// What a finished supervisor's done file holds (`lc_supervisor::DONE_TEXT`).
const DONE_TEXT: &str = "last_page_acked\n";

/// The longest unix socket path (`sun_path` less its NUL).
const SOCKET_PATH_BYTES_MAX: usize = 107;

/// The longest state directory path, in bytes, under which every
/// instance's supervisor socket (`instances/<lease>-<generation>/run/
/// supervisor.sock`, for the largest lease and generation) still fits in a
/// unix socket path.
pub fn state_dir_bytes_max() -> usize {
    let below = std::path::Path::new("/instances")
        .join(instance_name(i64::MAX, i64::MAX))
        .join("run")
        .join(SOCKET_FILE);
    SOCKET_PATH_BYTES_MAX.saturating_sub(below.as_os_str().len())
}

/// The most instance directories one destroy or inventory inspects: far
/// above the instances one host runs.
pub const INSTANCES_SCANNED_MAX: usize = 100_000;

/// The most bytes of `bwrap.log` quoted in a start failure.
const LOG_TAIL_BYTES_MAX: usize = 2048;

/// The directory of the hand-off markers, in the state directory.
const SENT_DIR: &str = "sent";

/// Top-level names of a runtime tree the provider mounts itself.
const RESERVED_TOP: [&str; 5] = ["proc", "dev", "tmp", "workspace", ".lc"];

/// `close_range`'s flag that marks the range close-on-exec instead of
/// closing it (Linux 5.11).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Each of an instance's two writable tmpfs mounts, `/tmp` and `/dev/shm`,
/// holds at most `1 / TMPFS_MEMORY_DIVISOR` of the shape's memory. Their
/// pages are charged to the instance's memory cgroup and no process owns
/// them, so the OOM killer cannot free them by killing anyone: bounded so,
/// both full still leave half of the limit to the processes (the
/// supervisor's spool among them), and a full one answers the command's
/// write `ENOSPC` instead of making the kernel kill the supervisor.
pub const TMPFS_MEMORY_DIVISOR: u64 = 4;

/// The size of each writable tmpfs of an instance with `memory_bytes`, in
/// bytes: [`TMPFS_MEMORY_DIVISOR`]'s share, in whole 4 KiB pages.
pub fn tmpfs_bytes_max(memory_bytes: u64) -> u64 {
    (memory_bytes / TMPFS_MEMORY_DIVISOR) & !4095
}

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
    /// The slirp4netns binary, started for every instance of a network
    /// shape ([`crate::slirp`]).
    pub slirp_bin: PathBuf,
    /// Where cgroups are mounted (`/sys/fs/cgroup`).
    pub cgroup_mount: PathBuf,
    /// The provider's parent group name (`little-compute`).
    pub cgroup_parent: String,
    /// The supervisor's spool bound, bytes.
    pub spool_bytes_max: u64,
    /// The supervisor's spool bound, pages (the terminal page's slot
    /// included; see [`lc_core::page::SPOOL_PAGES_DEFAULT`]).
    pub spool_pages_max: u64,
    /// The rlimits.
    pub rlimits: RlimitPolicy,
    /// How long allocate waits for the supervisor's start handshake (its
    /// answer on the socket, given before the command is released, so the
    /// command cannot delay it).
    pub start_wait_max: Duration,
    /// The unprivileged host account every instance runs as (see
    /// [`crate::account`]); created at [`BwrapProvider::open`] when missing.
    pub sandbox_user: String,
    /// The blob store's directory ([`lc_blob::LocalBlobStore`]): where a
    /// quiesce puts a workspace snapshot's file bytes and a restore reads
    /// them.
    pub blob_dir: PathBuf,
}

impl BwrapConfig {
    /// The defaults for `provider_id` with state in `state_dir`: runtimes in
    /// `state_dir/runtimes`, `/usr/bin/bwrap`, `/usr/bin/slirp4netns`,
    /// `/sys/fs/cgroup`, parent
    /// group `little-compute`, the default spool and rlimits, 10 s to
    /// start, instances as [`account::SANDBOX_USER_DEFAULT`], blobs in
    /// `state_dir/blobs`.
    pub fn new(provider_id: ProviderId, state_dir: &Path, supervisor_bin: &Path) -> BwrapConfig {
        BwrapConfig {
            provider_id,
            state_dir: state_dir.to_owned(),
            runtime_dir: state_dir.join("runtimes"),
            supervisor_bin: supervisor_bin.to_owned(),
            bwrap_bin: PathBuf::from("/usr/bin/bwrap"),
            slirp_bin: PathBuf::from("/usr/bin/slirp4netns"),
            cgroup_mount: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent: "little-compute".to_owned(),
            spool_bytes_max: SPOOL_BYTES_DEFAULT,
            spool_pages_max: SPOOL_PAGES_DEFAULT,
            rlimits: RlimitPolicy::default(),
            start_wait_max: Duration::from_secs(10),
            sandbox_user: account::SANDBOX_USER_DEFAULT.to_owned(),
            blob_dir: state_dir.join("blobs"),
        }
    }
}

/// The descriptors bubblewrap passes on to the supervisor.
#[derive(Debug, Clone, Copy)]
struct SupervisorFds {
    /// The listening socket (`--listen-fd`).
    listen: i32,
    /// The done file (`--done-fd`).
    done: i32,
    /// The release pipe's read end (`--release-fd`).
    release: i32,
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
    /// Absent in records written before stdin could be opened: closed.
    #[serde(default)]
    stdin_open: bool,
    /// Absent in records written before numbering could start later: 1.
    #[serde(default = "one")]
    first_seq: i64,
    /// Absent in records written before numbering could start later: 1.
    #[serde(default = "one")]
    first_input_seq: i64,
    /// The head (64 hex) the workspace was restored from; absent for a
    /// fresh workspace.
    #[serde(default)]
    restore_head: Option<String>,
}

fn one() -> i64 {
    1
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
            stdin_open: req.stdin_open,
            first_seq: req.first_seq,
            first_input_seq: req.first_input_seq,
            restore_head: req
                .restore
                .as_ref()
                .map(|r| lc_core::Digest::of(&r.manifest).to_hex()),
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
    account: SandboxAccount,
    blobs: Arc<LocalBlobStore>,
    /// Serializes allocate, destroy and quiesce; a restore or a snapshot
    /// holds it on its blocking thread until it ends, even when the
    /// request that started it was abandoned.
    lock: Arc<tokio::sync::Mutex<()>>,
}

/// What `quiesced.json` holds: a quiesce's answer, returned again to every
/// repeated quiesce.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuiescedRecord {
    /// The manifest's canonical bytes, standard base64.
    manifest_b64: String,
    /// The signed quiescence statement.
    evidence: Envelope,
}

/// The name prefix of [`restore_tree`]'s temporary directory, built next
/// to the workspace directory it becomes.
const RESTORE_TEMP_PREFIX: &[u8] = b".lc-restore-";

/// The file of a quiesce's answer in the instance directory.
const QUIESCED_FILE: &str = "quiesced.json";

/// The instance's accounting as it was when quiescing removed its groups
/// (`{"cpu_time_ns":N,"peak_memory_bytes":N}`), so the destroy's
/// measurement still has the generation's cost.
const ACCOUNTING_FILE: &str = "accounting.json";

/// What `accounting.json` holds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct AccountingRecord {
    cpu_time_ns: u64,
    peak_memory_bytes: u64,
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

/// Creates the directory `path` if missing and makes it the sandbox
/// account's, mode `0700`, through a descriptor opened without following
/// a symlink (so a name planted there is refused, never chowned through).
fn own_dir(path: &Path, a: &SandboxAccount) -> Result<(), ProviderError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    match std::fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(path.display(), e)),
    }
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io(path.display(), e))?;
    std::os::unix::fs::fchown(&dir, Some(a.uid), Some(a.gid))
        .and_then(|()| dir.set_permissions(std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| io(path.display(), e))
}

/// Makes the provider's own directory `path` (created if missing) mode
/// `mode`, refusing one that is not a directory owned by the provider (a
/// directory another user owns, that user could rename things in). Every
/// parent inside the state directory is the provider's, so no other user
/// can plant a symlink at these names; one an operator made is followed.
fn provider_dir(path: &Path, mode: u32) -> Result<(), ProviderError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    std::fs::create_dir_all(path).map_err(|e| io(path.display(), e))?;
    let meta = std::fs::metadata(path).map_err(|e| io(path.display(), e))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me {
        return Err(io(
            path.display(),
            format!("not a directory owned by the provider (uid {me})"),
        ));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io(path.display(), e))
}

/// Adds search permission for others to the directory `path` when the
/// provider owns it and others lack it: bubblewrap, as the sandbox
/// account, binds runtime trees from below it. Listing stays as it was.
fn searchable_by_others(path: &Path) -> Result<(), ProviderError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let meta = std::fs::metadata(path).map_err(|e| io(path.display(), e))?;
    let mode = meta.permissions().mode();
    // SAFETY: geteuid has no preconditions.
    if mode & 0o001 == 0 && meta.uid() == unsafe { libc::geteuid() } {
        std::fs::set_permissions(
            path,
            std::fs::Permissions::from_mode((mode | 0o001) & 0o7777),
        )
        .map_err(|e| io(path.display(), e))?;
    }
    Ok(())
}

/// Checks that `a` can execute `program` from the working directory
/// `cwd`: bubblewrap runs as `a`, so every source it binds (the
/// supervisor, the runtime trees, the instance and workspace directories)
/// must be reachable by it. The kernel decides (the child changes to `a`,
/// then to `cwd`, then executes); the child is killed at once.
fn check_reachable(a: &SandboxAccount, program: &Path, cwd: &Path) -> Result<(), ProviderError> {
    use std::os::unix::process::CommandExt as _;
    let mut child = std::process::Command::new(program)
        .env_clear()
        .current_dir(cwd)
        .uid(a.uid)
        .gid(a.gid)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            io(
                program.display(),
                format!(
                    "the sandbox account {} (uid {}) cannot execute it from {}: {e} \
                     (it and every directory above it and above {} must be searchable by that account)",
                    a.name,
                    a.uid,
                    cwd.display(),
                    cwd.display()
                ),
            )
        })?;
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

impl BwrapProvider {
    /// Opens (creating if needed) the provider's state: its key, fences,
    /// instance and workspace directories (modes of the module docs), the
    /// runtime store, the sandbox account ([`crate::account::ensure`]),
    /// and detects the cgroup version.
    ///
    /// # Errors
    /// [`ProviderError::Io`] for a provider not running as root, an
    /// unusable state directory, key, cgroup mount, supervisor binary, a
    /// set-id bubblewrap, a sandbox account that cannot be created or is
    /// root, a supervisor or directory that account cannot reach, or a
    /// state path too long for a unix socket.
    pub fn open(cfg: BwrapConfig) -> Result<BwrapProvider, ProviderError> {
        use std::os::unix::fs::PermissionsExt as _;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(io(
                "the provider",
                "must run as root: it limits instances through cgroups and starts each as the unprivileged sandbox account",
            ));
        }
        // Resolved (or created) before anything is written: a refused
        // account leaves no state behind.
        let account = account::ensure(&cfg.sandbox_user)?;
        // The state directory and the two the sandbox account must pass
        // through are searchable, not listable; fences only the provider's.
        provider_dir(&cfg.state_dir, 0o711)?;
        for d in ["instances", "workspaces"] {
            provider_dir(&cfg.state_dir.join(d), 0o711)?;
        }
        let key = identity::load_or_create(&cfg.state_dir.join(identity::KEY_FILE))?;
        let fences = Fences::open(&cfg.state_dir.join("fences"))?;
        provider_dir(&cfg.state_dir.join("fences"), 0o700)?;
        provider_dir(&cfg.state_dir.join(SENT_DIR), 0o700)?;
        let runtimes =
            RuntimeStore::open(&cfg.runtime_dir).map_err(|e| io(cfg.runtime_dir.display(), e))?;
        searchable_by_others(&cfg.runtime_dir)?;
        let cgroups = CgroupRoot::detect(&cfg.cgroup_mount, &cfg.cgroup_parent)?;
        if !cfg.supervisor_bin.is_file() {
            return Err(io(
                cfg.supervisor_bin.display(),
                "the supervisor binary does not exist",
            ));
        }
        let bwrap_meta =
            std::fs::metadata(&cfg.bwrap_bin).map_err(|e| io(cfg.bwrap_bin.display(), e))?;
        if !bwrap_meta.is_file() {
            return Err(io(cfg.bwrap_bin.display(), "bubblewrap does not exist"));
        }
        if bwrap_meta.permissions().mode() & 0o6000 != 0 {
            return Err(io(
                cfg.bwrap_bin.display(),
                "bubblewrap is set-uid or set-gid: the provider runs it unprivileged, as the sandbox account, and builds no instance through a privileged helper",
            ));
        }
        let state_bytes = cfg.state_dir.as_os_str().len();
        if state_bytes > state_dir_bytes_max() {
            return Err(io(
                cfg.state_dir.display(),
                format!(
                    "the state directory's path is {state_bytes} bytes, at most {} fit: every instance's supervisor socket lives below it and a unix socket path has at most {SOCKET_PATH_BYTES_MAX} bytes; choose a shorter path",
                    state_dir_bytes_max()
                ),
            ));
        }
        check_reachable(
            &account,
            &cfg.supervisor_bin,
            &cfg.state_dir.join("instances"),
        )?;
        check_reachable(
            &account,
            &cfg.supervisor_bin,
            &cfg.state_dir.join("workspaces"),
        )?;
        check_reachable(&account, &cfg.bwrap_bin, &cfg.runtime_dir)?;
        let blobs =
            LocalBlobStore::open(&cfg.blob_dir).map_err(|e| io(cfg.blob_dir.display(), e))?;
        let provider = BwrapProvider {
            cfg,
            key,
            fences,
            runtimes,
            cgroups,
            account,
            blobs: Arc::new(blobs),
            lock: Arc::new(tokio::sync::Mutex::new(())),
        };
        provider.mark_recorded_instances_sent()?;
        provider.remove_restore_leftovers()?;
        Ok(provider)
    }

    /// Removes the temporary directories of restores a crash interrupted
    /// (`workspaces/.lc-restore-*`, never a workspace: their names are not
    /// workspace ids). No restore runs while the provider opens.
    fn remove_restore_leftovers(&self) -> Result<(), ProviderError> {
        let dir = self.cfg.state_dir.join("workspaces");
        let entries = std::fs::read_dir(&dir).map_err(|e| io(dir.display(), e))?;
        for e in entries.take(INSTANCES_SCANNED_MAX) {
            let e = e.map_err(|e| io(dir.display(), e))?;
            if e.file_name()
                .as_encoded_bytes()
                .starts_with(RESTORE_TEMP_PREFIX)
            {
                let path = e.path();
                std::fs::remove_dir_all(&path).map_err(|e| io(path.display(), e))?;
            }
        }
        Ok(())
    }

    /// Writes the hand-off marker of every instance with a record that has
    /// none: a state directory from before markers were kept may hold
    /// instances whose command was handed over without one. An instance
    /// whose start stopped between its record and its hand-off (its
    /// command never released) is marked too, which only refuses a proof
    /// (its allocate replays it as existing and its Lease expires).
    fn mark_recorded_instances_sent(&self) -> Result<(), ProviderError> {
        let dir = self.cfg.state_dir.join("instances");
        let entries = std::fs::read_dir(&dir).map_err(|e| io(dir.display(), e))?;
        for e in entries.take(INSTANCES_SCANNED_MAX) {
            let e = e.map_err(|e| io(dir.display(), e))?;
            if let Some(rec) = self.read_record(&e.path())?
                && !self.was_sent(rec.lease_id, rec.generation)?
            {
                self.record_sent(rec.lease_id, rec.generation)?;
            }
        }
        Ok(())
    }

    /// The unprivileged host account every instance runs as.
    pub fn sandbox_account(&self) -> &SandboxAccount {
        &self.account
    }

    /// The blob store workspace snapshots are put into and restored from.
    pub fn blobs(&self) -> &LocalBlobStore {
        &self.blobs
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

    /// The hand-off marker of `(lease_id, generation)`.
    fn sent_marker(&self, lease_id: i64, generation: i64) -> PathBuf {
        self.cfg
            .state_dir
            .join(SENT_DIR)
            .join(instance_name(lease_id, generation))
    }

    /// Records, durably, that the command of `(lease_id, generation)` is
    /// being handed to a supervisor: the marker file is created (an
    /// existing one is kept) and fsynced, then its directory.
    fn record_sent(&self, lease_id: i64, generation: i64) -> Result<(), ProviderError> {
        let path = self.sent_marker(lease_id, generation);
        let io = |e: std::io::Error| io(path.display(), e);
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io)?;
        }
        std::fs::File::open(self.cfg.state_dir.join(SENT_DIR))
            .and_then(|d| d.sync_all())
            .map_err(io)
    }

    /// Whether the hand-off marker of `(lease_id, generation)` exists.
    fn was_sent(&self, lease_id: i64, generation: i64) -> Result<bool, ProviderError> {
        let path = self.sent_marker(lease_id, generation);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(path.display(), e)),
        }
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
        fds: SupervisorFds,
        net: Option<(i32, i32)>,
    ) -> Result<Vec<String>, ProviderError> {
        let p = |p: &Path| p.to_string_lossy().into_owned();
        let mut a: Vec<String> = Vec::new();
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        // Its own network namespace, always; a network shape's gets
        // slirp4netns, which needs the sandbox's pid (info) before the
        // command runs (block).
        push(&["--unshare-all"]);
        if let Some((info_fd, block_fd)) = net {
            push(&[
                "--info-fd",
                &info_fd.to_string(),
                "--block-fd",
                &block_fd.to_string(),
            ]);
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
        let tmpfs_bytes = tmpfs_bytes_max(req.shape.memory_bytes).to_string();
        push(&[
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            &tmpfs_bytes,
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/dev",
            "--size",
            &tmpfs_bytes,
            "--tmpfs",
            "/tmp",
            "--bind",
            &p(workspace),
            "/workspace",
            "--ro-bind",
            &p(&self.cfg.supervisor_bin),
            "/.lc/supervisor",
            "--remount-ro",
            "/",
            "--chdir",
            "/workspace",
            "--",
            "/.lc/supervisor",
            "--listen-fd",
            &fds.listen.to_string(),
            "--done-fd",
            &fds.done.to_string(),
            "--release-fd",
            &fds.release.to_string(),
            "--spool-bytes",
            &self.cfg.spool_bytes_max.to_string(),
            "--spool-pages",
            &self.cfg.spool_pages_max.to_string(),
            "--first-seq",
            &req.first_seq.to_string(),
            "--first-input-seq",
            &req.first_input_seq.to_string(),
        ]);
        if req.stdin_open {
            push(&["--stdin-open"]);
        }
        push(&["--"]);
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
        // The only host directories the sandbox writes: its own.
        let workspace = self.workspace_dir(req.workspace_id);
        own_dir(&workspace, &self.account)?;
        // The provider's own: the sandbox neither sees nor writes it.
        let run = dir.join("run");
        provider_dir(&run, 0o700)?;
        let socket = run.join(SOCKET_FILE);
        let listener =
            std::os::unix::net::UnixListener::bind(&socket).map_err(|e| io(socket.display(), e))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io(socket.display(), e))?;
        }
        let done_path = run.join(DONE_FILE);
        let done = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&done_path)
                .map_err(|e| io(done_path.display(), e))?
        };
        // The supervisor starts the command once a byte arrives here: after
        // its handshake answer and the hand-off marker.
        let (release_r, release_w) = slirp::pipe().map_err(|e| io("a pipe", e))?;
        let mut release_w = std::fs::File::from(release_w);
        let fds = {
            use std::os::fd::AsRawFd as _;
            SupervisorFds {
                listen: listener.as_raw_fd(),
                done: done.as_raw_fd(),
                release: release_r.as_raw_fd(),
            }
        };
        // A network shape's pipes: bubblewrap's info (it writes), its block
        // (it reads); the provider keeps the other ends.
        let net_pipes = if req.shape.network {
            let (info_r, info_w) = slirp::pipe().map_err(|e| io("a pipe", e))?;
            let (block_r, block_w) = slirp::pipe().map_err(|e| io("a pipe", e))?;
            Some((info_r, info_w, block_r, block_w))
        } else {
            None
        };
        let net_fds = net_pipes.as_ref().map(|(_, info_w, block_r, _)| {
            use std::os::fd::AsRawFd as _;
            (info_w.as_raw_fd(), block_r.as_raw_fd())
        });
        let args = self.bwrap_args(req, &root, &workspace, fds, net_fds)?;
        let inherited: [i32; 5] = match net_fds {
            Some((i, b)) => [fds.listen, fds.done, fds.release, i, b],
            None => [fds.listen, fds.done, fds.release, -1, -1],
        };
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
        let log = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&log_path)
                .map_err(|e| io(log_path.display(), e))?
        };
        let log2 = log.try_clone().map_err(|e| io(log_path.display(), e))?;
        let log3 = log.try_clone().map_err(|e| io(log_path.display(), e))?;
        let mut cmd = tokio::process::Command::new(&self.cfg.bwrap_bin);
        // The process becomes the account, whose other processes may read
        // its environment: it gets none of the provider's.
        cmd.args(&args)
            .env_clear()
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(false);
        let rl = self.cfg.rlimits;
        let (uid, gid) = (self.account.uid, self.account.gid);
        // Joining the groups and setting the limits need root; then the
        // process becomes the sandbox account for good, so bubblewrap
        // builds the instance unprivileged.
        // SAFETY: the closure only calls close_range, fcntl, open/write/close
        // (join_self), getrlimit/setrlimit and the id system calls of
        // drop_to, all async-signal-safe; it allocates nothing.
        let procs2 = procs.clone();
        unsafe {
            cmd.pre_exec(move || {
                // Bubblewrap inherits the descriptors it passes on to the
                // supervisor (and its network pipes), nothing else the
                // provider has open.
                inherit_only(&inherited)?;
                InstanceCgroup::join_self(&procs)?;
                apply_rlimits(rl)?;
                account::drop_to(uid, gid)
            });
        }
        // The supervisor holds its command until released below, so the
        // hand-off marker is not written yet: a start that fails before the
        // release is provably not sent.
        let spawned = cmd.spawn();
        // Bubblewrap holds them now: once it is gone, nothing listens.
        drop(listener);
        drop(done);
        drop(release_r);
        let (info_r, block_w) = match net_pipes {
            Some((info_r, info_w, block_r, block_w)) => {
                drop((info_w, block_r));
                (Some(info_r), Some(block_w))
            }
            None => (None, None),
        };
        let mut child = spawned.map_err(|e| ProviderError::StartFailed {
            detail: format!("bwrap: {e}"),
        })?;
        let t = Instant::now();
        let slirp = match (info_r, block_w) {
            (Some(info_r), Some(block_w)) => {
                let deadline = Instant::now() + self.cfg.start_wait_max;
                match self
                    .start_slirp(info_r, block_w, procs2, log3, deadline)
                    .await
                {
                    Ok(s) => Some(s),
                    Err(detail) => {
                        // A bubblewrap that failed says why in its log.
                        if let Ok(Ok(status)) =
                            tokio::time::timeout(Duration::from_millis(500), child.wait()).await
                        {
                            return Err(start_failed(status, &log_path));
                        }
                        return Err(ProviderError::StartFailed { detail });
                    }
                }
            }
            _ => None,
        };
        // The start handshake, bounded by start_wait_max. Connections queue
        // on the socket from its bind on; the supervisor answers before its
        // command exists (nothing of the sandbox but bubblewrap and the
        // supervisor runs yet, so nothing can stop or delay the answer),
        // and a bubblewrap that exits closes the socket, failing the call.
        loop {
            let left = self.cfg.start_wait_max.saturating_sub(t.elapsed());
            if let Ok(Some(status)) = child.try_wait() {
                return Err(start_failed(status, &log_path));
            }
            if left.is_zero() {
                return Err(ProviderError::StartFailed {
                    detail: format!(
                        "the supervisor did not answer within {:?}",
                        self.cfg.start_wait_max
                    ),
                });
            }
            let probe = socket::call_within(socket.clone(), SocketRequest::Status, left).await;
            if let Ok(SocketResponse::Status(_)) = probe {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The hand-off: recorded first (a not-sent proof is never signed
        // for a released command), then released. Both are synchronous, so
        // an abandoned allocate stops before the marker or after the
        // release, never between.
        self.record_sent(req.lease_id.0, req.generation.0)?;
        {
            use std::io::Write as _;
            release_w
                .write_all(&[1])
                .map_err(|e| ProviderError::StartFailed {
                    detail: format!("the supervisor did not take its command: {e}"),
                })?;
        }
        drop(release_w);
        // The outer bwrap process is our child: reap it when it ends, and
        // end its slirp4netns with it.
        tokio::spawn(async move {
            let _ = child.wait().await;
            if let Some((mut slirp, exit_w)) = slirp {
                drop(exit_w);
                let _ = slirp.start_kill();
                let _ = tokio::time::timeout(slirp::KILL_WAIT_MAX, slirp.wait()).await;
            }
        });
        Ok(())
    }

    /// Starts slirp4netns for the sandbox bubblewrap reports on `info_r`
    /// and releases the sandbox through `block_w` once the network is up,
    /// by `deadline` (see [`crate::slirp`]). Returns slirp4netns and the
    /// write end of its exit pipe.
    async fn start_slirp(
        &self,
        info_r: std::os::fd::OwnedFd,
        block_w: std::os::fd::OwnedFd,
        procs: Vec<CString>,
        log: std::fs::File,
        deadline: Instant,
    ) -> Result<(tokio::process::Child, std::os::fd::OwnedFd), String> {
        use std::os::fd::AsRawFd as _;
        let (pid, net_ino) =
            tokio::task::spawn_blocking(move || slirp::read_info(&info_r, deadline))
                .await
                .map_err(|e| e.to_string())??;
        let (net, user) = slirp::open_namespaces(pid, net_ino)?;
        let (ready_r, ready_w) = slirp::pipe().map_err(|e| format!("a pipe: {e}"))?;
        let (exit_r, exit_w) = slirp::pipe().map_err(|e| format!("a pipe: {e}"))?;
        let inherited = [
            net.as_raw_fd(),
            user.as_raw_fd(),
            ready_w.as_raw_fd(),
            exit_r.as_raw_fd(),
        ];
        let mut cmd = tokio::process::Command::new(&self.cfg.slirp_bin);
        cmd.args(slirp::args(
            inherited[0],
            inherited[1],
            inherited[2],
            inherited[3],
        ))
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
        let rl = self.cfg.rlimits;
        let (uid, gid) = (self.account.uid, self.account.gid);
        // SAFETY: as for bubblewrap; private_tun only makes system calls
        // on static strings.
        unsafe {
            cmd.pre_exec(move || {
                inherit_only(&inherited)?;
                InstanceCgroup::join_self(&procs)?;
                apply_rlimits(rl)?;
                slirp::private_tun(uid, gid)?;
                account::drop_to(uid, gid)
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("{}: {e}", self.cfg.slirp_bin.display()))?;
        drop((net, user, ready_w, exit_r));
        tokio::task::spawn_blocking(move || {
            slirp::wait_ready(&ready_r, deadline)?;
            slirp::release(block_w)
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok((child, exit_w))
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

    /// `e`, or [`ProviderError::InstanceLost`] when the instance has no
    /// process left (so no supervisor will ever answer again).
    fn lost_or(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        e: ProviderError,
    ) -> ProviderError {
        if self.state_of(lease_id.0, generation.0) == InstanceState::Exited {
            ProviderError::InstanceLost {
                lease_id: lease_id.0,
                generation: generation.0,
            }
        } else {
            e
        }
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
        Ok(dir.join("run").join(SOCKET_FILE))
    }

    /// The signed attachment of `(lease_id, generation)` to workspace
    /// `workspace_id` restored from `head`.
    fn attachment(&self, rec: &InstanceRecord, head: &str) -> Envelope {
        self.signed(Statement::Attachment {
            provider_id: self.cfg.provider_id.as_str().to_owned(),
            lease_id: rec.lease_id,
            generation: rec.generation,
            workspace_id: rec.workspace_id,
            head: head.to_owned(),
            writable: true,
        })
    }

    /// Replaces workspace `workspace_id`'s directory by the tree of
    /// `restore`'s manifest, owned by the sandbox account, holding `guard`
    /// (the provider's lock) until the restore ends; returns the guard.
    /// On any error no workspace directory is left.
    async fn restore_workspace(
        &self,
        guard: tokio::sync::OwnedMutexGuard<()>,
        workspace_id: WorkspaceId,
        restore: &Restore,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>, ProviderError> {
        let manifest = SnapshotManifest::from_canonical(&restore.manifest).map_err(|e| {
            ProviderError::RestoreFailed {
                path: String::new(),
                digest: Digest::of(&restore.manifest).to_hex(),
                reason: e.code().to_owned(),
                detail: format!("the restore manifest is refused: {e}"),
            }
        })?;
        if manifest.workspace_id != workspace_id {
            return Err(ProviderError::InvalidRequest {
                detail: format!(
                    "the restore manifest is of workspace {}, the request's workspace is {workspace_id}",
                    manifest.workspace_id
                ),
            });
        }
        // The snapshot supersedes whatever the directory held.
        let ws = self.workspace_dir(workspace_id);
        match std::fs::remove_dir_all(&ws) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(ws.display(), e)),
        }
        let store = self.blobs.clone();
        let owner = Some((self.account.uid, self.account.gid));
        let dest = ws.clone();
        let (guard, restored) = tokio::task::spawn_blocking(move || {
            let restored = restore_tree(&manifest, store.as_ref(), &dest, owner);
            (guard, restored)
        })
        .await
        .map_err(|e| io(ws.display(), e))?;
        match restored {
            Ok(_) => Ok(guard),
            Err(e) => {
                // restore_tree leaves no destination behind; make sure.
                let _ = std::fs::remove_dir_all(&ws);
                Err(restore_error(e))
            }
        }
    }

    /// The persisted answer of an earlier quiesce of the instance in `dir`.
    fn read_quiesced(&self, dir: &Path) -> Result<Option<Quiesced>, ProviderError> {
        use base64::Engine as _;
        let p = dir.join(QUIESCED_FILE);
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(p.display(), e)),
        };
        let rec: QuiescedRecord = serde_json::from_slice(&bytes).map_err(|e| io(p.display(), e))?;
        let manifest = base64::engine::general_purpose::STANDARD
            .decode(rec.manifest_b64.as_bytes())
            .map_err(|e| io(p.display(), e))?;
        Ok(Some(Quiesced {
            manifest,
            evidence: rec.evidence,
        }))
    }

    /// Whether the instance's command has ended and its last page is
    /// acknowledged, asked of its supervisor with `fence` (which it checks)
    /// while the supervisor still runs; the supervisor exits once its last
    /// page is acknowledged, writing its done file first, so a written done
    /// file means exactly that.
    async fn check_ended(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<(), ProviderError> {
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            return Ok(());
        }
        let running = |detail: String| ProviderError::CommandRunning {
            lease_id: lease_id.0,
            generation: generation.0,
            detail,
        };
        // A fenced request first, so a stale owner learns it is stale.
        let probe = SocketRequest::Pages {
            fence,
            after_seq: i64::MAX,
            max: 0,
        };
        let status = match socket::call(sock.clone(), probe).await {
            Ok(SocketResponse::Pages(_)) => socket::call(sock.clone(), SocketRequest::Status).await,
            Ok(other) => return Err(refusal(other)),
            Err(e) => Err(e),
        };
        let s = match status {
            Ok(SocketResponse::Status(s)) => s,
            Ok(other) => return Err(refusal(other)),
            Err(_) if finished(&sock) => return Ok(()),
            Err(e) => return Err(self.lost_or(lease_id, generation, e)),
        };
        let last = s.terminal_seq.max(s.stopped_seq);
        if !s.command_exited || last == 0 {
            return Err(running(
                "the command is running: stop it (or wait for its terminal page), acknowledge every page, then quiesce".into(),
            ));
        }
        if s.acked_through < last {
            return Err(running(format!(
                "the command ended but its pages are acknowledged only through seq {}: acknowledge through seq {last}, then quiesce",
                s.acked_through
            )));
        }
        Ok(())
    }
}

/// Persists `q` as the answer of the quiesce of the instance in `dir`: a
/// fresh temporary file, fsynced, renamed into place, then the directory
/// fsynced. Two concurrent writers each rename a complete file of the
/// same answer.
fn write_quiesced(dir: &Path, q: &Quiesced) -> Result<(), ProviderError> {
    use base64::Engine as _;
    let rec = QuiescedRecord {
        manifest_b64: base64::engine::general_purpose::STANDARD.encode(&q.manifest),
        evidence: q.evidence.clone(),
    };
    let bytes = serde_json::to_vec(&rec).map_err(|e| io(dir.join(QUIESCED_FILE).display(), e))?;
    write_file_atomic(dir, QUIESCED_FILE, &bytes)
}

/// Writes `bytes` as `dir/name` (mode 0600) atomically and durably: a
/// fresh temporary file, fsynced, renamed over it, then `dir` fsynced.
fn write_file_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ProviderError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let p = dir.join(name);
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| io(p.display(), e))?;
    let tmp = dir.join(format!(".{name}.{}", hex::encode(random)));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &p));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
        .and_then(|()| std::fs::File::open(dir)?.sync_all())
        .map_err(|e| io(p.display(), e))
}

/// The accounting a quiesce kept in `dir` (`(cpu_time_ns,
/// peak_memory_bytes)`), `None` when none was kept.
fn read_accounting(dir: &Path) -> Result<Option<(u64, u64)>, ProviderError> {
    let p = dir.join(ACCOUNTING_FILE);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(p.display(), e)),
    };
    let rec: AccountingRecord = serde_json::from_slice(&bytes).map_err(|e| io(p.display(), e))?;
    Ok(Some((rec.cpu_time_ns, rec.peak_memory_bytes)))
}

/// A restore's failure as the provider answers it: a missing or corrupt
/// blob, or a manifest broken, as [`ProviderError::RestoreFailed`] naming
/// the path and digest; a failing file system or blob store as
/// [`ProviderError::Io`] (retry).
fn restore_error(e: TreeError) -> ProviderError {
    let reason = e.code().to_owned();
    let detail = e.to_string();
    match e {
        TreeError::BlobMissing { path, digest } | TreeError::BlobCorrupt { path, digest } => {
            ProviderError::RestoreFailed {
                path,
                digest: digest.to_hex(),
                reason,
                detail,
            }
        }
        TreeError::Blob { path, digest, .. } if reason != "blob_io" => {
            ProviderError::RestoreFailed {
                path,
                digest: digest.to_hex(),
                reason,
                detail,
            }
        }
        TreeError::Blob { .. } | TreeError::Io { .. } => ProviderError::Io { detail },
        other => ProviderError::RestoreFailed {
            path: String::new(),
            digest: String::new(),
            reason,
            detail: other.to_string(),
        },
    }
}

/// A snapshot's failure as the provider answers it: a failing file system
/// or blob store as [`ProviderError::Io`] (retry), anything the tree itself
/// breaks as [`ProviderError::SnapshotRefused`].
fn snapshot_error(e: TreeError) -> ProviderError {
    let reason = e.code().to_owned();
    let detail = e.to_string();
    match e {
        TreeError::Io { .. } => ProviderError::Io { detail },
        TreeError::Blob { .. } if reason == "blob_io" => ProviderError::Io { detail },
        TreeError::SpecialFile { path } | TreeError::PathNotUtf8 { path } => {
            ProviderError::SnapshotRefused {
                path,
                reason,
                detail,
            }
        }
        TreeError::Blob { path, .. } => ProviderError::SnapshotRefused {
            path,
            reason,
            detail,
        },
        _ => ProviderError::SnapshotRefused {
            path: String::new(),
            reason,
            detail,
        },
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
        for (name, seq) in [
            ("first_seq", req.first_seq),
            ("first_input_seq", req.first_input_seq),
        ] {
            if !(1..=FIRST_SEQ_MAX).contains(&seq) {
                return Err(ProviderError::InvalidRequest {
                    detail: format!("{name} must be 1..={FIRST_SEQ_MAX}, got {seq}"),
                });
            }
        }
        let mut guard = self.lock.clone().lock_owned().await;
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
        let existing = self.read_record(&dir)?;
        if existing.as_ref().is_some_and(|e| *e != record) {
            return Err(ProviderError::AllocationConflict {
                lease_id: l,
                generation: g,
            });
        }
        // An instance whose command was released is this request's: it is
        // answered again, never started twice. One recorded without its
        // hand-off marker never released its command (its allocate was
        // abandoned before): it is removed below and started afresh.
        if let Some(existing) = existing
            && self.was_sent(l, g)?
        {
            return Ok(Allocation {
                lease_id: req.lease_id,
                generation: req.generation,
                state: self.state_of(l, g),
                created: false,
                attachment: existing
                    .restore_head
                    .as_deref()
                    .map(|head| self.attachment(&existing, head)),
            });
        }
        if self.runtimes.resolve(&req.runtime).is_none() {
            return Err(ProviderError::UnknownRuntime {
                digest: req.runtime.to_hex(),
            });
        }
        // A directory without a record, or with a record but no marker, is
        // a start that never completed.
        self.remove_instance(l, g)?;
        // Restored before the record is written: a failed restore leaves
        // no instance, and a crash before the record only a workspace the
        // next allocate restores again.
        if let Some(r) = &req.restore {
            guard = self.restore_workspace(guard, req.workspace_id, r).await?;
        }
        provider_dir(&dir, 0o711)?;
        let rec_path = dir.join("instance.json");
        let bytes = serde_json::to_vec(&record).map_err(|e| io(rec_path.display(), e))?;
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&rec_path)
                .and_then(|mut f| {
                    f.write_all(&bytes)?;
                    f.sync_all()
                })
                .map_err(|e| io(rec_path.display(), e))?;
        }
        if let Err(e) = self.start(&req, &dir).await {
            // Nothing of a failed start stays: no process, group or directory.
            let _ = self.remove_instance(l, g);
            return Err(e);
        }
        drop(guard);
        Ok(Allocation {
            lease_id: req.lease_id,
            generation: req.generation,
            state: self.state_of(l, g),
            created: true,
            attachment: record
                .restore_head
                .as_deref()
                .map(|head| self.attachment(&record, head)),
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

    async fn prove_not_sent(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        check_ids(lease_id, generation)?;
        // The lock allocate holds from its fence check through the release
        // of the command: once the fence is raised here, no marker of G can
        // appear.
        let _guard = self.lock.lock().await;
        let (l, g) = (lease_id.0, generation.0);
        self.fences.raise(l, g)?;
        if self.was_sent(l, g)? {
            return Err(ProviderError::CommandSent {
                lease_id: l,
                generation: g,
            });
        }
        Ok(self.signed(Statement::NotSent {
            provider_id: self.cfg.provider_id.as_str().to_owned(),
            lease_id: l,
            generation: g,
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

    async fn measure(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        check_ids(lease_id, generation)?;
        let (l, g) = (lease_id.0, generation.0);
        let Some(record) = self.read_record(&self.instance_dir(l, g))? else {
            return Err(ProviderError::NoInstance {
                lease_id: l,
                generation: g,
            });
        };
        let shape = lc_core::shape::Shape::by_name(&record.shape)
            .map_err(|e| io(format_args!("instance {l}-{g} shape"), e))?;
        let live = self.cgroups.instance(&instance_name(l, g)).accounting();
        let accounting = match live {
            Some(a) => Some((a.cpu_time_ns, a.peak_memory_bytes)),
            None => read_accounting(&self.instance_dir(l, g))?,
        };
        let cost = accounting.and_then(|(cpu_time_ns, peak_memory_bytes)| {
            CostObservation::from_accounting(cpu_time_ns, peak_memory_bytes)
        });
        Ok(self.signed(Statement::Measurement {
            provider_id: self.cfg.provider_id.as_str().to_owned(),
            lease_id: l,
            generation: g,
            cost,
            externality: ExternalityObservation::of_sandbox(shape.network),
        }))
    }

    async fn pages(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<Page>, ProviderError> {
        check_fence(fence)?;
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            // The supervisor finished (its terminal page was acknowledged).
            return Ok(Vec::new());
        }
        let max = max.min(PAGES_PER_REQUEST_MAX as usize) as u32;
        let req = SocketRequest::Pages {
            fence,
            after_seq,
            max,
        };
        let answer = socket::call(sock, req).await;
        match answer.map_err(|e| self.lost_or(lease_id, generation, e))? {
            SocketResponse::Pages(p) => Ok(p),
            other => Err(refusal(other)),
        }
    }

    async fn inventory(&self) -> Result<Vec<InstanceSummary>, ProviderError> {
        let dir = self.cfg.state_dir.join("instances");
        let mut out = Vec::new();
        let entries = std::fs::read_dir(&dir).map_err(|e| io(dir.display(), e))?;
        for e in entries.take(INSTANCES_SCANNED_MAX) {
            let e = e.map_err(|e| io(dir.display(), e))?;
            if let Some(rec) = self.read_record(&e.path())? {
                out.push(InstanceSummary {
                    lease_id: SandboxLeaseId(rec.lease_id),
                    generation: Generation(rec.generation),
                    exec_id: lc_core::ExecId(rec.exec_id),
                    state: self.state_of(rec.lease_id, rec.generation),
                });
            }
        }
        out.sort_by_key(|i| (i.lease_id, i.generation));
        Ok(out)
    }

    async fn ack(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        through_seq: i64,
    ) -> Result<(), ProviderError> {
        check_fence(fence)?;
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            // The supervisor exits only after its terminal page was acknowledged.
            return Ok(());
        }
        let req = SocketRequest::Ack { fence, through_seq };
        match socket::call(sock.clone(), req).await {
            Ok(SocketResponse::Acked { .. }) => Ok(()),
            Ok(SocketResponse::Error { code }) if code == "ack_ahead" => {
                Err(ProviderError::InvalidRequest {
                    detail: format!("ack through {through_seq} is ahead of the spool"),
                })
            }
            Ok(other) => Err(refusal(other)),
            // The supervisor may exit right after answering the terminal ack.
            Err(_) if finished(&sock) => Ok(()),
            Err(e) => Err(self.lost_or(lease_id, generation, e)),
        }
    }

    async fn cancel(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<(), ProviderError> {
        check_fence(fence)?;
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            // The supervisor finished: the command ended and its terminal
            // page was acknowledged, so there is nothing left to cancel.
            return Ok(());
        }
        match socket::call(sock.clone(), SocketRequest::Cancel { fence }).await {
            Ok(SocketResponse::Cancelled { .. }) => Ok(()),
            Ok(other) => Err(refusal(other)),
            Err(_) if finished(&sock) => Ok(()),
            Err(e) => Err(self.lost_or(lease_id, generation, e)),
        }
    }

    async fn stop(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<Option<StopOutcome>, ProviderError> {
        check_fence(fence)?;
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            // The supervisor finished: its last page was acknowledged.
            return Ok(None);
        }
        match socket::call(sock.clone(), SocketRequest::Stop { fence }).await {
            Ok(SocketResponse::Stopped { outcome }) => Ok(Some(outcome)),
            Ok(other) => Err(refusal(other)),
            Err(_) if finished(&sock) => Ok(None),
            Err(e) => Err(self.lost_or(lease_id, generation, e)),
        }
    }

    async fn quiesce(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<Quiesced, ProviderError> {
        check_fence(fence)?;
        check_ids(lease_id, generation)?;
        let guard = self.lock.clone().lock_owned().await;
        let (l, g) = (lease_id.0, generation.0);
        let dir = self.instance_dir(l, g);
        let Some(rec) = self.read_record(&dir)? else {
            return Err(ProviderError::NoInstance {
                lease_id: l,
                generation: g,
            });
        };
        if let Some(done) = self.read_quiesced(&dir)? {
            return Ok(done);
        }
        self.check_ended(lease_id, generation, fence).await?;
        // Nothing of the instance may still write its workspace: what is
        // left (bubblewrap, an idle supervisor) is killed, the instance
        // directory and the workspace stay. Its accounting goes with its
        // groups, so it is kept in the instance directory first (a repeated
        // quiesce, the groups already gone, keeps the first).
        let groups = self.cgroups.instance(&instance_name(l, g));
        if let Some(a) = groups.accounting() {
            let rec = AccountingRecord {
                cpu_time_ns: a.cpu_time_ns,
                peak_memory_bytes: a.peak_memory_bytes,
            };
            let bytes =
                serde_json::to_vec(&rec).map_err(|e| io(dir.join(ACCOUNTING_FILE).display(), e))?;
            write_file_atomic(&dir, ACCOUNTING_FILE, &bytes)?;
        }
        groups.kill_and_remove()?;
        // Every page was acknowledged: a supervisor killed before it wrote
        // its done file has finished all the same.
        mark_finished(&dir.join("run").join(SOCKET_FILE))?;
        let parent = rec
            .restore_head
            .as_deref()
            .map(Digest::from_hex)
            .transpose()
            .map_err(|e| io(dir.join("instance.json").display(), e))?;
        let workspace_id = WorkspaceId(rec.workspace_id);
        let ws = self.workspace_dir(workspace_id);
        let store = self.blobs.clone();
        let key = self.key.clone();
        let provider_id = self.cfg.provider_id.as_str().to_owned();
        // The walk, the signature and the persisted answer run to their end
        // on a blocking thread even when the request is abandoned (a large
        // workspace outlasting a client's timeout): its retry then finds
        // the answer.
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let manifest =
                snapshot_tree(&ws, workspace_id, parent, store.as_ref()).map_err(snapshot_error)?;
            let bytes = manifest.canonical_bytes();
            if bytes.len() > MANIFEST_BYTES_MAX {
                return Err(ProviderError::SnapshotRefused {
                    path: String::new(),
                    reason: "manifest_too_large".into(),
                    detail: format!(
                        "the workspace's manifest is {} bytes, at most {MANIFEST_BYTES_MAX} are signed: remove files from the workspace",
                        bytes.len()
                    ),
                });
            }
            let evidence = sign(
                &Statement::Quiescence {
                    provider_id,
                    lease_id: l,
                    generation: g,
                    workspace_id: workspace_id.0,
                    head: manifest.digest().to_hex(),
                },
                &key,
            );
            let done = Quiesced {
                manifest: bytes,
                evidence,
            };
            write_quiesced(&dir, &done)?;
            Ok(done)
        })
        .await
        .map_err(|e| io(self.workspace_dir(workspace_id).display(), e))?
    }

    async fn send(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        input_seq: i64,
        bytes: Vec<u8>,
        eof: bool,
    ) -> Result<i64, ProviderError> {
        check_fence(fence)?;
        if bytes.len() > INPUT_BYTES_MAX {
            return Err(ProviderError::InvalidRequest {
                detail: format!(
                    "an input holds at most {INPUT_BYTES_MAX} bytes, got {}",
                    bytes.len()
                ),
            });
        }
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            return Err(ProviderError::InputRefused {
                reason: "input_closed".into(),
                detail: "the command has ended and its output was read".into(),
            });
        }
        let req = SocketRequest::Send {
            fence,
            input_seq,
            bytes,
            eof,
        };
        match socket::call(sock.clone(), req).await {
            Ok(SocketResponse::Sent { input_seq }) => Ok(input_seq),
            Ok(SocketResponse::Error { code })
                if code.starts_with("input_") || code == "bad_input_seq" =>
            {
                let detail = match code.as_str() {
                    "input_gap" => "send the inputs before this seq first",
                    "input_busy" => "the command has not read its earlier input yet: retry later",
                    "bad_input_seq" => "input seqs start at 1",
                    _ => "the command's stdin is closed: nothing more can be sent",
                };
                Err(ProviderError::InputRefused {
                    reason: code,
                    detail: detail.into(),
                })
            }
            Ok(other) => Err(refusal(other)),
            Err(e) => Err(self.lost_or(lease_id, generation, e)),
        }
    }

    async fn spool_status(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Option<SpoolStatus>, ProviderError> {
        let sock = self.socket_of(lease_id, generation)?;
        if finished(&sock) {
            return Ok(None);
        }
        match socket::call(sock.clone(), SocketRequest::Status).await {
            Ok(SocketResponse::Status(s)) => Ok(Some(s)),
            Ok(other) => Err(refusal(other)),
            Err(_) if finished(&sock) => Ok(None),
            Err(e) => Err(self.lost_or(lease_id, generation, e)),
        }
    }
}

/// Marks every descriptor above stderr close-on-exec but those of
/// `inherited` (negative entries skipped), which it makes inheritable.
/// Async-signal-safe: close_range and fcntl only; for a child between
/// fork and exec.
fn inherit_only(inherited: &[i32]) -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC and fcntl only change
    // descriptor flags.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        for &fd in inherited.iter().filter(|fd| **fd >= 0) {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The start failure of a bubblewrap that exited with `status`, quoting
/// the tail of its log.
fn start_failed(status: std::process::ExitStatus, log_path: &Path) -> ProviderError {
    let log = std::fs::read(log_path).unwrap_or_default();
    let tail = &log[log.len().saturating_sub(LOG_TAIL_BYTES_MAX)..];
    ProviderError::StartFailed {
        detail: format!(
            "bwrap exited with {status}: {}",
            String::from_utf8_lossy(tail).trim_end()
        ),
    }
}

/// Whether the supervisor whose socket is `sock` has finished: its last
/// page was acknowledged (it wrote its done file before answering that
/// ack, or quiesce did after killing it), so it exits, or has, and nothing
/// is left to read.
fn finished(sock: &Path) -> bool {
    std::fs::metadata(sock.with_file_name(DONE_FILE)).is_ok_and(|m| m.len() > 0)
}

/// Records that the supervisor whose socket is `sock` has finished, as it
/// does itself (its done file holds the supervisor's [`DONE_TEXT`]).
fn mark_finished(sock: &Path) -> Result<(), ProviderError> {
    let done = sock.with_file_name(DONE_FILE);
    if finished(sock) {
        return Ok(());
    }
    std::fs::write(&done, DONE_TEXT).map_err(|e| io(done.display(), e))
}

/// An owner fence is >= 1.
fn check_fence(fence: OwnerFence) -> Result<(), ProviderError> {
    if fence.0 < 1 {
        return Err(ProviderError::InvalidRequest {
            detail: format!("owner fence must be >= 1, got {fence}"),
        });
    }
    Ok(())
}

/// A supervisor answer that is not the one asked for: a stale fence as
/// [`ProviderError::StaleFence`], anything else as
/// [`ProviderError::SupervisorUnavailable`] with its code.
fn refusal(answer: SocketResponse) -> ProviderError {
    match answer {
        SocketResponse::StaleFence { presented, highest } => ProviderError::StaleFence {
            presented: presented.0,
            highest: highest.0,
        },
        SocketResponse::Error { code } => ProviderError::SupervisorUnavailable { detail: code },
        other => ProviderError::SupervisorUnavailable {
            detail: format!("unexpected supervisor answer {other:?}"),
        },
    }
}
