//! Snapshot and restore of real directory trees through a `LocalBlobStore`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, Permissions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use lc_blob::tree::{RESTORE_ROOT_MODE, RestoreReport, TreeError, restore_tree, snapshot_tree};
use lc_blob::{BLOB_BYTES_MAX, BlobError, BlobStore, LocalBlobStore, PutOutcome};
use lc_core::snapshot::{
    Entry, EntryKind, Manifest, SNAPSHOT_ENTRIES_MAX, SNAPSHOT_FILE_BYTES_MAX, SnapshotError,
};
use lc_core::{Digest, WorkspaceId};

const WS: WorkspaceId = WorkspaceId(42);

/// A scratch directory with a blob store in `blobs/` and trees beside it.
struct Scratch {
    dir: tempfile::TempDir,
    store: LocalBlobStore,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::open(dir.path().join("blobs")).unwrap();
        Scratch { dir, store }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The names in the scratch directory, sorted (a left-over restore
    /// directory would show here).
    fn names(&self) -> Vec<String> {
        names_in(self.dir.path())
    }

    /// How many blobs the store holds.
    fn blob_count(&self) -> usize {
        let root = self.path("blobs/sha256");
        fs::read_dir(&root)
            .unwrap()
            .map(|shard| fs::read_dir(shard.unwrap().path()).unwrap().count())
            .sum()
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn write(path: &Path, bytes: &[u8], mode: u32) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, Permissions::from_mode(mode)).unwrap();
}

fn mkdir(path: &Path, mode: u32) {
    fs::create_dir(path).unwrap();
    fs::set_permissions(path, Permissions::from_mode(mode)).unwrap();
}

const RUN: &[u8] = b"#!/bin/sh\necho hi\n";
const SECRET: &[u8] = b"\x00\xff\x01binary\nsecret\xfe";
const KEY: &[u8] = b"private key bytes";
const RO_A: &[u8] = b"read-only dir's file";
const RO_B: &[u8] = b"deeper";

/// The tree every round trip uses: nested directories, modes 0o755, 0o600,
/// 0o4755, a 0o700 directory, a 0o555 read-only directory holding files and
/// a directory, an empty file, a hard link, and symlinks with an absolute
/// and a `..` target.
fn make_tree(root: &Path) {
    fs::create_dir(root).unwrap();
    mkdir(&root.join("bin"), 0o755);
    write(&root.join("bin/run"), RUN, 0o755);
    fs::hard_link(root.join("bin/run"), root.join("bin/run2")).unwrap();
    symlink("../x", root.join("bin/up")).unwrap();
    write(&root.join("secret"), SECRET, 0o600);
    write(&root.join("suid"), RUN, 0o4755);
    write(&root.join("empty"), b"", 0o644);
    mkdir(&root.join("private"), 0o700);
    write(&root.join("private/key"), KEY, 0o600);
    fs::create_dir(root.join("ro")).unwrap();
    write(&root.join("ro/a"), RO_A, 0o644);
    mkdir(&root.join("ro/sub"), 0o755);
    write(&root.join("ro/sub/b"), RO_B, 0o444);
    fs::set_permissions(root.join("ro"), Permissions::from_mode(0o555)).unwrap();
    symlink("/etc/passwd", root.join("abs")).unwrap();
}

/// The manifest `make_tree` must give, exactly.
fn expected_entries() -> Vec<Entry> {
    let file = |path: &str, mode: u32, bytes: &[u8]| {
        Entry::file(path, mode, bytes.len() as u64, Digest::of(bytes))
    };
    vec![
        Entry::symlink("abs", "/etc/passwd"),
        Entry::dir("bin", 0o755),
        file("bin/run", 0o755, RUN),
        file("bin/run2", 0o755, RUN),
        Entry::symlink("bin/up", "../x"),
        file("empty", 0o644, b""),
        Entry::dir("private", 0o700),
        file("private/key", 0o600, KEY),
        Entry::dir("ro", 0o555),
        file("ro/a", 0o644, RO_A),
        Entry::dir("ro/sub", 0o755),
        file("ro/sub/b", 0o444, RO_B),
        file("secret", 0o600, SECRET),
        file("suid", 0o4755, RUN),
    ]
}

/// What a tree holds, read without following links: path -> (type, mode,
/// uid, gid, bytes or target).
type Listing = BTreeMap<String, (&'static str, u32, u32, u32, Vec<u8>)>;

fn list_tree(root: &Path) -> Listing {
    let mut out = Listing::new();
    let mut pending = vec![(root.to_owned(), String::new())];
    while let Some((dir, rel)) = pending.pop() {
        for name in names_in(&dir) {
            let host = dir.join(&name);
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let meta = fs::symlink_metadata(&host).unwrap();
            let (kind, content) = if meta.is_dir() {
                pending.push((host.clone(), path.clone()));
                ("dir", Vec::new())
            } else if meta.is_file() {
                ("file", fs::read(&host).unwrap())
            } else {
                let target = fs::read_link(&host).unwrap();
                ("symlink", target.as_os_str().as_bytes().to_vec())
            };
            out.insert(
                path,
                (kind, meta.mode() & 0o7777, meta.uid(), meta.gid(), content),
            );
        }
    }
    out
}

/// The listing with owners left out.
fn shape(listing: &Listing) -> BTreeMap<String, (&'static str, u32, Vec<u8>)> {
    listing
        .iter()
        .map(|(p, (k, m, _, _, c))| (p.clone(), (*k, *m, c.clone())))
        .collect()
}

#[test]
fn a_tree_round_trips_byte_for_byte_with_exact_modes_and_links() {
    let s = Scratch::new();
    let src = s.path("src");
    make_tree(&src);
    let parent = Digest::of(b"previous snapshot");
    let m = snapshot_tree(&src, WS, Some(parent), &s.store).unwrap();
    assert_eq!(m.workspace_id, WS);
    assert_eq!(m.parent, Some(parent));
    assert_eq!(m.entries, expected_entries());
    let file_bytes = (3 * RUN.len() + SECRET.len() + KEY.len() + RO_A.len() + RO_B.len()) as u64;
    assert_eq!(m.file_bytes(), file_bytes);
    assert_eq!(Manifest::from_canonical(&m.canonical_bytes()).unwrap(), m);
    // Every blob is in the store before the manifest is returned; the hard
    // link and the setuid copy share one blob with bin/run.
    for e in &m.entries {
        if let EntryKind::File { sha256, .. } = e.kind {
            let bytes = s.store.get(&sha256).unwrap().unwrap();
            assert_eq!(bytes, fs::read(src.join(&e.path)).unwrap(), "{}", e.path);
        }
    }
    assert_eq!(s.blob_count(), 6);

    let dest = s.path("dest");
    let report = restore_tree(&m, &s.store, &dest, None).unwrap();
    assert_eq!(
        report,
        RestoreReport {
            entries: 14,
            file_bytes,
        }
    );
    let before = list_tree(&src);
    let after = list_tree(&dest);
    assert_eq!(shape(&after), shape(&before));
    assert_eq!(after["abs"].4, b"/etc/passwd".to_vec());
    assert_eq!(after["bin/up"].4, b"../x".to_vec());
    assert_eq!(after["ro"].1, 0o555);
    assert_eq!(after["suid"].1, 0o4755);
    assert_eq!(after["ro/sub/b"], before["ro/sub/b"]);
    // The links are links, not followed: neither target exists here.
    assert!(
        fs::symlink_metadata(dest.join("bin/up"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(!dest.join("x").exists() && !s.path("x").exists());
    // The hard link is restored as its own file.
    assert_ne!(
        fs::metadata(dest.join("bin/run")).unwrap().ino(),
        fs::metadata(dest.join("bin/run2")).unwrap().ino()
    );
    assert_eq!(
        fs::symlink_metadata(&dest).unwrap().mode() & 0o7777,
        RESTORE_ROOT_MODE
    );
    // No restore directory is left beside the destination.
    assert_eq!(s.names(), ["blobs", "dest", "src"]);
    // The restored tree snapshots to the same manifest and digest.
    let again = snapshot_tree(&dest, WS, Some(parent), &s.store).unwrap();
    assert_eq!(again, m);
    assert_eq!(again.digest(), m.digest());
    assert_eq!(s.blob_count(), 6);
}

#[test]
fn identical_trees_have_one_digest_and_one_byte_changes_it() {
    let s = Scratch::new();
    make_tree(&s.path("one"));
    make_tree(&s.path("two"));
    let one = snapshot_tree(&s.path("one"), WS, None, &s.store).unwrap();
    let two = snapshot_tree(&s.path("two"), WS, None, &s.store).unwrap();
    assert_eq!(one.canonical_bytes(), two.canonical_bytes());
    assert_eq!(one.digest(), two.digest());
    // The second tree's blobs were already there.
    assert_eq!(s.blob_count(), 6);
    assert_eq!(
        s.store.put(&Digest::of(KEY), KEY).unwrap(),
        PutOutcome::Existing
    );

    fs::write(s.path("two/private/key"), b"private key byteS").unwrap();
    let changed = snapshot_tree(&s.path("two"), WS, None, &s.store).unwrap();
    assert_ne!(changed.digest(), one.digest());
    let differing: Vec<&str> = one
        .entries
        .iter()
        .zip(&changed.entries)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.path.as_str())
        .collect();
    assert_eq!(differing, ["private/key"]);
    assert_eq!(
        changed.entry("private/key").unwrap().kind,
        EntryKind::File {
            size: KEY.len() as u64,
            sha256: Digest::of(b"private key byteS"),
        }
    );
    // A mode change alone changes the digest too.
    fs::set_permissions(s.path("one/secret"), Permissions::from_mode(0o640)).unwrap();
    let mode_changed = snapshot_tree(&s.path("one"), WS, None, &s.store).unwrap();
    assert_ne!(mode_changed.digest(), one.digest());
    assert_eq!(mode_changed.entry("secret").unwrap().mode, 0o640);
}

/// The restore failed, and left neither `dest` nor a restore directory.
fn assert_nothing_restored(s: &Scratch, dest: &Path) {
    assert!(fs::symlink_metadata(dest).is_err(), "{dest:?} exists");
    assert_eq!(s.names(), ["blobs", "src"]);
}

#[test]
fn a_corrupt_blob_fails_the_restore_naming_its_path_and_digest() {
    let s = Scratch::new();
    make_tree(&s.path("src"));
    let m = snapshot_tree(&s.path("src"), WS, None, &s.store).unwrap();
    let digest = Digest::of(KEY);
    // Same length, one byte different.
    fs::write(s.store.path_of(&digest), b"private key byteS").unwrap();
    let dest = s.path("dest");
    let e = restore_tree(&m, &s.store, &dest, None).unwrap_err();
    assert_eq!(e.code(), "blob_corrupt");
    assert!(
        matches!(&e, TreeError::BlobCorrupt { path, digest: d } if path == "private/key" && *d == digest),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "file \"private/key\": blob {digest} is corrupt in the blob store; put it again or restore another snapshot"
        )
    );
    assert_nothing_restored(&s, &dest);
    // A truncated blob likewise; the first file in path order is named.
    let run = Digest::of(RUN);
    fs::write(s.store.path_of(&run), b"").unwrap();
    let e = restore_tree(&m, &s.store, &dest, None).unwrap_err();
    assert!(
        matches!(&e, TreeError::BlobCorrupt { path, digest: d } if path == "bin/run" && *d == run),
        "{e:?}"
    );
    assert_nothing_restored(&s, &dest);
}

#[test]
fn a_missing_blob_fails_the_restore_naming_its_path_and_digest() {
    let s = Scratch::new();
    make_tree(&s.path("src"));
    let m = snapshot_tree(&s.path("src"), WS, None, &s.store).unwrap();
    let digest = Digest::of(RO_B);
    fs::remove_file(s.store.path_of(&digest)).unwrap();
    let dest = s.path("dest");
    let e = restore_tree(&m, &s.store, &dest, None).unwrap_err();
    assert_eq!(e.code(), "blob_missing");
    assert!(
        matches!(&e, TreeError::BlobMissing { path, digest: d } if path == "ro/sub/b" && *d == digest),
        "{e:?}"
    );
    // It failed after the read-only directory's other entries were
    // written: they are gone with it.
    assert_nothing_restored(&s, &dest);
}

/// A store that answers with bytes other than those asked for (a store
/// that does not verify).
struct LyingStore {
    bytes: Vec<u8>,
}

impl BlobStore for LyingStore {
    fn put(&self, _: &Digest, _: &[u8]) -> Result<PutOutcome, BlobError> {
        Ok(PutOutcome::Existing)
    }
    fn get(&self, _: &Digest) -> Result<Option<Vec<u8>>, BlobError> {
        Ok(Some(self.bytes.clone()))
    }
    fn put_reader(&self, _: &mut dyn Read, _: u64) -> Result<(Digest, u64, PutOutcome), BlobError> {
        Ok((
            Digest::of(&self.bytes),
            self.bytes.len() as u64,
            PutOutcome::Existing,
        ))
    }
    fn copy_to(&self, _: &Digest, _: u64, out: &mut dyn Write) -> Result<Option<u64>, BlobError> {
        out.write_all(&self.bytes)
            .map_err(|source| BlobError::Output { source })?;
        Ok(Some(self.bytes.len() as u64))
    }
}

#[test]
fn restore_checks_every_blob_itself_whatever_the_store() {
    let s = Scratch::new();
    fs::create_dir(s.path("src")).unwrap();
    let digest = Digest::of(b"abc");
    let m = Manifest::new(WS, None, vec![Entry::file("f", 0o644, 3, digest)]).unwrap();
    let dest = s.path("dest");
    for bytes in [b"abd".to_vec(), b"abcd".to_vec(), Vec::new()] {
        let e = restore_tree(&m, &LyingStore { bytes }, &dest, None).unwrap_err();
        assert!(
            matches!(&e, TreeError::BlobCorrupt { path, digest: d } if path == "f" && *d == digest),
            "{e:?}"
        );
        assert_nothing_restored(&s, &dest);
    }
    // A right answer restores.
    let store = LyingStore {
        bytes: b"abc".to_vec(),
    };
    assert_eq!(
        restore_tree(&m, &store, &dest, None).unwrap(),
        RestoreReport {
            entries: 1,
            file_bytes: 3
        }
    );
    assert_eq!(fs::read(dest.join("f")).unwrap(), b"abc");
}

#[test]
fn an_existing_destination_is_refused_and_left_alone() {
    let s = Scratch::new();
    make_tree(&s.path("src"));
    let m = snapshot_tree(&s.path("src"), WS, None, &s.store).unwrap();
    let dest = s.path("dest");
    fs::create_dir(&dest).unwrap();
    let e = restore_tree(&m, &s.store, &dest, None).unwrap_err();
    assert_eq!(e.code(), "dest_exists");
    assert_eq!(
        e.to_string(),
        format!(
            "restore destination {} exists; restore into a path that does not",
            dest.display()
        )
    );
    assert_eq!(names_in(&dest), Vec::<String>::new());
    // A dangling symlink is a destination that exists, too.
    let link = s.path("link");
    symlink("nowhere", &link).unwrap();
    let e = restore_tree(&m, &s.store, &link, None).unwrap_err();
    assert_eq!(e.code(), "dest_exists");
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("nowhere"));
    assert_eq!(s.names(), ["blobs", "dest", "link", "src"]);
}

#[test]
fn restore_sets_the_owner_of_every_entry_and_keeps_setuid() {
    let s = Scratch::new();
    make_tree(&s.path("src"));
    let m = snapshot_tree(&s.path("src"), WS, None, &s.store).unwrap();
    // Root may give entries away; anyone else may give them to itself.
    let me = fs::metadata(s.path("src")).unwrap();
    let owner = if me.uid() == 0 {
        (4242, 4343)
    } else {
        (me.uid(), me.gid())
    };
    let dest = s.path("dest");
    restore_tree(&m, &s.store, &dest, Some(owner)).unwrap();
    let listing = list_tree(&dest);
    assert_eq!(listing.len(), 14);
    for (path, (_, _, uid, gid, _)) in &listing {
        assert_eq!((*uid, *gid), owner, "{path}");
    }
    let root = fs::symlink_metadata(&dest).unwrap();
    assert_eq!((root.uid(), root.gid()), owner);
    assert_eq!(listing["suid"].1, 0o4755);
    assert_eq!(shape(&listing), shape(&list_tree(&s.path("src"))));
}

#[test]
fn restore_checks_a_manifest_built_without_its_rules() {
    let s = Scratch::new();
    fs::create_dir(s.path("src")).unwrap();
    let escape = Manifest {
        workspace_id: WS,
        parent: None,
        entries: vec![Entry::dir("../escape", 0o755)],
    };
    let dest = s.path("src/dest");
    let e = restore_tree(&escape, &s.store, &dest, None).unwrap_err();
    assert!(
        matches!(&e, TreeError::Snapshot(SnapshotError::PathInvalid { path, reason })
            if path == "../escape" && *reason == "has a `..` component"),
        "{e:?}"
    );
    assert_eq!(e.code(), "path_invalid");
    assert_eq!(s.names(), ["blobs", "src"]);
    assert_eq!(names_in(&s.path("src")), Vec::<String>::new());
    // Unsorted entries are sorted before anything is built.
    let unsorted = Manifest {
        workspace_id: WS,
        parent: None,
        entries: vec![Entry::dir("a/b", 0o700), Entry::dir("a", 0o755)],
    };
    restore_tree(&unsorted, &s.store, &dest, None).unwrap();
    assert_eq!(list_tree(&dest).len(), 2);
}

#[test]
fn fifos_sockets_and_devices_are_refused_naming_the_path() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, src.join("sub/pipe"), 0o644.into()).unwrap();
    let e = snapshot_tree(&src, WS, None, &s.store).unwrap_err();
    assert_eq!(e.code(), "special_file");
    assert!(
        matches!(&e, TreeError::SpecialFile { path } if path == "sub/pipe"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "\"sub/pipe\" is a device, fifo or socket; a snapshot holds only directories, regular files and symlinks: remove it and snapshot again"
    );
    fs::remove_file(src.join("sub/pipe")).unwrap();
    let _listener = UnixListener::bind(src.join("sock")).unwrap();
    let e = snapshot_tree(&src, WS, None, &s.store).unwrap_err();
    assert!(
        matches!(&e, TreeError::SpecialFile { path } if path == "sock"),
        "{e:?}"
    );
    fs::remove_file(src.join("sock")).unwrap();
    // A link to a device is only a link.
    symlink("/dev/null", src.join("null")).unwrap();
    let m = snapshot_tree(&src, WS, None, &s.store).unwrap();
    assert_eq!(
        m.entries,
        vec![
            Entry::symlink("null", "/dev/null"),
            Entry::dir("sub", 0o755)
        ]
    );
}

#[test]
fn a_name_that_is_not_utf8_is_refused_shown_lossily() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d").join(OsStr::from_bytes(b"bad\xffname")), b"x").unwrap();
    let e = snapshot_tree(&src, WS, None, &s.store).unwrap_err();
    assert_eq!(e.code(), "path_not_utf8");
    assert!(
        matches!(&e, TreeError::PathNotUtf8 { path } if path == "d/bad\u{fffd}name"),
        "{e:?}"
    );
    // A symlink target that is not UTF-8 is refused as a target.
    fs::remove_file(src.join("d").join(OsStr::from_bytes(b"bad\xffname"))).unwrap();
    symlink(OsStr::from_bytes(b"t\xff"), src.join("l")).unwrap();
    let e = snapshot_tree(&src, WS, None, &s.store).unwrap_err();
    assert!(
        matches!(&e, TreeError::Snapshot(SnapshotError::SymlinkTargetInvalid { path, reason })
            if path == "l" && *reason == "is not UTF-8"),
        "{e:?}"
    );
}

#[test]
fn a_file_over_the_bound_is_refused_before_it_is_read() {
    assert_eq!(SNAPSHOT_FILE_BYTES_MAX, 8 * 1024 * 1024 * 1024);
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir(&src).unwrap();
    // A sparse file: no bytes on disk, and none are read.
    let over = fs::File::create(src.join("over")).unwrap();
    over.set_len(SNAPSHOT_FILE_BYTES_MAX + 1).unwrap();
    let e = snapshot_tree(&src, WS, None, &s.store).unwrap_err();
    assert_eq!(e.code(), "file_too_large");
    assert!(
        matches!(&e, TreeError::Snapshot(SnapshotError::FileTooLarge { path, size, max })
            if path == "over" && *size == SNAPSHOT_FILE_BYTES_MAX + 1 && *max == SNAPSHOT_FILE_BYTES_MAX),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "file \"over\" has 8589934593 bytes, over the 8589934592-byte bound of one snapshot file; shrink or remove it"
    );
    // Nothing was stored, not even a temporary file.
    assert_eq!(names_in(&s.path("blobs/sha256")), Vec::<String>::new());
}

#[test]
fn the_root_must_be_a_directory_and_not_a_link() {
    let s = Scratch::new();
    make_tree(&s.path("src"));
    let link = s.path("link");
    symlink("src", &link).unwrap();
    let e = snapshot_tree(&link, WS, None, &s.store).unwrap_err();
    assert_eq!(e.code(), "tree_io");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: is not a directory (a symlink is not followed)",
            link.display()
        )
    );
    let e = snapshot_tree(&s.path("absent"), WS, None, &s.store).unwrap_err();
    assert_eq!(e.code(), "tree_io");
    // An invalid workspace id is refused before anything is read or put.
    let e = snapshot_tree(&s.path("src"), WorkspaceId(0), None, &s.store).unwrap_err();
    assert_eq!(e.code(), "workspace_id_invalid");
    assert_eq!(fs::read_dir(s.path("blobs/sha256")).unwrap().count(), 0);
}

#[test]
fn a_directory_of_too_many_names_is_refused_while_it_is_listed() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir(&src).unwrap();
    for i in 0..SNAPSHOT_ENTRIES_MAX {
        fs::File::create(src.join(format!("{i:06}"))).unwrap();
    }
    let m = snapshot_tree(&src, WS, None, &s.store).unwrap();
    assert_eq!(m.entries.len(), SNAPSHOT_ENTRIES_MAX);
    assert_eq!(s.blob_count(), 1);
    fs::File::create(src.join("over")).unwrap();
    let e = snapshot_tree(&src, WS, None, &s.store).unwrap_err();
    assert_eq!(e.code(), "too_many_entries");
    assert!(
        matches!(&e, TreeError::Snapshot(SnapshotError::TooManyEntries { max, .. })
            if *max == SNAPSHOT_ENTRIES_MAX),
        "{e:?}"
    );
}

/// A store whose every call fails as a broken disk would.
struct BrokenStore;

impl BlobStore for BrokenStore {
    fn put(&self, _: &Digest, _: &[u8]) -> Result<PutOutcome, BlobError> {
        Err(BlobError::Io {
            path: "/broken".into(),
            source: std::io::Error::other("disk gone"),
        })
    }
    fn get(&self, _: &Digest) -> Result<Option<Vec<u8>>, BlobError> {
        self.put(&Digest::of(b""), b"").map(|_| None)
    }
    fn put_reader(&self, _: &mut dyn Read, _: u64) -> Result<(Digest, u64, PutOutcome), BlobError> {
        self.put(&Digest::of(b""), b"")
            .map(|o| (Digest::of(b""), 0, o))
    }
    fn copy_to(&self, _: &Digest, _: u64, _: &mut dyn Write) -> Result<Option<u64>, BlobError> {
        self.get(&Digest::of(b"")).map(|_| None)
    }
}

#[test]
fn a_failing_store_fails_with_its_own_code_naming_the_file() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"abc").unwrap();
    let e = snapshot_tree(&src, WS, None, &BrokenStore).unwrap_err();
    assert_eq!(e.code(), "blob_io");
    assert_eq!(
        e.to_string(),
        "file \"f\": blob store failed to store its bytes: blob store I/O on /broken: disk gone"
    );
    assert!(
        matches!(&e, TreeError::BlobPut { path, source } if path == "f" && source.code() == "blob_io"),
        "{e:?}"
    );
    let m = snapshot_tree(&src, WS, None, &s.store).unwrap();
    let dest = s.path("dest");
    let e = restore_tree(&m, &BrokenStore, &dest, None).unwrap_err();
    assert_eq!(e.code(), "blob_io");
    assert!(
        matches!(&e, TreeError::Blob { path, digest, .. } if path == "f" && *digest == Digest::of(b"abc")),
        "{e:?}"
    );
    assert_nothing_restored(&s, &dest);
}

/// 40 MiB: forty streaming buffers, and more than a page blob may hold.
const LARGE_BYTES: usize = 40 * 1024 * 1024;

/// `LARGE_BYTES` of a fixed xorshift sequence of `seed`.
fn large_content(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut bytes = Vec::with_capacity(LARGE_BYTES);
    while bytes.len() < LARGE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes
}

/// The blob files in the store, sorted, after checking that the store holds
/// nothing else (no temporary file in its root or in a shard).
fn blob_names(s: &Scratch) -> Vec<String> {
    let root = s.path("blobs/sha256");
    let mut blobs = Vec::new();
    for shard in names_in(&root) {
        assert!(
            shard.len() == 2 && shard.bytes().all(|b| b.is_ascii_hexdigit()),
            "{shard}"
        );
        for name in names_in(&root.join(&shard)) {
            assert!(name.len() == 64 && name.starts_with(&shard), "{name}");
            blobs.push(name);
        }
    }
    blobs
}

#[test]
fn a_40_mib_file_round_trips_byte_for_byte_through_the_stream() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir(&src).unwrap();
    mkdir(&src.join("data"), 0o750);
    let original = large_content(1);
    write(&src.join("data/big.bin"), &original, 0o640);
    let digest = Digest::of(&original);
    let m = snapshot_tree(&src, WS, None, &s.store).unwrap();
    assert_eq!(
        m.entries,
        vec![
            Entry::dir("data", 0o750),
            Entry::file("data/big.bin", 0o640, 41_943_040, digest),
        ]
    );
    assert_eq!(blob_names(&s), vec![digest.to_hex()]);
    assert_eq!(
        fs::metadata(s.store.path_of(&digest)).unwrap().len(),
        41_943_040
    );
    // The page bound still holds for whole-slice reads.
    let e = s.store.get(&digest).unwrap_err();
    assert!(
        matches!(e, BlobError::TooLarge { bytes, max }
            if bytes == BLOB_BYTES_MAX as u64 + 1 && max == 16_777_216),
        "{e:?}"
    );

    let dest = s.path("dest");
    assert_eq!(
        restore_tree(&m, &s.store, &dest, None).unwrap(),
        RestoreReport {
            entries: 2,
            file_bytes: 41_943_040,
        }
    );
    let restored = fs::read(dest.join("data/big.bin")).unwrap();
    assert_eq!(restored.len(), LARGE_BYTES);
    assert_eq!(Digest::of(&restored), Digest::of(&original));
    assert!(restored == original, "restored bytes differ");
    let meta = fs::metadata(dest.join("data/big.bin")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!(
        fs::metadata(dest.join("data")).unwrap().mode() & 0o7777,
        0o750
    );
    assert_eq!(s.names(), ["blobs", "dest", "src"]);
}

/// Replaces the byte at `offset` of `path` by its complement.
fn flip_byte(path: &Path, offset: u64) {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut byte).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&[!byte[0]]).unwrap();
}

#[test]
fn a_damaged_large_blob_fails_the_restore_naming_its_path_and_digest() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir(&src).unwrap();
    let original = large_content(2);
    write(&src.join("big.bin"), &original, 0o644);
    let m = snapshot_tree(&src, WS, None, &s.store).unwrap();
    let digest = Digest::of(&original);
    let blob = s.store.path_of(&digest);
    let dest = s.path("dest");
    let refused = |what: &str| {
        let e = restore_tree(&m, &s.store, &dest, None).unwrap_err();
        assert_eq!(e.code(), "blob_corrupt", "{what}");
        assert!(
            matches!(&e, TreeError::BlobCorrupt { path, digest: d } if path == "big.bin" && *d == digest),
            "{what}: {e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "file \"big.bin\": blob {digest} is corrupt in the blob store; put it again or restore another snapshot"
            ),
            "{what}"
        );
        assert_nothing_restored(&s, &dest);
    };
    // One byte flipped in the middle: same size, wrong SHA-256.
    flip_byte(&blob, LARGE_BYTES as u64 / 2);
    refused("flipped");
    // Truncated to half.
    fs::write(&blob, &original[..LARGE_BYTES / 2]).unwrap();
    refused("truncated");
    // One byte longer.
    let mut longer = original.clone();
    longer.push(0);
    fs::write(&blob, &longer).unwrap();
    refused("longer");
    // A snapshot of the same file puts a good copy back, and it restores.
    assert_eq!(snapshot_tree(&src, WS, None, &s.store).unwrap(), m);
    restore_tree(&m, &s.store, &dest, None).unwrap();
    assert!(fs::read(dest.join("big.bin")).unwrap() == original);
}

#[test]
fn the_same_large_content_in_two_files_is_one_blob() {
    let s = Scratch::new();
    let src = s.path("src");
    fs::create_dir(&src).unwrap();
    for dir in ["a", "b", "c"] {
        mkdir(&src.join(dir), 0o755);
    }
    let content = large_content(3);
    write(&src.join("a/weights"), &content, 0o644);
    write(&src.join("b/weights"), &content, 0o600);
    let mut other = content.clone();
    other[LARGE_BYTES / 2] ^= 0x01;
    write(&src.join("c/weights"), &other, 0o644);
    let m = snapshot_tree(&src, WS, None, &s.store).unwrap();
    let (same, differs) = (Digest::of(&content), Digest::of(&other));
    assert_eq!(
        m.entries,
        vec![
            Entry::dir("a", 0o755),
            Entry::file("a/weights", 0o644, 41_943_040, same),
            Entry::dir("b", 0o755),
            Entry::file("b/weights", 0o600, 41_943_040, same),
            Entry::dir("c", 0o755),
            Entry::file("c/weights", 0o644, 41_943_040, differs),
        ]
    );
    assert_eq!(m.file_bytes(), 125_829_120);
    let mut expected = vec![same.to_hex(), differs.to_hex()];
    expected.sort();
    assert_eq!(blob_names(&s), expected);
    // A second snapshot of the same tree adds nothing.
    assert_eq!(snapshot_tree(&src, WS, None, &s.store).unwrap(), m);
    assert_eq!(blob_names(&s), expected);
}
