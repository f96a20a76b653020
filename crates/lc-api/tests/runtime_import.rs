//! `POST /v1/runtimes?name=`: a tarball unpacked into the runtime
//! directory and registered on the real store; every refused tarball is a
//! 422 with the runtime store's code and registers nothing; an imported
//! runtime runs execs by name and by digest.

mod support;

use lc_api::ServiceOptions;
use serde_json::{Value, json};
use support::pg::PgSvc;
use support::*;

/// A header for `path` written byte for byte (the tar crate refuses the
/// bad paths these tests need to send).
fn raw_header(path: &[u8], kind: tar::EntryType, size: u64, link: &[u8]) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.as_old_mut().name[..path.len()].copy_from_slice(path);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h
}

/// One entry: path, kind, data, link target.
type Entry<'a> = (&'a [u8], tar::EntryType, &'a [u8], &'a [u8]);

fn tarball(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data, link) in entries {
        let h = raw_header(path, *kind, data.len() as u64, link);
        b.append(&h, *data).expect("append");
    }
    b.into_inner().expect("tar")
}

fn good() -> Vec<u8> {
    tarball(&[
        (b"bin/", tar::EntryType::Directory, b"", b""),
        (
            b"bin/hello",
            tar::EntryType::Regular,
            b"#!/bin/sh\necho hi\n",
            b"",
        ),
        (b"etc/motd", tar::EntryType::Regular, b"welcome\n", b""),
        (b"hello", tar::EntryType::Symlink, b"", b"bin/hello"),
    ])
}

fn import(name: &str, key: &str, body: Vec<u8>) -> Req {
    Req::post(format!("/v1/runtimes?name={name}"))
        .token(ADMIN)
        .key(key)
        .raw(body, Some("application/x-tar"))
}

#[tokio::test]
async fn import_register_replay_refuse_and_run() {
    let dir = std::env::temp_dir().join(format!("lc-api-runtimes-{}", std::process::id()));
    let s = PgSvc::start_with(ServiceOptions {
        runtime_dir: Some(dir.clone()),
        ..ServiceOptions::default()
    })
    .await;
    let r = send(&s.router, import("tools", "r-1", good())).await;
    let rt = r.ok(201).clone();
    let digest = rt["digest"].as_str().unwrap().to_string();
    assert_eq!(rt["name"], "tools");
    assert_eq!(digest.len(), 64);
    // The digest is the SHA-256 of the canonical manifest the body carries.
    let canonical = serde_jcs::to_vec(&rt["manifest"]).unwrap();
    assert_eq!(hex::encode(lc_api::auth::sha256(&canonical)), digest);
    // Unpacked in the content-addressed directory.
    assert_eq!(
        std::fs::read(dir.join(&digest).join("tree/etc/motd")).unwrap(),
        b"welcome\n"
    );
    // Replay: the same answer; another tarball under the same key: 409.
    assert_eq!(
        send(&s.router, import("tools", "r-1", good()))
            .await
            .ok(201),
        &rt
    );
    let other = tarball(&[(b"x", tar::EntryType::Regular, b"x", b"")]);
    send(&s.router, import("tools", "r-1", other.clone()))
        .await
        .problem(409, "idempotency_conflict");
    // Another tree under a taken name: 409 already_exists.
    send(&s.router, import("tools", "r-2", other))
        .await
        .problem(409, "already_exists");
    // Refused tarballs: the store's code, nothing registered.
    for (key, body, code) in [
        (
            "b-abs",
            tarball(&[(b"/etc/passwd", tar::EntryType::Regular, b"x", b"")]),
            "absolute_path",
        ),
        (
            "b-dotdot",
            tarball(&[(b"a/../../x", tar::EntryType::Regular, b"x", b"")]),
            "parent_path",
        ),
        (
            "b-link",
            tarball(&[(b"l", tar::EntryType::Symlink, b"", b"../../etc/passwd")]),
            "symlink_escape",
        ),
        (
            "b-dev",
            tarball(&[(b"null", tar::EntryType::Char, b"", b"")]),
            "special_file",
        ),
        (
            "b-fifo",
            tarball(&[(b"p", tar::EntryType::Fifo, b"", b"")]),
            "special_file",
        ),
        (
            "b-junk",
            b"this is not a tar archive at all".repeat(20),
            "malformed_tar",
        ),
    ] {
        let r = send(&s.router, import(&format!("bad-{key}"), key, body)).await;
        r.problem(422, "invalid_tarball");
        let detail = r.body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("invalid tarball: {code}: ")),
            "{key}: {detail}"
        );
    }
    let list = send(&s.router, Req::get("/v1/runtimes").token(ADMIN)).await;
    let names: Vec<&str> = list.ok(200)["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["base", "tools"]);
    // Over the body bound: 413 before anything is unpacked.
    let huge = vec![0u8; lc_api::api::RUNTIME_TAR_BYTES_MAX + 1];
    send(&s.router, import("huge", "r-huge", huge))
        .await
        .problem(413, "payload_too_large");
    // A tenant runs execs on it, by name and by digest.
    let t = send(
        &s.router,
        Req::post("/v1/tenants")
            .token(ADMIN)
            .key("t")
            .json(json!({"name": "blue", "units": 2})),
    )
    .await;
    let key = t.ok(201)["api_key"].as_str().unwrap().to_string();
    for (k, runtime) in [
        ("e-name", "tools".to_string()),
        ("e-digest", digest.clone()),
    ] {
        let e = send(
            &s.router,
            Req::post("/v1/execs")
                .token(&key)
                .key(k)
                .json(json!({"runtime": runtime, "shape": "small", "command": ["/bin/hello"]})),
        )
        .await;
        assert_eq!(
            e.ok(201)["canonical"]["runtime"],
            Value::String(digest.clone())
        );
    }
    // A tenant key may list runtimes but not import them.
    send(&s.router, Req::get("/v1/runtimes").token(&key))
        .await
        .ok(200);
    send(&s.router, import("mine", "r-t", good()).token(&key))
        .await
        .problem(403, "forbidden");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_refused_tarball_s_detail_echoes_a_bounded_part_of_it() {
    let dir = std::env::temp_dir().join(format!("lc-api-runtimes-echo-{}", std::process::id()));
    let s = PgSvc::start_with(ServiceOptions {
        runtime_dir: Some(dir.clone()),
        ..ServiceOptions::default()
    })
    .await;
    // A device file under a 3000-byte name (a GNU long name entry).
    let name = "d".repeat(3000);
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Char);
    h.set_size(0);
    h.set_mode(0o644);
    b.append_data(&mut h, &name, &[][..]).expect("append");
    let body = b.into_inner().expect("tar");
    let r = send(&s.router, import("long", "r-long", body)).await;
    r.problem(422, "invalid_tarball");
    let detail = r.body["detail"].as_str().unwrap();
    assert!(
        detail.len() <= lc_api::error::DETAIL_BYTES_MAX,
        "{} bytes: {detail}",
        detail.len()
    );
    assert!(
        detail.starts_with("invalid tarball: special_file: ")
            && detail.contains(" bytes left out]…"),
        "{detail}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
