//! Workspace hibernation and resume: Little Compute's snapshot and restore
//! against `cp -a` (with and without `sha256sum` of every file), interleaved
//! sample by sample in one run.
//!
//! Three workspaces are built once under the run directory (pseudo-random
//! bytes, so no two files share a blob): **1 MB** (one file of 1 000 000
//! bytes), **100 MB** (one file of 100 000 000 bytes) and **10k files**
//! (10 000 files of 1 KiB in 100 directories, mixed modes, plus 4 symlinks).
//! Per sample of a workspace, each variant runs once, the order rotated by
//! one every sample so a drifting load hits every variant alike:
//!
//! 1. **snapshot**: [`lc_blob::tree::snapshot_tree`] of the source into a
//!    fresh [`LocalBlobStore`] (every blob fsynced), then the manifest's
//!    canonical bytes and digest: what hibernation costs once the command
//!    has stopped.
//! 2. **restore**: [`lc_blob::tree::restore_tree`] of the source's manifest
//!    (from a store written once before the samples) into a fresh
//!    directory, every blob's size and SHA-256 checked: what resume costs
//!    before the command starts.
//! 3. **`cp -a` + `sha256sum`**: `sh -c 'cp -a SRC DST && cd DST && find .
//!    -type f -print0 | xargs -0 sha256sum'`, spawn to exit; its output must
//!    have one line per file.
//! 4. **`cp -a`**: `cp -a SRC DST`, spawn to exit.
//! 5. **quiesce** (unless `--skip-quiesce`): a real [`BwrapProvider`]
//!    instance of `sleep 1000` over a workspace directory holding a copy of
//!    the source (put there by the host, untimed, before `allocate`);
//!    timed from `stop` through reading the stopped page and acknowledging
//!    it to `quiesce`'s return (the walk into the provider's blob store, the
//!    signature, the persisted answer), and `quiesce` on its own. The
//!    provider's blob store is emptied after every sample, so every quiesce
//!    writes every blob as a fresh snapshot does.
//!
//! After every timed step, untimed: a `sync` (so no step's writeback lands
//! in another's time), and the checks: a restored or copied tree must equal
//! the source entry for entry (kind, mode, bytes, symlink target), a
//! snapshot's and a quiesce's manifest must list the source's entries and
//! have the same digest every sample. A failed check ends the run with an
//! error and no table. Every tree a sample writes is kept until the
//! workspace's last sample and only then removed (about 6 copies of the
//! workspace per sample on disk meanwhile): on ext4 creating files right
//! after thousands were removed is several times slower, which would land
//! in whichever variant ran next. The page cache is **warm** for every variant: the
//! source and the restore store are written before the samples and read by
//! an unmeasured warm-up sample first.
//!
//! Needs root (cgroups, bubblewrap) and, for the quiesce, the
//! `lc-supervisor` binary (`--supervisor-bin`, by default next to this
//! executable: `cargo build --release -p lc-supervisor`).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use jiff::Timestamp;
use lc_blob::LocalBlobStore;
use lc_blob::tree::{restore_tree, snapshot_tree};
use lc_core::owner::OwnerFence;
use lc_core::shape::SMALL;
use lc_core::snapshot::{Entry, Manifest};
use lc_core::{AttemptNo, Command, ExecId, Generation, ProviderId, SandboxLeaseId, WorkspaceId};
use lc_provider::runtime::base_digest;
use lc_provider::{AllocateRequest, BwrapConfig, BwrapProvider, Provider};
use tollgate_bench::{LatencySummary, micros};

/// The most samples of one workspace.
const SAMPLES_MAX: u32 = 1_000;

/// The most unmeasured samples of one workspace.
const WARMUP_MAX: u32 = 10;

/// The longest wait for an instance's stopped page.
const STOPPED_WAIT_MAX: Duration = Duration::from_secs(30);

/// How often `pages` is polled for the stopped page.
const PAGES_POLL: Duration = Duration::from_millis(1);

/// The bytes of the 1 MB workspace's one file.
const ONE_MB_BYTES: usize = 1_000_000;

/// The bytes of the 100 MB workspace's one file.
const HUNDRED_MB_BYTES: usize = 100_000_000;

/// Directories of the 10k-files workspace.
const MANY_DIRS: usize = 100;

/// Files per directory of the 10k-files workspace.
const MANY_FILES_PER_DIR: usize = 100;

/// Bytes of each file of the 10k-files workspace.
const MANY_FILE_BYTES: usize = 1024;

/// The bytes written per call while a source file is generated.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// The workspace id every snapshot of the benchmark names.
const WORKSPACE: WorkspaceId = WorkspaceId(1);

/// The fence of every provider call.
const FENCE: OwnerFence = OwnerFence(1);

#[derive(Parser, Debug)]
#[command(
    about = "Workspace hibernation and resume: snapshot_tree / restore_tree / quiesce against cp -a (+ sha256sum)"
)]
struct Args {
    /// Measured samples of the 1 MB workspace.
    #[arg(long, default_value_t = 20)]
    samples_1mb: u32,
    /// Measured samples of the 100 MB workspace.
    #[arg(long, default_value_t = 5)]
    samples_100mb: u32,
    /// Measured samples of the 10k-files workspace.
    #[arg(long, default_value_t = 20)]
    samples_10k: u32,
    /// Unmeasured samples first, per workspace.
    #[arg(long, default_value_t = 1)]
    warmup: u32,
    /// Leave out the provider's quiesce (no root, bubblewrap or supervisor
    /// needed then).
    #[arg(long)]
    skip_quiesce: bool,
    /// The run directory (must not exist; removed at the end). Default
    /// `/tmp/lc-hibbench-<pid>`.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The `lc-supervisor` binary (default: next to this executable).
    #[arg(long)]
    supervisor_bin: Option<PathBuf>,
    /// The bubblewrap binary.
    #[arg(long, default_value = "/usr/bin/bwrap")]
    bwrap: PathBuf,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("lc_hibernate_resume: {e}");
        std::process::exit(1);
    }
}

/// One benchmarked workspace.
#[derive(Debug, Clone, Copy)]
enum Case {
    OneMb,
    HundredMb,
    ManyFiles,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::OneMb => "1 file of 1 MB",
            Case::HundredMb => "1 file of 100 MB",
            Case::ManyFiles => "10 000 files of 1 KiB in 100 dirs + 4 symlinks",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Case::OneMb => "1mb",
            Case::HundredMb => "100mb",
            Case::ManyFiles => "10k",
        }
    }
}

/// Pseudo-random bytes (SplitMix64): distinct seeds give distinct files.
fn fill(seed: u64, buf: &mut [u8]) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    for chunk in buf.chunks_mut(8) {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn err(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

/// Writes `bytes` pseudo-random bytes of `seed` to the new file `path` of
/// mode `mode`.
fn write_file(path: &Path, seed: u64, bytes: usize, mode: u32) -> Result<(), String> {
    let mut f = fs::File::create_new(path).map_err(err(path))?;
    let mut buf = vec![0u8; WRITE_CHUNK_BYTES.min(bytes)];
    let mut left = bytes;
    let mut part = 0u64;
    while left > 0 {
        let n = left.min(buf.len());
        fill(
            seed.wrapping_mul(1_000_003).wrapping_add(part),
            &mut buf[..n],
        );
        f.write_all(&buf[..n]).map_err(err(path))?;
        left -= n;
        part += 1;
    }
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(err(path))
}

/// Builds the source tree of `case` at the new directory `root`; gives
/// `(files, file bytes)`.
fn build_source(case: Case, root: &Path) -> Result<(usize, u64), String> {
    fs::create_dir(root).map_err(err(root))?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).map_err(err(root))?;
    match case {
        Case::OneMb => {
            write_file(&root.join("data.bin"), 1, ONE_MB_BYTES, 0o644)?;
            Ok((1, ONE_MB_BYTES as u64))
        }
        Case::HundredMb => {
            write_file(&root.join("data.bin"), 2, HUNDRED_MB_BYTES, 0o644)?;
            Ok((1, HUNDRED_MB_BYTES as u64))
        }
        Case::ManyFiles => {
            for d in 0..MANY_DIRS {
                let dir = root.join(format!("d{d:02}"));
                fs::create_dir(&dir).map_err(err(&dir))?;
                for f in 0..MANY_FILES_PER_DIR {
                    let mode = [0o644, 0o600, 0o755, 0o640][f % 4];
                    let seed = 1000 + (d * MANY_FILES_PER_DIR + f) as u64;
                    write_file(&dir.join(format!("f{f:03}")), seed, MANY_FILE_BYTES, mode)?;
                }
                let mode = if d % 10 == 0 { 0o750 } else { 0o755 };
                fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).map_err(err(&dir))?;
            }
            for (link, target) in [
                ("link-file", "d00/f000"),
                ("link-dir", "d01"),
                ("link-abs", "/etc/hostname"),
                ("d02/up", "../d03/f001"),
            ] {
                let at = root.join(link);
                symlink(target, &at).map_err(err(&at))?;
            }
            let files = MANY_DIRS * MANY_FILES_PER_DIR;
            Ok((files, (files * MANY_FILE_BYTES) as u64))
        }
    }
}

/// What one entry of a tree is, for comparing trees.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir { mode: u32 },
    File { mode: u32, bytes: u64 },
    Symlink { target: PathBuf },
}

/// Every entry below `root` (not following links), by relative path.
fn listing(root: &Path) -> Result<BTreeMap<PathBuf, Node>, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let dir = root.join(&rel);
        for item in fs::read_dir(&dir).map_err(err(&dir))? {
            let item = item.map_err(err(&dir))?;
            let rel = rel.join(item.file_name());
            let path = root.join(&rel);
            let meta = fs::symlink_metadata(&path).map_err(err(&path))?;
            let mode = meta.mode() & 0o7777;
            let node = if meta.is_dir() {
                pending.push(rel.clone());
                Node::Dir { mode }
            } else if meta.is_file() {
                Node::File {
                    mode,
                    bytes: meta.len(),
                }
            } else if meta.file_type().is_symlink() {
                Node::Symlink {
                    target: fs::read_link(&path).map_err(err(&path))?,
                }
            } else {
                return Err(format!(
                    "{}: not a file, directory or symlink",
                    path.display()
                ));
            };
            out.insert(rel, node);
        }
    }
    Ok(out)
}

/// Whether the files `a` and `b` hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> Result<bool, String> {
    let (mut fa, mut fb) = (
        fs::File::open(a).map_err(err(a))?,
        fs::File::open(b).map_err(err(b))?,
    );
    let (mut ba, mut bb) = (vec![0u8; WRITE_CHUNK_BYTES], vec![0u8; WRITE_CHUNK_BYTES]);
    // Each pass reads at least one byte of a finite file or ends.
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(err(a))?;
        let nb = read_full(&mut fb, &mut bb).map_err(err(b))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Checks that the tree at `copy` equals `source`: the same entries, kinds,
/// modes, symlink targets and file bytes.
fn check_same_tree(
    source: &Path,
    source_list: &BTreeMap<PathBuf, Node>,
    copy: &Path,
) -> Result<(), String> {
    let got = listing(copy)?;
    if &got != source_list {
        let first = source_list
            .iter()
            .find(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, v)| format!("{}: {v:?} vs {:?}", k.display(), got.get(k)));
        return Err(format!(
            "{} differs from {}: {} vs {} entries; first difference: {first:?}",
            copy.display(),
            source.display(),
            got.len(),
            source_list.len()
        ));
    }
    for (rel, node) in source_list {
        if let Node::File { .. } = node
            && !same_bytes(&source.join(rel), &copy.join(rel))?
        {
            return Err(format!(
                "{}: bytes differ from the source",
                copy.join(rel).display()
            ));
        }
    }
    Ok(())
}

/// Flushes every dirty page of the machine (`sync`), untimed.
fn sync_all() -> Result<(), String> {
    let st = std::process::Command::new("sync")
        .status()
        .map_err(|e| format!("sync: {e}"))?;
    if !st.success() {
        return Err(format!("sync exited with {st}"));
    }
    Ok(())
}

/// Runs `program args`, spawn to exit; gives the time and its stdout.
fn timed_spawn(program: &str, args: &[&str]) -> Result<(Duration, Vec<u8>), String> {
    let t0 = Instant::now();
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    let took = t0.elapsed();
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((took, out.stdout))
}

fn remove(path: &Path) -> Result<(), String> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The variants, in their table order.
const VARIANTS: [&str; 6] = [
    "`snapshot_tree` into a fresh store + canonical manifest and digest",
    "`restore_tree` into an empty directory (every blob verified)",
    "reference: `cp -a` + `sha256sum` of every file",
    "`cp -a` alone",
    "provider: `stop` + stopped page + `ack` + `quiesce`",
    "provider: `quiesce` alone",
];

/// The position in [`VARIANTS`] of the reference.
const REFERENCE: usize = 2;

/// The position in [`VARIANTS`] of `cp -a` alone.
const CP_ALONE: usize = 3;

/// A running provider and what the quiesce samples need of it.
struct Quiescer {
    provider: BwrapProvider,
    /// The next lease (and exec and workspace) id.
    next: i64,
    /// Where each sample's workspace and blobs are set aside until the
    /// workspace's samples end.
    kept: PathBuf,
}

impl Quiescer {
    /// One quiesce sample over a copy of `source`: `(stop to quiesce's
    /// return, quiesce alone)`; checks its manifest lists `want`.
    async fn sample(
        &mut self,
        source: &Path,
        want: &[Entry],
    ) -> Result<(Duration, Duration), String> {
        self.next += 1;
        let n = self.next;
        let (l, g, ws_id) = (SandboxLeaseId(n), Generation(1), WorkspaceId(n));
        let ws = self.provider.workspace_dir(ws_id);
        if let Some(parent) = ws.parent() {
            fs::create_dir_all(parent).map_err(err(parent))?;
        }
        let ws_text = ws.to_string_lossy().into_owned();
        let src_text = source.to_string_lossy().into_owned();
        timed_spawn("cp", &["-a", &src_text, &ws_text])?;
        sync_all()?;
        let req = AllocateRequest {
            lease_id: l,
            generation: g,
            exec_id: ExecId(n),
            attempt: AttemptNo(1),
            runtime: base_digest(),
            shape: SMALL,
            command: Command::new(vec!["sleep".into(), "1000".into()])
                .map_err(|e| e.to_string())?,
            workspace_id: ws_id,
            stdin_open: false,
            first_seq: 1,
            first_input_seq: 1,
            restore: None,
        };
        self.provider
            .allocate(req)
            .await
            .map_err(|e| format!("allocate: {e}"))?;
        let t0 = Instant::now();
        self.provider
            .stop(l, g, FENCE)
            .await
            .map_err(|e| format!("stop: {e}"))?;
        let mut after = 0;
        let last = loop {
            let pages = self
                .provider
                .pages(l, g, FENCE, after, 64)
                .await
                .map_err(|e| format!("pages: {e}"))?;
            if let Some(p) = pages.last() {
                after = p.seq();
                if p.is_last() {
                    break p.seq();
                }
            }
            if t0.elapsed() > STOPPED_WAIT_MAX {
                return Err(format!("no stopped page within {STOPPED_WAIT_MAX:?}"));
            }
            tokio::time::sleep(PAGES_POLL).await;
        };
        self.provider
            .ack(l, g, FENCE, last)
            .await
            .map_err(|e| format!("ack: {e}"))?;
        let t1 = Instant::now();
        let q = self
            .provider
            .quiesce(l, g, FENCE)
            .await
            .map_err(|e| format!("quiesce: {e}"))?;
        let (total, alone) = (t0.elapsed(), t1.elapsed());
        let m =
            Manifest::from_canonical(&q.manifest).map_err(|e| format!("quiesce manifest: {e}"))?;
        if m.entries != want {
            return Err(format!(
                "the quiesce manifest lists {} entries, not the source's {}",
                m.entries.len(),
                want.len()
            ));
        }
        self.provider
            .destroy(l, g)
            .await
            .map_err(|e| format!("destroy: {e}"))?;
        // Set aside, not removed (see `measure`): the workspace, and the
        // store's blobs, so the next sample's quiesce finds an empty store
        // as a first snapshot does.
        let kept = self.kept.join(format!("quiesce-{n}"));
        fs::create_dir_all(&kept).map_err(err(&kept))?;
        fs::rename(&ws, kept.join("workspace")).map_err(err(&ws))?;
        let blobs = self.provider.config().blob_dir.join("sha256");
        fs::rename(&blobs, kept.join("blobs")).map_err(err(&blobs))?;
        fs::create_dir(&blobs).map_err(err(&blobs))?;
        sync_all()?;
        Ok((total, alone))
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

async fn run(args: &Args) -> Result<(), String> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/lc-hibbench-{}", std::process::id())));
    if fs::symlink_metadata(&dir).is_ok() {
        return Err(format!("{} exists: pass a fresh --dir", dir.display()));
    }
    fs::create_dir_all(&dir).map_err(err(&dir))?;
    let mut quiescer = None;
    let result = async {
        if !args.skip_quiesce {
            quiescer = Some(open_provider(args, &dir)?);
        }
        measure(args, &dir, quiescer.as_mut()).await
    }
    .await;
    if let Some(q) = &quiescer {
        let parent = &q.provider.config().cgroup_parent;
        for c in ["memory", "pids", "cpu", "cpu,cpuacct", ""] {
            let _ = fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(parent));
        }
    }
    let _ = fs::remove_dir_all(&dir);
    result
}

fn open_provider(args: &Args, dir: &Path) -> Result<Quiescer, String> {
    let supervisor = match &args.supervisor_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("lc-supervisor"),
    };
    if !supervisor.is_file() {
        return Err(format!(
            "{} missing: cargo build --release -p lc-supervisor, pass --supervisor-bin, or --skip-quiesce",
            supervisor.display()
        ));
    }
    let mut cfg = BwrapConfig::new(
        ProviderId::new("bench").map_err(|e| e.to_string())?,
        &dir.join("provider"),
        &supervisor,
    );
    cfg.bwrap_bin = args.bwrap.clone();
    cfg.cgroup_parent = format!("little-compute-hibbench-{}", std::process::id());
    let provider = BwrapProvider::open(cfg).map_err(|e| e.to_string())?;
    Ok(Quiescer {
        provider,
        next: 0,
        kept: dir.join("kept"),
    })
}

async fn measure(
    args: &Args,
    dir: &Path,
    mut quiescer: Option<&mut Quiescer>,
) -> Result<(), String> {
    println!("# Workspace hibernation and resume: snapshot/restore/quiesce vs cp -a (+ sha256sum)");
    println!("date: {}", Timestamp::now());
    println!("load average before: {}", loadavg());
    println!("run directory: {} (page cache: warm)", dir.display());
    let cases = [
        (Case::OneMb, args.samples_1mb),
        (Case::HundredMb, args.samples_100mb),
        (Case::ManyFiles, args.samples_10k),
    ];
    let warmup = args.warmup.min(WARMUP_MAX);
    let mut rows = Vec::new();
    for (case, samples) in cases {
        let samples = samples.clamp(1, SAMPLES_MAX);
        let source = dir.join(format!("src-{}", case.slug()));
        let (files, bytes) = build_source(case, &source)?;
        let source_list = listing(&source)?;
        // The store every restore reads, written once.
        let restore_store_dir = dir.join(format!("restore-store-{}", case.slug()));
        let restore_store = LocalBlobStore::open(&restore_store_dir).map_err(|e| e.to_string())?;
        let manifest =
            snapshot_tree(&source, WORKSPACE, None, &restore_store).map_err(|e| e.to_string())?;
        let digest = manifest.digest();
        if manifest.file_bytes() != bytes {
            return Err(format!(
                "the manifest counts {} file bytes, the source has {bytes}",
                manifest.file_bytes()
            ));
        }
        if manifest.entries.len() != source_list.len() {
            return Err(format!(
                "the manifest lists {} entries, the source has {}",
                manifest.entries.len(),
                source_list.len()
            ));
        }
        sync_all()?;
        println!(
            "{}: {} entries, {files} files, {bytes} file bytes, manifest {} bytes, head {}; load {}",
            case.name(),
            manifest.entries.len(),
            manifest.canonical_bytes().len(),
            digest.to_hex(),
            loadavg()
        );
        let mut v: Vec<Vec<u64>> = vec![Vec::new(); VARIANTS.len()];
        let (src_text, n_variants) = (
            source.to_string_lossy().into_owned(),
            if quiescer.is_some() { 5 } else { 4 },
        );
        for i in 0..warmup + samples {
            let mut took: [Option<Duration>; 6] = [None; 6];
            for k in 0..n_variants {
                let step = (k + i as usize) % n_variants;
                let dst = dir.join(format!("dst-{}-{i}-{step}", case.slug()));
                let dst_text = dst.to_string_lossy().into_owned();
                match step {
                    0 => {
                        let store = LocalBlobStore::open(&dst).map_err(|e| e.to_string())?;
                        let t0 = Instant::now();
                        let m = snapshot_tree(&source, WORKSPACE, None, &store)
                            .map_err(|e| format!("snapshot: {e}"))?;
                        let canonical = m.canonical_bytes();
                        let d = m.digest();
                        took[0] = Some(t0.elapsed());
                        if d != digest || canonical != manifest.canonical_bytes() {
                            return Err(format!(
                                "snapshot {i}: head {} is not {}",
                                d.to_hex(),
                                digest.to_hex()
                            ));
                        }
                    }
                    1 => {
                        let t0 = Instant::now();
                        let r = restore_tree(&manifest, &restore_store, &dst, None)
                            .map_err(|e| format!("restore: {e}"))?;
                        took[1] = Some(t0.elapsed());
                        if (r.entries, r.file_bytes) != (manifest.entries.len(), bytes) {
                            return Err(format!("restore {i}: report {r:?}"));
                        }
                        check_same_tree(&source, &source_list, &dst)?;
                    }
                    2 => {
                        let (t, out) = timed_spawn(
                            "sh",
                            &[
                                "-c",
                                "cp -a \"$1\" \"$2\" && cd \"$2\" && find . -type f -print0 | xargs -0 sha256sum",
                                "sh",
                                &src_text,
                                &dst_text,
                            ],
                        )?;
                        took[2] = Some(t);
                        let lines = out.iter().filter(|b| **b == b'\n').count();
                        if lines != files {
                            return Err(format!(
                                "sha256sum printed {lines} lines for {files} files"
                            ));
                        }
                        check_same_tree(&source, &source_list, &dst)?;
                    }
                    3 => {
                        let (t, _) = timed_spawn("cp", &["-a", &src_text, &dst_text])?;
                        took[3] = Some(t);
                        check_same_tree(&source, &source_list, &dst)?;
                    }
                    _ => {
                        let q = quiescer
                            .as_deref_mut()
                            .ok_or("quiesce step without a provider")?;
                        let (total, alone) = q.sample(&source, &manifest.entries).await?;
                        took[4] = Some(total);
                        took[5] = Some(alone);
                    }
                }
                sync_all()?;
            }
            if i >= warmup {
                for (k, t) in took.iter().enumerate() {
                    if let Some(t) = t {
                        v[k].push(micros(*t));
                    }
                }
            }
        }
        // Every tree of the workspace's samples is removed only now: on
        // ext4 creating files right after thousands were removed is
        // several times slower, which would land in whichever variant came
        // next.
        for i in 0..warmup + samples {
            for step in 0..n_variants {
                remove(&dir.join(format!("dst-{}-{i}-{step}", case.slug())))?;
            }
        }
        if let Some(q) = quiescer.as_deref() {
            remove(&q.kept)?;
        }
        remove(&source)?;
        remove(&restore_store_dir)?;
        sync_all()?;
        rows.push((case, v));
    }
    println!("load average after: {}", loadavg());
    println!();
    println!(
        "| workspace | variant | samples | p50 ms | p90 ms | max ms | **p50 / reference p50** | p50 / `cp -a` p50 |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (case, mut v) in rows {
        let reference = LatencySummary::of(&mut v[REFERENCE].clone()).p50_us as f64;
        let cp = LatencySummary::of(&mut v[CP_ALONE].clone()).p50_us as f64;
        for (k, samples) in v.iter_mut().enumerate() {
            if samples.is_empty() {
                continue;
            }
            let l = LatencySummary::of(samples);
            println!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | **{:.2}** | {:.2} |",
                case.name(),
                VARIANTS[k],
                l.count,
                ms(l.p50_us),
                ms(l.p90_us),
                ms(l.max_us),
                l.p50_us as f64 / reference,
                l.p50_us as f64 / cp
            );
        }
    }
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
