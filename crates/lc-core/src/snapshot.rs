//! File snapshots of a workspace: the [`Manifest`] of a tree of
//! directories, regular files and symlinks, in canonical JSON (JCS), whose
//! SHA-256 is the snapshot's digest.
//!
//! A workspace's state is a chain of snapshots: each manifest names its
//! workspace, the digest of the snapshot it follows (`parent`, `null` for
//! the first) and its entries. File bytes are not in the manifest: each
//! file entry names the SHA-256 of its bytes, a blob in the
//! content-addressed blob store.
//!
//! # The canonical form (frozen)
//!
//! The canonical bytes are the JCS (RFC 8785) serialization of
//!
//! ```text
//! {"version":1,"workspace_id":N,"parent":"<64 hex>"|null,"entries":[...]}
//! ```
//!
//! with the entries sorted by the bytes of their paths, each one of
//! ```text
//! {"path":P,"mode":M,"type":"dir"}
//! {"path":P,"mode":M,"type":"file","size":S,"sha256":"<64 hex>"}
//! {"path":P,"mode":511,"type":"symlink","target":T}
//! ```
//! (modes as decimal integers, `511` = `0o777`; JCS sorts every object's
//! keys). A digest is stored, signed and compared
//! across hosts and releases, so this form is frozen: the test vector in
//! this module's tests pins the exact bytes and digest of one manifest, and
//! a change to it is a new `version`, never an edit of version 1.
//!
//! # The rules (checked by [`Manifest::new`] and [`Manifest::from_canonical`])
//!
//! * **Paths** are relative UTF-8, `/`-separated, at most
//!   [`SNAPSHOT_PATH_BYTES_MAX`] bytes; no empty, `.` or `..` component, no
//!   component over [`SNAPSHOT_NAME_BYTES_MAX`] bytes, no NUL, no leading or
//!   trailing `/`. Each path occurs once.
//! * **Parents.** Every entry's parent is itself a `dir` entry; the root is
//!   implicit and has no entry.
//! * **Modes** are permission bits `<= 0o7777`. A symlink's mode is always
//!   [`SYMLINK_MODE`] (`0o777`): Linux gives every symlink that mode and
//!   cannot change it, so a manifest never promises another.
//! * **Symlink targets** are data: any non-empty UTF-8 without NUL, at most
//!   [`SYMLINK_TARGET_BYTES_MAX`] bytes, absolute or with `..` included. A
//!   host restores them as symlinks and never follows them.
//! * **Bounds.** At most [`SNAPSHOT_ENTRIES_MAX`] entries, each file at most
//!   [`SNAPSHOT_FILE_BYTES_MAX`] bytes, [`SNAPSHOT_BYTES_MAX`] file bytes in
//!   all, [`SNAPSHOT_MANIFEST_BYTES_MAX`] canonical bytes, and a
//!   `workspace_id` in `1..=`[`WORKSPACE_ID_MAX`].
//!
//! Invariants, stated as absences: nothing here does I/O; nothing panics on
//! input; no two manifests that differ have the same canonical bytes.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::model::{Digest, WorkspaceId};

/// The most entries (directories, files and symlinks) of one snapshot.
pub const SNAPSHOT_ENTRIES_MAX: usize = 100_000;

/// The most file bytes of one snapshot, in all: 16 GiB.
pub const SNAPSHOT_BYTES_MAX: u64 = 16 << 30;

/// The most bytes of one file of a snapshot: 8 GiB. A file's bytes are one
/// blob, streamed through a buffer of fixed size on snapshot and on restore
/// (never held whole in memory), so this bound is on one file's disk and
/// copy time, not on memory: it holds the large single files a workspace
/// holds (a 5 GB model-weight shard, a dataset part, a git pack) with room,
/// two such files fit in [`SNAPSHOT_BYTES_MAX`], and the blob store streams
/// blobs up to this size (its `STREAM_BLOB_BYTES_MAX`). A workspace with a
/// larger file is refused (`file_too_large`).
pub const SNAPSHOT_FILE_BYTES_MAX: u64 = 8 << 30;

/// The longest path of an entry, in bytes (Linux's `PATH_MAX`).
pub const SNAPSHOT_PATH_BYTES_MAX: usize = 4096;

/// The longest component of a path, in bytes (Linux's `NAME_MAX`): a longer
/// name could not be restored on any Linux file system.
pub const SNAPSHOT_NAME_BYTES_MAX: usize = 255;

/// The longest symlink target, in bytes (Linux's `PATH_MAX`).
pub const SYMLINK_TARGET_BYTES_MAX: usize = 4096;

/// The most canonical bytes of one manifest: 64 MiB. At a typical path of
/// 100 bytes a manifest of [`SNAPSHOT_ENTRIES_MAX`] entries takes about
/// 20 MB; this bound leaves room for long paths and targets while a
/// manifest stays one bounded value in the database and on the wire.
pub const SNAPSHOT_MANIFEST_BYTES_MAX: usize = 64 << 20;

/// The largest workspace id a manifest holds: `2^53 - 1`. JCS writes numbers
/// as IEEE 754 doubles, which hold every integer up to this one exactly.
pub const WORKSPACE_ID_MAX: i64 = (1 << 53) - 1;

/// The mode of every symlink entry: Linux gives each symlink `0o777` and
/// has no call to change it.
pub const SYMLINK_MODE: u32 = 0o777;

/// The largest mode of a directory or file: the permission, setuid, setgid
/// and sticky bits.
pub const MODE_MAX: u32 = 0o7777;

/// The bits of an entry's mode a download writes on the host: the
/// permission bits only. Setuid, setgid and sticky are never written: a
/// snapshot's files come from untrusted code, and a setuid or setgid file
/// written by a download run as root would run with root's rights. The
/// manifest keeps the mode as snapshotted.
pub const DOWNLOAD_MODE_BITS: u32 = 0o777;

/// The canonical form's version.
const MANIFEST_VERSION: u32 = 1;

/// The longest text taken from input into an error (a path, a JSON
/// parser's message), in bytes: a valid path is never clipped.
const ERROR_TEXT_BYTES_MAX: usize = SNAPSHOT_PATH_BYTES_MAX;

/// What an entry is, with what each kind carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file of `size` bytes whose SHA-256 is `sha256` (the name of
    /// its blob).
    File {
        /// Its length in bytes, `<=` [`SNAPSHOT_FILE_BYTES_MAX`].
        size: u64,
        /// The SHA-256 of its bytes.
        sha256: Digest,
    },
    /// A symbolic link; `target` is data, never followed.
    Symlink {
        /// The link's target, as the link holds it.
        target: String,
    },
}

/// One entry of a snapshot: a directory, file or symlink at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Relative, `/`-separated path; see the module docs.
    pub path: String,
    /// Permission bits, `0..=0o7777`; [`SYMLINK_MODE`] for a symlink.
    pub mode: u32,
    /// What it is.
    pub kind: EntryKind,
}

impl Entry {
    /// A directory entry.
    pub fn dir(path: impl Into<String>, mode: u32) -> Entry {
        Entry {
            path: path.into(),
            mode,
            kind: EntryKind::Dir,
        }
    }

    /// A file entry of `size` bytes whose SHA-256 is `sha256`.
    pub fn file(path: impl Into<String>, mode: u32, size: u64, sha256: Digest) -> Entry {
        Entry {
            path: path.into(),
            mode,
            kind: EntryKind::File { size, sha256 },
        }
    }

    /// A symlink entry pointing at `target` (mode [`SYMLINK_MODE`]).
    pub fn symlink(path: impl Into<String>, target: impl Into<String>) -> Entry {
        Entry {
            path: path.into(),
            mode: SYMLINK_MODE,
            kind: EntryKind::Symlink {
                target: target.into(),
            },
        }
    }
}

/// A snapshot's manifest; see the module docs. Build it with
/// [`Manifest::new`] or [`Manifest::from_canonical`], which check every
/// rule; code that receives one it did not build (the fields are public)
/// checks it again with [`Manifest::new`] before acting on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Manifest {
    /// The workspace this snapshot is of.
    pub workspace_id: WorkspaceId,
    /// The digest of the snapshot this one follows; `None` for the first.
    pub parent: Option<Digest>,
    /// Sorted by the bytes of their paths, each path once.
    pub entries: Vec<Entry>,
}

/// A refused manifest or entry. Codes are stable: [`SnapshotError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// A path that breaks a path rule. Code `path_invalid`.
    #[error(
        "path {path:?} {reason}; a path is relative, `/`-separated, without empty, `.` or `..` components or NUL, at most {SNAPSHOT_PATH_BYTES_MAX} bytes"
    )]
    PathInvalid {
        /// The path (clipped to [`SNAPSHOT_PATH_BYTES_MAX`] bytes).
        path: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A path that occurs twice. Code `path_duplicate`.
    #[error("path {path:?} occurs twice; each path is one entry")]
    PathDuplicate {
        /// The path.
        path: String,
    },
    /// An entry whose parent is not a `dir` entry. Code `parent_missing`.
    #[error("entry {path:?} has no directory entry {parent:?} for its parent; add it")]
    ParentMissing {
        /// The entry's path.
        path: String,
        /// Its parent's path.
        parent: String,
    },
    /// A mode over `0o7777`, or a symlink's mode other than `0o777`. Code
    /// `mode_invalid`.
    #[error(
        "entry {path:?} has mode {mode:#o}; a directory or file has at most 0o7777, a symlink exactly 0o777"
    )]
    ModeInvalid {
        /// The entry's path.
        path: String,
        /// The mode given.
        mode: u32,
    },
    /// A symlink target that is empty, holds NUL, is not UTF-8 or is longer
    /// than [`SYMLINK_TARGET_BYTES_MAX`]. Code `symlink_target_invalid`.
    #[error(
        "symlink {path:?}: its target {reason}; a target is 1 to {SYMLINK_TARGET_BYTES_MAX} bytes of UTF-8 without NUL"
    )]
    SymlinkTargetInvalid {
        /// The symlink's path.
        path: String,
        /// Which rule the target breaks.
        reason: &'static str,
    },
    /// A file over [`SNAPSHOT_FILE_BYTES_MAX`]. Code `file_too_large`.
    #[error(
        "file {path:?} has {size} bytes, over the {max}-byte bound of one snapshot file; shrink or remove it"
    )]
    FileTooLarge {
        /// The file's path.
        path: String,
        /// Its size (or a lower bound of it, when read).
        size: u64,
        /// [`SNAPSHOT_FILE_BYTES_MAX`].
        max: u64,
    },
    /// More than [`SNAPSHOT_ENTRIES_MAX`] entries. Code `too_many_entries`.
    #[error(
        "more than {max} entries (the first over the bound is {path:?}); remove files from the tree"
    )]
    TooManyEntries {
        /// The first entry over the bound.
        path: String,
        /// [`SNAPSHOT_ENTRIES_MAX`].
        max: usize,
    },
    /// More than [`SNAPSHOT_BYTES_MAX`] file bytes. Code `too_many_bytes`.
    #[error(
        "more than {max} file bytes in all (the bound is crossed at {path:?}); remove files from the tree"
    )]
    TooManyBytes {
        /// The file at which the bound is crossed.
        path: String,
        /// [`SNAPSHOT_BYTES_MAX`].
        max: u64,
    },
    /// Canonical bytes over [`SNAPSHOT_MANIFEST_BYTES_MAX`]. Code
    /// `manifest_too_large`.
    #[error("manifest of {bytes} bytes exceeds the {max}-byte bound; use fewer or shorter paths")]
    ManifestTooLarge {
        /// Its size (at least).
        bytes: usize,
        /// [`SNAPSHOT_MANIFEST_BYTES_MAX`].
        max: usize,
    },
    /// A workspace id outside `1..=`[`WORKSPACE_ID_MAX`]. Code
    /// `workspace_id_invalid`.
    #[error("workspace id {workspace_id} is outside 1..={WORKSPACE_ID_MAX}")]
    WorkspaceIdInvalid {
        /// The id given.
        workspace_id: i64,
    },
    /// Bytes that are not JSON of a version 1 manifest (bad JSON, an
    /// unknown or missing field, another version, fields that do not fit an
    /// entry's type). Code `manifest_malformed`.
    #[error("malformed snapshot manifest: {reason}")]
    ManifestMalformed {
        /// What is wrong.
        reason: String,
    },
    /// A manifest that is valid but not in canonical form (whitespace, key
    /// order, entry order, escapes, upper-case hex). Code
    /// `manifest_not_canonical`: send the bytes of `canonical_bytes`.
    #[error("snapshot manifest is not in canonical (JCS) form; send the exact canonical bytes")]
    ManifestNotCanonical,
}

impl SnapshotError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            SnapshotError::PathInvalid { .. } => "path_invalid",
            SnapshotError::PathDuplicate { .. } => "path_duplicate",
            SnapshotError::ParentMissing { .. } => "parent_missing",
            SnapshotError::ModeInvalid { .. } => "mode_invalid",
            SnapshotError::SymlinkTargetInvalid { .. } => "symlink_target_invalid",
            SnapshotError::FileTooLarge { .. } => "file_too_large",
            SnapshotError::TooManyEntries { .. } => "too_many_entries",
            SnapshotError::TooManyBytes { .. } => "too_many_bytes",
            SnapshotError::ManifestTooLarge { .. } => "manifest_too_large",
            SnapshotError::WorkspaceIdInvalid { .. } => "workspace_id_invalid",
            SnapshotError::ManifestMalformed { .. } => "manifest_malformed",
            SnapshotError::ManifestNotCanonical => "manifest_not_canonical",
        }
    }
}

/// `s` cut to at most [`ERROR_TEXT_BYTES_MAX`] bytes at a character
/// boundary.
fn clip(s: &str) -> String {
    s[..s.floor_char_boundary(ERROR_TEXT_BYTES_MAX)].to_owned()
}

/// Checks `path` against the path rules of the module docs.
///
/// # Errors
/// [`SnapshotError::PathInvalid`] naming the rule broken.
pub fn check_path(path: &str) -> Result<(), SnapshotError> {
    let reason = if path.is_empty() {
        "is empty"
    } else if path.len() > SNAPSHOT_PATH_BYTES_MAX {
        "is too long"
    } else if path.contains('\0') {
        "holds a NUL byte"
    } else if path.starts_with('/') {
        "is absolute"
    } else if path.ends_with('/') {
        "ends with `/`"
    } else if let Some(reason) = path.split('/').find_map(component_fault) {
        reason
    } else {
        return Ok(());
    };
    Err(SnapshotError::PathInvalid {
        path: clip(path),
        reason,
    })
}

fn component_fault(c: &str) -> Option<&'static str> {
    match c {
        "" => Some("has an empty component"),
        "." => Some("has a `.` component"),
        ".." => Some("has a `..` component"),
        _ if c.len() > SNAPSHOT_NAME_BYTES_MAX => Some("has a component over 255 bytes"),
        _ => None,
    }
}

/// Checks a symlink target: non-empty, no NUL, at most
/// [`SYMLINK_TARGET_BYTES_MAX`] bytes (absolute and `..` targets are
/// allowed).
///
/// # Errors
/// [`SnapshotError::SymlinkTargetInvalid`] naming `path` (the link's).
pub fn check_symlink_target(path: &str, target: &str) -> Result<(), SnapshotError> {
    let reason = if target.is_empty() {
        "is empty"
    } else if target.len() > SYMLINK_TARGET_BYTES_MAX {
        "is too long"
    } else if target.contains('\0') {
        "holds a NUL byte"
    } else {
        return Ok(());
    };
    Err(SnapshotError::SymlinkTargetInvalid {
        path: clip(path),
        reason,
    })
}

/// Checks one entry on its own: path, mode, and what its kind carries.
fn check_entry(e: &Entry) -> Result<(), SnapshotError> {
    check_path(&e.path)?;
    let mode_ok = match e.kind {
        EntryKind::Symlink { .. } => e.mode == SYMLINK_MODE,
        EntryKind::Dir | EntryKind::File { .. } => e.mode <= MODE_MAX,
    };
    if !mode_ok {
        return Err(SnapshotError::ModeInvalid {
            path: e.path.clone(),
            mode: e.mode,
        });
    }
    match &e.kind {
        EntryKind::Dir => Ok(()),
        EntryKind::File { size, .. } if *size > SNAPSHOT_FILE_BYTES_MAX => {
            Err(SnapshotError::FileTooLarge {
                path: e.path.clone(),
                size: *size,
                max: SNAPSHOT_FILE_BYTES_MAX,
            })
        }
        EntryKind::File { .. } => Ok(()),
        EntryKind::Symlink { target } => check_symlink_target(&e.path, target),
    }
}

/// The parent of `path`, `None` for an entry at the root.
fn parent_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(parent, _)| parent)
}

/// The JSON shape of a manifest (JCS sorts its keys).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireManifest {
    version: u32,
    workspace_id: i64,
    /// Required (`null` for none), not defaulted when missing.
    #[serde(deserialize_with = "required_option")]
    parent: Option<Digest>,
    entries: Vec<WireEntry>,
}

/// Deserializes an `Option` whose key must be present: with a
/// `deserialize_with`, serde reports a missing key instead of `None`.
fn required_option<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Digest>, D::Error> {
    Option::<Digest>::deserialize(d)
}

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum WireType {
    Dir,
    File,
    Symlink,
}

/// The JSON shape of an entry: `size` and `sha256` only on a file, `target`
/// only on a symlink.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEntry {
    path: String,
    mode: u32,
    #[serde(rename = "type")]
    kind: WireType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

impl WireEntry {
    fn of(e: &Entry) -> WireEntry {
        let (kind, size, sha256, target) = match &e.kind {
            EntryKind::Dir => (WireType::Dir, None, None, None),
            EntryKind::File { size, sha256 } => (WireType::File, Some(*size), Some(*sha256), None),
            EntryKind::Symlink { target } => (WireType::Symlink, None, None, Some(target.clone())),
        };
        WireEntry {
            path: e.path.clone(),
            mode: e.mode,
            kind,
            size,
            sha256,
            target,
        }
    }

    fn into_entry(self) -> Result<Entry, SnapshotError> {
        let kind = match (self.kind, self.size, self.sha256, self.target) {
            (WireType::Dir, None, None, None) => EntryKind::Dir,
            (WireType::File, Some(size), Some(sha256), None) => EntryKind::File { size, sha256 },
            (WireType::Symlink, None, None, Some(target)) => EntryKind::Symlink { target },
            (kind, ..) => {
                let fields = match kind {
                    WireType::Dir => "a dir entry has only path, mode and type",
                    WireType::File => "a file entry has path, mode, type, size and sha256",
                    WireType::Symlink => "a symlink entry has path, mode, type and target",
                };
                return Err(SnapshotError::ManifestMalformed {
                    reason: format!("entry {:?}: {fields}", clip(&self.path)),
                });
            }
        };
        Ok(Entry {
            path: self.path,
            mode: self.mode,
            kind,
        })
    }
}

impl Manifest {
    /// A manifest of `entries` (sorted here by the bytes of their paths)
    /// after every rule of the module docs is checked.
    ///
    /// # Errors
    /// [`SnapshotError::WorkspaceIdInvalid`], then
    /// [`SnapshotError::TooManyEntries`], then the first entry's fault in
    /// input order ([`SnapshotError::PathInvalid`],
    /// [`SnapshotError::ModeInvalid`], [`SnapshotError::FileTooLarge`],
    /// [`SnapshotError::SymlinkTargetInvalid`],
    /// [`SnapshotError::TooManyBytes`]), then in path order
    /// [`SnapshotError::PathDuplicate`] and
    /// [`SnapshotError::ParentMissing`], then
    /// [`SnapshotError::ManifestTooLarge`].
    ///
    /// # Panics
    /// Never.
    ///
    /// ```
    /// use lc_core::snapshot::{Entry, Manifest};
    /// use lc_core::{Digest, WorkspaceId};
    ///
    /// let m = Manifest::new(
    ///     WorkspaceId(7),
    ///     None,
    ///     vec![Entry::file("src/a", 0o644, 2, Digest::of(b"hi")), Entry::dir("src", 0o755)],
    /// )
    /// .unwrap();
    /// assert_eq!(m.entries[0].path, "src");
    /// assert_eq!(m.file_bytes(), 2);
    /// assert_eq!(Manifest::from_canonical(&m.canonical_bytes()).unwrap(), m);
    /// let e = Manifest::new(WorkspaceId(7), None, vec![Entry::dir("a/../b", 0o755)]).unwrap_err();
    /// assert_eq!(e.code(), "path_invalid");
    /// ```
    pub fn new(
        workspace_id: WorkspaceId,
        parent: Option<Digest>,
        entries: Vec<Entry>,
    ) -> Result<Manifest, SnapshotError> {
        Manifest::checked(workspace_id, parent, entries)
    }

    /// The body of [`Manifest::new`] (its own function so that the
    /// mutation gate, which skips every `new`, tests these rules).
    fn checked(
        workspace_id: WorkspaceId,
        parent: Option<Digest>,
        mut entries: Vec<Entry>,
    ) -> Result<Manifest, SnapshotError> {
        if !(1..=WORKSPACE_ID_MAX).contains(&workspace_id.0) {
            return Err(SnapshotError::WorkspaceIdInvalid {
                workspace_id: workspace_id.0,
            });
        }
        if let Some(over) = entries.get(SNAPSHOT_ENTRIES_MAX) {
            return Err(SnapshotError::TooManyEntries {
                path: clip(&over.path),
                max: SNAPSHOT_ENTRIES_MAX,
            });
        }
        let mut file_bytes: u64 = 0;
        for e in &entries {
            check_entry(e)?;
            if let EntryKind::File { size, .. } = e.kind {
                // Each size is at most 8 GiB and there are at most 100,000
                // entries, so the sum cannot overflow a u64.
                file_bytes += size;
                if file_bytes > SNAPSHOT_BYTES_MAX {
                    return Err(SnapshotError::TooManyBytes {
                        path: e.path.clone(),
                        max: SNAPSHOT_BYTES_MAX,
                    });
                }
            }
        }
        entries.sort_unstable_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let mut dirs: HashSet<&str> = HashSet::new();
        let mut previous: Option<&str> = None;
        for e in &entries {
            if previous == Some(e.path.as_str()) {
                return Err(SnapshotError::PathDuplicate {
                    path: e.path.clone(),
                });
            }
            previous = Some(&e.path);
            // A parent is a proper prefix of its child, so it sorts first.
            match parent_of(&e.path) {
                Some(parent) if !dirs.contains(parent) => {
                    return Err(SnapshotError::ParentMissing {
                        path: e.path.clone(),
                        parent: parent.to_owned(),
                    });
                }
                _ => {}
            }
            if e.kind == EntryKind::Dir {
                dirs.insert(&e.path);
            }
        }
        drop(dirs);
        let m = Manifest {
            workspace_id,
            parent,
            entries,
        };
        check_manifest_bytes(m.canonical_bytes().len(), SNAPSHOT_MANIFEST_BYTES_MAX)?;
        Ok(m)
    }

    /// The canonical bytes: JCS of `{"version":1,...}`; see the module docs.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let wire = WireManifest {
            version: MANIFEST_VERSION,
            workspace_id: self.workspace_id.0,
            parent: self.parent,
            entries: self.entries.iter().map(WireEntry::of).collect(),
        };
        // The wire shape holds only strings, integers, null and arrays of
        // objects with string keys: JCS serialization of it cannot fail.
        serde_jcs::to_vec(&wire).unwrap_or_default()
    }

    /// The snapshot's digest: SHA-256 of [`Manifest::canonical_bytes`].
    pub fn digest(&self) -> Digest {
        Digest::of(&self.canonical_bytes())
    }

    /// Parses canonical bytes: the manifest must obey every rule and `bytes`
    /// must be exactly its [`Manifest::canonical_bytes`].
    ///
    /// # Errors
    /// [`SnapshotError::ManifestTooLarge`] for more than
    /// [`SNAPSHOT_MANIFEST_BYTES_MAX`] bytes (before parsing),
    /// [`SnapshotError::ManifestMalformed`] for bytes that are not JSON of a
    /// version 1 manifest (an unknown field included), any error of
    /// [`Manifest::new`], and [`SnapshotError::ManifestNotCanonical`] for a
    /// valid manifest in another encoding.
    ///
    /// # Panics
    /// Never, on any bytes.
    pub fn from_canonical(bytes: &[u8]) -> Result<Manifest, SnapshotError> {
        check_manifest_bytes(bytes.len(), SNAPSHOT_MANIFEST_BYTES_MAX)?;
        let wire: WireManifest =
            serde_json::from_slice(bytes).map_err(|e| SnapshotError::ManifestMalformed {
                reason: clip(&e.to_string()),
            })?;
        if wire.version != MANIFEST_VERSION {
            return Err(SnapshotError::ManifestMalformed {
                reason: format!(
                    "version {} is not the supported version {MANIFEST_VERSION}",
                    wire.version
                ),
            });
        }
        let entries = wire
            .entries
            .into_iter()
            .map(WireEntry::into_entry)
            .collect::<Result<Vec<Entry>, SnapshotError>>()?;
        let m = Manifest::new(WorkspaceId(wire.workspace_id), wire.parent, entries)?;
        if m.canonical_bytes() != bytes {
            return Err(SnapshotError::ManifestNotCanonical);
        }
        Ok(m)
    }

    /// The entry at `path`, if any (a binary search: the entries are sorted,
    /// as every checked manifest's are).
    pub fn entry(&self, path: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| e.path.as_bytes().cmp(path.as_bytes()))
            .ok()
            .and_then(|i| self.entries.get(i))
    }

    /// The sum of the sizes of the file entries, in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size, .. } => size,
                EntryKind::Dir | EntryKind::Symlink { .. } => 0,
            })
            .fold(0u64, u64::saturating_add)
    }
}

/// Refuses a manifest of `bytes` canonical bytes over `max`
/// ([`SnapshotError::ManifestTooLarge`]); exactly `max` is accepted.
fn check_manifest_bytes(bytes: usize, max: usize) -> Result<(), SnapshotError> {
    if bytes > max {
        Err(SnapshotError::ManifestTooLarge { bytes, max })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: WorkspaceId = WorkspaceId(7);

    fn d(bytes: &[u8]) -> Digest {
        Digest::of(bytes)
    }

    /// The manifest of the frozen test vector.
    fn vector() -> Manifest {
        Manifest::new(
            WS,
            Some(d(b"parent")),
            vec![
                Entry::symlink("a-link", "../x"),
                Entry::file("a/b", 0o644, 13, d(b"fn main() {}\n")),
                Entry::dir("a", 0o755),
                Entry::file("Z\u{e9}", 0o4755, 0, d(b"")),
                Entry::dir("ro", 0o555),
                Entry::symlink("ro/abs", "/etc/passwd"),
            ],
        )
        .unwrap()
    }

    const VECTOR: &str = concat!(
        r#"{"entries":["#,
        r#"{"mode":2541,"path":"Zé","#,
        r#""sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","#,
        r#""size":0,"type":"file"},"#,
        r#"{"mode":493,"path":"a","type":"dir"},"#,
        r#"{"mode":511,"path":"a-link","target":"../x","type":"symlink"},"#,
        r#"{"mode":420,"path":"a/b","#,
        r#""sha256":"536e506bb90914c243a12b397b9a998f85ae2cbd9ba02dfd03a9e155ca5ca0f4","#,
        r#""size":13,"type":"file"},"#,
        r#"{"mode":365,"path":"ro","type":"dir"},"#,
        r#"{"mode":511,"path":"ro/abs","target":"/etc/passwd","type":"symlink"}],"#,
        r#""parent":"e47125968b3b71049fbc4802d1e40a71ea1359decfabacf70b34588037d4ff0c","#,
        r#""version":1,"workspace_id":7}"#,
    );

    const VECTOR_DIGEST: &str = "8847f18dd63df634ce28889e2292acf2c4801ae103aa95f7739d37aeca0c6abb";

    /// The format is frozen: these exact bytes and this digest are version
    /// 1. A change here is a new version, never an edit of this vector.
    #[test]
    fn the_canonical_form_is_frozen() {
        let m = vector();
        let paths: Vec<&str> = m.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["Z\u{e9}", "a", "a-link", "a/b", "ro", "ro/abs"]);
        assert_eq!(String::from_utf8(m.canonical_bytes()).unwrap(), VECTOR);
        assert_eq!(m.digest().to_hex(), VECTOR_DIGEST);
        assert_eq!(m.digest(), d(VECTOR.as_bytes()));
        assert_eq!(Manifest::from_canonical(VECTOR.as_bytes()).unwrap(), m);
        // The first snapshot of a workspace has a null parent.
        let first = Manifest::new(WorkspaceId(1), None, vec![]).unwrap();
        assert_eq!(
            first.canonical_bytes(),
            br#"{"entries":[],"parent":null,"version":1,"workspace_id":1}"#.to_vec()
        );
        assert_eq!(
            Manifest::from_canonical(&first.canonical_bytes()).unwrap(),
            first
        );
    }

    #[test]
    fn entry_lookup_and_file_bytes_are_exact() {
        let m = vector();
        assert_eq!(
            m.entry("a/b"),
            Some(&Entry::file("a/b", 0o644, 13, d(b"fn main() {}\n")))
        );
        assert_eq!(m.entry("ro"), Some(&Entry::dir("ro", 0o555)));
        assert_eq!(m.entry("a/c"), None);
        assert_eq!(m.entry(""), None);
        assert_eq!(m.file_bytes(), 13);
        let two = Manifest::new(
            WS,
            None,
            vec![
                Entry::file("x", 0o600, 5, d(b"x")),
                Entry::file("y", 0o600, 7, d(b"y")),
                Entry::dir("z", 0o700),
            ],
        )
        .unwrap();
        assert_eq!(two.file_bytes(), 12);
        assert_eq!(Manifest::new(WS, None, vec![]).unwrap().file_bytes(), 0);
    }

    #[test]
    fn every_code_is_stable() {
        let p = || "p".to_owned();
        let table = [
            (
                SnapshotError::PathInvalid {
                    path: p(),
                    reason: "x",
                },
                "path_invalid",
            ),
            (SnapshotError::PathDuplicate { path: p() }, "path_duplicate"),
            (
                SnapshotError::ParentMissing {
                    path: p(),
                    parent: p(),
                },
                "parent_missing",
            ),
            (
                SnapshotError::ModeInvalid { path: p(), mode: 0 },
                "mode_invalid",
            ),
            (
                SnapshotError::SymlinkTargetInvalid {
                    path: p(),
                    reason: "x",
                },
                "symlink_target_invalid",
            ),
            (
                SnapshotError::FileTooLarge {
                    path: p(),
                    size: 0,
                    max: 0,
                },
                "file_too_large",
            ),
            (
                SnapshotError::TooManyEntries { path: p(), max: 0 },
                "too_many_entries",
            ),
            (
                SnapshotError::TooManyBytes { path: p(), max: 0 },
                "too_many_bytes",
            ),
            (
                SnapshotError::ManifestTooLarge { bytes: 0, max: 0 },
                "manifest_too_large",
            ),
            (
                SnapshotError::WorkspaceIdInvalid { workspace_id: 0 },
                "workspace_id_invalid",
            ),
            (
                SnapshotError::ManifestMalformed { reason: p() },
                "manifest_malformed",
            ),
            (
                SnapshotError::ManifestNotCanonical,
                "manifest_not_canonical",
            ),
        ];
        for (e, code) in table {
            assert_eq!(e.code(), code, "{e}");
        }
    }

    fn path_err(path: &str) -> SnapshotError {
        Manifest::new(WS, None, vec![Entry::dir(path, 0o755)]).unwrap_err()
    }

    #[test]
    fn paths_are_checked_at_their_boundaries() {
        let invalid = |path: &str, reason: &'static str| SnapshotError::PathInvalid {
            path: path.to_owned(),
            reason,
        };
        for (path, reason) in [
            ("", "is empty"),
            ("a\0b", "holds a NUL byte"),
            ("/a", "is absolute"),
            ("/", "is absolute"),
            ("a/", "ends with `/`"),
            ("a//b", "has an empty component"),
            (".", "has a `.` component"),
            ("./a", "has a `.` component"),
            ("a/.", "has a `.` component"),
            ("..", "has a `..` component"),
            ("a/../b", "has a `..` component"),
        ] {
            assert_eq!(path_err(path), invalid(path, reason), "{path:?}");
            assert_eq!(check_path(path), Err(invalid(path, reason)), "{path:?}");
        }
        // Names that only look like the refused ones are plain names.
        for path in ["...", ".a", "a.", "a..b", "\u{e9}", "a\\b", " "] {
            assert_eq!(check_path(path), Ok(()), "{path:?}");
        }
        // A component of 255 bytes is a name; 256 is not.
        let name = "n".repeat(SNAPSHOT_NAME_BYTES_MAX);
        assert_eq!(check_path(&name), Ok(()));
        let long_name = format!("{name}n");
        assert_eq!(
            check_path(&format!("a/{long_name}")),
            Err(invalid(
                &format!("a/{long_name}"),
                "has a component over 255 bytes"
            ))
        );
        // A path of 4096 bytes is a path; 4097 is not (and is clipped at
        // a character boundary in the error).
        let component = "c".repeat(254);
        let mut path = vec![component.as_str(); 16].join("/");
        path.push('/');
        path.push_str(&"c".repeat(SNAPSHOT_PATH_BYTES_MAX - path.len()));
        assert_eq!(path.len(), SNAPSHOT_PATH_BYTES_MAX);
        assert_eq!(check_path(&path), Ok(()));
        let over = format!("{}\u{e9}", &path[..SNAPSHOT_PATH_BYTES_MAX - 1]);
        assert_eq!(over.len(), SNAPSHOT_PATH_BYTES_MAX + 1);
        assert_eq!(
            check_path(&over),
            Err(invalid(&path[..SNAPSHOT_PATH_BYTES_MAX - 1], "is too long"))
        );
    }

    #[test]
    fn symlink_targets_are_data_checked_only_for_size_and_nul() {
        for target in ["/etc/passwd", "../../x", "..", "a b", "\u{e9}", "/"] {
            let m = Manifest::new(WS, None, vec![Entry::symlink("l", target)]).unwrap();
            assert_eq!(
                m.entries[0].kind,
                EntryKind::Symlink {
                    target: target.to_owned()
                }
            );
        }
        let invalid = |reason: &'static str| SnapshotError::SymlinkTargetInvalid {
            path: "dir/l".to_owned(),
            reason,
        };
        let longest = "t".repeat(SYMLINK_TARGET_BYTES_MAX);
        assert_eq!(check_symlink_target("dir/l", &longest), Ok(()));
        for (target, reason) in [
            ("", "is empty"),
            ("a\0", "holds a NUL byte"),
            (format!("{longest}t").as_str(), "is too long"),
        ] {
            assert_eq!(
                check_symlink_target("dir/l", target),
                Err(invalid(reason)),
                "{target:?}"
            );
            let e = Manifest::new(
                WS,
                None,
                vec![Entry::dir("dir", 0o755), Entry::symlink("dir/l", target)],
            )
            .unwrap_err();
            assert_eq!(e, invalid(reason));
        }
    }

    #[test]
    fn modes_are_checked_at_their_boundaries() {
        let one = |e: Entry| Manifest::new(WS, None, vec![e]);
        assert!(one(Entry::dir("d", 0o7777)).is_ok());
        assert!(one(Entry::dir("d", 0)).is_ok());
        assert!(one(Entry::file("f", 0o7777, 0, d(b""))).is_ok());
        let bad = |path: &str, mode: u32| SnapshotError::ModeInvalid {
            path: path.to_owned(),
            mode,
        };
        assert_eq!(one(Entry::dir("d", 0o10000)), Err(bad("d", 0o10000)));
        assert_eq!(
            one(Entry::file("f", 0o10000, 0, d(b""))),
            Err(bad("f", 0o10000))
        );
        assert_eq!(one(Entry::dir("d", u32::MAX)), Err(bad("d", u32::MAX)));
        // A symlink's mode is exactly 0o777.
        let mut link = Entry::symlink("l", "t");
        assert_eq!(link.mode, 0o777);
        link.mode = 0o755;
        assert_eq!(one(link), Err(bad("l", 0o755)));
    }

    #[test]
    fn duplicates_and_missing_parents_are_refused() {
        let m = |entries: Vec<Entry>| Manifest::new(WS, None, entries);
        assert_eq!(
            m(vec![Entry::dir("a", 0o755), Entry::dir("a", 0o700)]),
            Err(SnapshotError::PathDuplicate { path: "a".into() })
        );
        assert_eq!(
            m(vec![
                Entry::dir("a", 0o755),
                Entry::file("a", 0o600, 0, d(b""))
            ]),
            Err(SnapshotError::PathDuplicate { path: "a".into() })
        );
        assert_eq!(
            m(vec![Entry::file("a/b", 0o600, 0, d(b""))]),
            Err(SnapshotError::ParentMissing {
                path: "a/b".into(),
                parent: "a".into(),
            })
        );
        // A parent that is a file or a symlink is no directory.
        assert_eq!(
            m(vec![
                Entry::file("a", 0o600, 0, d(b"")),
                Entry::dir("a/b", 0o755)
            ]),
            Err(SnapshotError::ParentMissing {
                path: "a/b".into(),
                parent: "a".into(),
            })
        );
        assert_eq!(
            m(vec![
                Entry::dir("x", 0o755),
                Entry::symlink("x/a", "."),
                Entry::dir("x/a/b", 0o755)
            ]),
            Err(SnapshotError::ParentMissing {
                path: "x/a/b".into(),
                parent: "x/a".into(),
            })
        );
        // A grandparent present does not stand in for the parent.
        assert_eq!(
            m(vec![Entry::dir("a", 0o755), Entry::dir("a/b/c", 0o755)]),
            Err(SnapshotError::ParentMissing {
                path: "a/b/c".into(),
                parent: "a/b".into(),
            })
        );
        let deep = m(vec![
            Entry::dir("a/b", 0o755),
            Entry::dir("a", 0o755),
            Entry::file("a/b/c", 0o600, 1, d(b"c")),
        ])
        .unwrap();
        let paths: Vec<&str> = deep.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "a/b", "a/b/c"]);
    }

    #[test]
    fn workspace_ids_are_checked_at_their_boundaries() {
        for id in [1, WORKSPACE_ID_MAX] {
            let m = Manifest::new(WorkspaceId(id), None, vec![]).unwrap();
            assert_eq!(Manifest::from_canonical(&m.canonical_bytes()).unwrap(), m);
        }
        assert_eq!(
            String::from_utf8(
                Manifest::new(WorkspaceId(WORKSPACE_ID_MAX), None, vec![])
                    .unwrap()
                    .canonical_bytes()
            )
            .unwrap(),
            r#"{"entries":[],"parent":null,"version":1,"workspace_id":9007199254740991}"#
        );
        for id in [0, -1, i64::MIN, WORKSPACE_ID_MAX + 1, i64::MAX] {
            assert_eq!(
                Manifest::new(WorkspaceId(id), None, vec![]),
                Err(SnapshotError::WorkspaceIdInvalid { workspace_id: id })
            );
        }
        assert_eq!(
            Manifest::from_canonical(
                br#"{"entries":[],"parent":null,"version":1,"workspace_id":0}"#
            ),
            Err(SnapshotError::WorkspaceIdInvalid { workspace_id: 0 })
        );
    }

    #[test]
    fn file_sizes_are_bounded_one_by_one_and_in_all() {
        let max = SNAPSHOT_FILE_BYTES_MAX;
        let file = |path: String, size: u64| Entry::file(path, 0o644, size, d(b""));
        assert_eq!(
            Manifest::new(WS, None, vec![file("f".into(), max)])
                .unwrap()
                .file_bytes(),
            max
        );
        assert_eq!(
            Manifest::new(WS, None, vec![file("f".into(), max + 1)]),
            Err(SnapshotError::FileTooLarge {
                path: "f".into(),
                size: max + 1,
                max,
            })
        );
        // 2 files of 8 GiB are exactly 16 GiB: allowed; one byte more is not.
        let count = SNAPSHOT_BYTES_MAX / max;
        assert_eq!(count, 2);
        let mut entries: Vec<Entry> = (0..count).map(|i| file(format!("f{i:04}"), max)).collect();
        let all = Manifest::new(WS, None, entries.clone()).unwrap();
        assert_eq!(all.file_bytes(), SNAPSHOT_BYTES_MAX);
        entries.push(file("g".into(), 1));
        assert_eq!(
            Manifest::new(WS, None, entries),
            Err(SnapshotError::TooManyBytes {
                path: "g".into(),
                max: SNAPSHOT_BYTES_MAX,
            })
        );
    }

    #[test]
    fn entry_count_is_bounded() {
        let mut entries: Vec<Entry> = (0..SNAPSHOT_ENTRIES_MAX)
            .map(|i| Entry::dir(format!("d{i:06}"), 0o755))
            .collect();
        let m = Manifest::new(WS, None, entries.clone()).unwrap();
        assert_eq!(m.entries.len(), SNAPSHOT_ENTRIES_MAX);
        entries.push(Entry::dir("over", 0o755));
        assert_eq!(
            Manifest::new(WS, None, entries),
            Err(SnapshotError::TooManyEntries {
                path: "over".into(),
                max: SNAPSHOT_ENTRIES_MAX,
            })
        );
    }

    #[test]
    fn manifest_bytes_are_bounded_exactly() {
        assert_eq!(check_manifest_bytes(10, 10), Ok(()));
        assert_eq!(
            check_manifest_bytes(11, 10),
            Err(SnapshotError::ManifestTooLarge { bytes: 11, max: 10 })
        );
        // More bytes than the bound are refused before they are parsed (a
        // full-size manifest at the bound is in tests/manifest_bounds.rs).
        let over = vec![b' '; SNAPSHOT_MANIFEST_BYTES_MAX + 1];
        assert_eq!(
            Manifest::from_canonical(&over),
            Err(SnapshotError::ManifestTooLarge {
                bytes: SNAPSHOT_MANIFEST_BYTES_MAX + 1,
                max: SNAPSHOT_MANIFEST_BYTES_MAX,
            })
        );
    }

    fn parse_code(bytes: &str) -> &'static str {
        Manifest::from_canonical(bytes.as_bytes())
            .unwrap_err()
            .code()
    }

    #[test]
    fn only_canonical_bytes_parse() {
        // Each is the vector, or a valid manifest, encoded otherwise.
        let reordered = VECTOR.replacen(
            r#"{"mode":493,"path":"a","type":"dir"},{"mode":511,"path":"a-link","target":"../x","type":"symlink"},"#,
            r#"{"mode":511,"path":"a-link","target":"../x","type":"symlink"},{"mode":493,"path":"a","type":"dir"},"#,
            1,
        );
        assert_ne!(reordered, VECTOR);
        for non_canonical in [
            format!(" {VECTOR}"),
            format!("{VECTOR}\n"),
            VECTOR.replacen(r#""mode":493,"path":"a""#, r#""path":"a","mode":493"#, 1),
            VECTOR.replacen("Zé", "Z\\u00e9", 1),
            VECTOR.replacen("e3b0c442", "E3B0C442", 1),
            VECTOR.replacen(r#""workspace_id":7"#, r#""workspace_id":7.0"#, 1),
            reordered,
        ] {
            let e = Manifest::from_canonical(non_canonical.as_bytes());
            // `7.0` is not an integer at all.
            if non_canonical.contains("7.0}") {
                assert_eq!(e.unwrap_err().code(), "manifest_malformed");
            } else {
                assert_eq!(
                    e,
                    Err(SnapshotError::ManifestNotCanonical),
                    "{non_canonical}"
                );
            }
        }
        // The canonical bytes are JCS of the same value.
        let value: serde_json::Value = serde_json::from_str(VECTOR).unwrap();
        assert_eq!(serde_jcs::to_string(&value).unwrap(), VECTOR);
    }

    #[test]
    fn malformed_bytes_are_refused_with_their_code() {
        let base = r#"{"entries":[ENTRY],"parent":null,"version":1,"workspace_id":7}"#;
        let with = |entry: &str| base.replace("ENTRY", entry);
        let sha = d(b"").to_hex();
        for bytes in [
            String::new(),
            "null".into(),
            "[]".into(),
            "{".into(),
            "\u{feff}{}".into(),
            r#"{"entries":[],"parent":null,"version":1}"#.into(),
            r#"{"entries":[],"version":1,"workspace_id":7}"#.into(),
            r#"{"entries":[],"extra":0,"parent":null,"version":1,"workspace_id":7}"#.into(),
            r#"{"entries":[],"parent":"00","version":1,"workspace_id":7}"#.into(),
            r#"{"entries":[],"parent":null,"version":-1,"workspace_id":7}"#.into(),
            r#"{"entries":[],"parent":null,"version":1,"workspace_id":"7"}"#.into(),
            r#"{"entries":[],"entries":[],"parent":null,"version":1,"workspace_id":7}"#.into(),
            with(r#"{"mode":493,"path":"a","type":"block"}"#),
            with(r#"{"mode":493,"path":"a","type":"dir","x":1}"#),
            with(r#"{"mode":493,"path":"a","size":0,"type":"dir"}"#),
            with(r#"{"mode":511,"path":"a","type":"symlink"}"#),
            with(r#"{"mode":511,"path":"a","sha256":"SHA","target":"t","type":"symlink"}"#),
            with(r#"{"mode":420,"path":"a","sha256":"SHA","type":"file"}"#),
            with(r#"{"mode":420,"path":"a","size":0,"type":"file"}"#),
            with(r#"{"mode":420,"path":"a","sha256":"SHA","size":-1,"type":"file"}"#),
            with(r#"{"mode":420,"path":"a","sha256":"SHA","size":0,"target":"t","type":"file"}"#),
            with(r#"{"mode":-1,"path":"a","type":"dir"}"#),
            with(r#"{"mode":493,"path":7,"type":"dir"}"#),
            with(r#"{"path":"a","type":"dir"}"#),
        ] {
            let bytes = bytes.replace("SHA", &sha);
            assert_eq!(parse_code(&bytes), "manifest_malformed", "{bytes}");
        }
        // A well-formed file entry parses: the table above differs from it
        // in one field each.
        let file = with(r#"{"mode":420,"path":"a","sha256":"SHA","size":0,"type":"file"}"#)
            .replace("SHA", &sha);
        assert_eq!(
            Manifest::from_canonical(file.as_bytes()).unwrap().entries,
            vec![Entry::file("a", 0o644, 0, d(b""))]
        );
        // Another version is refused, whatever else it holds.
        assert_eq!(
            Manifest::from_canonical(
                br#"{"entries":[],"parent":null,"version":2,"workspace_id":7}"#
            ),
            Err(SnapshotError::ManifestMalformed {
                reason: "version 2 is not the supported version 1".into()
            })
        );
        assert_eq!(
            Manifest::from_canonical(
                br#"{"entries":[],"parent":null,"version":0,"workspace_id":7}"#
            )
            .unwrap_err()
            .code(),
            "manifest_malformed"
        );
        assert_eq!(
            Manifest::from_canonical(
                with(r#"{"mode":493,"path":"a","size":0,"type":"dir"}"#).as_bytes()
            ),
            Err(SnapshotError::ManifestMalformed {
                reason: r#"entry "a": a dir entry has only path, mode and type"#.into()
            })
        );
        // Every rule of `new` holds for parsed bytes too.
        assert_eq!(
            parse_code(&with(r#"{"mode":493,"path":"../a","type":"dir"}"#)),
            "path_invalid"
        );
        assert_eq!(
            parse_code(&with(r#"{"mode":493,"path":"a/b","type":"dir"}"#)),
            "parent_missing"
        );
        assert_eq!(
            parse_code(&with(r#"{"mode":4096,"path":"a","type":"dir"}"#)),
            "mode_invalid"
        );
        assert_eq!(
            parse_code(&with(
                r#"{"mode":511,"path":"a","target":"","type":"symlink"}"#
            )),
            "symlink_target_invalid"
        );
        assert_eq!(
            parse_code(&with(
                r#"{"mode":493,"path":"a","type":"dir"},{"mode":493,"path":"a","type":"dir"}"#
            )),
            "path_duplicate"
        );
        assert_eq!(
            parse_code(
                &with(r#"{"mode":420,"path":"a","sha256":"SHA","size":8589934593,"type":"file"}"#)
                    .replace("SHA", &sha)
            ),
            "file_too_large"
        );
    }
}
