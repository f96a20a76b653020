//! The runtime store's importer: exact manifests and digests, idempotent
//! imports, and every refusal with its code and nothing left behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use lc_core::manifest::Manifest;
use lc_core::page::sha256;
use lc_provider::runtime::{ImportLimits, RuntimeRoot, RuntimeStore, base_digest};

static COUNTER: AtomicU32 = AtomicU32::new(0);

struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(tag: &str) -> Tmp {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("lc-rt-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

/// Names in the store directory: after a refusal there are none.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// One raw tar entry; the name is written into the header unchecked, so
/// archives the `tar` crate's builder would refuse can be made.
fn entry(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, data: &[u8], link: &str, mode: u32) {
    let mut h = tar::Header::new_ustar();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

fn good_tar() -> Vec<u8> {
    let mut t = Vec::new();
    entry(&mut t, "./", tar::EntryType::Directory, b"", "", 0o755);
    entry(&mut t, "./bin/", tar::EntryType::Directory, b"", "", 0o755);
    entry(
        &mut t,
        "./bin/hello",
        tar::EntryType::Regular,
        b"#!/bin/sh\necho hi\n",
        "",
        0o4755,
    );
    entry(
        &mut t,
        "./etc/motd",
        tar::EntryType::Regular,
        b"hi\n",
        "",
        0o644,
    );
    entry(&mut t, "./sbin", tar::EntryType::Symlink, b"", "bin", 0o777);
    finish(t)
}

#[test]
fn a_tar_import_has_an_exact_manifest_and_digest() {
    let store_dir = tmp("good");
    let store = RuntimeStore::open(&store_dir.0).unwrap();
    let imported = store
        .import_tar(&good_tar()[..], ImportLimits::default())
        .unwrap();
    let want = format!(
        concat!(
            r#"{{"entries":["#,
            r#"{{"mode":493,"path":"bin","type":"dir"}},"#,
            r#"{{"mode":493,"path":"bin/hello","sha256":"{}","size":18,"type":"file"}},"#,
            r#"{{"mode":493,"path":"etc","type":"dir"}},"#,
            r#"{{"mode":420,"path":"etc/motd","sha256":"{}","size":3,"type":"file"}},"#,
            r#"{{"path":"sbin","target":"bin","type":"symlink"}}"#,
            r#"],"kind":"tree"}}"#
        ),
        hex::encode(sha256(b"#!/bin/sh\necho hi\n")),
        hex::encode(sha256(b"hi\n")),
    );
    assert_eq!(
        String::from_utf8(imported.manifest.canonical()).unwrap(),
        want
    );
    assert_eq!(imported.digest.0, sha256(want.as_bytes()));
    assert!(imported.created);
    let hex = imported.digest.to_hex();
    assert_eq!(listing(&store_dir.0), vec![hex.clone()]);
    let root = store.resolve(&imported.digest).unwrap();
    let RuntimeRoot::Tree(tree) = root else {
        panic!("not a tree")
    };
    assert_eq!(std::fs::read(tree.join("etc/motd")).unwrap(), b"hi\n");
    use std::os::unix::fs::PermissionsExt as _;
    // The set-uid bit is dropped.
    assert_eq!(
        std::fs::metadata(tree.join("bin/hello"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(tree.join("sbin")).unwrap(),
        Path::new("bin")
    );
    assert_eq!(
        std::fs::read(store_dir.0.join(&hex).join("manifest.json")).unwrap(),
        want.as_bytes()
    );
    assert_eq!(store.manifest(&imported.digest).unwrap(), imported.manifest);
    // The same tree again is the same runtime, and nothing new is stored.
    let again = store
        .import_tar(&good_tar()[..], ImportLimits::default())
        .unwrap();
    assert_eq!(again.digest, imported.digest);
    assert!(!again.created);
    assert_eq!(listing(&store_dir.0), vec![hex.clone()]);
    // The same tree from a directory is the same runtime too.
    let src = tmp("src");
    std::fs::create_dir_all(src.0.join("bin")).unwrap();
    std::fs::create_dir_all(src.0.join("etc")).unwrap();
    std::fs::write(src.0.join("bin/hello"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(src.0.join("etc/motd"), b"hi\n").unwrap();
    for (p, m) in [
        ("bin", 0o755),
        ("etc", 0o755),
        ("bin/hello", 0o755),
        ("etc/motd", 0o644),
    ] {
        std::fs::set_permissions(src.0.join(p), std::fs::Permissions::from_mode(m)).unwrap();
    }
    std::os::unix::fs::symlink("bin", src.0.join("sbin")).unwrap();
    let from_dir = store.import_dir(&src.0, ImportLimits::default()).unwrap();
    assert_eq!(from_dir.digest, imported.digest);
    assert_eq!(listing(&store_dir.0), vec![hex]);
}

#[test]
fn the_base_runtime_is_built_in() {
    let store_dir = tmp("base");
    let store = RuntimeStore::open(&store_dir.0).unwrap();
    assert_eq!(base_digest().0, Manifest::base().digest());
    assert_eq!(
        base_digest().to_hex(),
        "e7cafcb1a70f147b4a1b74292b407976657a7e2d2c9669f16dd587c5f0f4d226"
    );
    assert_eq!(store.resolve(&base_digest()), Some(RuntimeRoot::HostUsr));
    assert_eq!(store.resolve(&lc_core::Digest([1; 32])), None);
}

fn refused(archive: Vec<u8>, limits: ImportLimits) -> String {
    let store_dir = tmp("bad");
    let store = RuntimeStore::open(&store_dir.0).unwrap();
    let err = store.import_tar(&archive[..], limits).unwrap_err();
    assert_eq!(
        listing(&store_dir.0),
        Vec::<String>::new(),
        "left behind after {err}"
    );
    err.code().to_owned()
}

fn one(name: &str, kind: tar::EntryType, data: &[u8], link: &str) -> Vec<u8> {
    let mut t = Vec::new();
    entry(&mut t, name, kind, data, link, 0o644);
    finish(t)
}

#[test]
fn bad_tarballs_are_refused_with_codes_and_leave_nothing() {
    let d = ImportLimits::default();
    use tar::EntryType as T;
    assert_eq!(
        refused(one("/etc/passwd", T::Regular, b"x", ""), d),
        "absolute_path"
    );
    assert_eq!(
        refused(one("a/../../x", T::Regular, b"x", ""), d),
        "parent_path"
    );
    assert_eq!(
        refused(one("l", T::Symlink, b"", "../etc"), d),
        "symlink_escape"
    );
    assert_eq!(
        refused(one("l", T::Symlink, b"", "/etc/passwd"), d),
        "symlink_escape"
    );
    assert_eq!(
        refused(one("dev/null", T::Char, b"", ""), d),
        "special_file"
    );
    assert_eq!(
        refused(one("dev/sda", T::Block, b"", ""), d),
        "special_file"
    );
    assert_eq!(refused(one("p", T::Fifo, b"", ""), d), "special_file");
    assert_eq!(
        refused(one("h", T::Link, b"", "etc/passwd"), d),
        "special_file"
    );
    let mut below = Vec::new();
    entry(&mut below, "l", T::Symlink, b"", "d", 0o777);
    entry(&mut below, "l/x", T::Regular, b"x", "", 0o644);
    assert_eq!(refused(finish(below), d), "not_a_directory");
    let mut twice = Vec::new();
    entry(&mut twice, "f", T::Regular, b"x", "", 0o644);
    entry(&mut twice, "f", T::Regular, b"y", "", 0o644);
    assert_eq!(refused(finish(twice), d), "duplicate_entry");
    let small = ImportLimits {
        entries_max: 10,
        bytes_max: 10,
    };
    assert_eq!(
        refused(one("f", T::Regular, &[0; 11], ""), small),
        "too_large"
    );
    assert!(
        RuntimeStore::open(&tmp("ok").0)
            .unwrap()
            .import_tar(&one("f", T::Regular, &[0; 10], "")[..], small)
            .is_ok()
    );
    let few = ImportLimits {
        entries_max: 2,
        bytes_max: 10,
    };
    // a/b/c needs three entries: the implicit a and a/b, then the file.
    assert_eq!(
        refused(one("a/b/c", T::Regular, b"", ""), few),
        "too_many_entries"
    );
    let three = ImportLimits {
        entries_max: 3,
        bytes_max: 10,
    };
    assert!(
        RuntimeStore::open(&tmp("ok3").0)
            .unwrap()
            .import_tar(&one("a/b/c", T::Regular, b"", "")[..], three)
            .is_ok()
    );
    assert_eq!(refused(vec![7u8; 1024], d), "malformed_tar");
}

#[test]
fn bad_directories_are_refused_and_leave_nothing() {
    let d = ImportLimits::default();
    let src = tmp("fifo-src");
    std::fs::create_dir(src.0.join("sub")).unwrap();
    let fifo = std::ffi::CString::new(src.0.join("sub/p").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let store_dir = tmp("fifo-store");
    let store = RuntimeStore::open(&store_dir.0).unwrap();
    assert_eq!(
        store.import_dir(&src.0, d).unwrap_err().code(),
        "special_file"
    );
    assert_eq!(listing(&store_dir.0), Vec::<String>::new());
    let src = tmp("esc-src");
    std::fs::create_dir(src.0.join("a")).unwrap();
    std::os::unix::fs::symlink("../../../etc/shadow", src.0.join("a/l")).unwrap();
    assert_eq!(
        store.import_dir(&src.0, d).unwrap_err().code(),
        "symlink_escape"
    );
    assert_eq!(listing(&store_dir.0), Vec::<String>::new());
}
