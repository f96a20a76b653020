//! The real supervisor binary, run as a plain process: exact page bytes and
//! order, the terminal page, back-pressure, exit codes and signals, reaping.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lc_core::page::{
    ExitStatus, PAGE_BYTES_MAX, Page, PageKind, SocketRequest, SocketResponse, read_frame,
    write_frame,
};

/// Bound on every wait of these tests.
const DEADLINE: Duration = Duration::from_secs(20);

struct Sup {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl Drop for Sup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lc-sup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn start(tag: &str, spool: Option<u64>, argv: &[&str]) -> Sup {
    let dir = tempdir(tag);
    let socket = dir.join("s.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"));
    cmd.arg("--socket").arg(&socket).arg("--any-peer");
    if let Some(n) = spool {
        cmd.arg("--spool-bytes").arg(n.to_string());
    }
    cmd.arg("--").args(argv).stdin(Stdio::null());
    let child = cmd.spawn().unwrap();
    Sup { child, socket, dir }
}

fn connect(path: &Path) -> UnixStream {
    let t = Instant::now();
    loop {
        if let Ok(s) = UnixStream::connect(path) {
            return s;
        }
        assert!(t.elapsed() < DEADLINE, "supervisor socket never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn call(sup: &Sup, req: SocketRequest) -> SocketResponse {
    let mut s = connect(&sup.socket);
    write_frame(&mut s, &req.encode()).unwrap();
    let body = read_frame(&mut s).unwrap().unwrap();
    SocketResponse::decode(&body).unwrap()
}

fn pages(sup: &Sup, after_seq: i64, max: u32) -> Vec<Page> {
    match call(sup, SocketRequest::Pages { after_seq, max }) {
        SocketResponse::Pages(p) => p,
        other => panic!("unexpected {other:?}"),
    }
}

/// Reads every page to the terminal one, acknowledging as it goes; checks
/// seq continuity.
fn drain(sup: &Sup) -> Vec<Page> {
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let after = all.last().map_or(0, |p| p.seq());
        let got = pages(sup, after, 64);
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p.seq(), (all.len() + i) as i64 + 1, "seq gap");
            assert!(p.bytes().len() <= PAGE_BYTES_MAX);
        }
        all.extend(got);
        if let Some(last) = all.last() {
            let seq = last.seq();
            let terminal = last.is_terminal();
            assert_eq!(
                call(sup, SocketRequest::Ack { through_seq: seq }),
                SocketResponse::Acked { acked_through: seq }
            );
            if terminal {
                return all;
            }
        }
        assert!(t.elapsed() < DEADLINE, "no terminal page");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn stream(pages: &[Page], kind: PageKind) -> Vec<u8> {
    pages
        .iter()
        .filter(|p| p.kind() == kind)
        .flat_map(|p| p.bytes().to_vec())
        .collect()
}

fn wait_exit(sup: &mut Sup) -> i32 {
    let t = Instant::now();
    loop {
        if let Some(s) = sup.child.try_wait().unwrap() {
            return s.code().unwrap();
        }
        assert!(t.elapsed() < DEADLINE, "supervisor did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn output_bytes_order_and_exit_code_are_exact() {
    let mut sup = start(
        "exact",
        None,
        &[
            "sh",
            "-c",
            "printf 'out1\\n'; printf 'err1\\n' >&2; printf 'out2\\n'; exit 3",
        ],
    );
    let all = drain(&sup);
    assert_eq!(stream(&all, PageKind::Stdout), b"out1\nout2\n");
    assert_eq!(stream(&all, PageKind::Stderr), b"err1\n");
    let last = all.last().unwrap();
    assert_eq!(last.exit(), Some(ExitStatus::exited(3)));
    assert_eq!(last.bytes(), b"");
    assert_eq!(all.iter().filter(|p| p.is_terminal()).count(), 1);
    assert_eq!(wait_exit(&mut sup), 0);
    assert!(!sup.socket.exists());
}

#[test]
fn a_signal_is_the_terminal_status() {
    let mut sup = start("signal", None, &["sh", "-c", "printf x; kill -9 $$"]);
    let all = drain(&sup);
    assert_eq!(stream(&all, PageKind::Stdout), b"x");
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::signaled(9)));
    assert_eq!(wait_exit(&mut sup), 0);
}

#[test]
fn large_output_is_paged_exactly() {
    let dir = tempdir("large-src");
    let file = dir.join("data");
    let data: Vec<u8> = (0..(3 * 1024 * 1024 + 17u32))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let mut sup = start("large", None, &["cat", file.to_str().unwrap()]);
    let all = drain(&sup);
    assert_eq!(stream(&all, PageKind::Stdout), data);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(wait_exit(&mut sup), 0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_full_spool_blocks_the_command_until_an_ack() {
    let spool_bytes = 1000u64;
    let mark = tempdir("bp-mark").join("done");
    let script = format!("head -c 300000 /dev/zero; touch {}", mark.display());
    let mut sup = start("bp", Some(spool_bytes), &["sh", "-c", &script]);
    // Fill: pages appear until the spool holds exactly its bound.
    let t = Instant::now();
    let held = loop {
        let got = pages(&sup, 0, 64);
        let bytes: u64 = got.iter().map(|p| p.bytes().len() as u64).sum();
        assert!(bytes <= spool_bytes, "spool above its bound: {bytes}");
        if bytes == spool_bytes {
            break got;
        }
        assert!(t.elapsed() < DEADLINE, "spool never filled: {got:?}");
        std::thread::sleep(Duration::from_millis(2));
    };
    // Nothing is read while the spool is full, so the command cannot finish
    // its 300000 bytes (the pipe buffer holds far less): observe for a while.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!mark.exists(), "the command finished despite a full spool");
    let again = pages(&sup, 0, 64);
    assert_eq!(again, held, "the spool changed without an ack");
    let all = drain(&sup);
    assert!(mark.exists());
    assert_eq!(stream(&all, PageKind::Stdout), vec![0u8; 300000]);
    assert!(all.iter().all(|p| p.bytes().len() as u64 <= spool_bytes));
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(wait_exit(&mut sup), 0);
    std::fs::remove_dir_all(mark.parent().unwrap()).unwrap();
}

#[test]
fn a_command_that_cannot_start_reports_127() {
    let mut sup = start("nostart", None, &["/nonexistent/cmd", "a"]);
    let all = drain(&sup);
    assert_eq!(all.len(), 2);
    let err = String::from_utf8(stream(&all, PageKind::Stderr)).unwrap();
    assert!(
        err.starts_with("lc-supervisor: cannot start \"/nonexistent/cmd\": "),
        "{err}"
    );
    assert_eq!(all[1].exit(), Some(ExitStatus::exited(127)));
    assert_eq!(wait_exit(&mut sup), 0);
}

#[test]
fn acks_ahead_of_the_spool_are_refused_and_acks_are_idempotent() {
    let mut sup = start("ack", None, &["sh", "-c", "printf a"]);
    assert_eq!(
        call(&sup, SocketRequest::Ack { through_seq: 5 }),
        SocketResponse::Error {
            code: "ack_ahead".into()
        }
    );
    let t = Instant::now();
    while pages(&sup, 0, 64).len() < 2 {
        assert!(t.elapsed() < DEADLINE);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        call(&sup, SocketRequest::Ack { through_seq: 1 }),
        SocketResponse::Acked { acked_through: 1 }
    );
    assert_eq!(
        call(&sup, SocketRequest::Ack { through_seq: 0 }),
        SocketResponse::Acked { acked_through: 1 }
    );
    let rest = pages(&sup, 0, 64);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].seq(), 2);
    assert!(rest[0].is_terminal());
    // A request frame that is not a request gets a coded error.
    let mut s = connect(&sup.socket);
    write_frame(&mut s, &[9]).unwrap();
    let body = read_frame(&mut s).unwrap().unwrap();
    assert_eq!(
        SocketResponse::decode(&body).unwrap(),
        SocketResponse::Error {
            code: "malformed_page".into()
        }
    );
    drop(s);
    assert_eq!(
        call(&sup, SocketRequest::Ack { through_seq: 2 }),
        SocketResponse::Acked { acked_through: 2 }
    );
    assert_eq!(wait_exit(&mut sup), 0);
}

#[test]
fn orphans_of_the_command_are_reaped() {
    let mut sup = start(
        "reap",
        None,
        &["sh", "-c", "sleep 0.2 >/dev/null 2>&1 & echo $!"],
    );
    // Read to the terminal page without acknowledging it, so the supervisor
    // stays up while the orphan lives.
    let t = Instant::now();
    let all = loop {
        let got = pages(&sup, 0, 64);
        if got.last().is_some_and(|p| p.is_terminal()) {
            break got;
        }
        assert!(t.elapsed() < DEADLINE, "no terminal page");
        std::thread::sleep(Duration::from_millis(2));
    };
    let pid: u32 = String::from_utf8(stream(&all, PageKind::Stdout))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The orphan outlives its shell, is reparented to the supervisor, and is
    // reaped when it exits: its /proc entry (a zombie keeps one) goes away.
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if let Some(ppid) = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            && ppid != "0"
        {
            assert_eq!(ppid, sup.child.id().to_string(), "orphan not adopted");
        }
        assert!(t.elapsed() < DEADLINE, "orphan {pid} never reaped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let last = all.last().unwrap().seq();
    assert_eq!(
        call(&sup, SocketRequest::Ack { through_seq: last }),
        SocketResponse::Acked {
            acked_through: last
        }
    );
    assert_eq!(wait_exit(&mut sup), 0);
}

#[test]
fn bad_usage_exits_2() {
    for args in [
        vec!["--", "true"],
        vec!["--socket", "/tmp/x"],
        vec!["--socket", "/tmp/x", "--spool-bytes", "0", "--", "true"],
        vec!["--bogus"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("usage_error: "));
    }
}

/// The socket's name appears only once the supervisor listens: the first
/// connection after it appears is accepted, every time. (Bound at its name
/// directly, a connection in the window between bind and listen is refused
/// within a few dozen of these rounds.)
#[test]
fn the_socket_accepts_as_soon_as_it_appears() {
    for i in 0..200 {
        let sup = start(&format!("appear-{i}"), None, &["true"]);
        let t = Instant::now();
        while !sup.socket.exists() {
            assert!(t.elapsed() < DEADLINE, "supervisor socket never appeared");
            std::hint::spin_loop();
        }
        let s = UnixStream::connect(&sup.socket);
        assert!(s.is_ok(), "round {i}: {s:?}");
        assert!(!sup.dir.join(lc_supervisor::BINDING_NAME).exists());
        drop(s);
    }
}

#[test]
fn without_any_peer_a_reader_in_its_own_pid_namespace_is_closed_unread() {
    // Run without `--any-peer`, this test (which shares the supervisor's
    // PID namespace, as the sandboxed command would) is refused: the
    // connection is closed before any frame is read or answered.
    let dir = tempdir("peer");
    let socket = dir.join("s.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"))
        .arg("--socket")
        .arg(&socket)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..3 {
        let mut s = connect(&socket);
        let _ = write_frame(&mut s, &SocketRequest::Ack { through_seq: 1 }.encode());
        assert_eq!(read_frame(&mut s).ok().flatten(), None, "closed unread");
    }
    // Nothing was acknowledged: the command's terminal page is still
    // spooled, so the supervisor is still waiting for a reader.
    assert_eq!(child.try_wait().unwrap(), None);
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
