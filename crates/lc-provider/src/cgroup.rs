//! Resource limits of an instance through cgroups, v1 or v2.
//!
//! Every instance gets its own group named `<lease>-<generation>` under the
//! provider's parent group (`little-compute` by default):
//!
//! * **v1** (separate hierarchies mounted under `/sys/fs/cgroup/<controller>`):
//!   `memory/<parent>/<name>` with `memory.limit_in_bytes` (and
//!   `memory.memsw.limit_in_bytes` at the same value when swap accounting is
//!   on, so swap is no way around the limit), `pids/<parent>/<name>` with
//!   `pids.max`, `cpu/<parent>/<name>` with `cpu.shares` when the cpu
//!   controller is mounted, and `cpuacct/<parent>/<name>` when the cpuacct
//!   controller is mounted on a hierarchy of its own (co-mounted with cpu,
//!   the cpu group counts too).
//! * **v2** (`/sys/fs/cgroup` is a cgroup2 file system): one group
//!   `<parent>/<name>` with `memory.max`, `memory.swap.max = 0`, `pids.max`
//!   and `cpu.weight` (the shares mapped onto 1..=10000), the controllers
//!   enabled in the parents' `cgroup.subtree_control`.
//!
//! The instance's first process joins every group before it executes
//! bubblewrap ([`InstanceCgroup::join_self`], called between fork and exec),
//! so nothing of the instance ever runs outside its limits. Destroy kills
//! every process listed in the groups with `SIGKILL` (or writes `cgroup.kill`
//! on v2) until they are empty, within [`KILL_ROUNDS_MAX`] rounds, then
//! removes the groups.
//!
//! [`InstanceCgroup::accounting`] reads what the kernel counted for the
//! instance: CPU time (v1 `cpuacct.usage`, v2 `usage_usec` of `cpu.stat`)
//! and peak memory (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ProviderError;

/// `statfs` magic of a cgroup2 file system.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Rounds of "list, kill, wait" before destroy gives up (and is retried):
/// 500 rounds of [`KILL_ROUND_WAIT`] = 5 s, far above the time a killed
/// instance of at most `pids_max` processes needs to exit.
pub const KILL_ROUNDS_MAX: u32 = 500;

/// The wait between two kill rounds.
pub const KILL_ROUND_WAIT: Duration = Duration::from_millis(10);

/// The most pids read from one `cgroup.procs` file per round: above every
/// shape's `pids_max`.
const PROCS_PER_ROUND_MAX: usize = 65536;

/// The cgroup version in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Separate v1 hierarchies per controller.
    V1,
    /// The unified v2 hierarchy.
    V2,
}

/// The limits of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit in bytes (a multiple of the page size is stored exactly).
    pub memory_bytes: u64,
    /// The most processes and threads at once.
    pub pids_max: u32,
    /// Relative CPU weight as v1 `cpu.shares` (2..=262144).
    pub cpu_shares: u32,
}

/// Where the provider's groups live.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    version: CgroupVersion,
    /// The cgroup mount (`/sys/fs/cgroup`).
    mount: PathBuf,
    /// The provider's parent group name.
    parent: String,
}

/// The groups of one instance.
#[derive(Debug, Clone)]
pub struct InstanceCgroup {
    version: CgroupVersion,
    /// One directory per hierarchy (v1: memory, pids, then cpu and cpuacct
    /// when mounted; v2: one).
    dirs: Vec<PathBuf>,
    /// The directory holding the CPU accounting (v1 `cpuacct.usage`, v2
    /// `cpu.stat`); `None` on a v1 host without the cpuacct controller.
    cpu_accounting: Option<PathBuf>,
}

/// What the kernel counted for an instance's groups since they were made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accounting {
    /// CPU time of every process that ran in the groups, user + system, in
    /// nanoseconds (v2 counts microseconds: a multiple of 1000).
    pub cpu_time_ns: u64,
    /// The most memory charged to the memory group at once, in bytes.
    pub peak_memory_bytes: u64,
}

fn io(path: &Path, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::io(path.display(), e)
}

fn write(path: &Path, value: &str) -> Result<(), ProviderError> {
    std::fs::write(path, value).map_err(|e| io(path, e))
}

/// Maps v1 `cpu.shares` (2..=262144, default 1024) onto v2 `cpu.weight`
/// (1..=10000, default 100), as the container runtimes do.
pub fn shares_to_weight(shares: u32) -> u32 {
    let s = u64::from(shares.clamp(2, 262_144));
    (1 + ((s - 2) * 9999) / 262_142) as u32
}

impl CgroupRoot {
    /// Detects the version at `mount`: v2 when it is a cgroup2 file system,
    /// v1 when it holds `memory` and `pids` hierarchies.
    ///
    /// # Errors
    /// [`ProviderError::Io`] when neither is usable.
    pub fn detect(mount: &Path, parent: &str) -> Result<CgroupRoot, ProviderError> {
        let c = CString::new(mount.as_os_str().as_bytes()).map_err(|e| io(mount, e))?;
        // SAFETY: statfs writes only into `st`; `c` is a valid C string.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
        if rc != 0 {
            return Err(io(mount, std::io::Error::last_os_error()));
        }
        let version = if st.f_type as i64 == CGROUP2_SUPER_MAGIC {
            // A v2 hierarchy whose memory or pids controller is bound to a
            // v1 hierarchy (a hybrid mount) cannot limit anything.
            let have =
                std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
            for c in ["memory", "pids"] {
                if !have.split_whitespace().any(|h| h == c) {
                    return Err(io(mount, format!("cgroup2 without the {c} controller")));
                }
            }
            CgroupVersion::V2
        } else if mount.join("memory/cgroup.procs").exists()
            && mount.join("pids/cgroup.procs").exists()
        {
            CgroupVersion::V1
        } else {
            return Err(io(
                mount,
                "neither cgroup2 nor v1 memory and pids hierarchies",
            ));
        };
        Ok(CgroupRoot {
            version,
            mount: mount.to_owned(),
            parent: parent.to_owned(),
        })
    }

    /// A root of `version` at `mount` without detection (for a mount that
    /// was detected before, or a test tree).
    pub fn with_version(version: CgroupVersion, mount: &Path, parent: &str) -> CgroupRoot {
        CgroupRoot {
            version,
            mount: mount.to_owned(),
            parent: parent.to_owned(),
        }
    }

    /// The version in use.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The group directories of instance `name` and the one holding its
    /// CPU accounting.
    fn dirs(&self, name: &str) -> (Vec<PathBuf>, Option<PathBuf>) {
        match self.version {
            CgroupVersion::V2 => {
                let d = self.mount.join(&self.parent).join(name);
                (vec![d.clone()], Some(d))
            }
            CgroupVersion::V1 => {
                let mut v = vec![
                    self.mount.join("memory").join(&self.parent).join(name),
                    self.mount.join("pids").join(&self.parent).join(name),
                ];
                let cpu = self.mount.join("cpu");
                let cpuacct = self.mount.join("cpuacct");
                if cpu.join("cgroup.procs").exists() {
                    v.push(cpu.join(&self.parent).join(name));
                }
                let mut accounting = None;
                if cpuacct.join("cgroup.procs").exists() {
                    let group = cpuacct.join(&self.parent).join(name);
                    // `cpu` and `cpuacct` are often links to one `cpu,cpuacct`
                    // hierarchy: then the cpu group is the accounting group.
                    let same = matches!(
                        (std::fs::canonicalize(&cpu), std::fs::canonicalize(&cpuacct)),
                        (Ok(a), Ok(b)) if a == b
                    );
                    if same {
                        accounting = Some(cpu.join(&self.parent).join(name));
                    } else {
                        v.push(group.clone());
                        accounting = Some(group);
                    }
                }
                (v, accounting)
            }
        }
    }

    /// The groups of instance `name`, whether or not they exist.
    pub fn instance(&self, name: &str) -> InstanceCgroup {
        let (dirs, cpu_accounting) = self.dirs(name);
        InstanceCgroup {
            version: self.version,
            dirs,
            cpu_accounting,
        }
    }

    /// Creates (or reuses) the groups of instance `name` and writes `limits`.
    ///
    /// # Errors
    /// [`ProviderError::Io`] when a group cannot be made or a limit written.
    pub fn create(&self, name: &str, limits: Limits) -> Result<InstanceCgroup, ProviderError> {
        let cg = self.instance(name);
        match self.version {
            CgroupVersion::V2 => {
                let parent = self.mount.join(&self.parent);
                std::fs::create_dir_all(&parent).map_err(|e| io(&parent, e))?;
                for dir in [&self.mount, &parent] {
                    let ctl = dir.join("cgroup.subtree_control");
                    let have =
                        std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
                    let want: Vec<&str> = ["memory", "pids", "cpu"]
                        .into_iter()
                        .filter(|c| have.split_whitespace().any(|h| h == *c))
                        .collect();
                    for c in want {
                        // Already enabled controllers are accepted again.
                        write(&ctl, &format!("+{c}"))?;
                    }
                }
                let d = &cg.dirs[0];
                std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
                write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                if d.join("memory.swap.max").exists() {
                    write(&d.join("memory.swap.max"), "0")?;
                }
                write(&d.join("pids.max"), &limits.pids_max.to_string())?;
                if d.join("cpu.weight").exists() {
                    write(
                        &d.join("cpu.weight"),
                        &shares_to_weight(limits.cpu_shares).to_string(),
                    )?;
                }
            }
            CgroupVersion::V1 => {
                for d in &cg.dirs {
                    std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
                }
                let mem = &cg.dirs[0];
                write(
                    &mem.join("memory.limit_in_bytes"),
                    &limits.memory_bytes.to_string(),
                )?;
                if mem.join("memory.memsw.limit_in_bytes").exists() {
                    write(
                        &mem.join("memory.memsw.limit_in_bytes"),
                        &limits.memory_bytes.to_string(),
                    )?;
                }
                write(&cg.dirs[1].join("pids.max"), &limits.pids_max.to_string())?;
                if let Some(cpu) = cg.dirs.get(2) {
                    write(
                        &cpu.join("cpu.shares"),
                        &limits.cpu_shares.clamp(2, 262_144).to_string(),
                    )?;
                }
            }
        }
        Ok(cg)
    }
}

impl InstanceCgroup {
    /// The version of these groups.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The group directories (v1: memory, pids[, cpu][, cpuacct]; v2: one).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// What the kernel counted for the groups so far: CPU time and peak
    /// memory. `None` when either cannot be read (the groups are gone, the
    /// host has no CPU accounting, a v2 kernel without `memory.peak`):
    /// unknown, never zero.
    pub fn accounting(&self) -> Option<Accounting> {
        let read = |p: PathBuf| std::fs::read_to_string(p).ok();
        let acct = self.cpu_accounting.as_ref()?;
        let (cpu_time_ns, peak) = match self.version {
            CgroupVersion::V1 => (
                read(acct.join("cpuacct.usage"))?
                    .trim()
                    .parse::<u64>()
                    .ok()?,
                read(self.dirs[0].join("memory.max_usage_in_bytes"))?,
            ),
            CgroupVersion::V2 => (
                read(acct.join("cpu.stat"))?
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))?
                    .trim()
                    .parse::<u64>()
                    .ok()?
                    .checked_mul(1000)?,
                read(self.dirs[0].join("memory.peak"))?,
            ),
        };
        Some(Accounting {
            cpu_time_ns,
            peak_memory_bytes: peak.trim().parse().ok()?,
        })
    }

    /// The file holding the memory limit (`memory.limit_in_bytes` or `memory.max`).
    pub fn memory_limit_file(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.dirs[0].join("memory.limit_in_bytes"),
            CgroupVersion::V2 => self.dirs[0].join("memory.max"),
        }
    }

    /// The file holding the pids limit.
    pub fn pids_max_file(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.dirs[1].join("pids.max"),
            CgroupVersion::V2 => self.dirs[0].join("pids.max"),
        }
    }

    /// The `cgroup.procs` paths as C strings, prepared before a fork so the
    /// child can join without allocating.
    ///
    /// # Errors
    /// [`ProviderError::Io`] for a path with a NUL byte.
    pub fn procs_paths(&self) -> Result<Vec<CString>, ProviderError> {
        self.dirs
            .iter()
            .map(|d| {
                let p = d.join("cgroup.procs");
                CString::new(p.as_os_str().as_bytes()).map_err(|e| io(&p, e))
            })
            .collect()
    }

    /// Moves the calling process into every group of `procs` (from
    /// [`InstanceCgroup::procs_paths`]). Async-signal-safe: only `open`,
    /// `write` and `close`; meant for the child between fork and exec.
    ///
    /// # Errors
    /// The OS error of the first group that refused.
    pub fn join_self(procs: &[CString]) -> std::io::Result<()> {
        for p in procs {
            // SAFETY: `p` is a valid C string; the buffer is a static "0",
            // which cgroup.procs reads as "the writing process".
            let fd = unsafe { libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
            let err = std::io::Error::last_os_error();
            unsafe { libc::close(fd) };
            if n != 1 {
                return Err(err);
            }
        }
        Ok(())
    }

    /// Every pid listed in the groups now (deduplicated, bounded).
    pub fn pids(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for d in &self.dirs {
            let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) else {
                continue;
            };
            for pid in text
                .lines()
                .take(PROCS_PER_ROUND_MAX)
                .filter_map(|l| l.trim().parse::<i32>().ok())
            {
                if !out.contains(&pid) {
                    out.push(pid);
                }
            }
        }
        out
    }

    /// Whether any group directory still exists.
    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|d| d.exists())
    }

    /// Kills every process of the groups and removes them, within
    /// [`KILL_ROUNDS_MAX`] rounds. Idempotent: missing groups are done.
    ///
    /// # Errors
    /// [`ProviderError::DestroyIncomplete`] naming what is left.
    pub fn kill_and_remove(&self) -> Result<(), ProviderError> {
        let kill_file = self.dirs[0].join("cgroup.kill");
        for _ in 0..KILL_ROUNDS_MAX {
            let pids = self.pids();
            if pids.is_empty() {
                let mut left = Vec::new();
                for d in &self.dirs {
                    match std::fs::remove_dir(d) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(_) => left.push(d.clone()),
                    }
                }
                if left.is_empty() {
                    return Ok(());
                }
            } else if self.version == CgroupVersion::V2 && kill_file.exists() {
                let _ = std::fs::write(&kill_file, "1");
            } else {
                for pid in pids {
                    // SAFETY: kill takes plain integers. A pid read from the
                    // instance's own cgroup.procs belongs to the instance.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            std::thread::sleep(KILL_ROUND_WAIT);
        }
        Err(ProviderError::DestroyIncomplete {
            detail: format!(
                "pids {:?} or groups {:?} remain after {KILL_ROUNDS_MAX} rounds",
                self.pids(),
                self.dirs.iter().filter(|d| d.exists()).collect::<Vec<_>>()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_map_onto_weights_at_the_ends() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(0), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(512), 20);
        assert_eq!(shares_to_weight(262_144), 10000);
        assert_eq!(shares_to_weight(u32::MAX), 10000);
    }

    #[test]
    fn a_hybrid_v2_mount_without_controllers_is_refused() {
        // This host's unified hierarchy has no memory or pids controller.
        let e = CgroupRoot::detect(Path::new("/sys/fs/cgroup/unified"), "x").unwrap_err();
        assert_eq!(e.code(), "provider_io");
        assert!(
            e.to_string()
                .contains("cgroup2 without the memory controller"),
            "{e}"
        );
    }

    #[test]
    fn v2_groups_get_exact_limits() {
        // A tree shaped like a cgroup2 mount: the files the kernel provides
        // are made by hand, the limits are written by `create`.
        let mount = std::env::temp_dir().join(format!("lc-cg2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&mount);
        std::fs::create_dir_all(mount.join("lc/7-2")).unwrap();
        for dir in [mount.clone(), mount.join("lc")] {
            std::fs::write(
                dir.join("cgroup.controllers"),
                "cpuset cpu io memory pids\n",
            )
            .unwrap();
        }
        for f in ["memory.swap.max", "cpu.weight"] {
            std::fs::write(mount.join("lc/7-2").join(f), "max\n").unwrap();
        }
        std::fs::write(
            mount.join("lc/7-2/cpu.stat"),
            "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
        )
        .unwrap();
        let root = CgroupRoot::with_version(CgroupVersion::V2, &mount, "lc");
        let cg = root
            .create(
                "7-2",
                Limits {
                    memory_bytes: 256 << 20,
                    pids_max: 64,
                    cpu_shares: 1024,
                },
            )
            .unwrap();
        let read = |f: &str| std::fs::read_to_string(mount.join("lc/7-2").join(f)).unwrap();
        assert_eq!(cg.dirs(), &[mount.join("lc/7-2")]);
        assert_eq!(cg.memory_limit_file(), mount.join("lc/7-2/memory.max"));
        assert_eq!(read("memory.max"), "268435456");
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("pids.max"), "64");
        assert_eq!(read("cpu.weight"), "39");
        // Without memory.peak (a kernel before 5.19) the cost is unknown.
        assert_eq!(cg.accounting(), None);
        std::fs::write(mount.join("lc/7-2/memory.peak"), "8388608\n").unwrap();
        assert_eq!(
            cg.accounting(),
            Some(Accounting {
                cpu_time_ns: 123_456_000,
                peak_memory_bytes: 8_388_608,
            })
        );
        std::fs::write(mount.join("lc/7-2/cpu.stat"), "user_usec 1\n").unwrap();
        assert_eq!(cg.accounting(), None);
        // The last controller written to each parent's subtree_control.
        assert_eq!(
            std::fs::read_to_string(mount.join("cgroup.subtree_control")).unwrap(),
            "+cpu"
        );
        std::fs::remove_dir_all(&mount).unwrap();
    }

    #[test]
    fn v1_accounting_counts_what_the_instance_ran_and_is_unknown_once_removed() {
        let root = CgroupRoot::detect(Path::new("/sys/fs/cgroup"), "little-compute-acct").unwrap();
        let name = format!("a-{}", std::process::id());
        let cg = root
            .create(
                &name,
                Limits {
                    memory_bytes: 64 * 1024 * 1024,
                    pids_max: 8,
                    cpu_shares: 1024,
                },
            )
            .unwrap();
        // This host mounts cpuacct on its own hierarchy: a fourth group.
        assert_eq!(
            cg.dirs().last().unwrap(),
            &Path::new("/sys/fs/cgroup/cpuacct/little-compute-acct").join(&name)
        );
        // Nothing ran yet: a measured zero, not an unknown.
        assert_eq!(
            cg.accounting(),
            Some(Accounting {
                cpu_time_ns: 0,
                peak_memory_bytes: 0,
            })
        );
        let procs = cg.procs_paths().unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"]);
        use std::os::unix::process::CommandExt as _;
        // SAFETY: join_self only calls open, write and close.
        unsafe { cmd.pre_exec(move || InstanceCgroup::join_self(&procs)) };
        // Reaped below with wait4, which also gives its rusage.
        let child_pid = cmd.spawn().unwrap().id() as i32;
        // The child's own CPU time, from the kernel's rusage of it: an
        // independent count of the same work.
        let mut status = 0;
        // SAFETY: wait4 writes only into `status` and `usage`.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = unsafe { libc::wait4(child_pid, &mut status, 0, &mut usage) };
        assert_eq!(pid, child_pid);
        assert_eq!(status, 0);
        let tv_ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        let rusage_ns = tv_ns(usage.ru_utime) + tv_ns(usage.ru_stime);
        let a = cg.accounting().unwrap();
        // Both count the same process, the group from the moment it joined
        // (before its exec), rusage in whole microseconds: they agree within
        // 20 ms of the at least 100 ms the loop takes.
        assert!(rusage_ns >= 100_000_000, "the loop ran {rusage_ns} ns");
        assert!(
            a.cpu_time_ns + 20_000_000 >= rusage_ns && a.cpu_time_ns <= rusage_ns + 20_000_000,
            "group {} ns, rusage {rusage_ns} ns",
            a.cpu_time_ns
        );
        assert!(
            a.peak_memory_bytes >= 4096 && a.peak_memory_bytes <= 64 * 1024 * 1024,
            "{}",
            a.peak_memory_bytes
        );
        cg.kill_and_remove().unwrap();
        assert_eq!(cg.accounting(), None);
        for c in ["memory", "pids", "cpu", "cpuacct"] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(c)
                    .join("little-compute-acct"),
            );
        }
    }

    #[test]
    fn v1_groups_get_exact_limits_and_are_removed() {
        let root = CgroupRoot::detect(Path::new("/sys/fs/cgroup"), "little-compute-unit").unwrap();
        assert_eq!(root.version(), CgroupVersion::V1);
        let name = format!("t-{}", std::process::id());
        let cg = root
            .create(
                &name,
                Limits {
                    memory_bytes: 64 * 1024 * 1024,
                    pids_max: 17,
                    cpu_shares: 512,
                },
            )
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(cg.memory_limit_file()).unwrap(),
            "67108864\n"
        );
        assert_eq!(std::fs::read_to_string(cg.pids_max_file()).unwrap(), "17\n");
        assert_eq!(
            std::fs::read_to_string(cg.dirs()[2].join("cpu.shares")).unwrap(),
            "512\n"
        );
        // A process that joins the groups between fork and exec is listed,
        // and killed by kill_and_remove.
        let procs = cg.procs_paths().unwrap();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("60");
        use std::os::unix::process::CommandExt as _;
        // SAFETY: join_self only calls open, write and close.
        unsafe { cmd.pre_exec(move || InstanceCgroup::join_self(&procs)) };
        let mut child = cmd.spawn().unwrap();
        assert_eq!(cg.pids(), vec![child.id() as i32]);
        let waiter = std::thread::spawn(move || child.wait().unwrap());
        cg.kill_and_remove().unwrap();
        assert!(!cg.exists());
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
        cg.kill_and_remove().unwrap();
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/memory/little-compute-unit"));
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/pids/little-compute-unit"));
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/cpu/little-compute-unit"));
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/cpuacct/little-compute-unit"));
    }
}
