//! Properties of snapshot manifests and of snapshot/restore round trips.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};

use lc_blob::LocalBlobStore;
use lc_blob::tree::{restore_tree, snapshot_tree};
use lc_core::snapshot::{Entry, EntryKind, Manifest, WORKSPACE_ID_MAX};
use lc_core::{Digest, WorkspaceId};
use proptest::prelude::*;

/// What a generated leaf is.
#[derive(Debug, Clone)]
enum Leaf {
    Dir(u32),
    File(u32, Vec<u8>),
    Symlink(String),
}

fn leaf() -> impl Strategy<Value = Leaf> {
    prop_oneof![
        (0u32..=0o7777).prop_map(Leaf::Dir),
        (0u32..=0o7777, proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(m, b)| Leaf::File(m, b)),
        // Any UTF-8 without NUL, absolute and `..` included.
        "[^\u{0}]{1,24}".prop_map(Leaf::Symlink),
    ]
}

/// A component: never empty, `.` or `..` (the class has no `.` alone), and
/// holding the characters JSON escapes.
fn component() -> impl Strategy<Value = String> {
    "[a-c\u{e9}\u{1}\"\\\\ .-]{1,4}".prop_filter("not . or ..", |c| c != "." && c != "..")
}

/// Entries: each generated path with every parent added as a directory;
/// the first kind given to a path wins, a parent is always a directory.
fn entries() -> impl Strategy<Value = Vec<Entry>> {
    proptest::collection::vec(
        (proptest::collection::vec(component(), 1..4), leaf()),
        0..24,
    )
    .prop_map(|leaves| {
        let mut by_path: BTreeMap<String, Entry> = BTreeMap::new();
        for (components, leaf) in leaves {
            for depth in 1..components.len() {
                let parent = components[..depth].join("/");
                by_path.insert(parent.clone(), Entry::dir(parent, 0o755));
            }
            let path = components.join("/");
            by_path.entry(path.clone()).or_insert(match leaf {
                Leaf::Dir(mode) => Entry::dir(path, mode),
                Leaf::File(mode, bytes) => {
                    Entry::file(path, mode, bytes.len() as u64, Digest::of(&bytes))
                }
                Leaf::Symlink(target) => Entry::symlink(path, target),
            });
        }
        // A parent inserted after its child's leaf was a file or link wins
        // as a directory (the insert above replaced it).
        by_path.into_values().rev().collect()
    })
}

fn manifest() -> impl Strategy<Value = Manifest> {
    (
        1..=WORKSPACE_ID_MAX,
        proptest::option::of(any::<[u8; 32]>()),
        entries(),
    )
        .prop_map(|(id, parent, entries)| {
            Manifest::new(WorkspaceId(id), parent.map(Digest), entries).unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canonical_bytes_parse_back_to_the_same_manifest(m in manifest()) {
        let bytes = m.canonical_bytes();
        let parsed = Manifest::from_canonical(&bytes).unwrap();
        prop_assert_eq!(&parsed, &m);
        prop_assert_eq!(parsed.digest(), Digest::of(&bytes));
        // Sorted by path bytes, each path once.
        for pair in m.entries.windows(2) {
            prop_assert!(pair[0].path.as_bytes() < pair[1].path.as_bytes());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_only_canonical_bytes_parse(
        bytes in proptest::collection::vec(any::<u8>(), 0..512)
    ) {
        if let Ok(m) = Manifest::from_canonical(&bytes) {
            prop_assert_eq!(m.canonical_bytes(), bytes);
        }
    }

    #[test]
    fn a_changed_byte_of_canonical_bytes_never_parses_to_another_manifest(
        m in manifest(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = m.canonical_bytes();
        let i = at.index(bytes.len());
        prop_assume!(bytes[i] != byte);
        bytes[i] = byte;
        if let Ok(other) = Manifest::from_canonical(&bytes) {
            // Only a manifest whose own canonical bytes these are.
            prop_assert_eq!(other.canonical_bytes(), bytes);
            prop_assert_ne!(other, m);
        }
    }
}

proptest! {
    // Each case writes and fsyncs a real tree twice.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_generated_tree_restores_to_what_was_snapshotted(m in manifest()) {
        // The walk needs to list every directory and read every file, which
        // a user other than root may only do with the owner's bits set.
        let entries = m.entries.iter().cloned().map(|mut e| {
            match e.kind {
                EntryKind::Dir => e.mode |= 0o700,
                EntryKind::File { .. } => e.mode |= 0o400,
                EntryKind::Symlink { .. } => {}
            }
            e
        });
        let m = Manifest::new(m.workspace_id, m.parent, entries.collect()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::open(dir.path().join("blobs")).unwrap();
        // Write the tree by hand (files' bytes are their blobs).
        let src = dir.path().join("src");
        fs::create_dir(&src).unwrap();
        let mut contents = BTreeMap::new();
        for e in &m.entries {
            let path = src.join(&e.path);
            match &e.kind {
                EntryKind::Dir => fs::create_dir(&path).unwrap(),
                EntryKind::File { .. } => {
                    // The manifest names only digests: each file holds its
                    // own path instead.
                    fs::write(&path, e.path.as_bytes()).unwrap();
                    contents.insert(e.path.clone(), e.path.clone().into_bytes());
                }
                EntryKind::Symlink { target } => symlink(target, &path).unwrap(),
            }
        }
        // Modes last, deepest first, so read-only directories do not block.
        for e in m.entries.iter().rev() {
            if !matches!(e.kind, EntryKind::Symlink { .. }) {
                fs::set_permissions(src.join(&e.path), fs::Permissions::from_mode(e.mode)).unwrap();
            }
        }
        let snap = snapshot_tree(&src, m.workspace_id, m.parent, &store).unwrap();
        let paths = |x: &Manifest| x.entries.iter().map(|e| (e.path.clone(), e.mode)).collect::<Vec<_>>();
        prop_assert_eq!(paths(&snap), paths(&m));
        for e in &snap.entries {
            if let EntryKind::File { size, sha256 } = e.kind {
                prop_assert_eq!(size, e.path.len() as u64);
                prop_assert_eq!(sha256, Digest::of(e.path.as_bytes()));
            }
        }
        let dest = dir.path().join("dest");
        let report = restore_tree(&snap, &store, &dest, None).unwrap();
        prop_assert_eq!(report.entries, snap.entries.len());
        let again = snapshot_tree(&dest, m.workspace_id, m.parent, &store).unwrap();
        prop_assert_eq!(again.digest(), snap.digest());
        for (path, bytes) in contents {
            prop_assert_eq!(fs::read(dest.join(&path)).unwrap(), bytes);
        }
        // Let the temporary directory go: read-only directories would block it.
        for e in &snap.entries {
            if e.kind == EntryKind::Dir {
                for root in [&src, &dest] {
                    let _ = fs::set_permissions(root.join(&e.path), fs::Permissions::from_mode(0o700));
                }
            }
        }
    }
}
