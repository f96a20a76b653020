//! Snapshot and restore of a workspace tree through the blob store.
//!
//! [`snapshot_tree`] walks a directory into a [`Manifest`] and puts every
//! file's bytes into a [`BlobStore`]; [`restore_tree`] builds the tree of a
//! manifest at a path that does not exist yet, all or nothing.
//!
//! # Snapshot
//!
//! * **No link is followed.** Every entry is examined with `lstat`; a
//!   symlink is recorded with its target as data. A file is opened with
//!   `O_NOFOLLOW | O_NONBLOCK` and its `fstat` must be the regular file the
//!   `lstat` saw (device and inode), so a file swapped for a link, fifo or
//!   another file between the two is refused (`tree_io`), never read. The
//!   walk expects a quiescent tree (the workspace's processes are gone);
//!   it detects a swap of a file, not of a directory under it.
//! * **One read per file, streamed.** Each file is read once, through
//!   [`BlobStore::put_reader`], which hashes the bytes as it stores them:
//!   the digest and size recorded are those of exactly the bytes stored.
//!   No `Vec` of a whole file is ever built: memory holds one buffer of at
//!   most [`crate::STREAM_BUFFER_BYTES`] whatever the file's size.
//! * **Blobs first.** Every file's blob is durable in the store
//!   (`put_reader` fsyncs) before the manifest is returned, so a manifest
//!   committed after this call names only blobs that exist. The store
//!   deduplicates by digest.
//! * **Bounded.** Names, entries, file bytes and each file are checked
//!   against the [`lc_core::snapshot`] bounds as they are met, before more is
//!   read: a directory of too many names is refused while it is listed, a
//!   file too large before it is opened (and one that grows past the bound
//!   while it is read, within one buffer of it).
//! * **Only three kinds.** Hard links become independent files; a device,
//!   fifo or socket is [`TreeError::SpecialFile`]; a name that is not UTF-8
//!   is [`TreeError::PathNotUtf8`].
//!
//! # Restore
//!
//! * `dest` must not exist ([`TreeError::DestExists`]). The tree is built in
//!   a fresh sibling directory `.lc-restore-<16 hex>` of mode `0o700`, so
//!   nothing else can enter it while it is built: directories (parents
//!   first), then each file created with `O_CREAT | O_EXCL | O_NOFOLLOW`
//!   and its blob streamed into it ([`BlobStore::copy_to`], one buffer at a
//!   time), the blob's size and SHA-256 checked against the entry both by
//!   the store and here, on the bytes written
//!   ([`TreeError::BlobCorrupt`], [`TreeError::BlobMissing`]), owned
//!   (`fchown`, before `fchmod`, which a `chown` would otherwise strip of
//!   setuid and setgid), given its mode and fsynced; then the symlinks
//!   (last, so no file or directory is ever created through one); then each
//!   directory, deepest first, is owned, given its mode and fsynced, so a
//!   read-only directory never blocks the creation of its entries; then the
//!   root (mode [`RESTORE_ROOT_MODE`]).
//! * The built directory is renamed onto `dest` with `RENAME_NOREPLACE` (a
//!   `dest` that appeared meanwhile is not replaced) and the parent
//!   directory is fsynced.
//! * **All or nothing.** On any error the temporary directory is removed
//!   whole (best effort, after giving every directory in it back write
//!   permission) and `dest` is left absent; an error after the rename (the
//!   parent's fsync) removes `dest` again.

use std::ffi::OsString;
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{
    DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, fchown, lchown, symlink,
};
use std::path::{Path, PathBuf};

use lc_core::snapshot::{
    Entry, EntryKind, Manifest, SNAPSHOT_BYTES_MAX, SNAPSHOT_ENTRIES_MAX, SNAPSHOT_FILE_BYTES_MAX,
    SnapshotError, check_path, check_symlink_target,
};
use lc_core::{Digest, WorkspaceId};
use sha2::Digest as _;

use crate::{BlobError, BlobStore, STREAM_BLOB_BYTES_MAX};

// Every file of a snapshot fits in one streamed blob.
const _: () = assert!(SNAPSHOT_FILE_BYTES_MAX <= STREAM_BLOB_BYTES_MAX);
// One file never exceeds the whole snapshot's bound. (Stated here, not next
// to the constants, whose file the mutation gate mutates.)
const _: () = assert!(SNAPSHOT_FILE_BYTES_MAX <= SNAPSHOT_BYTES_MAX);

/// The mode of a restored tree's root directory, which has no entry of its
/// own: its owner may write, everyone may read and enter.
pub const RESTORE_ROOT_MODE: u32 = 0o755;

/// Random bytes in a restore's temporary directory name, so concurrent
/// restores next to each other never share one.
const RESTORE_TEMP_RANDOM_BYTES: usize = 8;

/// The prefix of a restore's temporary directory name.
const RESTORE_TEMP_PREFIX: &str = ".lc-restore-";

/// A snapshot or restore's refusal or failure. Codes are stable:
/// [`TreeError::code`].
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// The store has no blob for a file entry. Code `blob_missing`: put the
    /// blob again from its source, or restore another snapshot.
    #[error(
        "file {path:?}: blob {digest} is not in the blob store; put it again or restore another snapshot"
    )]
    BlobMissing {
        /// The file's path in the manifest.
        path: String,
        /// The blob's name (the entry's SHA-256).
        digest: Digest,
    },
    /// The store's bytes for a file entry do not hash to its SHA-256 or
    /// differ from its size. Code `blob_corrupt`: put the blob again from
    /// its source, or restore another snapshot.
    #[error(
        "file {path:?}: blob {digest} is corrupt in the blob store; put it again or restore another snapshot"
    )]
    BlobCorrupt {
        /// The file's path in the manifest.
        path: String,
        /// The blob's name (the entry's SHA-256).
        digest: Digest,
    },
    /// A device, fifo or socket in the tree. Code `special_file`: a
    /// snapshot holds only directories, regular files and symlinks; remove
    /// it and snapshot again.
    #[error(
        "{path:?} is a device, fifo or socket; a snapshot holds only directories, regular files and symlinks: remove it and snapshot again"
    )]
    SpecialFile {
        /// Its path below the root.
        path: String,
    },
    /// A name that is not UTF-8. Code `path_not_utf8`: rename it and
    /// snapshot again.
    #[error(
        "{path:?} (shown with U+FFFD for the bytes that are not UTF-8) has a name that is not UTF-8: rename it and snapshot again"
    )]
    PathNotUtf8 {
        /// Its path below the root, converted lossily.
        path: String,
    },
    /// The tree or the manifest breaks a snapshot rule; the code is the
    /// [`SnapshotError`]'s own (`path_invalid`, `file_too_large`, ...).
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The blob store failed to store a file's bytes on snapshot; the code
    /// is the [`BlobError`]'s own (`blob_io`, `blob_too_large`).
    #[error("file {path:?}: blob store failed to store its bytes: {source}")]
    BlobPut {
        /// The file's path.
        path: String,
        /// The store's error (boxed: it is the largest variant's part).
        #[source]
        source: Box<BlobError>,
    },
    /// The blob store failed to give a file's blob on restore (other than
    /// a missing or corrupt blob); the code is the [`BlobError`]'s own
    /// (`blob_io`, `blob_too_large`).
    #[error("file {path:?}: blob store failed for blob {digest}: {source}")]
    Blob {
        /// The file's path.
        path: String,
        /// The blob's name.
        digest: Digest,
        /// The store's error (boxed: it is the largest variant's part).
        #[source]
        source: Box<BlobError>,
    },
    /// The file system failed, or changed under the walk. Code `tree_io`:
    /// check the path's space and permissions (or stop its writers) and
    /// retry.
    #[error("{path}: {detail}")]
    Io {
        /// The entry's path below the root, or the host path of the root,
        /// destination or its parent.
        path: String,
        /// What failed.
        detail: String,
    },
    /// The restore destination exists. Code `dest_exists`: restore into a
    /// fresh path.
    #[error("restore destination {path} exists; restore into a path that does not")]
    DestExists {
        /// The destination.
        path: String,
    },
}

impl TreeError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            TreeError::BlobMissing { .. } => "blob_missing",
            TreeError::BlobCorrupt { .. } => "blob_corrupt",
            TreeError::SpecialFile { .. } => "special_file",
            TreeError::PathNotUtf8 { .. } => "path_not_utf8",
            TreeError::Snapshot(e) => e.code(),
            TreeError::BlobPut { source, .. } | TreeError::Blob { source, .. } => source.code(),
            TreeError::Io { .. } => "tree_io",
            TreeError::DestExists { .. } => "dest_exists",
        }
    }
}

fn io_err(path: impl Into<String>) -> impl FnOnce(io::Error) -> TreeError {
    let path = path.into();
    move |e| TreeError::Io {
        path,
        detail: e.to_string(),
    }
}

fn host(path: &Path) -> String {
    path.display().to_string()
}

/// `rel/name` (or `name` at the root).
fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        format!("{rel}/{name}")
    }
}

/// Walks `root` into a manifest of `workspace_id` following `parent`,
/// putting every file's bytes into `store` first; see the module docs.
///
/// # Errors
/// [`TreeError::Snapshot`] for an invalid `workspace_id` (before anything
/// is read) or a tree that breaks a rule or bound; [`TreeError::SpecialFile`],
/// [`TreeError::PathNotUtf8`]; [`TreeError::BlobPut`] when a put fails;
/// [`TreeError::Io`] when `root` is not a directory (a symlink to one
/// included), a read fails, or a file changed under the walk. Blobs put
/// before an error stay in the store (they are content-addressed and
/// harmless).
///
/// # Panics
/// Never.
pub fn snapshot_tree(
    root: &Path,
    workspace_id: WorkspaceId,
    parent: Option<Digest>,
    store: &dyn BlobStore,
) -> Result<Manifest, TreeError> {
    Manifest::new(workspace_id, parent, Vec::new())?;
    let meta = fs::symlink_metadata(root).map_err(io_err(host(root)))?;
    if !meta.is_dir() {
        return Err(TreeError::Io {
            path: host(root),
            detail: "is not a directory (a symlink is not followed)".into(),
        });
    }
    let mut walk = Walk {
        store,
        entries: Vec::new(),
        file_bytes: 0,
    };
    // Directories still to list: (host path, path below the root). At most
    // one per entry, so bounded by the entry bound.
    let mut pending: Vec<(PathBuf, String)> = vec![(root.to_owned(), String::new())];
    while let Some((dir, rel)) = pending.pop() {
        for name in walk.list(&dir, &rel)? {
            let Some(name_text) = name.to_str() else {
                return Err(TreeError::PathNotUtf8 {
                    path: join(&rel, &name.to_string_lossy()),
                });
            };
            let path = join(&rel, name_text);
            check_path(&path)?;
            if walk.entries.len() >= SNAPSHOT_ENTRIES_MAX {
                return Err(SnapshotError::TooManyEntries {
                    path,
                    max: SNAPSHOT_ENTRIES_MAX,
                }
                .into());
            }
            let host_path = dir.join(&name);
            let meta = fs::symlink_metadata(&host_path).map_err(io_err(path.as_str()))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                walk.entries
                    .push(Entry::dir(path.as_str(), meta.mode() & 0o7777));
                pending.push((host_path, path));
            } else if kind.is_file() {
                let entry = walk.file(&host_path, path, &meta)?;
                walk.entries.push(entry);
            } else if kind.is_symlink() {
                let target = fs::read_link(&host_path)
                    .map_err(io_err(path.as_str()))?
                    .into_os_string()
                    .into_string()
                    .map_err(|_| SnapshotError::SymlinkTargetInvalid {
                        path: path.clone(),
                        reason: "is not UTF-8",
                    })?;
                check_symlink_target(&path, &target)?;
                walk.entries.push(Entry::symlink(path, target));
            } else {
                return Err(TreeError::SpecialFile { path });
            }
        }
    }
    Ok(Manifest::new(workspace_id, parent, walk.entries)?)
}

/// The state of one snapshot walk.
struct Walk<'a> {
    store: &'a dyn BlobStore,
    entries: Vec<Entry>,
    file_bytes: u64,
}

impl Walk<'_> {
    /// The names in `dir`, sorted by their bytes; refused while listing
    /// once they would take the entries over the bound.
    fn list(&self, dir: &Path, rel: &str) -> Result<Vec<OsString>, TreeError> {
        let shown = if rel.is_empty() {
            host(dir)
        } else {
            rel.to_owned()
        };
        let mut names = Vec::new();
        for item in fs::read_dir(dir).map_err(io_err(shown.as_str()))? {
            let name = item.map_err(io_err(shown.as_str()))?.file_name();
            if self.entries.len() + names.len() >= SNAPSHOT_ENTRIES_MAX {
                return Err(SnapshotError::TooManyEntries {
                    path: join(rel, &name.to_string_lossy()),
                    max: SNAPSHOT_ENTRIES_MAX,
                }
                .into());
            }
            names.push(name);
        }
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        Ok(names)
    }

    /// Reads the regular file at `host_path` once, streaming its bytes into
    /// the store, and gives its entry.
    fn file(
        &mut self,
        host_path: &Path,
        path: String,
        seen: &fs::Metadata,
    ) -> Result<Entry, TreeError> {
        self.check_size(&path, seen.len())?;
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(flags.bits() as i32)
            .open(host_path)
            .map_err(io_err(path.as_str()))?;
        let meta = file.metadata().map_err(io_err(path.as_str()))?;
        if !meta.is_file() || meta.dev() != seen.dev() || meta.ino() != seen.ino() {
            return Err(TreeError::Io {
                path,
                detail: "changed while the snapshot was taken; stop its writers and snapshot again"
                    .into(),
            });
        }
        let (digest, size) = put_file(self.store, &mut &file, &path, SNAPSHOT_FILE_BYTES_MAX)?;
        self.check_size(&path, size)?;
        self.file_bytes += size;
        Ok(Entry::file(path, meta.mode() & 0o7777, size, digest))
    }

    /// Refuses a file of `size` bytes over the per-file bound or taking the
    /// snapshot over its total.
    fn check_size(&self, path: &str, size: u64) -> Result<(), SnapshotError> {
        if size > SNAPSHOT_FILE_BYTES_MAX {
            return Err(SnapshotError::FileTooLarge {
                path: path.to_owned(),
                size,
                max: SNAPSHOT_FILE_BYTES_MAX,
            });
        }
        // Both terms are bounded (16 GiB and 8 GiB): no overflow.
        if self.file_bytes + size > SNAPSHOT_BYTES_MAX {
            return Err(SnapshotError::TooManyBytes {
                path: path.to_owned(),
                max: SNAPSHOT_BYTES_MAX,
            });
        }
        Ok(())
    }
}

/// Streams `file` into `store` as one blob of at most `bytes_max` bytes;
/// gives its digest and size. A file longer than `bytes_max` (one that grew
/// after its size was checked) is [`SnapshotError::FileTooLarge`] with the
/// bytes read so far as its size.
fn put_file(
    store: &dyn BlobStore,
    file: &mut dyn Read,
    path: &str,
    bytes_max: u64,
) -> Result<(Digest, u64), TreeError> {
    let mut counted = Counted {
        inner: file,
        bytes: 0,
    };
    match store.put_reader(&mut counted, bytes_max) {
        Ok((digest, size, _)) => Ok((digest, size)),
        Err(BlobError::TooLarge { .. }) if counted.bytes > bytes_max => {
            Err(SnapshotError::FileTooLarge {
                path: path.to_owned(),
                size: counted.bytes,
                max: bytes_max,
            }
            .into())
        }
        Err(BlobError::Input { source }) => Err(io_err(path)(source)),
        Err(source) => Err(TreeError::BlobPut {
            path: path.to_owned(),
            source: Box::new(source),
        }),
    }
}

/// A reader that counts the bytes it gives.
struct Counted<'a> {
    inner: &'a mut dyn Read,
    bytes: u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        // `n <= buf.len()`, and a file is far shorter than `u64::MAX`.
        self.bytes = self.bytes.saturating_add(n as u64);
        Ok(n)
    }
}

/// What a restore built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreReport {
    /// Entries restored (directories, files and symlinks; the root is not
    /// an entry).
    pub entries: usize,
    /// File bytes written.
    pub file_bytes: u64,
}

/// Builds the tree of `manifest` at `dest`, all or nothing; see the module
/// docs. `owner` is `(uid, gid)` for every restored entry and the root, or
/// `None` to keep the caller's.
///
/// # Errors
/// [`TreeError::Snapshot`] when `manifest` breaks a rule (it is checked
/// again here); [`TreeError::DestExists`]; [`TreeError::BlobMissing`] and
/// [`TreeError::BlobCorrupt`] naming the file and its digest;
/// [`TreeError::Blob`] when the store fails otherwise; [`TreeError::Io`].
/// After any error `dest` does not exist and no temporary directory is
/// left (unless removing it failed too).
///
/// # Panics
/// Never.
pub fn restore_tree(
    manifest: &Manifest,
    store: &dyn BlobStore,
    dest: &Path,
    owner: Option<(u32, u32)>,
) -> Result<RestoreReport, TreeError> {
    let manifest = Manifest::new(
        manifest.workspace_id,
        manifest.parent,
        manifest.entries.clone(),
    )?;
    match fs::symlink_metadata(dest) {
        Ok(_) => return Err(TreeError::DestExists { path: host(dest) }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(host(dest))(e)),
    }
    let parent_dir = match dest.parent() {
        Some(p) if dest.file_name().is_some() => {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        }
        _ => {
            return Err(TreeError::Io {
                path: host(dest),
                detail: "has no parent directory to restore next to".into(),
            });
        }
    };
    let mut random = [0u8; RESTORE_TEMP_RANDOM_BYTES];
    getrandom::fill(&mut random).map_err(|e| TreeError::Io {
        path: host(parent_dir),
        detail: format!("random source: {e}"),
    })?;
    let temp = parent_dir.join(format!("{RESTORE_TEMP_PREFIX}{}", hex::encode(random)));
    DirBuilder::new()
        .mode(0o700)
        .create(&temp)
        .map_err(io_err(host(&temp)))?;
    let report = match build(&manifest, store, &temp, owner) {
        Ok(report) => report,
        Err(e) => {
            remove_tree(&temp);
            return Err(e);
        }
    };
    if let Err(e) = rename_no_replace(&temp, dest) {
        remove_tree(&temp);
        return Err(if e.kind() == io::ErrorKind::AlreadyExists {
            TreeError::DestExists { path: host(dest) }
        } else {
            io_err(host(dest))(e)
        });
    }
    if let Err(e) = sync_dir(parent_dir) {
        remove_tree(dest);
        return Err(io_err(host(parent_dir))(e));
    }
    Ok(report)
}

/// Builds every entry of `m` inside the fresh directory `temp`.
fn build(
    m: &Manifest,
    store: &dyn BlobStore,
    temp: &Path,
    owner: Option<(u32, u32)>,
) -> Result<RestoreReport, TreeError> {
    let (uid, gid) = (owner.map(|o| o.0), owner.map(|o| o.1));
    // Directories, parents first (the entries are sorted), private until
    // their own modes are set last.
    for e in m.entries.iter().filter(|e| e.kind == EntryKind::Dir) {
        DirBuilder::new()
            .mode(0o700)
            .create(temp.join(&e.path))
            .map_err(io_err(e.path.as_str()))?;
    }
    let mut file_bytes = 0u64;
    for e in &m.entries {
        let EntryKind::File { size, sha256 } = e.kind else {
            continue;
        };
        let io = || io_err(e.path.as_str());
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(temp.join(&e.path))
            .map_err(io())?;
        restore_blob(store, &e.path, size, sha256, &mut file)?;
        if owner.is_some() {
            fchown(&file, uid, gid).map_err(io())?;
        }
        file.set_permissions(Permissions::from_mode(e.mode))
            .map_err(io())?;
        file.sync_all().map_err(io())?;
        file_bytes += size;
    }
    for e in &m.entries {
        let EntryKind::Symlink { target } = &e.kind else {
            continue;
        };
        let link = temp.join(&e.path);
        symlink(target, &link).map_err(io_err(e.path.as_str()))?;
        if owner.is_some() {
            lchown(&link, uid, gid).map_err(io_err(e.path.as_str()))?;
        }
    }
    // Deepest first: a descendant's path sorts after its ancestor's.
    for e in m.entries.iter().rev().filter(|e| e.kind == EntryKind::Dir) {
        finish_dir(&temp.join(&e.path), e.mode, owner).map_err(io_err(e.path.as_str()))?;
    }
    finish_dir(temp, RESTORE_ROOT_MODE, owner).map_err(io_err(host(temp)))?;
    Ok(RestoreReport {
        entries: m.entries.len(),
        file_bytes,
    })
}

/// Streams the blob of a file entry into `out`, checking it against the
/// entry's size and SHA-256 on the bytes written, whatever the store says.
/// What `out` holds after an error is to be discarded.
fn restore_blob(
    store: &dyn BlobStore,
    path: &str,
    size: u64,
    sha256: Digest,
    out: &mut dyn Write,
) -> Result<(), TreeError> {
    let corrupt = || TreeError::BlobCorrupt {
        path: path.to_owned(),
        digest: sha256,
    };
    let mut checked = Checked {
        out,
        size_max: size,
        written: 0,
        hasher: sha2::Sha256::new(),
        overflowed: false,
    };
    let copied = store.copy_to(&sha256, size, &mut checked);
    // The store verifies, but the trait is not trusted to: any store's
    // bytes are checked here.
    if checked.overflowed {
        return Err(corrupt());
    }
    match copied {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(TreeError::BlobMissing {
                path: path.to_owned(),
                digest: sha256,
            });
        }
        Err(BlobError::Corrupt { .. } | BlobError::WrongSize { .. }) => return Err(corrupt()),
        Err(BlobError::Output { source }) => return Err(io_err(path)(source)),
        Err(source) => {
            return Err(TreeError::Blob {
                path: path.to_owned(),
                digest: sha256,
                source: Box::new(source),
            });
        }
    }
    let Checked {
        written, hasher, ..
    } = checked;
    if written != size || Digest(hasher.finalize().into()) != sha256 {
        return Err(corrupt());
    }
    Ok(())
}

/// A writer that hashes and counts what it passes on, and refuses (setting
/// `overflowed`) any byte past `size_max`.
struct Checked<'a> {
    out: &'a mut dyn Write,
    size_max: u64,
    written: u64,
    hasher: sha2::Sha256,
    overflowed: bool,
}

impl Write for Checked<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.size_max - self.written {
            self.overflowed = true;
            return Err(io::Error::other(
                "the blob holds more bytes than the entry's size",
            ));
        }
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        // `n <= buf.len()`: `written` stays at most `size_max`.
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Owns, chmods and fsyncs the directory at `path` through one descriptor
/// (opened while it is still `0o700`).
fn finish_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> io::Result<()> {
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::DIRECTORY;
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)?;
    if let Some((uid, gid)) = owner {
        fchown(&dir, Some(uid), Some(gid))?;
    }
    dir.set_permissions(Permissions::from_mode(mode))?;
    dir.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Renames `from` onto `to` unless `to` exists (`RENAME_NOREPLACE`). On a
/// file system without that flag, checks that `to` is absent and renames.
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) if e == Errno::INVAL || e == Errno::NOSYS => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::ErrorKind::AlreadyExists.into());
            }
            fs::rename(from, to)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes the restore directory `top` whole, best effort: first gives
/// every directory in it (never following a symlink) its owner's full
/// permission back, so read-only directories do not block the removal of
/// their entries.
fn remove_tree(top: &Path) {
    let mut pending = vec![top.to_owned()];
    // At most one visit per directory of a manifest, plus the root.
    let mut visits_left = SNAPSHOT_ENTRIES_MAX + 1;
    while let Some(dir) = pending.pop() {
        if visits_left == 0 {
            break;
        }
        visits_left -= 1;
        let _ = fs::set_permissions(&dir, Permissions::from_mode(0o700));
        let Ok(items) = fs::read_dir(&dir) else {
            continue;
        };
        for item in items.flatten() {
            if item.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(item.path());
            }
        }
    }
    let _ = fs::remove_dir_all(top);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_rename_never_replaces_even_an_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        fs::create_dir(&from).unwrap();
        fs::write(from.join("f"), b"x").unwrap();
        // A plain rename(2) would replace this empty directory.
        fs::create_dir(&to).unwrap();
        let e = rename_no_replace(&from, &to).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(from.join("f")).unwrap(), b"x");
        fs::remove_dir(&to).unwrap();
        rename_no_replace(&from, &to).unwrap();
        assert_eq!(fs::read(to.join("f")).unwrap(), b"x");
        assert!(!from.exists());
    }

    #[test]
    fn remove_tree_removes_read_only_directories_and_not_link_targets() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("top");
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::set_permissions(&outside, Permissions::from_mode(0o555)).unwrap();
        fs::create_dir_all(top.join("ro/deeper")).unwrap();
        fs::write(top.join("ro/deeper/f"), b"x").unwrap();
        symlink(&outside, top.join("ro/link")).unwrap();
        for d in ["ro/deeper", "ro"] {
            fs::set_permissions(top.join(d), Permissions::from_mode(0o555)).unwrap();
        }
        remove_tree(&top);
        assert!(fs::symlink_metadata(&top).is_err());
        // The link's target is neither removed nor given new permissions.
        assert_eq!(fs::metadata(&outside).unwrap().mode() & 0o7777, 0o555);
    }

    /// A reader that gives `good` bytes, then fails.
    struct FailingReader {
        good: usize,
    }

    impl Read for FailingReader {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.good == 0 {
                return Err(io::Error::other("file gone"));
            }
            let n = buf.len().min(self.good);
            buf[..n].fill(b'x');
            self.good -= n;
            Ok(n)
        }
    }

    #[test]
    fn a_file_that_grows_past_the_bound_while_read_is_file_too_large() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::LocalBlobStore::open(dir.path()).unwrap();
        assert_eq!(
            put_file(&store, &mut &b"0123456789"[..], "f", 10).unwrap(),
            (Digest::of(b"0123456789"), 10)
        );
        let e = put_file(&store, &mut &b"0123456789a"[..], "f", 10).unwrap_err();
        assert!(
            matches!(&e, TreeError::Snapshot(SnapshotError::FileTooLarge { path, size: 11, max: 10 })
                if path == "f"),
            "{e:?}"
        );
        // A read that fails is the tree's own I/O error, naming the path.
        let e = put_file(&store, &mut FailingReader { good: 3 }, "d/f", 10).unwrap_err();
        assert_eq!(e.code(), "tree_io");
        assert_eq!(e.to_string(), "d/f: file gone");
    }

    #[test]
    fn file_sizes_are_checked_at_both_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::LocalBlobStore::open(dir.path()).unwrap();
        let mut walk = Walk {
            store: &store,
            entries: Vec::new(),
            file_bytes: 0,
        };
        let max = SNAPSHOT_FILE_BYTES_MAX;
        assert_eq!(walk.check_size("f", max), Ok(()));
        assert_eq!(
            walk.check_size("f", max + 1),
            Err(SnapshotError::FileTooLarge {
                path: "f".into(),
                size: 8_589_934_593,
                max: 8_589_934_592,
            })
        );
        walk.file_bytes = SNAPSHOT_BYTES_MAX - max;
        assert_eq!(walk.check_size("g", max), Ok(()));
        walk.file_bytes += 1;
        assert_eq!(
            walk.check_size("g", max),
            Err(SnapshotError::TooManyBytes {
                path: "g".into(),
                max: 17_179_869_184,
            })
        );
    }

    #[test]
    fn join_puts_names_below_the_root_without_a_leading_slash() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
        assert_eq!(join("a/b", "c"), "a/b/c");
    }
}
