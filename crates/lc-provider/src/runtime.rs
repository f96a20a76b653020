//! The runtime store: root filesystem trees, content-addressed by the
//! SHA-256 of their canonical manifest ([`lc_core::manifest`]).
//!
//! Layout: `<dir>/<digest hex>/manifest.json` (the canonical manifest) and
//! `<dir>/<digest hex>/tree/` (the files). The built-in `base` runtime
//! ([`Manifest::base`]) has no directory: it is the host's `/usr`.
//!
//! An import (from a directory or a tar stream) is built in a fresh staging
//! directory next to the store and renamed into place only once every rule
//! held; on any refusal the staging directory is removed, so nothing is left
//! behind. The rules: every path relative and clean (no `..`, no absolute
//! path), only directories, regular files and symlinks (no device, fifo,
//! socket or hard link), every symlink's target inside the tree, no entry
//! below a symlink or a file, no path twice, at most
//! [`ImportLimits::entries_max`] entries and [`ImportLimits::bytes_max`]
//! bytes of file data. Permission bits are kept as `mode & 0o777`
//! (set-id and sticky bits are dropped); owners are not kept. Symlinks in a
//! source directory are never followed. Parent directories a tar stream
//! leaves implicit are created `0o755`.

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use lc_core::Digest;
use lc_core::manifest::{
    EntryType, Manifest, ManifestEntry, ManifestError, check_relative_path, check_symlink_target,
};
use sha2::Digest as _;

/// Bounds of one import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// The most entries (directories, files, symlinks).
    pub entries_max: usize,
    /// The most bytes of file data, summed.
    pub bytes_max: u64,
}

impl Default for ImportLimits {
    /// 100 000 entries and 2 GiB: a full distribution root filesystem fits.
    fn default() -> ImportLimits {
        ImportLimits {
            entries_max: 100_000,
            bytes_max: 2 << 30,
        }
    }
}

/// A refused import. Codes are stable ([`ImportError::code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// A path or symlink the manifest rules refuse (`absolute_path`,
    /// `parent_path`, `bad_path`, `symlink_escape`, ...).
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// A device, fifo, socket or hard link. Code `special_file`.
    #[error("{0:?} is not a directory, regular file or symlink")]
    SpecialFile(String),
    /// An entry below a symlink or a regular file. Code `not_a_directory`.
    #[error("{0:?} lies below a symlink or a file")]
    NotADirectory(String),
    /// The same path twice. Code `duplicate_entry`.
    #[error("{0:?} appears twice")]
    Duplicate(String),
    /// More entries than the bound. Code `too_many_entries`.
    #[error("more than {0} entries")]
    TooManyEntries(usize),
    /// More file bytes than the bound. Code `too_large`.
    #[error("more than {0} bytes of file data")]
    TooLarge(u64),
    /// A path that is not UTF-8. Code `bad_path`.
    #[error("a path is not UTF-8")]
    NotUtf8,
    /// The tar stream is not a tar archive. Code `malformed_tar`.
    #[error("malformed tar: {0}")]
    MalformedTar(String),
    /// The store or the source failed. Code `runtime_io`.
    #[error("runtime store: {0}")]
    Io(String),
}

impl ImportError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            ImportError::Manifest(m) => m.code(),
            ImportError::SpecialFile(_) => "special_file",
            ImportError::NotADirectory(_) => "not_a_directory",
            ImportError::Duplicate(_) => "duplicate_entry",
            ImportError::TooManyEntries(_) => "too_many_entries",
            ImportError::TooLarge(_) => "too_large",
            ImportError::NotUtf8 => "bad_path",
            ImportError::MalformedTar(_) => "malformed_tar",
            ImportError::Io(_) => "runtime_io",
        }
    }
}

impl From<ImportError> for crate::ProviderError {
    fn from(e: ImportError) -> crate::ProviderError {
        crate::ProviderError::RuntimeRefused {
            reason: e.code().to_owned(),
            detail: e.to_string(),
        }
    }
}

fn ioe(what: impl std::fmt::Display, e: impl std::fmt::Display) -> ImportError {
    ImportError::Io(format!("{what}: {e}"))
}

/// Where an instance's root comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeRoot {
    /// The host's `/usr`, read-only (the `base` runtime).
    HostUsr,
    /// An imported tree at this path.
    Tree(PathBuf),
}

/// An imported runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The runtime digest.
    pub digest: Digest,
    /// The canonical manifest.
    pub manifest: Manifest,
    /// `false` when the same tree was already in the store.
    pub created: bool,
}

/// The store; see the module docs.
#[derive(Debug, Clone)]
pub struct RuntimeStore {
    dir: PathBuf,
}

/// The digest of the built-in `base` runtime.
pub fn base_digest() -> Digest {
    Digest(Manifest::base().digest())
}

/// A staging directory removed on drop unless kept.
struct Staging {
    dir: PathBuf,
    keep: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The entries of an import being built, checked as they arrive.
struct Builder {
    tree: PathBuf,
    entries: BTreeMap<String, ManifestEntry>,
    bytes: u64,
    limits: ImportLimits,
}

impl Builder {
    fn admit(&mut self, path: &str) -> Result<(), ImportError> {
        check_relative_path(path)?;
        if self.entries.contains_key(path) {
            return Err(ImportError::Duplicate(path.to_owned()));
        }
        // Every ancestor is a directory entry (created implicitly if new).
        let mut ancestors: Vec<&str> = Vec::new();
        let mut p = path;
        while let Some((parent, _)) = p.rsplit_once('/') {
            ancestors.push(parent);
            p = parent;
        }
        for a in ancestors.into_iter().rev() {
            match self.entries.get(a).map(|e| e.entry_type) {
                Some(EntryType::Dir) => {}
                Some(_) => return Err(ImportError::NotADirectory(path.to_owned())),
                None => self.dir(a, 0o755)?,
            }
        }
        // Counted after the implicit parents, each of which is an entry too.
        if self.entries.len() >= self.limits.entries_max {
            return Err(ImportError::TooManyEntries(self.limits.entries_max));
        }
        Ok(())
    }

    fn dir(&mut self, path: &str, mode: u32) -> Result<(), ImportError> {
        if let Some(e) = self.entries.get_mut(path)
            && e.entry_type == EntryType::Dir
        {
            // An explicit directory entry after an implicit one sets its mode.
            e.mode = Some(mode & 0o777);
            let full = self.tree.join(path);
            return std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| ioe(full.display(), e));
        }
        self.admit(path)?;
        let full = self.tree.join(path);
        // Directories stay 0700 while the import writes into them; the
        // manifest records the mode, applied when the import completes.
        std::fs::create_dir(&full).map_err(|e| ioe(full.display(), e))?;
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| ioe(full.display(), e))?;
        self.entries
            .insert(path.to_owned(), ManifestEntry::dir(path, mode & 0o777));
        Ok(())
    }

    fn file(
        &mut self,
        path: &str,
        mode: u32,
        size: u64,
        mut src: impl Read,
    ) -> Result<(), ImportError> {
        self.admit(path)?;
        let total = self.bytes.saturating_add(size);
        if total > self.limits.bytes_max {
            return Err(ImportError::TooLarge(self.limits.bytes_max));
        }
        let full = self.tree.join(path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&full)
            .map_err(|e| ioe(full.display(), e))?;
        let mut hasher = sha2::Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut written: u64 = 0;
        // Bounded by `size`, itself bounded by bytes_max.
        while written < size {
            let want = (size - written).min(buf.len() as u64) as usize;
            let n = src.read(&mut buf[..want]).map_err(|e| ioe(path, e))?;
            if n == 0 {
                return Err(ImportError::MalformedTar(format!("{path}: short file")));
            }
            hasher.update(&buf[..n]);
            f.write_all(&buf[..n]).map_err(|e| ioe(full.display(), e))?;
            written += n as u64;
        }
        f.sync_all().map_err(|e| ioe(full.display(), e))?;
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| ioe(full.display(), e))?;
        self.bytes = total;
        self.entries.insert(
            path.to_owned(),
            ManifestEntry::file(path, mode & 0o777, size, hasher.finalize().into()),
        );
        Ok(())
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<(), ImportError> {
        self.admit(path)?;
        check_symlink_target(path, target)?;
        let full = self.tree.join(path);
        std::os::unix::fs::symlink(target, &full).map_err(|e| ioe(full.display(), e))?;
        self.entries
            .insert(path.to_owned(), ManifestEntry::symlink(path, target));
        Ok(())
    }

    /// Applies the recorded directory modes (deepest first) and returns the
    /// checked manifest.
    fn finish(self) -> Result<Manifest, ImportError> {
        for e in self.entries.values().rev() {
            if e.entry_type == EntryType::Dir {
                let full = self.tree.join(&e.path);
                std::fs::set_permissions(
                    &full,
                    std::fs::Permissions::from_mode(e.mode.unwrap_or(0o755)),
                )
                .map_err(|err| ioe(full.display(), err))?;
            }
        }
        Ok(Manifest::tree(self.entries.into_values().collect())?)
    }
}

impl RuntimeStore {
    /// The store in `dir` (created if missing).
    ///
    /// # Errors
    /// [`ImportError::Io`].
    pub fn open(dir: &Path) -> Result<RuntimeStore, ImportError> {
        std::fs::create_dir_all(dir).map_err(|e| ioe(dir.display(), e))?;
        Ok(RuntimeStore {
            dir: dir.to_owned(),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where runtime `digest` comes from, `None` when it is not in the store.
    pub fn resolve(&self, digest: &Digest) -> Option<RuntimeRoot> {
        if *digest == base_digest() {
            return Some(RuntimeRoot::HostUsr);
        }
        let d = self.dir.join(digest.to_hex());
        let tree = d.join("tree");
        (d.join("manifest.json").is_file() && tree.is_dir()).then_some(RuntimeRoot::Tree(tree))
    }

    /// The canonical manifest of `digest`, `None` when not in the store.
    pub fn manifest(&self, digest: &Digest) -> Option<Manifest> {
        if *digest == base_digest() {
            return Some(Manifest::base());
        }
        let bytes = std::fs::read(self.dir.join(digest.to_hex()).join("manifest.json")).ok()?;
        Manifest::parse(&bytes).ok()
    }

    fn staging(&self) -> Result<(Staging, Builder), ImportError> {
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| ioe("getrandom", e))?;
        let dir = self.dir.join(format!(".staging-{}", hex::encode(rnd)));
        let tree = dir.join("tree");
        std::fs::create_dir_all(&tree).map_err(|e| ioe(tree.display(), e))?;
        Ok((
            Staging { dir, keep: false },
            Builder {
                tree,
                entries: BTreeMap::new(),
                bytes: 0,
                limits: ImportLimits::default(),
            },
        ))
    }

    fn commit(&self, mut staging: Staging, builder: Builder) -> Result<Imported, ImportError> {
        let manifest = builder.finish()?;
        let digest = Digest(manifest.digest());
        let bytes = manifest.canonical();
        let mpath = staging.dir.join("manifest.json");
        std::fs::write(&mpath, &bytes).map_err(|e| ioe(mpath.display(), e))?;
        let dest = self.dir.join(digest.to_hex());
        if dest.join("manifest.json").is_file() {
            return Ok(Imported {
                digest,
                manifest,
                created: false,
            });
        }
        std::fs::rename(&staging.dir, &dest).map_err(|e| ioe(dest.display(), e))?;
        staging.keep = true;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| ioe(self.dir.display(), e))?;
        Ok(Imported {
            digest,
            manifest,
            created: true,
        })
    }

    /// Imports the tree at `src` (symlinks are copied, never followed).
    ///
    /// # Errors
    /// An [`ImportError`] for the first rule broken; nothing is left in the store.
    pub fn import_dir(&self, src: &Path, limits: ImportLimits) -> Result<Imported, ImportError> {
        let (staging, mut b) = self.staging()?;
        b.limits = limits;
        // Depth-first with an explicit stack; every pushed path becomes an
        // entry, so the entry bound also bounds the walk.
        let mut stack: Vec<String> = Vec::new();
        let mut top = read_dir_sorted(src, limits.entries_max)?;
        top.reverse();
        stack.extend(top);
        while let Some(rel) = stack.pop() {
            let full = src.join(&rel);
            let meta = std::fs::symlink_metadata(&full).map_err(|e| ioe(full.display(), e))?;
            let ft = meta.file_type();
            let mode = meta.permissions().mode();
            if ft.is_dir() {
                b.dir(&rel, mode)?;
                let mut kids: Vec<String> = read_dir_sorted(&full, limits.entries_max)?
                    .into_iter()
                    .map(|k| format!("{rel}/{k}"))
                    .collect();
                kids.reverse();
                stack.extend(kids);
            } else if ft.is_file() {
                let f = std::fs::File::open(&full).map_err(|e| ioe(full.display(), e))?;
                b.file(&rel, mode, meta.len(), f)?;
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&full).map_err(|e| ioe(full.display(), e))?;
                let t = t.to_str().ok_or(ImportError::NotUtf8)?;
                b.symlink(&rel, t)?;
            } else {
                return Err(ImportError::SpecialFile(rel));
            }
        }
        self.commit(staging, b)
    }

    /// Imports a tar stream (plain, uncompressed; GNU and PAX long names
    /// accepted).
    ///
    /// # Errors
    /// An [`ImportError`] for the first rule broken; nothing is left in the store.
    pub fn import_tar(
        &self,
        src: impl Read,
        limits: ImportLimits,
    ) -> Result<Imported, ImportError> {
        let (staging, mut b) = self.staging()?;
        b.limits = limits;
        let mut archive = tar::Archive::new(src);
        let entries = archive
            .entries()
            .map_err(|e| ImportError::MalformedTar(e.to_string()))?;
        // Bounded: each entry either becomes a manifest entry (bounded by
        // entries_max) or refuses the import; `.` entries are at most one per
        // header, and each header consumes 512 bytes of a finite stream.
        for entry in entries {
            let mut entry = entry.map_err(|e| ImportError::MalformedTar(e.to_string()))?;
            let raw = entry.path_bytes().into_owned();
            let raw = std::str::from_utf8(&raw).map_err(|_| ImportError::NotUtf8)?;
            if raw.starts_with('/') {
                return Err(ManifestError::AbsolutePath(raw.chars().take(256).collect()).into());
            }
            let mut path = raw.trim_end_matches('/');
            while let Some(rest) = path.strip_prefix("./") {
                path = rest;
            }
            if path.is_empty() || path == "." {
                continue;
            }
            let header = entry.header();
            let mode = header
                .mode()
                .map_err(|e| ImportError::MalformedTar(e.to_string()))?;
            match header.entry_type() {
                tar::EntryType::Directory => b.dir(path, mode)?,
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = entry.size();
                    b.file(path, mode, size, &mut entry)?;
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .ok_or_else(|| {
                            ImportError::MalformedTar(format!("{path}: symlink without target"))
                        })?
                        .into_owned();
                    let target = std::str::from_utf8(&target).map_err(|_| ImportError::NotUtf8)?;
                    b.symlink(path, target)?;
                }
                _ => return Err(ImportError::SpecialFile(path.to_owned())),
            }
        }
        self.commit(staging, b)
    }
}

/// The names in `dir`, sorted; more than `entries_max` refuses the import.
fn read_dir_sorted(dir: &Path, entries_max: usize) -> Result<Vec<String>, ImportError> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| ioe(dir.display(), e))? {
        let e = e.map_err(|e| ioe(dir.display(), e))?;
        if names.len() >= entries_max {
            return Err(ImportError::TooManyEntries(entries_max));
        }
        names.push(
            e.file_name()
                .into_string()
                .map_err(|_| ImportError::NotUtf8)?,
        );
    }
    names.sort();
    Ok(names)
}
