//! The real supervisor binary, run as a plain process: exact page bytes and
//! order, the terminal page, back-pressure, exit codes and signals, reaping.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lc_core::owner::OwnerFence;
use lc_core::page::{
    ExitStatus, PAGE_BYTES_MAX, Page, PageKind, SocketRequest, SocketResponse, SpoolStatus,
    StopOutcome, read_frame, write_frame,
};

/// The fence these tests present unless a test is about fences.
const F: OwnerFence = OwnerFence(1);

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
    start_bounded(tag, spool, None, argv)
}

fn start_bounded(tag: &str, spool: Option<u64>, spool_pages: Option<u64>, argv: &[&str]) -> Sup {
    start_with(tag, spool, spool_pages, false, argv)
}

fn start_with(
    tag: &str,
    spool: Option<u64>,
    spool_pages: Option<u64>,
    stdin_open: bool,
    argv: &[&str],
) -> Sup {
    start_flags(tag, spool, spool_pages, stdin_open, &[], argv)
}

/// A supervisor with `flags` besides the spool bounds and `--stdin-open`.
fn start_flags(
    tag: &str,
    spool: Option<u64>,
    spool_pages: Option<u64>,
    stdin_open: bool,
    flags: &[&str],
    argv: &[&str],
) -> Sup {
    let dir = tempdir(tag);
    let socket = dir.join("s.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"));
    cmd.arg("--socket")
        .arg(&socket)
        .arg("--any-peer")
        .args(flags);
    if stdin_open {
        cmd.arg("--stdin-open");
    }
    if let Some(n) = spool {
        cmd.arg("--spool-bytes").arg(n.to_string());
    }
    if let Some(n) = spool_pages {
        cmd.arg("--spool-pages").arg(n.to_string());
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
    match call(
        sup,
        SocketRequest::Pages {
            fence: F,
            after_seq,
            max,
        },
    ) {
        SocketResponse::Pages(p) => p,
        other => panic!("unexpected {other:?}"),
    }
}

fn ack(through_seq: i64) -> SocketRequest {
    SocketRequest::Ack {
        fence: F,
        through_seq,
    }
}

fn status(sup: &Sup) -> SpoolStatus {
    match call(sup, SocketRequest::Status) {
        SocketResponse::Status(s) => s,
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
                call(sup, ack(seq)),
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
        call(&sup, ack(5)),
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
        call(&sup, ack(1)),
        SocketResponse::Acked { acked_through: 1 }
    );
    assert_eq!(
        call(&sup, ack(0)),
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
        call(&sup, ack(2)),
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
    // The orphan is reparented to the supervisor, killed once its shell
    // has exited, and reaped: its /proc entry (a zombie keeps one) goes away.
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
        call(&sup, ack(last)),
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
        vec!["--socket", "/tmp/x", "--first-seq", "0", "--", "true"],
        vec!["--socket", "/tmp/x", "--first-seq", "-3", "--", "true"],
        vec!["--socket", "/tmp/x", "--first-input-seq", "0", "--", "true"],
        vec![
            "--socket",
            "/tmp/x",
            "--first-seq",
            "4611686018427387905",
            "--",
            "true",
        ],
        vec!["--socket", "/tmp/x", "--first-seq"],
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
        let _ = write_frame(&mut s, &ack(1).encode());
        assert_eq!(read_frame(&mut s).ok().flatten(), None, "closed unread");
    }
    // Nothing was acknowledged: the command's terminal page is still
    // spooled, so the supervisor is still waiting for a reader.
    assert_eq!(child.try_wait().unwrap(), None);
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The exact output of `seq 1 n`.
fn seq_output(n: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 1..=n {
        out.extend_from_slice(format!("{i}\n").as_bytes());
    }
    out
}

/// Polls `status` until `done` holds for it; every status seen is checked
/// against the spool's bounds.
fn wait_status(sup: &Sup, what: &str, done: impl Fn(&SpoolStatus) -> bool) -> SpoolStatus {
    let t = Instant::now();
    loop {
        let s = status(sup);
        assert!(s.bytes <= s.bytes_max, "spool bytes above the bound: {s:?}");
        assert!(s.pages <= s.pages_max, "spool pages above the bound: {s:?}");
        if done(&s) {
            return s;
        }
        assert!(t.elapsed() < DEADLINE, "{what}: last status {s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Like [`drain`], checking the spool's bounds through `status` before
/// every read.
fn drain_bounded(sup: &Sup) -> Vec<Page> {
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let s = status(sup);
        assert!(s.bytes <= s.bytes_max, "spool bytes above the bound: {s:?}");
        assert!(s.pages <= s.pages_max, "spool pages above the bound: {s:?}");
        let after = all.last().map_or(0, |p| p.seq());
        let got = pages(sup, after, 64);
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p.seq(), (all.len() + i) as i64 + 1, "seq gap");
        }
        all.extend(got);
        if let Some(last) = all.last() {
            let seq = last.seq();
            let terminal = last.is_terminal();
            assert_eq!(
                call(sup, ack(seq)),
                SocketResponse::Acked { acked_through: seq }
            );
            if terminal {
                return all;
            }
        }
        assert!(t.elapsed() < DEADLINE * 3, "no terminal page");
    }
}

/// Far more output than the spool holds, on both streams at once, while
/// nobody reads: the spool stops at its byte bound (never above it, though
/// two pipe readers race for the room), the command blocks unfinished, and
/// once drained every byte of each stream arrives exactly once, in order.
#[test]
fn a_flood_through_a_small_spool_blocks_and_then_arrives_exactly() {
    let spool_bytes = 1024 * 1024u64;
    let n = 4_500_000u32;
    let want = seq_output(n);
    // 2 x 34.9 MB, above 64 MiB in all.
    assert!(2 * want.len() > 64 * 1024 * 1024);
    let mark = tempdir("flood-mark").join("done");
    let script = format!("seq 1 {n} >&2 & seq 1 {n}; wait; touch {}", mark.display());
    let mut sup = start("flood", Some(spool_bytes), &["sh", "-c", &script]);
    let full = wait_status(&sup, "the spool never filled", |s| s.bytes == spool_bytes);
    assert_eq!(
        (full.bytes_max, full.pages_max, full.acked_through),
        (spool_bytes, lc_core::page::SPOOL_PAGES_DEFAULT, 0)
    );
    // Nothing is read while the spool is full: the command stays blocked.
    std::thread::sleep(Duration::from_millis(300));
    let still = status(&sup);
    assert_eq!(still, full, "the spool changed without an ack");
    assert!(!still.command_exited && still.terminal_seq == 0);
    assert!(!mark.exists(), "the command finished despite a full spool");
    let all = drain_bounded(&sup);
    assert!(mark.exists());
    let out = stream(&all, PageKind::Stdout);
    let err = stream(&all, PageKind::Stderr);
    assert_eq!((out.len(), err.len()), (want.len(), want.len()));
    assert_eq!(lc_core::page::sha256(&out), lc_core::page::sha256(&want));
    assert_eq!(lc_core::page::sha256(&err), lc_core::page::sha256(&want));
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(wait_exit(&mut sup), 0);
    std::fs::remove_dir_all(mark.parent().unwrap()).unwrap();
}

/// One-byte writes, each its own page while the reader keeps up: the page
/// bound stops reading at `pages_max - 1` data pages (one slot is the
/// terminal page's), the command blocks once the pipe buffer is full, and
/// every byte still arrives.
#[test]
fn many_tiny_writes_stop_at_the_page_bound() {
    let pages_max = 16u64;
    let mark = tempdir("tiny-mark").join("done");
    let script = format!(
        "dd if=/dev/zero bs=1 count=200000 status=none; touch {}",
        mark.display()
    );
    let mut sup = start_bounded("tiny", None, Some(pages_max), &["sh", "-c", &script]);
    let full = wait_status(&sup, "the page bound was never reached", |s| {
        s.pages == pages_max - 1
    });
    assert_eq!(full.pages_max, pages_max);
    std::thread::sleep(Duration::from_millis(300));
    let still = status(&sup);
    assert_eq!(still, full, "the spool changed without an ack");
    assert!(!mark.exists(), "the command finished despite a full spool");
    let all = drain_bounded(&sup);
    assert_eq!(stream(&all, PageKind::Stdout), vec![0u8; 200000]);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(wait_exit(&mut sup), 0);
    std::fs::remove_dir_all(mark.parent().unwrap()).unwrap();
}

#[test]
fn binary_and_invalid_utf8_arrive_byte_exact() {
    let dir = tempdir("binary-src");
    let file = dir.join("data");
    let data: Vec<u8> = (0..256 * 1000u32).map(|i| (i % 256) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let script = format!(
        "printf '\\377\\376\\000\\001\\200abc\\300\\n'; cat {f} >&2; cat {f}",
        f = file.display()
    );
    let mut sup = start("binary", None, &["sh", "-c", &script]);
    let all = drain(&sup);
    let mut want_out = b"\xff\xfe\x00\x01\x80abc\xc0\n".to_vec();
    assert!(std::str::from_utf8(&want_out).is_err());
    want_out.extend_from_slice(&data);
    assert_eq!(stream(&all, PageKind::Stdout), want_out);
    assert_eq!(stream(&all, PageKind::Stderr), data);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(wait_exit(&mut sup), 0);
    std::fs::remove_dir_all(dir).unwrap();
}

/// stdout reaches end of file long before stderr does: stderr keeps being
/// paged (through a spool far smaller than it), and the terminal page waits
/// for both.
#[test]
fn stdout_closed_early_while_stderr_keeps_writing() {
    let mut sup = start(
        "close-out",
        Some(4096),
        &[
            "sh",
            "-c",
            "printf a; exec 1>&-; head -c 300000 /dev/zero >&2; printf z >&2; exit 4",
        ],
    );
    let all = drain(&sup);
    assert_eq!(stream(&all, PageKind::Stdout), b"a");
    let mut want = vec![0u8; 300000];
    want.push(b'z');
    assert_eq!(stream(&all, PageKind::Stderr), want);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(4)));
    assert_eq!(all.iter().filter(|p| p.is_terminal()).count(), 1);
    assert_eq!(wait_exit(&mut sup), 0);
}

fn gone(pid: u32) {
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(t.elapsed() < DEADLINE, "process {pid} still exists");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pids_of(pages: &[Page]) -> Vec<u32> {
    String::from_utf8(stream(pages, PageKind::Stdout))
        .unwrap()
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("pid="))
        .map(|p| p.parse().unwrap())
        .collect()
}

/// Children that outlive the command and hold its stdout open (one in the
/// command's process group, one in a session of its own) are killed once
/// the command exits, so the terminal page (with the command's own status)
/// arrives instead of waiting for them forever.
#[test]
fn children_that_outlive_the_command_are_killed_when_it_exits() {
    let mut sup = start(
        "outlive",
        None,
        &[
            "sh",
            "-c",
            "sleep 1000 & echo pid=$!; (setsid sleep 1000 & echo pid=$!); echo done; exit 5",
        ],
    );
    let all = drain(&sup);
    let pids = pids_of(&all);
    assert_eq!(pids.len(), 2, "{all:?}");
    assert!(
        String::from_utf8(stream(&all, PageKind::Stdout))
            .unwrap()
            .ends_with("done\n")
    );
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(5)));
    for pid in pids {
        gone(pid);
    }
    assert_eq!(wait_exit(&mut sup), 0);
}

/// A fence below the highest shown is refused `stale_fence` naming the
/// highest, for every fenced request, and changes nothing: the spool keeps
/// its pages and the command keeps running.
#[test]
fn a_stale_fence_is_refused_and_changes_nothing() {
    let sup = start("fence", None, &["sh", "-c", "printf one; exec sleep 1000"]);
    wait_status(&sup, "no page", |s| s.pages == 1);
    let p = |fence: i64| SocketRequest::Pages {
        fence: OwnerFence(fence),
        after_seq: 0,
        max: 64,
    };
    let SocketResponse::Pages(first) = call(&sup, p(5)) else {
        panic!("pages refused")
    };
    assert_eq!(stream(&first, PageKind::Stdout), b"one");
    let stale = SocketResponse::StaleFence {
        presented: OwnerFence(4),
        highest: OwnerFence(5),
    };
    let refused = [
        SocketRequest::Ack {
            fence: OwnerFence(4),
            through_seq: 1,
        },
        SocketRequest::Cancel {
            fence: OwnerFence(4),
        },
        p(4),
    ];
    for req in refused {
        assert_eq!(call(&sup, req), stale);
    }
    let s = status(&sup);
    assert_eq!(
        (s.pages, s.bytes, s.acked_through, s.highest_fence),
        (1, 3, 0, 5)
    );
    assert!(!s.command_exited && !s.cancelled);
    // An equal fence is served; a higher one becomes the highest.
    assert_eq!(call(&sup, p(5)), SocketResponse::Pages(first.clone()));
    assert_eq!(
        call(
            &sup,
            SocketRequest::Ack {
                fence: OwnerFence(7),
                through_seq: 1,
            }
        ),
        SocketResponse::Acked { acked_through: 1 }
    );
    assert_eq!(
        call(&sup, p(5)),
        SocketResponse::StaleFence {
            presented: OwnerFence(5),
            highest: OwnerFence(7),
        }
    );
    // A fence below 1 is not a fence.
    let mut zero = SocketRequest::Cancel {
        fence: OwnerFence(1),
    }
    .encode();
    zero[8] = 0;
    let mut s = connect(&sup.socket);
    write_frame(&mut s, &zero).unwrap();
    let body = read_frame(&mut s).unwrap().unwrap();
    assert_eq!(
        SocketResponse::decode(&body).unwrap(),
        SocketResponse::Error {
            code: "bad_fence".into()
        }
    );
    assert_eq!(status(&sup).highest_fence, 7);
}

/// Cancel kills the command and what it started, the terminal page says
/// signal 9, and every byte spooled before the cancel (here a full spool)
/// is still there and in order; a second cancel, and one after the
/// terminal page, answer ok without killing anything.
#[test]
fn cancel_kills_everything_and_loses_nothing_before_the_terminal_page() {
    let spool_bytes = 65536u64;
    let n = 300_000u32;
    let mut sup = start(
        "cancel",
        Some(spool_bytes),
        &[
            "sh",
            "-c",
            &format!("sleep 1000 & echo pid=$!; seq 1 {n}; sleep 1000"),
        ],
    );
    let full = wait_status(&sup, "the spool never filled", |s| s.bytes == spool_bytes);
    let before = pages(&sup, 0, 64);
    let cancel = SocketRequest::Cancel { fence: F };
    assert_eq!(
        call(&sup, cancel.clone()),
        SocketResponse::Cancelled { killed: true }
    );
    assert_eq!(
        call(&sup, cancel.clone()),
        SocketResponse::Cancelled { killed: false }
    );
    let all = drain_bounded(&sup);
    assert_eq!(
        &all[..before.len()],
        &before[..],
        "pages before the cancel changed"
    );
    let out = stream(&all, PageKind::Stdout);
    let pid: u32 = pids_of(&all[..1])[0];
    let mut want = format!("pid={pid}\n").into_bytes();
    want.extend_from_slice(&seq_output(n));
    assert!(out.len() as u64 >= full.bytes);
    assert!(out.len() < want.len(), "seq was not cut short");
    assert_eq!(
        out,
        want[..out.len()],
        "the output is not a prefix of seq's"
    );
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::signaled(9)));
    assert_eq!(all.iter().filter(|p| p.is_terminal()).count(), 1);
    gone(pid);
    assert_eq!(wait_exit(&mut sup), 0);
}

#[test]
fn cancel_after_the_terminal_page_is_a_no_op() {
    let mut sup = start("cancel-late", None, &["sh", "-c", "printf x; exit 2"]);
    let s = wait_status(&sup, "no terminal page", |s| s.terminal_seq != 0);
    assert_eq!((s.terminal_seq, s.pages, s.command_exited), (2, 2, true));
    assert_eq!(
        call(&sup, SocketRequest::Cancel { fence: F }),
        SocketResponse::Cancelled { killed: false }
    );
    let all = drain(&sup);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(2)));
    assert!(!status_after_exit(&mut sup));
}

/// Waits for the supervisor to exit 0; `false` once it has.
fn status_after_exit(sup: &mut Sup) -> bool {
    assert_eq!(wait_exit(sup), 0);
    sup.socket.exists()
}

fn send(seq: i64, bytes: &[u8], eof: bool) -> SocketRequest {
    SocketRequest::Send {
        fence: F,
        input_seq: seq,
        bytes: bytes.to_vec(),
        eof,
    }
}

fn refused(code: &str) -> SocketResponse {
    SocketResponse::Error { code: code.into() }
}

/// `send` writes each input seq once, in order: a replay answers ok without
/// writing again, a gap and anything after the eof input are refused, and a
/// stale fence writes nothing.
#[test]
fn send_writes_each_input_once_in_order() {
    let mut sup = start_with("send", None, None, true, &["cat"]);
    assert_eq!(
        call(&sup, send(1, b"hello ", false)),
        SocketResponse::Sent { input_seq: 1 }
    );
    assert_eq!(
        call(&sup, send(1, b"hello ", false)),
        SocketResponse::Sent { input_seq: 1 }
    );
    assert_eq!(call(&sup, send(3, b"!", false)), refused("input_gap"));
    assert_eq!(call(&sup, send(0, b"", false)), refused("bad_input_seq"));
    // A newer owner's fence makes the old one stale for input too (cat has
    // echoed the first input, once).
    wait_status(&sup, "no echo", |s| s.pages == 1);
    assert_eq!(
        call(
            &sup,
            SocketRequest::Pages {
                fence: OwnerFence(2),
                after_seq: 0,
                max: 1
            }
        ),
        SocketResponse::Pages(vec![
            Page::data(1, PageKind::Stdout, b"hello ".to_vec()).unwrap()
        ])
    );
    assert_eq!(
        call(&sup, send(2, b"stale", false)),
        SocketResponse::StaleFence {
            presented: F,
            highest: OwnerFence(2)
        }
    );
    let send2 = |seq: i64, bytes: &[u8], eof: bool| SocketRequest::Send {
        fence: OwnerFence(2),
        input_seq: seq,
        bytes: bytes.to_vec(),
        eof,
    };
    assert_eq!(
        call(&sup, send2(2, b"\xffworld", true)),
        SocketResponse::Sent { input_seq: 2 }
    );
    assert_eq!(
        call(&sup, send2(2, b"\xffworld", true)),
        SocketResponse::Sent { input_seq: 2 }
    );
    assert_eq!(
        call(&sup, send2(3, b"late", false)),
        refused("input_closed")
    );
    assert_eq!(status(&sup).input_seq, 2);
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let got = match call(
            &sup,
            SocketRequest::Pages {
                fence: OwnerFence(2),
                after_seq: all.last().map_or(0, |p| p.seq()),
                max: 64,
            },
        ) {
            SocketResponse::Pages(p) => p,
            other => panic!("{other:?}"),
        };
        all.extend(got);
        if all.last().is_some_and(|p| p.is_terminal()) {
            break;
        }
        assert!(t.elapsed() < DEADLINE, "no terminal page");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(stream(&all, PageKind::Stdout), b"hello \xffworld");
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    let last = all.last().unwrap().seq();
    assert_eq!(
        call(
            &sup,
            SocketRequest::Ack {
                fence: OwnerFence(2),
                through_seq: last
            }
        ),
        SocketResponse::Acked {
            acked_through: last
        }
    );
    assert_eq!(wait_exit(&mut sup), 0);
}

/// Input waits in a bounded queue: a command that never reads its stdin
/// makes `send` answer `input_busy` (and accept nothing) once the queue
/// is full; without `--stdin-open` every input is refused.
#[test]
fn input_is_bounded_and_closed_without_stdin_open() {
    let sup = start_with("send-busy", None, None, true, &["sleep", "1000"]);
    let chunk = vec![7u8; lc_core::page::INPUT_BYTES_MAX];
    let bound = lc_supervisor::INPUT_QUEUE_BYTES_MAX / chunk.len() + 2;
    let mut accepted = 0i64;
    let busy = loop {
        match call(&sup, send(accepted + 1, &chunk, false)) {
            SocketResponse::Sent { input_seq } => {
                assert_eq!(input_seq, accepted + 1);
                accepted = input_seq;
            }
            other => break other,
        }
        assert!(accepted as usize <= bound, "the input queue is unbounded");
    };
    assert_eq!(busy, refused("input_busy"));
    assert!(accepted as usize >= lc_supervisor::INPUT_QUEUE_BYTES_MAX / chunk.len());
    assert_eq!(status(&sup).input_seq, accepted);
    assert_eq!(
        call(&sup, SocketRequest::Cancel { fence: F }),
        SocketResponse::Cancelled { killed: true }
    );
    assert_eq!(
        call(&sup, send(accepted + 1, b"x", false)),
        refused("input_closed")
    );
    let all = drain(&sup);
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::signaled(9)));

    let closed = start("send-closed", None, &["sh", "-c", "exec sleep 1000"]);
    assert_eq!(call(&closed, send(1, b"x", false)), refused("input_closed"));
    assert_eq!(status(&closed).input_seq, 0);
}

/// A supervisor serving a listening socket it inherited (`--listen-fd`),
/// reporting the terminal ack through an inherited file (`--done-fd`):
/// the socket's path is the caller's, and neither descriptor reaches the
/// command, which the kernel's OOM killer prefers (`oom_score_adj` 1000)
/// over the supervisor (left at its default).
#[test]
fn an_inherited_listener_and_done_file_serve_and_never_reach_the_command() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    let dir = tempdir("listen-fd");
    let socket = dir.join("s.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let done_path = dir.join("done");
    let done = std::fs::File::create(&done_path).unwrap();
    let (lfd, dfd) = (listener.as_raw_fd(), done.as_raw_fd());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"));
    cmd.args([
        "--listen-fd",
        &lfd.to_string(),
        "--done-fd",
        &dfd.to_string(),
    ])
    .args(["--any-peer", "--", "sh", "-c"])
    .arg(format!(
        "cat /proc/self/oom_score_adj; ls /proc/self/fd/{lfd} /proc/self/fd/{dfd} 2>&1; true"
    ))
    .stdin(Stdio::null());
    // SAFETY: fcntl only changes the descriptors' close-on-exec flags.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [lfd, dfd] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    // The supervisor holds them now; the socket keeps its path.
    drop(listener);
    drop(done);
    let mut sup = Sup {
        child,
        socket,
        dir: dir.clone(),
    };
    let pid = sup.child.id();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap(),
        "0\n"
    );
    let t = Instant::now();
    let all = loop {
        let got = pages(&sup, 0, 64);
        if got.last().is_some_and(|p| p.is_terminal()) {
            break got;
        }
        assert!(t.elapsed() < DEADLINE, "no terminal page");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(
        String::from_utf8(stream(&all, PageKind::Stdout)).unwrap(),
        format!(
            "1000\nls: cannot access '/proc/self/fd/{lfd}': No such file or directory\n\
             ls: cannot access '/proc/self/fd/{dfd}': No such file or directory\n"
        )
    );
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(std::fs::read(&done_path).unwrap(), b"");
    let last = all.last().unwrap().seq();
    // The done file is written before the terminal ack is answered.
    assert_eq!(
        call(&sup, ack(last)),
        SocketResponse::Acked {
            acked_through: last
        }
    );
    assert_eq!(
        std::fs::read_to_string(&done_path).unwrap(),
        "last_page_acked\n"
    );
    assert_eq!(wait_exit(&mut sup), 0);
    // The socket's path is the caller's: the supervisor leaves it.
    assert!(sup.socket.exists());
}

#[test]
fn an_unusable_listen_fd_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"))
        .args(["--listen-fd", "250", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "lc-supervisor: listen_fd_unusable: descriptor 250: Bad file descriptor (os error 9)\n"
    );
    for args in [
        vec!["--listen-fd", "3", "--socket", "/tmp/x", "--", "true"],
        vec!["--listen-fd", "x", "--", "true"],
        vec!["--listen-fd", "2", "--", "true"],
        vec!["--socket", "/tmp/x", "--done-fd", "-1", "--", "true"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lc-supervisor"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("usage_error: "));
    }
}

fn stop(fence: i64) -> SocketRequest {
    SocketRequest::Stop {
        fence: OwnerFence(fence),
    }
}

fn stopped(outcome: StopOutcome) -> SocketResponse {
    SocketResponse::Stopped { outcome }
}

/// Reads (with fence `fence`) every page after `after` to the last one
/// (terminal or stopped), without acknowledging.
fn until_last(sup: &Sup, fence: i64, after: i64) -> Vec<Page> {
    let t = Instant::now();
    let mut all: Vec<Page> = Vec::new();
    loop {
        let got = match call(
            sup,
            SocketRequest::Pages {
                fence: OwnerFence(fence),
                after_seq: all.last().map_or(after, |p| p.seq()),
                max: 64,
            },
        ) {
            SocketResponse::Pages(p) => p,
            other => panic!("{other:?}"),
        };
        all.extend(got);
        if all.last().is_some_and(|p| p.is_last()) {
            return all;
        }
        assert!(t.elapsed() < DEADLINE, "no last page; so far {all:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Stop kills the command and what it started, the pages written before
/// it stay in order, the stream ends with the stopped page (signal 9, the
/// next seq, no terminal page); a second stop answers `already_stopped`,
/// a stale fence is refused and changes nothing, a cancel and an input
/// after the stop do nothing, and the supervisor exits once the stopped
/// page is acknowledged.
#[test]
fn stop_kills_everything_and_ends_with_the_stopped_page() {
    let mut sup = start_with(
        "stop",
        None,
        None,
        true,
        &[
            "sh",
            "-c",
            "sleep 1000 & echo pid=$!; echo two; exec sleep 100",
        ],
    );
    let before = until_bytes(&sup, b"two\n");
    let s = status(&sup);
    assert!(!s.stopped && s.stopped_seq == 0 && !s.command_exited);
    // Fence 5 becomes the highest; a stop with fence 4 is stale.
    assert_eq!(
        call(&sup, stop(5)),
        stopped(StopOutcome::Killed),
        "the first stop kills"
    );
    assert_eq!(
        call(&sup, stop(4)),
        SocketResponse::StaleFence {
            presented: OwnerFence(4),
            highest: OwnerFence(5)
        }
    );
    assert_eq!(call(&sup, stop(5)), stopped(StopOutcome::AlreadyStopped));
    assert_eq!(
        call(
            &sup,
            SocketRequest::Cancel {
                fence: OwnerFence(5)
            }
        ),
        SocketResponse::Cancelled { killed: false }
    );
    let all = until_last(&sup, 5, 0);
    assert_eq!(&all[..before.len()], &before[..]);
    let last = all.last().unwrap();
    let n = all.len() as i64;
    assert_eq!(
        (last.seq(), last.kind(), last.bytes(), last.exit()),
        (
            n,
            PageKind::Stopped,
            &b""[..],
            Some(ExitStatus::signaled(9))
        )
    );
    assert_eq!(all.iter().filter(|p| p.is_last()).count(), 1);
    assert!(!all.iter().any(Page::is_terminal));
    let pid = pids_of(&all)[0];
    gone(pid);
    let s = status(&sup);
    assert_eq!(
        (
            s.stopped,
            s.stopped_seq,
            s.terminal_seq,
            s.cancelled,
            s.command_exited
        ),
        (true, n, 0, false, true)
    );
    assert_eq!(
        call(
            &sup,
            SocketRequest::Send {
                fence: OwnerFence(5),
                input_seq: 1,
                bytes: b"x".to_vec(),
                eof: false,
            }
        ),
        refused("input_closed")
    );
    assert_eq!(call(&sup, stop(6)), stopped(StopOutcome::AlreadyStopped));
    assert_eq!(
        call(
            &sup,
            SocketRequest::Ack {
                fence: OwnerFence(6),
                through_seq: n
            }
        ),
        SocketResponse::Acked { acked_through: n }
    );
    assert_eq!(wait_exit(&mut sup), 0);
    assert!(!sup.socket.exists());
}

/// Pages (fence 5) until the stdout stream is exactly `want`.
fn until_bytes(sup: &Sup, want: &[u8]) -> Vec<Page> {
    let t = Instant::now();
    loop {
        let got = match call(
            sup,
            SocketRequest::Pages {
                fence: OwnerFence(5),
                after_seq: 0,
                max: 64,
            },
        ) {
            SocketResponse::Pages(p) => p,
            other => panic!("{other:?}"),
        };
        let out = stream(&got, PageKind::Stdout);
        if out.ends_with(want) {
            return got;
        }
        assert!(t.elapsed() < DEADLINE, "output so far {out:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A stop after the command exited kills nothing, answers `ended`, and the
/// terminal page stays its last page; so does a stop after a cancel.
#[test]
fn a_stop_after_the_command_ended_leaves_the_terminal_page() {
    let mut sup = start("stop-late", None, &["sh", "-c", "printf x; exit 4"]);
    let s = wait_status(&sup, "no terminal page", |s| s.terminal_seq != 0);
    assert_eq!((s.terminal_seq, s.pages), (2, 2));
    assert_eq!(call(&sup, stop(1)), stopped(StopOutcome::Ended));
    assert_eq!(call(&sup, stop(1)), stopped(StopOutcome::Ended));
    let s = status(&sup);
    assert_eq!((s.stopped, s.stopped_seq, s.terminal_seq), (false, 0, 2));
    let all = drain(&sup);
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].kind(), PageKind::Terminal);
    assert_eq!(all[1].exit(), Some(ExitStatus::exited(4)));
    assert_eq!(wait_exit(&mut sup), 0);

    let mut sup = start("stop-cancelled", None, &["sleep", "1000"]);
    assert_eq!(
        call(&sup, SocketRequest::Cancel { fence: F }),
        SocketResponse::Cancelled { killed: true }
    );
    assert_eq!(call(&sup, stop(1)), stopped(StopOutcome::Ended));
    let all = drain(&sup);
    assert_eq!(
        (all.len(), all[0].kind(), all[0].exit()),
        (1, PageKind::Terminal, Some(ExitStatus::signaled(9)))
    );
    assert_eq!(wait_exit(&mut sup), 0);
}

/// With `--first-seq 41` the pages are 41, 42, ... (the stopped page
/// included), an ack below 41 changes nothing and one at 41 or above what
/// was spooled is checked as usual; with `--first-input-seq 7` the first
/// input written is 7, a lower seq (accepted by an earlier generation)
/// answers ok without writing, and the status reports both.
#[test]
fn numbering_starts_at_the_first_seqs() {
    let mut sup = start_flags(
        "first-seq",
        None,
        None,
        true,
        &["--first-seq", "41", "--first-input-seq", "7"],
        &["cat"],
    );
    let s = status(&sup);
    assert_eq!(
        (s.next_seq, s.acked_through, s.input_seq, s.terminal_seq),
        (41, 40, 6, 0)
    );
    assert_eq!(
        call(&sup, send(3, b"old", false)),
        SocketResponse::Sent { input_seq: 6 }
    );
    assert_eq!(call(&sup, send(8, b"gap", false)), refused("input_gap"));
    assert_eq!(
        call(&sup, send(7, b"one\n", false)),
        SocketResponse::Sent { input_seq: 7 }
    );
    wait_status(&sup, "no echo", |s| s.next_seq == 42);
    assert_eq!(call(&sup, ack(42)), refused("ack_ahead"));
    assert_eq!(
        call(&sup, ack(12)),
        SocketResponse::Acked { acked_through: 40 }
    );
    assert_eq!(
        pages(&sup, 0, 64),
        vec![Page::data(41, PageKind::Stdout, b"one\n".to_vec()).unwrap()]
    );
    assert_eq!(
        call(&sup, ack(41)),
        SocketResponse::Acked { acked_through: 41 }
    );
    assert_eq!(
        call(&sup, send(8, b"two\n", false)),
        SocketResponse::Sent { input_seq: 8 }
    );
    wait_status(&sup, "no second echo", |s| s.next_seq == 43);
    assert_eq!(call(&sup, stop(1)), stopped(StopOutcome::Killed));
    let all = until_last(&sup, 1, 41);
    assert_eq!(
        all,
        vec![
            Page::data(42, PageKind::Stdout, b"two\n".to_vec()).unwrap(),
            Page::stopped(43, ExitStatus::signaled(9)).unwrap(),
        ]
    );
    let s = status(&sup);
    assert_eq!((s.input_seq, s.stopped_seq, s.next_seq), (8, 43, 44));
    assert_eq!(
        call(&sup, ack(43)),
        SocketResponse::Acked { acked_through: 43 }
    );
    assert_eq!(wait_exit(&mut sup), 0);
}

/// A pipe whose read end a child inherits (the write end stays here,
/// close-on-exec): `(read_fd, write end)`.
fn release_pipe() -> (i32, std::fs::File) {
    use std::os::fd::FromRawFd as _;
    let mut fds = [0i32; 2];
    // Both ends close-on-exec from the start (another test's child never
    // inherits the write end); then the read end is made inheritable.
    // SAFETY: pipe2 writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fcntl on an integer descriptor touches no memory.
    assert_eq!(unsafe { libc::fcntl(fds[0], libc::F_SETFD, 0) }, 0);
    // SAFETY: the write end was just opened and is owned by nothing else.
    (fds[0], unsafe { std::fs::File::from_raw_fd(fds[1]) })
}

/// Closes this process's copy of `fd` (the child has its own).
fn close_fd(fd: i32) {
    // SAFETY: close takes an integer descriptor this test owns.
    assert_eq!(unsafe { libc::close(fd) }, 0);
}

#[test]
fn a_held_command_starts_once_released_and_never_when_the_pipe_closes_first() {
    use std::io::Write as _;
    let mark = std::env::temp_dir().join(format!("lc-sup-held-mark-{}", std::process::id()));
    let _ = std::fs::remove_file(&mark);
    let mark_s = mark.to_str().unwrap();
    let (r, mut w) = release_pipe();
    let fd = r.to_string();
    let mut sup = start_flags(
        "held",
        None,
        None,
        false,
        &["--release-fd", &fd],
        &["sh", "-c", "echo ran > \"$0\"; echo ran", mark_s],
    );
    close_fd(r);
    // The supervisor answers its first connection (the handshake) before
    // its command exists: nothing spooled, nothing exited, nothing written.
    // It accepts no other connection until the release.
    let s = status(&sup);
    assert_eq!(
        (s.pages, s.next_seq, s.terminal_seq, s.command_exited),
        (0, 1, 0, false)
    );
    assert!(!mark.exists());
    w.write_all(&[1]).unwrap();
    drop(w);
    let all = drain(&sup);
    assert_eq!(stream(&all, PageKind::Stdout), b"ran\n");
    assert_eq!(all.last().unwrap().exit(), Some(ExitStatus::exited(0)));
    assert_eq!(std::fs::read_to_string(&mark).unwrap(), "ran\n");
    assert_eq!(wait_exit(&mut sup), 0);
    std::fs::remove_file(&mark).unwrap();

    // The provider gave the start up: the command never runs.
    let (r, w) = release_pipe();
    let fd = r.to_string();
    let mut sup = start_flags(
        "held-closed",
        None,
        None,
        false,
        &["--release-fd", &fd],
        &["sh", "-c", "echo ran > \"$0\"", mark_s],
    );
    close_fd(r);
    drop(w);
    let all = drain(&sup);
    assert_eq!(all.len(), 2);
    assert_eq!(
        String::from_utf8(stream(&all, PageKind::Stderr)).unwrap(),
        "lc-supervisor: the provider gave the start up before releasing the command\n"
    );
    assert_eq!(all[1].exit(), Some(ExitStatus::exited(127)));
    assert_eq!(wait_exit(&mut sup), 0);
    assert!(!mark.exists());
}
