//! `lc workspace download`: a snapshot's tree and every file's bytes into
//! a directory, all or nothing.
//!
//! The tree the server sends is checked as a manifest
//! ([`lc_core::snapshot::Manifest::new`]: relative paths without `..`,
//! `.` or empty components, every parent a directory, modes within
//! 0o7777) and its digest must be the snapshot's, so a path that escapes
//! the directory or a tree other than the snapshot's is refused before
//! anything is written. Entries are written into a fresh temporary
//! directory next to the target (directories first, files created new
//! and never through a link, each file's length and SHA-256 compared with
//! the tree's), directory modes last (deepest first, so a read-only
//! directory is filled before it is closed), then the temporary directory
//! is renamed to the target. On any failure the temporary directory is
//! removed and the target is left as it was. Modes are written without
//! setuid, setgid and sticky ([`DOWNLOAD_MODE_BITS`]): the files come from
//! untrusted code.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use lc_core::model::{Digest, WorkspaceId};
use lc_core::snapshot::{DOWNLOAD_MODE_BITS, Entry, EntryKind, Manifest};
use serde_json::{Value, json};

use super::http::{Client, ClientError};

/// Mode of a directory while its entries are written (its own mode is set
/// once they are).
const DIR_WRITE_MODE: u32 = 0o700;

/// What a download wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// Files written.
    pub files: u64,
    /// Directories written (the target itself not counted).
    pub dirs: u64,
    /// Symlinks written.
    pub symlinks: u64,
    /// Bytes of the files.
    pub bytes: u64,
}

fn failed(m: impl Into<String>) -> ClientError {
    ClientError::Failed(m.into())
}

/// The tree answer (`GET .../tree`) as a checked manifest whose digest is
/// `head`.
///
/// # Errors
/// [`ClientError::Failed`] naming the entry or the mismatch.
pub fn manifest_of(tree: &Value, head: Digest) -> Result<Manifest, ClientError> {
    let bad = |m: String| {
        failed(format!(
            "the server's tree of snapshot {head} is refused: {m}"
        ))
    };
    let workspace_id = tree["workspace_id"]
        .as_i64()
        .ok_or_else(|| bad("no workspace_id".into()))?;
    let parent = match &tree["parent"] {
        Value::Null => None,
        Value::String(p) => Some(Digest::from_hex(p).map_err(|e| bad(e.to_string()))?),
        other => return Err(bad(format!("parent {other}"))),
    };
    let entries = tree["entries"]
        .as_array()
        .ok_or_else(|| bad("no entries".into()))?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let path = e["path"]
            .as_str()
            .ok_or_else(|| bad(format!("an entry without a path: {e}")))?;
        let mode = e["mode"]
            .as_u64()
            .and_then(|m| u32::try_from(m).ok())
            .ok_or_else(|| bad(format!("{path:?}: mode {}", e["mode"])))?;
        let entry = match e["kind"].as_str() {
            Some("dir") => Entry::dir(path, mode),
            Some("file") => {
                let size = e["size"]
                    .as_u64()
                    .ok_or_else(|| bad(format!("{path:?}: size {}", e["size"])))?;
                let sha = e["sha256"]
                    .as_str()
                    .ok_or_else(|| bad(format!("{path:?}: no sha256")))?;
                Entry::file(
                    path,
                    mode,
                    size,
                    Digest::from_hex(sha).map_err(|x| bad(format!("{path:?}: {x}")))?,
                )
            }
            Some("symlink") => {
                let target = e["target"]
                    .as_str()
                    .ok_or_else(|| bad(format!("{path:?}: no target")))?;
                Entry::symlink(path, target)
            }
            other => return Err(bad(format!("{path:?}: kind {other:?}"))),
        };
        out.push(entry);
    }
    let m = Manifest::new(WorkspaceId(workspace_id), parent, out)
        .map_err(|e| bad(format!("{} ({})", e, e.code())))?;
    if m.digest() != head {
        return Err(bad(format!("its entries hash to {}", m.digest())));
    }
    Ok(m)
}

/// Refuses a target that exists and is not an empty directory.
fn check_target(to: &Path) -> Result<(), ClientError> {
    match std::fs::symlink_metadata(to) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(failed(format!("{}: {e}", to.display()))),
        Ok(m) if !m.is_dir() => Err(failed(format!(
            "{} exists and is not a directory; name a new or empty directory with --to",
            to.display()
        ))),
        Ok(_) => {
            let mut entries =
                std::fs::read_dir(to).map_err(|e| failed(format!("{}: {e}", to.display())))?;
            if entries.next().is_some() {
                return Err(failed(format!(
                    "{} is not empty; name a new or empty directory with --to (nothing was written)",
                    to.display()
                )));
            }
            Ok(())
        }
    }
}

/// A fresh temporary directory next to `to`.
fn temp_next_to(to: &Path) -> Result<PathBuf, ClientError> {
    let parent = match to.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = to
        .file_name()
        .ok_or_else(|| failed(format!("{}: name a directory with --to", to.display())))?;
    let key = super::http::fresh_idempotency_key()?;
    let tmp = parent.join(format!(".{}.lc-download-{key}", name.to_string_lossy()));
    std::fs::DirBuilder::new()
        .mode(DIR_WRITE_MODE)
        .create(&tmp)
        .map_err(|e| failed(format!("creating {}: {e}", tmp.display())))?;
    Ok(tmp)
}

/// Downloads snapshot `head` of exec `id` (the tree answer `tree`) into
/// `to`; see the module docs.
///
/// # Errors
/// [`ClientError`] of the requests; [`ClientError::Failed`] for a refused
/// target or tree, a file whose bytes do not verify, or a write that
/// failed. `to` is unchanged on every error.
pub async fn download(
    client: &Client,
    id: i64,
    head: Digest,
    tree: &Value,
    to: &Path,
) -> Result<Downloaded, ClientError> {
    let m = manifest_of(tree, head)?;
    check_target(to)?;
    let tmp = temp_next_to(to)?;
    match fill(client, id, head, &m, &tmp).await {
        Ok(d) => {
            // rename(2) replaces an empty directory atomically.
            if let Err(e) = std::fs::rename(&tmp, to) {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(failed(format!(
                    "moving the download into {}: {e} (nothing was left there)",
                    to.display()
                )));
            }
            Ok(d)
        }
        Err(e) => {
            make_removable(&tmp);
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Gives every directory under `dir` its owner's write and search bits, so
/// a failed download can be removed whatever modes it had set.
fn make_removable(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_WRITE_MODE));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_removable(&e.path());
            }
        }
    }
}

async fn fill(
    client: &Client,
    id: i64,
    head: Digest,
    m: &Manifest,
    root: &Path,
) -> Result<Downloaded, ClientError> {
    let mut d = Downloaded {
        files: 0,
        dirs: 0,
        symlinks: 0,
        bytes: 0,
    };
    let io = |p: &Path, e: std::io::Error| failed(format!("{}: {e}", p.display()));
    // Sorted by path bytes: a directory precedes what it holds.
    for e in &m.entries {
        let path = root.join(&e.path);
        match &e.kind {
            EntryKind::Dir => {
                std::fs::DirBuilder::new()
                    .mode(DIR_WRITE_MODE)
                    .create(&path)
                    .map_err(|x| io(&path, x))?;
                d.dirs += 1;
            }
            EntryKind::Symlink { target } => {
                std::os::unix::fs::symlink(target, &path).map_err(|x| io(&path, x))?;
                d.symlinks += 1;
            }
            EntryKind::File { size, sha256 } => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(|x| io(&path, x))?;
                let url = format!(
                    "v1/execs/{id}/snapshots/{}/files/{}",
                    head.to_hex(),
                    escape_path(&e.path)
                );
                let (n, got) = client.download(&url, &mut f).await?;
                if n != *size || Digest(got) != *sha256 {
                    return Err(failed(format!(
                        "{:?}: the server sent {n} bytes hashing to {}, not the snapshot's {size} bytes hashing to {sha256}; nothing was written to the target",
                        e.path,
                        Digest(got)
                    )));
                }
                f.flush().map_err(|x| io(&path, x))?;
                f.sync_all().map_err(|x| io(&path, x))?;
                std::fs::set_permissions(
                    &path,
                    std::fs::Permissions::from_mode(e.mode & DOWNLOAD_MODE_BITS),
                )
                .map_err(|x| io(&path, x))?;
                d.files += 1;
                d.bytes += n;
            }
        }
    }
    // Directory modes last, deepest first.
    for e in m.entries.iter().rev() {
        if e.kind == EntryKind::Dir {
            let path = root.join(&e.path);
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(e.mode & DOWNLOAD_MODE_BITS),
            )
            .map_err(|x| io(&path, x))?;
        }
    }
    Ok(d)
}

/// `path` with each component percent-encoded and `/` kept.
fn escape_path(path: &str) -> String {
    path.split('/')
        .map(|c| {
            let mut out = String::with_capacity(c.len());
            for b in c.bytes() {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    out.push(char::from(b));
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The JSON `lc --json workspace download` prints.
pub fn summary(id: i64, head: Digest, to: &Path, d: &Downloaded) -> Value {
    json!({
        "exec_id": id,
        "head": head.to_hex(),
        "dir": to.display().to_string(),
        "files": d.files,
        "dirs": d.dirs,
        "symlinks": d.symlinks,
        "bytes": d.bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_paths_keep_their_slashes() {
        assert_eq!(escape_path("a b/c%d/e.txt"), "a%20b/c%25d/e.txt");
    }

    #[test]
    fn a_tree_that_escapes_or_is_not_the_snapshot_is_refused() {
        let good = Manifest::new(WorkspaceId(3), None, vec![Entry::dir("a", 0o755)]).unwrap();
        let tree = |path: &str| {
            json!({"workspace_id": 3, "parent": null, "entries": [
                {"path": path, "kind": "dir", "mode": 0o755}
            ]})
        };
        assert_eq!(manifest_of(&tree("a"), good.digest()).unwrap(), good);
        let rule = "a path is relative, `/`-separated, without empty, `.` or `..` components or NUL, at most 4096 bytes (path_invalid)";
        for (path, fault) in [("../a", "has a `..` component"), ("/a", "is absolute")] {
            assert_eq!(
                manifest_of(&tree(path), good.digest())
                    .unwrap_err()
                    .to_string(),
                format!(
                    "the server's tree of snapshot {} is refused: path {path:?} {fault}; {rule}",
                    good.digest()
                )
            );
        }
        let e = manifest_of(&tree("b"), good.digest()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the server's tree of snapshot {} is refused: its entries hash to {}",
                good.digest(),
                Manifest::new(WorkspaceId(3), None, vec![Entry::dir("b", 0o755)])
                    .unwrap()
                    .digest()
            )
        );
    }
}
