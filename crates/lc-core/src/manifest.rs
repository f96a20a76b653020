//! Runtime manifests: what a runtime's root filesystem holds, in canonical
//! JSON (JCS), whose SHA-256 is the runtime's digest.
//!
//! Two kinds:
//! * `{ "kind": "host-usr", "name": "base" }`: the built-in runtime that
//!   exposes the host's `/usr` read-only (with `/bin`, `/lib`, `/lib64`,
//!   `/sbin` as symlinks into it);
//! * `{ "kind": "tree", "entries": [...] }`: an imported tree, one entry per
//!   directory, regular file and symlink, sorted by path (bytewise), paths
//!   relative with `/` separators:
//!   `{ "path": "bin/sh", "type": "file", "mode": 493, "size": 12, "sha256": "<hex>" }`,
//!   `{ "path": "bin", "type": "dir", "mode": 493 }`,
//!   `{ "path": "lib", "type": "symlink", "target": "usr/lib" }`.
//!
//! The rules every tree satisfies (checked by [`Manifest::tree`] and
//! [`Manifest::parse`]): paths are relative, non-empty, without `.`, `..` or
//! empty components, NUL or a trailing `/`; every entry's parent directory
//! is itself an entry; modes fit in `0o7777`; a symlink target is relative
//! and, resolved lexically from the link's directory, stays inside the tree.
//! No other file type (device, fifo, socket) can be named.

use serde::{Deserialize, Serialize};

use crate::page::{parse_hex32, sha256};

/// The longest path of a tree entry, in bytes (Linux's `PATH_MAX`).
pub const PATH_BYTES_MAX: usize = 4096;

/// The most entries a parsed tree manifest holds: a runtime is a root
/// filesystem of at most this many directories, files and symlinks.
pub const TREE_ENTRIES_MAX: usize = 200_000;

/// The name of the built-in host-`/usr` runtime.
pub const BASE_RUNTIME_NAME: &str = "base";

/// The type of one tree entry, with its type-specific fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
}

/// One entry of a tree manifest; see the module docs for the JSON shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Relative path, `/`-separated.
    pub path: String,
    /// Directory, file or symlink.
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// Permission bits (`<= 0o7777`) of a directory or file; absent for a symlink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Size in bytes of a file; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Lowercase hex SHA-256 of a file's bytes; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A symlink's target; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl ManifestEntry {
    /// A directory entry.
    pub fn dir(path: &str, mode: u32) -> ManifestEntry {
        ManifestEntry {
            path: path.to_owned(),
            entry_type: EntryType::Dir,
            mode: Some(mode),
            size: None,
            sha256: None,
            target: None,
        }
    }

    /// A regular file entry of `size` bytes whose SHA-256 is `sha`.
    pub fn file(path: &str, mode: u32, size: u64, sha: [u8; 32]) -> ManifestEntry {
        ManifestEntry {
            path: path.to_owned(),
            entry_type: EntryType::File,
            mode: Some(mode),
            size: Some(size),
            sha256: Some(hex::encode(sha)),
            target: None,
        }
    }

    /// A symlink entry pointing at `target`.
    pub fn symlink(path: &str, target: &str) -> ManifestEntry {
        ManifestEntry {
            path: path.to_owned(),
            entry_type: EntryType::Symlink,
            mode: None,
            size: None,
            sha256: None,
            target: Some(target.to_owned()),
        }
    }

    fn check(&self) -> Result<(), ManifestError> {
        check_relative_path(&self.path)?;
        let shape_ok = match self.entry_type {
            EntryType::Dir => self.size.is_none() && self.sha256.is_none() && self.target.is_none(),
            EntryType::File => {
                self.size.is_some()
                    && self.target.is_none()
                    && self.sha256.as_deref().and_then(parse_hex32).is_some()
            }
            EntryType::Symlink => {
                self.mode.is_none() && self.size.is_none() && self.sha256.is_none()
            }
        };
        if !shape_ok {
            return Err(ManifestError::BadEntry(self.path.clone()));
        }
        match (self.entry_type, self.mode) {
            (EntryType::Symlink, _) => {}
            (_, Some(m)) if m <= 0o7777 => {}
            _ => return Err(ManifestError::BadEntry(self.path.clone())),
        }
        if let Some(t) = &self.target {
            check_symlink_target(&self.path, t)?;
        } else if self.entry_type == EntryType::Symlink {
            return Err(ManifestError::BadEntry(self.path.clone()));
        }
        Ok(())
    }
}

/// A runtime manifest; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Manifest {
    /// The host's `/usr`, read-only.
    HostUsr {
        /// The runtime's name (`base`).
        name: String,
    },
    /// An imported tree.
    Tree {
        /// Sorted by path, each path once.
        entries: Vec<ManifestEntry>,
    },
}

/// A refused manifest or path. Codes are stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// An absolute path. Code `absolute_path`.
    #[error("path {0:?} is absolute")]
    AbsolutePath(String),
    /// A `..` component. Code `parent_path`.
    #[error("path {0:?} has a `..` component")]
    ParentPath(String),
    /// Empty, `.`, empty component, NUL, trailing `/` or over
    /// [`PATH_BYTES_MAX`]. Code `bad_path`.
    #[error("path {0:?} is not a clean relative path")]
    BadPath(String),
    /// A symlink whose target is absolute or resolves outside the tree.
    /// Code `symlink_escape`.
    #[error("symlink {0:?} points outside the tree")]
    SymlinkEscape(String),
    /// An entry whose fields do not fit its type. Code `bad_entry`.
    #[error("entry {0:?} has fields that do not fit its type")]
    BadEntry(String),
    /// Entries out of order or a path twice. Code `unsorted_entries`.
    #[error("entries are not sorted by path, each once, at {0:?}")]
    Unsorted(String),
    /// An entry whose parent directory is not an entry. Code `missing_parent`.
    #[error("entry {0:?} has no parent directory entry")]
    MissingParent(String),
    /// More than [`TREE_ENTRIES_MAX`] entries. Code `too_many_entries`.
    #[error("a tree holds at most {TREE_ENTRIES_MAX} entries, got {0}")]
    TooManyEntries(usize),
    /// Not JSON of a manifest, or not its canonical form. Code `malformed_manifest`.
    #[error("malformed manifest: {0}")]
    Malformed(&'static str),
}

impl ManifestError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            ManifestError::AbsolutePath(_) => "absolute_path",
            ManifestError::ParentPath(_) => "parent_path",
            ManifestError::BadPath(_) => "bad_path",
            ManifestError::SymlinkEscape(_) => "symlink_escape",
            ManifestError::BadEntry(_) => "bad_entry",
            ManifestError::Unsorted(_) => "unsorted_entries",
            ManifestError::MissingParent(_) => "missing_parent",
            ManifestError::TooManyEntries(_) => "too_many_entries",
            ManifestError::Malformed(_) => "malformed_manifest",
        }
    }
}

/// Checks that `path` is a clean relative path: not absolute, no `..`, no
/// empty or `.` component, no NUL, no trailing `/`, at most
/// [`PATH_BYTES_MAX`] bytes.
///
/// # Errors
/// [`ManifestError::AbsolutePath`], [`ManifestError::ParentPath`],
/// [`ManifestError::BadPath`].
pub fn check_relative_path(path: &str) -> Result<(), ManifestError> {
    if path.starts_with('/') {
        return Err(ManifestError::AbsolutePath(clip(path)));
    }
    if path.is_empty() || path.len() > PATH_BYTES_MAX || path.contains('\0') {
        return Err(ManifestError::BadPath(clip(path)));
    }
    for c in path.split('/') {
        match c {
            ".." => return Err(ManifestError::ParentPath(clip(path))),
            "" | "." => return Err(ManifestError::BadPath(clip(path))),
            _ => {}
        }
    }
    Ok(())
}

/// Checks that a symlink at `link_path` with `target` stays inside the
/// tree: the target is relative, has no NUL, and resolving it lexically
/// from the link's directory never climbs above the tree's root.
///
/// # Errors
/// [`ManifestError::SymlinkEscape`].
pub fn check_symlink_target(link_path: &str, target: &str) -> Result<(), ManifestError> {
    if target.is_empty()
        || target.starts_with('/')
        || target.contains('\0')
        || target.len() > PATH_BYTES_MAX
    {
        return Err(ManifestError::SymlinkEscape(clip(link_path)));
    }
    // Depth of the link's directory below the root.
    let mut depth = link_path.split('/').count() as i64 - 1;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return Err(ManifestError::SymlinkEscape(clip(link_path)));
                }
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

fn clip(s: &str) -> String {
    s.chars().take(256).collect()
}

impl Manifest {
    /// The built-in `base` runtime's manifest.
    pub fn base() -> Manifest {
        Manifest::HostUsr {
            name: BASE_RUNTIME_NAME.to_owned(),
        }
    }

    /// A tree manifest of `entries`, sorted here; every rule is checked.
    ///
    /// # Errors
    /// The [`ManifestError`] of the first entry that breaks a rule.
    pub fn tree(mut entries: Vec<ManifestEntry>) -> Result<Manifest, ManifestError> {
        entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let m = Manifest::Tree { entries };
        m.check()?;
        Ok(m)
    }

    /// Checks every rule of the module docs.
    ///
    /// # Errors
    /// The [`ManifestError`] of the first broken rule.
    pub fn check(&self) -> Result<(), ManifestError> {
        let Manifest::Tree { entries } = self else {
            return Ok(());
        };
        if entries.len() > TREE_ENTRIES_MAX {
            return Err(ManifestError::TooManyEntries(entries.len()));
        }
        let mut dirs = std::collections::HashSet::new();
        let mut prev: Option<&str> = None;
        for e in entries {
            e.check()?;
            if let Some(p) = prev
                && p.as_bytes() >= e.path.as_bytes()
            {
                return Err(ManifestError::Unsorted(clip(&e.path)));
            }
            prev = Some(&e.path);
            if let Some((parent, _)) = e.path.rsplit_once('/')
                && !dirs.contains(parent)
            {
                return Err(ManifestError::MissingParent(clip(&e.path)));
            }
            if e.entry_type == EntryType::Dir {
                dirs.insert(e.path.as_str());
            }
        }
        Ok(())
    }

    /// The manifest's canonical (JCS) JSON bytes.
    pub fn canonical(&self) -> Vec<u8> {
        // A manifest holds only strings, integers and tags: JCS cannot fail on it.
        serde_jcs::to_vec(self).unwrap_or_default()
    }

    /// The runtime digest: SHA-256 of [`Manifest::canonical`].
    pub fn digest(&self) -> [u8; 32] {
        sha256(&self.canonical())
    }

    /// Parses a manifest that must be in canonical form and obey every rule.
    ///
    /// # Errors
    /// [`ManifestError::Malformed`] for bad JSON or a non-canonical
    /// encoding, else as [`Manifest::check`].
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|_| ManifestError::Malformed("not a manifest"))?;
        m.check()?;
        if m.canonical() != bytes {
            return Err(ManifestError::Malformed("not canonical JSON"));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_manifest_and_digest_are_exact() {
        let m = Manifest::base();
        assert_eq!(
            m.canonical(),
            br#"{"kind":"host-usr","name":"base"}"#.to_vec()
        );
        assert_eq!(
            hex::encode(m.digest()),
            "e7cafcb1a70f147b4a1b74292b407976657a7e2d2c9669f16dd587c5f0f4d226"
        );
        assert_eq!(Manifest::parse(&m.canonical()).unwrap(), m);
    }

    #[test]
    fn tree_manifest_is_sorted_and_canonical() {
        let m = Manifest::tree(vec![
            ManifestEntry::symlink("lib", "usr/lib"),
            ManifestEntry::file("bin/sh", 0o755, 0, sha256(b"")),
            ManifestEntry::dir("bin", 0o755),
        ])
        .unwrap();
        let want = format!(
            r#"{{"entries":[{{"mode":493,"path":"bin","type":"dir"}},{{"mode":493,"path":"bin/sh","sha256":"{}","size":0,"type":"file"}},{{"path":"lib","target":"usr/lib","type":"symlink"}}],"kind":"tree"}}"#,
            hex::encode(sha256(b""))
        );
        assert_eq!(String::from_utf8(m.canonical()).unwrap(), want);
        assert_eq!(m.digest(), sha256(want.as_bytes()));
        assert_eq!(Manifest::parse(want.as_bytes()).unwrap(), m);
    }

    #[test]
    fn paths_are_checked_with_codes() {
        let check = |p: &str, code: &str| {
            assert_eq!(check_relative_path(p).unwrap_err().code(), code, "{p}")
        };
        check("/etc", "absolute_path");
        check("a/../b", "parent_path");
        check("..", "parent_path");
        check("", "bad_path");
        check("a//b", "bad_path");
        check("./a", "bad_path");
        check("a/", "bad_path");
        check("a\0b", "bad_path");
        check(&"a".repeat(PATH_BYTES_MAX + 1), "bad_path");
        assert!(check_relative_path(&"a".repeat(PATH_BYTES_MAX)).is_ok());
        assert!(check_relative_path("a/b.c/..d").is_ok());
    }

    #[test]
    fn symlink_targets_stay_inside() {
        assert!(check_symlink_target("lib", "usr/lib").is_ok());
        assert!(check_symlink_target("a/b/l", "../../c").is_ok());
        assert!(check_symlink_target("a/l", "./x/../y").is_ok());
        for (link, target) in [
            ("l", "/etc/passwd"),
            ("l", ".."),
            ("a/l", "../../etc"),
            ("a/l", "x/../../../y"),
            ("l", ""),
        ] {
            assert_eq!(
                check_symlink_target(link, target).unwrap_err().code(),
                "symlink_escape",
                "{link} -> {target}"
            );
        }
    }

    #[test]
    fn bad_trees_are_refused() {
        let code = |entries: Vec<ManifestEntry>| Manifest::tree(entries).unwrap_err().code();
        assert_eq!(
            code(vec![ManifestEntry::dir("a/b", 0o755)]),
            "missing_parent"
        );
        assert_eq!(
            code(vec![
                ManifestEntry::dir("a", 0o755),
                ManifestEntry::dir("a", 0o755)
            ]),
            "unsorted_entries"
        );
        assert_eq!(code(vec![ManifestEntry::dir("a", 0o10000)]), "bad_entry");
        let mut f = ManifestEntry::file("f", 0o644, 1, sha256(b"x"));
        f.sha256 = Some("zz".into());
        assert_eq!(code(vec![f]), "bad_entry");
        let mut l = ManifestEntry::symlink("l", "x");
        l.target = None;
        assert_eq!(code(vec![l]), "bad_entry");
        assert_eq!(
            code(vec![ManifestEntry::symlink("l", "../x")]),
            "symlink_escape"
        );
        // A file is not a parent directory.
        assert_eq!(
            code(vec![
                ManifestEntry::file("a", 0o644, 0, sha256(b"")),
                ManifestEntry::dir("a/b", 0o755)
            ]),
            "missing_parent"
        );
        assert_eq!(
            Manifest::parse(br#"{"kind":"host-usr","name":"base","x":1}"#)
                .unwrap_err()
                .code(),
            "malformed_manifest"
        );
        assert_eq!(
            Manifest::parse(br#"{"name":"base","kind":"host-usr"}"#).unwrap_err(),
            ManifestError::Malformed("not canonical JSON")
        );
    }
}
