//! A manifest of exactly [`SNAPSHOT_MANIFEST_BYTES_MAX`] canonical bytes is
//! accepted and one byte more is refused, on full-size manifests. Kept out
//! of the unit tests: building 64 MiB manifests takes seconds in a debug
//! build, and the mutation gate runs the unit tests once per mutant (they
//! check the bound's comparison on small numbers).

use lc_core::WorkspaceId;
use lc_core::snapshot::{
    Entry, EntryKind, Manifest, SNAPSHOT_MANIFEST_BYTES_MAX, SYMLINK_TARGET_BYTES_MAX,
    SnapshotError,
};

const WS: WorkspaceId = WorkspaceId(7);

/// Symlinks whose canonical manifest is exactly `bytes` long.
fn manifest_of_len(bytes: usize) -> Manifest {
    let target_len = 4000;
    let link = |i: usize, len: usize| Entry::symlink(format!("l{i:05}"), "t".repeat(len));
    let one = Manifest::new(WS, None, vec![link(0, target_len)])
        .unwrap()
        .canonical_bytes()
        .len();
    let empty = Manifest::new(WS, None, vec![])
        .unwrap()
        .canonical_bytes()
        .len();
    // One entry adds at least its target's bytes: checked first, so a
    // broken encoding fails here instead of sizing millions of entries.
    assert!(
        one > empty + target_len,
        "one entry of {target_len} target bytes encodes {one} bytes, the empty manifest {empty}"
    );
    // Each further entry adds its own bytes and a comma.
    let per_entry = one - empty + 1;
    let count = (bytes - empty + 1) / per_entry;
    let mut entries: Vec<Entry> = (0..count).map(|i| link(i, target_len)).collect();
    let mut short = bytes
        - Manifest::new(WS, None, entries.clone())
            .unwrap()
            .canonical_bytes()
            .len();
    for e in entries.iter_mut() {
        let add = short.min(SYMLINK_TARGET_BYTES_MAX - target_len);
        e.kind = EntryKind::Symlink {
            target: "t".repeat(target_len + add),
        };
        short -= add;
    }
    assert_eq!(short, 0);
    Manifest::new(WS, None, entries).unwrap()
}

#[test]
fn canonical_bytes_are_bounded() {
    let max = SNAPSHOT_MANIFEST_BYTES_MAX;
    let at_max = manifest_of_len(max);
    let bytes = at_max.canonical_bytes();
    assert_eq!(bytes.len(), max);
    assert_eq!(Manifest::from_canonical(&bytes).unwrap(), at_max);
    let mut entries = at_max.entries;
    entries.push(Entry::dir("m", 0o755));
    assert_eq!(
        Manifest::new(WS, None, entries),
        Err(SnapshotError::ManifestTooLarge {
            bytes: max + r#",{"mode":493,"path":"m","type":"dir"}"#.len(),
            max,
        })
    );
    // More bytes than the bound are refused before they are parsed.
    let mut over = bytes;
    over.push(b' ');
    assert_eq!(
        Manifest::from_canonical(&over),
        Err(SnapshotError::ManifestTooLarge {
            bytes: max + 1,
            max,
        })
    );
}
