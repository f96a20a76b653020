//! lc-supervisor: the first process of a Little Compute sandbox instance.
//!
//! `lc-supervisor (--socket PATH | --listen-fd FD [--done-fd FD] [--release-fd FD]) [--spool-bytes N]
//! [--spool-pages P] [--stdin-open] [--first-seq S] [--first-input-seq I] -- ARGV...`
//!
//! It serves a listening unix socket: the one it inherited as descriptor
//! `--listen-fd` (the bubblewrap provider binds it on the host, where the
//! command cannot reach its name), or one it binds at `PATH` itself (under
//! the temporary name `.b` in the same directory, renamed to `PATH` once
//! it listens, so whoever sees `PATH` can connect at once). It starts
//! `ARGV` in its own process group with
//! its stdin on `/dev/null` and its stdout and stderr on pipes, and turns
//! what the command writes into numbered [`Page`]s (seq from `S`, default
//! 1, no gaps) in a bounded in-memory spool. A resumed generation of an
//! attempt is started with `S` = the seq after the last page its earlier
//! generations stored, and `I` = the input seq after the last input they
//! accepted, so both sequences continue across generations. Design and
//! failure modes:
//!
//! * **Back-pressure, never a drop.** The spool holds at most `N` bytes of
//!   unacknowledged page data (default [`SPOOL_BYTES_DEFAULT`]) and at most
//!   `P` pages (default [`SPOOL_PAGES_DEFAULT`], one slot of which is kept
//!   for the terminal page, so that many tiny writes cannot grow the queue
//!   without bound). A pipe is read only while the spool has room, and
//!   never more than the room left (one thread reads both pipes, so the
//!   room it saw is the room it fills); when it is
//!   full the pipes are not read, the kernel's pipe buffer fills and the
//!   command blocks in `write` until a reader acknowledges pages.
//! * **Terminal page.** After both pipes reached end of file and the command
//!   itself was reaped, one terminal page with its exit code or signal is
//!   appended (it carries no bytes and has its kept slot, so it never waits
//!   for room). A command that cannot be started yields a stderr page with
//!   the reason and exit code 127, as a shell reports it.
//! * **Children that outlive the command.** Once the command itself has
//!   exited (or was killed), the supervisor kills what is left of its
//!   processes (`SIGKILL` to the command's process group, then to every
//!   other process of its PID namespace but itself, then to every live
//!   descendant it still finds), reads the pipes to end of file, and only
//!   then appends the terminal page, which carries the command's own
//!   status. So an orphan holding stdout open cannot keep an exec alive
//!   forever, and what it wrote before it died is still paged.
//! * **Reaping.** The supervisor marks itself a child subreaper and reaps
//!   every child, so orphans of the command never linger as zombies, whether
//!   the supervisor is PID 1 of its PID namespace or runs under an init.
//! * **Release.** With `--release-fd` (the read end of a pipe the
//!   provider holds) the command is not started until the provider
//!   writes one byte there: the supervisor serves the first connection
//!   from outside the sandbox (the provider's start handshake), then waits
//!   for that byte before it accepts another, so the provider sees the
//!   supervisor answer, records that it hands the command over, and only
//!   then releases it. Nothing the command does can stall or fake that
//!   handshake, and every later request finds the command started. A
//!   pipe closed without that byte (the provider gave the start up) never
//!   starts the command: the stream ends with a stderr page saying so and
//!   a terminal page with exit code 127. Without `--release-fd` the
//!   command starts at once.
//! * **Socket protocol.** One request frame, one response frame
//!   ([`lc_core::page::SocketRequest`] / [`SocketResponse`]): `pages after
//!   seq S (max M)` returns what is spooled now (possibly nothing; the caller
//!   polls), `ack through seq S` drops every page up to `S`, `cancel` kills
//!   the command, `stop` kills it for hibernation, `status` reports the
//!   spool's occupancy ([`SpoolStatus`]).
//! * **Owner fences.** `pages`, `ack`, `cancel`, `stop` and `send` carry the caller's owner
//!   fence. The supervisor keeps the highest fence it was shown, in memory
//!   (it lives exactly as long as the instance), and answers a lower one
//!   `stale_fence` naming the highest, changing nothing: a gateway that
//!   lost its ownership can neither drop a page nor cancel the command.
//! * **Cancel.** `cancel` kills every process of the command as above;
//!   the pipes are then drained into the spool (under the same bounds) and
//!   the terminal page follows with signal 9, unless the command had
//!   already ended. A second cancel, and a cancel after the command ended,
//!   is a no-op that answers ok (`killed: false`).
//! * **Stop.** `stop` kills every process of the command exactly as
//!   `cancel` does and drains the pipes the same way, but the stream ends
//!   with the **stopped page** ([`PageKind::Stopped`], no bytes, the status
//!   the command was reaped with: signal 9) instead of the terminal page:
//!   the generation ends, the exec does not. It answers `killed`; a second
//!   stop answers `already_stopped`; a stop after the command ended, or
//!   after a cancel, kills nothing, answers `ended`, and the terminal page
//!   stays the last page. A cancel after a stop is a no-op.
//! * **Input.** With `--stdin-open`, `send` (fenced) writes its bytes to
//!   the command's stdin exactly once per input seq, in order: a repeated
//!   seq answers ok without writing again, a gap is refused `input_gap`,
//!   input after the eof one or after the command ended `input_closed`.
//!   Accepted inputs wait in a queue of at most [`INPUT_QUEUE_BYTES_MAX`]
//!   bytes (else `input_busy`), written by one thread, so a command that
//!   does not read its stdin blocks nothing else.
//! * **Peers.** Connections are
//!   served one at a time, each read bounded by [`CONNECTION_IDLE_MAX`],
//!   and only for a peer outside the supervisor's PID namespace (the
//!   provider on the host): a connection from inside the sandbox, where
//!   the command runs as the same uid and could reach the socket, is
//!   closed unread, so the command can neither acknowledge its own pages
//!   nor hold the connection (`--any-peer` lifts this for a supervisor run
//!   outside a sandbox).
//!   Once the last page (terminal or stopped) is acknowledged the
//!   supervisor writes `last_page_acked` to the inherited file `--done-fd`
//!   (before it answers that ack, so a reader that got the answer finds
//!   the file written), removes a socket it bound itself, and exits 0.
//! * **Nothing inherited reaches the command.** Every descriptor above
//!   stderr (those of `--listen-fd` and `--done-fd` among them) is made
//!   close-on-exec before the command starts, and the supervisor makes
//!   itself non-dumpable, so the command (the same uid in the same user
//!   namespace) can neither `ptrace` it nor copy its descriptors
//!   (`pidfd_getfd`, `/proc/PID/fd`).
//! * **The OOM killer's choice.** The command starts with `oom_score_adj`
//!   [`COMMAND_OOM_SCORE_ADJ`] (its descendants inherit it), the supervisor
//!   keeps its own: when the instance's memory limit is reached, the
//!   kernel kills the command, and the supervisor lives to page what it
//!   wrote and its terminal status (signal 9). Raising one's own score
//!   needs no privilege; the command may lower it back to the
//!   supervisor's, which only makes its own instance's supervisor a
//!   candidate.
//! * The supervisor's clock is never consulted for anything but that
//!   connection timeout; it holds no credential.
//! * **Identity.** Under the bubblewrap provider the supervisor and the
//!   command run as uid and gid 1000 of the instance's user namespace,
//!   with no capability and no supplementary group. On the host that uid
//!   is the provider's unprivileged sandbox account (`lc-sandbox` by
//!   default), never root: the provider drops to it before bubblewrap
//!   starts, so the pages and every file the command writes are that
//!   account's, and a host file bound in is read with that account's
//!   credentials. The supervisor needs nothing more: it only serves the
//!   socket the provider bound for it (root's, in a host directory that is
//!   not bound into the sandbox), writes the done file the provider opened
//!   for it, and runs the command.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use lc_core::owner::OwnerFence;
use lc_core::page::{
    ExitStatus, FIRST_SEQ_MAX, PAGE_BYTES_MAX, PAGES_PER_REQUEST_MAX, Page, PageKind,
    SPOOL_BYTES_DEFAULT, SPOOL_PAGES_DEFAULT, SPOOL_PAGES_MAX, SPOOL_PAGES_MIN, SocketRequest,
    SocketResponse, SpoolStatus, StopOutcome, read_frame, write_frame,
};

/// How long one connection may stay silent before the supervisor closes it
/// and serves the next: 30 s, far above a provider's per-request round trip.
pub const CONNECTION_IDLE_MAX: Duration = Duration::from_secs(30);

/// The smallest spool bound accepted, in bytes: one byte still makes
/// progress (a page of one byte at a time).
pub const SPOOL_BYTES_MIN: u64 = 1;

/// The largest spool bound accepted: 1 GiB of memory inside an instance.
pub const SPOOL_BYTES_LIMIT: u64 = 1 << 30;

/// The temporary name the socket is bound under, in the socket's
/// directory, before it is renamed into place: two bytes, so it fits
/// wherever the socket's own path does (a one-byte name aside).
pub const BINDING_NAME: &str = ".b";

/// Exit code of a command that could not be started.
pub const START_FAILED_CODE: i32 = 127;

/// The `oom_score_adj` the command starts with: the kernel's highest, so
/// the OOM killer picks the command (and its descendants) before the
/// supervisor, which keeps the default.
pub const COMMAND_OOM_SCORE_ADJ: i32 = 1000;

/// What the supervisor writes to `--done-fd` once the last page (terminal
/// or stopped) is acknowledged.
pub const DONE_TEXT: &str = "last_page_acked\n";

/// Parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The unix socket to bind (`--socket`); exactly one of it and
    /// `listen_fd` is given.
    pub socket: Option<std::path::PathBuf>,
    /// An inherited descriptor of a listening unix socket to serve
    /// (`--listen-fd`, >= 3).
    pub listen_fd: Option<i32>,
    /// An inherited descriptor of a file opened for writing, where
    /// [`DONE_TEXT`] is written once the last page is acknowledged
    /// (`--done-fd`, >= 3).
    pub done_fd: Option<i32>,
    /// An inherited descriptor of a pipe's read end (`--release-fd`, >= 3):
    /// the command starts once one byte arrives there, never if the pipe
    /// closes first. `None`: it starts at once.
    pub release_fd: Option<i32>,
    /// The spool bound in bytes.
    pub spool_bytes_max: u64,
    /// The spool bound in pages, the terminal page's slot included.
    pub spool_pages_max: u64,
    /// The command, `argv[0]` first.
    pub argv: Vec<String>,
    /// Give the command a stdin pipe the `send` request writes to
    /// (`--stdin-open`); without it stdin is `/dev/null`.
    pub stdin_open: bool,
    /// Serve every peer, not only those outside this process's PID
    /// namespace (`--any-peer`: for a supervisor run outside a sandbox,
    /// where its reader shares its PID namespace).
    pub any_peer: bool,
    /// The seq of the first page (`--first-seq`, `1..=FIRST_SEQ_MAX`,
    /// default 1).
    pub first_seq: i64,
    /// The seq of the first input `send` writes (`--first-input-seq`,
    /// `1..=FIRST_SEQ_MAX`, default 1); a `send` of a lower seq was
    /// accepted by an earlier generation and answers ok without writing.
    pub first_input_seq: i64,
}

/// A refused command line. Codes are stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "usage_error: {}\nusage: lc-supervisor (--socket PATH | --listen-fd FD [--done-fd FD] [--release-fd FD]) [--spool-bytes N] [--spool-pages N] [--stdin-open] [--any-peer] [--first-seq S] [--first-input-seq I] -- ARGV...",
            self.0
        )
    }
}

impl Args {
    /// Parses `args` (without the program name).
    ///
    /// # Errors
    /// [`UsageError`] for a missing command, neither or both of `--socket`
    /// and `--listen-fd`, a descriptor below 3, an unknown flag, a spool
    /// bound outside `SPOOL_BYTES_MIN..=SPOOL_BYTES_LIMIT`, or a first seq
    /// or first input seq outside `1..=FIRST_SEQ_MAX`.
    pub fn parse(args: &[String]) -> Result<Args, UsageError> {
        let mut socket = None;
        let mut listen_fd = None;
        let mut done_fd = None;
        let mut release_fd = None;
        let mut spool_bytes_max = SPOOL_BYTES_DEFAULT;
        let mut spool_pages_max = SPOOL_PAGES_DEFAULT;
        let mut it = args.iter();
        let mut argv = Vec::new();
        let mut any_peer = false;
        let mut stdin_open = false;
        let mut first_seq = 1;
        let mut first_input_seq = 1;
        let seq_flag = |flag: &str, v: Option<&String>| -> Result<i64, UsageError> {
            let v = v.ok_or_else(|| UsageError(format!("{flag} needs a number")))?;
            v.parse::<i64>()
                .ok()
                .filter(|n| (1..=FIRST_SEQ_MAX).contains(n))
                .ok_or_else(|| {
                    UsageError(format!(
                        "{flag} must be an integer 1..={FIRST_SEQ_MAX}, got {v:?}"
                    ))
                })
        };
        while let Some(a) = it.next() {
            match a.as_str() {
                "--any-peer" => any_peer = true,
                "--first-seq" => first_seq = seq_flag("--first-seq", it.next())?,
                "--first-input-seq" => first_input_seq = seq_flag("--first-input-seq", it.next())?,
                "--stdin-open" => stdin_open = true,
                "--socket" => {
                    socket = Some(
                        it.next()
                            .ok_or_else(|| UsageError("--socket needs a path".into()))?
                            .into(),
                    )
                }
                flag @ ("--listen-fd" | "--done-fd" | "--release-fd") => {
                    let v = it
                        .next()
                        .ok_or_else(|| UsageError(format!("{flag} needs a descriptor")))?;
                    // 0, 1 and 2 are the supervisor's own stdin, stdout, stderr.
                    let fd = v.parse::<i32>().ok().filter(|fd| *fd >= 3).ok_or_else(|| {
                        UsageError(format!("{flag} must be a descriptor >= 3, got {v:?}"))
                    })?;
                    match flag {
                        "--listen-fd" => listen_fd = Some(fd),
                        "--done-fd" => done_fd = Some(fd),
                        _ => release_fd = Some(fd),
                    }
                }
                "--spool-bytes" => {
                    let v = it
                        .next()
                        .ok_or_else(|| UsageError("--spool-bytes needs a number".into()))?;
                    spool_bytes_max = v
                        .parse::<u64>()
                        .ok()
                        .filter(|n| (SPOOL_BYTES_MIN..=SPOOL_BYTES_LIMIT).contains(n))
                        .ok_or_else(|| {
                            UsageError(format!(
                                "--spool-bytes must be {SPOOL_BYTES_MIN}..={SPOOL_BYTES_LIMIT}, got {v:?}"
                            ))
                        })?;
                }
                "--spool-pages" => {
                    let v = it
                        .next()
                        .ok_or_else(|| UsageError("--spool-pages needs a number".into()))?;
                    spool_pages_max = v
                        .parse::<u64>()
                        .ok()
                        .filter(|n| (SPOOL_PAGES_MIN..=SPOOL_PAGES_MAX).contains(n))
                        .ok_or_else(|| {
                            UsageError(format!(
                                "--spool-pages must be {SPOOL_PAGES_MIN}..={SPOOL_PAGES_MAX}, got {v:?}"
                            ))
                        })?;
                }
                "--" => {
                    argv = it.by_ref().cloned().collect();
                }
                other => return Err(UsageError(format!("unknown argument {other:?}"))),
            }
        }
        if socket.is_some() == listen_fd.is_some() {
            return Err(UsageError(
                "exactly one of --socket and --listen-fd is required".into(),
            ));
        }
        if argv.is_empty() || argv[0].is_empty() {
            return Err(UsageError("a command is required after --".into()));
        }
        Ok(Args {
            socket,
            listen_fd,
            done_fd,
            release_fd,
            spool_bytes_max,
            spool_pages_max,
            argv,
            stdin_open,
            any_peer,
            first_seq,
            first_input_seq,
        })
    }
}

/// The spool and the command's progress, shared by the pipe readers, the
/// reaper and the socket server.
struct State {
    pages: VecDeque<Page>,
    /// Bytes of page data in `pages`; never above `bytes_max`.
    bytes: u64,
    bytes_max: u64,
    /// `pages.len()` never exceeds it; one slot is the last page's.
    pages_max: u64,
    /// The seq the next page gets.
    next_seq: i64,
    /// Every page up to this seq has been acknowledged and dropped.
    acked_through: i64,
    /// Pipes not yet at end of file.
    pipes_open: u8,
    /// The command's pid (and process group), once started.
    command_pid: Option<libc::pid_t>,
    /// The command's status once reaped.
    exit: Option<ExitStatus>,
    /// The terminal page's seq once appended.
    terminal_seq: Option<i64>,
    /// The stopped page's seq once appended.
    stopped_seq: Option<i64>,
    /// The highest owner fence a request carried; 0 before the first.
    highest_fence: i64,
    /// Whether a cancel killed the command.
    cancelled: bool,
    /// Whether a stop killed the command: its last page is the stopped page.
    stopped: bool,
    /// Whether the command's stdin is a pipe the supervisor still writes
    /// (`--stdin-open`, until end of input or a failed write).
    input_open: bool,
    /// The highest input seq accepted (queued or written);
    /// `first_input_seq - 1` before the first.
    input_seq: i64,
    /// Whether the input accepted last closes stdin.
    input_eof: bool,
    /// Inputs accepted and not yet written, in seq order: (bytes, eof).
    input_queue: VecDeque<(Vec<u8>, bool)>,
    /// Bytes in `input_queue`; never above [`INPUT_QUEUE_BYTES_MAX`].
    input_queued_bytes: usize,
}

impl State {
    fn status(&self) -> SpoolStatus {
        SpoolStatus {
            pages: self.pages.len() as u64,
            bytes: self.bytes,
            pages_max: self.pages_max,
            bytes_max: self.bytes_max,
            next_seq: self.next_seq,
            acked_through: self.acked_through,
            highest_fence: self.highest_fence,
            terminal_seq: self.terminal_seq.unwrap_or(0),
            command_exited: self.exit.is_some(),
            cancelled: self.cancelled,
            input_seq: self.input_seq,
            stopped_seq: self.stopped_seq.unwrap_or(0),
            stopped: self.stopped,
        }
    }

    /// The last page's seq (terminal or stopped) once appended.
    fn last_seq(&self) -> Option<i64> {
        self.terminal_seq.or(self.stopped_seq)
    }

    /// Whether a pipe reader may claim room for one more data page: bytes
    /// left, and a page slot left besides the one kept for the last page.
    fn has_room(&self) -> bool {
        self.bytes < self.bytes_max && self.pages.len() as u64 + 1 < self.pages_max
    }
}

struct Spool {
    state: Mutex<State>,
    /// Signalled when room frees up (an ack) or the command's status changes.
    changed: Condvar,
}

impl Spool {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A reader thread that panicked leaves consistent state behind (every
        // mutation is one statement), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a data page; the caller checked the room (`State::has_room`).
    fn push(st: &mut State, kind: PageKind, bytes: Vec<u8>) {
        let len = bytes.len() as u64;
        match Page::data(st.next_seq, kind, bytes) {
            Ok(p) => {
                st.pages.push_back(p);
                st.bytes += len;
                st.next_seq += 1;
            }
            // Unreachable: seq >= 1 and the length is bounded by the read.
            Err(e) => eprintln!("lc-supervisor: page refused: {e}"),
        }
    }

    /// Appends the last page once the command is reaped and both pipes
    /// are closed: the stopped page when a stop killed the command, else
    /// the terminal page.
    fn maybe_finish(st: &mut State) {
        if st.last_seq().is_some() || st.pipes_open > 0 {
            return;
        }
        let Some(exit) = st.exit else { return };
        let seq = st.next_seq;
        let page = if st.stopped {
            Page::stopped(seq, exit)
        } else {
            Page::terminal(seq, exit)
        };
        match page {
            Ok(p) => {
                if st.stopped {
                    st.stopped_seq = Some(seq);
                } else {
                    st.terminal_seq = Some(seq);
                }
                st.pages.push_back(p);
                st.next_seq += 1;
            }
            Err(e) => eprintln!("lc-supervisor: last page refused: {e}"),
        }
    }
}

/// Reads both pipes into the spool, in one thread, never more than the
/// room left: it waits for room, then for a pipe to be readable (`poll`),
/// then reads at most that room from one ready pipe (the two take turns),
/// so the room it saw is the room it fills. Ends when both pipes reached
/// end of file (or failed).
fn pump(spool: Arc<Spool>, out: ChildStdout, err: ChildStderr) {
    use std::os::fd::AsRawFd as _;
    let fds = [out.as_raw_fd(), err.as_raw_fd()];
    let mut pipes: [Option<Box<dyn Read>>; 2] = [Some(Box::new(out)), Some(Box::new(err))];
    let kinds = [PageKind::Stdout, PageKind::Stderr];
    let mut buf = vec![0u8; PAGE_BYTES_MAX];
    let mut turn = 0usize;
    // Each pass reads at least one byte, ends a pipe, or waits: bounded by
    // what the command writes.
    while pipes.iter().any(Option::is_some) {
        let room = {
            let mut st = spool.lock();
            while !st.has_room() {
                st = spool.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            (st.bytes_max - st.bytes).min(PAGE_BYTES_MAX as u64) as usize
        };
        let mut polled = [0, 1].map(|i| libc::pollfd {
            // poll ignores a negative descriptor: a pipe already at its end.
            fd: if pipes[i].is_some() { fds[i] } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: `polled` is a valid array of two pollfd.
        let rc = unsafe { libc::poll(polled.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // Not expected (poll fails only on bad arguments): the pipes
            // are given up so the terminal page still comes.
            eprintln!("lc-supervisor: poll: {e}");
            let mut st = spool.lock();
            st.pipes_open = 0;
            Spool::maybe_finish(&mut st);
            spool.changed.notify_all();
            return;
        }
        let ready = |i: usize| pipes[i].is_some() && polled[i].revents != 0;
        let i = if ready(turn) {
            turn
        } else if ready(1 - turn) {
            1 - turn
        } else {
            continue;
        };
        turn = 1 - i;
        let Some(pipe) = pipes[i].as_mut() else {
            continue;
        };
        let read = pipe.read(&mut buf[..room]);
        let mut st = spool.lock();
        match read {
            Ok(0) => {
                pipes[i] = None;
                st.pipes_open -= 1;
                Spool::maybe_finish(&mut st);
                spool.changed.notify_all();
            }
            Ok(n) => Spool::push(&mut st, kinds[i], buf[..n].to_vec()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("lc-supervisor: reading {}: {e}", kinds[i].as_str());
                pipes[i] = None;
                st.pipes_open -= 1;
                Spool::maybe_finish(&mut st);
                spool.changed.notify_all();
            }
        }
    }
}

/// Rounds of [`kill_descendants`] before it gives up on a process that
/// keeps reappearing (one round a millisecond apart): 1000, one second.
pub const KILL_ROUNDS_MAX: u32 = 1000;

/// The most `/proc` entries one round of [`kill_descendants`] reads: the
/// kernel's default `pid_max` (4 Mi) bounds every PID namespace.
const PROC_ENTRIES_MAX: usize = 1 << 22;

/// The live (not zombie) descendants of `root`, from `/proc`.
fn live_descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of: Vec<(libc::pid_t, libc::pid_t, bool)> = Vec::new();
    for e in dir.flatten().take(PROC_ENTRIES_MAX) {
        let Some(pid) = e
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses,
        // so the fields are read after the last `)`.
        let mut rest = stat.rsplit(')').next().unwrap_or("").split_whitespace();
        let state = rest.next().unwrap_or("");
        let Some(ppid) = rest.next().and_then(|p| p.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        parent_of.push((pid, ppid, state == "Z" || state == "X"));
    }
    let mut tree = std::collections::HashSet::from([root]);
    let mut live = Vec::new();
    // Each pass adds the children of what is already in the tree; a pass
    // that adds nothing ends it, so at most one pass per process.
    let mut grew = true;
    while grew {
        grew = false;
        for &(pid, ppid, dead) in &parent_of {
            if tree.contains(&ppid) && tree.insert(pid) {
                grew = true;
                if !dead {
                    live.push(pid);
                }
            }
        }
    }
    live
}

/// Kills every process of the command but the supervisor itself, after
/// the caller signalled the command's process group: (inside its own PID
/// namespace, where the supervisor is PID 1 or 2) every process the
/// namespace holds but itself and its init, then every live descendant of
/// the supervisor found in `/proc` (it is their subreaper, so an orphan is
/// still one), round after round until none is left, at most
/// [`KILL_ROUNDS_MAX`].
fn kill_descendants() {
    // SAFETY: getpid and kill take no pointers.
    let me = unsafe { libc::getpid() };
    if me <= 2 {
        // kill(-1) inside a PID namespace reaches that namespace only,
        // sparing its PID 1 and the caller.
        unsafe { libc::kill(-1, libc::SIGKILL) };
    }
    for _ in 0..KILL_ROUNDS_MAX {
        let live = live_descendants(me);
        if live.is_empty() {
            return;
        }
        for pid in live {
            // SAFETY: kill takes plain integers.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("lc-supervisor: processes still alive after {KILL_ROUNDS_MAX} kill rounds");
}

/// Reaps every child until none is left; records the command's status.
///
/// The command's zombie is inspected without reaping (`WNOWAIT`) and reaped
/// only under the spool's lock with its status recorded, so a cancel that
/// sees the command still running signals a process group whose id cannot
/// have been reused. Once the command has ended, what is left of its
/// processes is killed (see the crate docs: children that outlive the
/// command).
fn reap(spool: Arc<Spool>, command_pid: libc::pid_t) {
    // Bounded by the number of processes that can ever be our children:
    // each successful wait removes one, and ECHILD ends the loop.
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value to be written into.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        // SAFETY: waitid filled `info` for a child state change.
        let pid = unsafe { info.si_pid() };
        if pid != command_pid {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid writes only into `status`.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            continue;
        }
        let mut st = spool.lock();
        // The command's group id stays reserved while its zombie exists:
        // signal what is left of the group before reaping the leader.
        // SAFETY: kill takes plain integers.
        unsafe { libc::kill(-command_pid, libc::SIGKILL) };
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes only into `status`.
        let got = unsafe { libc::waitpid(command_pid, &mut status, 0) };
        if got == command_pid {
            let es = std::process::ExitStatus::from_raw(status);
            let exit = match (es.code(), es.signal()) {
                (Some(c), _) => ExitStatus::exited(c),
                (None, Some(s)) => ExitStatus::signaled(s),
                (None, None) => ExitStatus::signaled(libc::SIGKILL),
            };
            st.exit = Some(exit);
            Spool::maybe_finish(&mut st);
            spool.changed.notify_all();
        }
        drop(st);
        kill_descendants();
    }
}

/// The most input bytes accepted and not yet written to the command's
/// stdin: 1 MiB, sixteen full inputs. A command that does not read its
/// stdin makes further `send`s answer `input_busy` (retry later) rather
/// than grow the supervisor's memory.
pub const INPUT_QUEUE_BYTES_MAX: usize = 16 * lc_core::page::INPUT_BYTES_MAX;

/// Writes accepted inputs to the command's stdin, in seq order, each once;
/// closes stdin after the input marked eof. A failed write (the command
/// closed its stdin or ended) closes the input: the rest of the queue is
/// discarded and later sends are refused `input_closed`.
fn feed(spool: Arc<Spool>, mut stdin: std::process::ChildStdin) {
    use std::io::Write as _;
    // Each pass writes one accepted input or ends: bounded by the inputs.
    loop {
        let (bytes, eof) = {
            let mut st = spool.lock();
            loop {
                if let Some(next) = st.input_queue.pop_front() {
                    break next;
                }
                if !st.input_open || st.exit.is_some() {
                    return;
                }
                st = spool.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let written = stdin.write_all(&bytes).and_then(|()| stdin.flush());
        let mut st = spool.lock();
        st.input_queued_bytes -= bytes.len();
        if written.is_err() || eof {
            st.input_open = false;
            st.input_queue.clear();
            st.input_queued_bytes = 0;
            return;
        }
    }
}

/// `close_range`'s flag that marks the range close-on-exec instead of
/// closing it (Linux 5.11).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// [`COMMAND_OOM_SCORE_ADJ`] as written to `oom_score_adj`.
const OOM_SCORE_ADJ_TEXT: &[u8] = b"1000";

fn start(argv: &[String], stdin_open: bool) -> std::io::Result<(Child, ChildStdout, ChildStderr)> {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(if stdin_open {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a cancel can signal the group at once.
        .process_group(0);
    // SAFETY: the closure only calls prctl, open, write and close, all
    // async-signal-safe, on static data; it allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            // The supervisor is not dumpable, so neither is this child
            // until it executes: /proc/self is not its own to write until
            // it is made dumpable again (exec would do so anyway).
            if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(
                fd,
                OOM_SCORE_ADJ_TEXT.as_ptr().cast(),
                OOM_SCORE_ADJ_TEXT.len(),
            );
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n != OOM_SCORE_ADJ_TEXT.len() as isize {
                return Err(err);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let out = child.stdout.take();
    let err = child.stderr.take();
    match (out, err) {
        (Some(o), Some(e)) => Ok((child, o, e)),
        _ => Err(std::io::Error::other("child pipes missing")),
    }
}

/// Handles one request against the spool. Returns the response and whether
/// the last page (terminal or stopped) has now been acknowledged.
fn handle(spool: &Spool, req: SocketRequest) -> (SocketResponse, bool) {
    let mut st = spool.lock();
    if let Some(fence) = req.fence() {
        if fence.0 < st.highest_fence {
            return (
                SocketResponse::StaleFence {
                    presented: fence,
                    highest: OwnerFence(st.highest_fence),
                },
                false,
            );
        }
        st.highest_fence = fence.0;
    }
    match req {
        SocketRequest::Pages { after_seq, max, .. } => {
            let max = max.min(PAGES_PER_REQUEST_MAX) as usize;
            let pages = st
                .pages
                .iter()
                .filter(|p| p.seq() > after_seq)
                .take(max)
                .cloned()
                .collect();
            (SocketResponse::Pages(pages), false)
        }
        SocketRequest::Ack { through_seq, .. } => {
            if through_seq >= st.next_seq {
                return (
                    SocketResponse::Error {
                        code: "ack_ahead".into(),
                    },
                    false,
                );
            }
            // Bounded by the spool's length.
            while st.pages.front().is_some_and(|p| p.seq() <= through_seq) {
                if let Some(p) = st.pages.pop_front() {
                    st.bytes -= p.bytes().len() as u64;
                }
            }
            st.acked_through = st.acked_through.max(through_seq);
            let done = st.last_seq().is_some_and(|t| st.acked_through >= t);
            let acked_through = st.acked_through;
            drop(st);
            spool.changed.notify_all();
            (SocketResponse::Acked { acked_through }, done)
        }
        SocketRequest::Cancel { .. } => {
            let pid = match st.command_pid {
                Some(pid) if st.exit.is_none() && !st.cancelled && !st.stopped => pid,
                // Already cancelled or stopped, never started, or already ended.
                _ => return (SocketResponse::Cancelled { killed: false }, false),
            };
            st.cancelled = true;
            // Under the lock the command is alive or an unreaped zombie, so
            // its group id is still its own.
            // SAFETY: kill takes plain integers.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            drop(st);
            kill_descendants();
            (SocketResponse::Cancelled { killed: true }, false)
        }
        SocketRequest::Stop { .. } => {
            let outcome = |outcome| (SocketResponse::Stopped { outcome }, false);
            if st.stopped {
                return outcome(StopOutcome::AlreadyStopped);
            }
            let pid = match st.command_pid {
                Some(pid) if st.exit.is_none() && !st.cancelled => pid,
                // Never started, cancelled, or already ended: the terminal
                // page is (or will be) its last page.
                _ => return outcome(StopOutcome::Ended),
            };
            st.stopped = true;
            // Under the lock the command is alive or an unreaped zombie, so
            // its group id is still its own.
            // SAFETY: kill takes plain integers.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            drop(st);
            kill_descendants();
            outcome(StopOutcome::Killed)
        }
        SocketRequest::Status => (SocketResponse::Status(st.status()), false),
        SocketRequest::Send {
            input_seq,
            bytes,
            eof,
            ..
        } => {
            let refuse = |code: &str| {
                (
                    SocketResponse::Error {
                        code: code.to_owned(),
                    },
                    false,
                )
            };
            if input_seq < 1 {
                return refuse("bad_input_seq");
            }
            if input_seq <= st.input_seq {
                // Accepted before: written once, never again.
                return (
                    SocketResponse::Sent {
                        input_seq: st.input_seq,
                    },
                    false,
                );
            }
            if input_seq > st.input_seq + 1 {
                return refuse("input_gap");
            }
            if !st.input_open || st.input_eof || st.exit.is_some() || st.cancelled || st.stopped {
                return refuse("input_closed");
            }
            if st.input_queued_bytes + bytes.len() > INPUT_QUEUE_BYTES_MAX {
                return refuse("input_busy");
            }
            st.input_queued_bytes += bytes.len();
            st.input_queue.push_back((bytes, eof));
            st.input_seq = input_seq;
            st.input_eof = eof;
            drop(st);
            spool.changed.notify_all();
            (SocketResponse::Sent { input_seq }, false)
        }
    }
}

/// Serves one connection; returns whether the last page was
/// acknowledged. [`DONE_TEXT`] goes to `done` before that ack is answered.
fn serve_connection(spool: &Spool, mut conn: UnixStream, done: Option<&std::fs::File>) -> bool {
    if conn.set_read_timeout(Some(CONNECTION_IDLE_MAX)).is_err() {
        return false;
    }
    loop {
        let body = match read_frame(&mut conn) {
            Ok(Some(b)) => b,
            Ok(None) | Err(_) => return false,
        };
        let (resp, finished) = match SocketRequest::decode(&body) {
            Ok(req) => handle(spool, req),
            Err(e) => (
                SocketResponse::Error {
                    code: e.code().into(),
                },
                false,
            ),
        };
        if finished && let Some(mut f) = done {
            use std::io::Write as _;
            if let Err(e) = f.write_all(DONE_TEXT.as_bytes()).and_then(|()| f.flush()) {
                eprintln!("lc-supervisor: done_fd_write_failed: {e}");
            }
        }
        let sent = resp
            .encode()
            .and_then(|b| write_frame(&mut conn, &b))
            .is_ok();
        if finished {
            return true;
        }
        if !sent {
            return false;
        }
    }
}

/// Runs the supervisor; returns the process exit code (0 once the last
/// page is acknowledged, 2 for bad usage, 1 if the socket cannot be bound).
pub fn run(args: Args) -> i32 {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer argument.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    // Not dumpable: the command, the same uid in the same user namespace,
    // can neither trace this process nor copy its descriptors.
    // SAFETY: prctl with PR_SET_DUMPABLE takes an integer argument.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // The command inherits its stdin, stdout and stderr, nothing else of
    // what this process was given.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets descriptor flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        eprintln!(
            "lc-supervisor: close_range_failed: {}",
            std::io::Error::last_os_error()
        );
        return 1;
    }
    let done = match args.done_fd.map(adopt_done_file).transpose() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("lc-supervisor: done_fd_unusable: {e}");
            return 1;
        }
    };
    let listener = match (&args.socket, args.listen_fd) {
        (_, Some(fd)) => match adopt_listener(fd) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("lc-supervisor: listen_fd_unusable: {e}");
                return 1;
            }
        },
        (Some(socket), None) => match bind_listener(socket) {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "lc-supervisor: socket_bind_failed: {}: {e}",
                    socket.display()
                );
                return 1;
            }
        },
        (None, None) => {
            eprintln!("lc-supervisor: usage_error: no socket to serve");
            return 2;
        }
    };
    let spool = Arc::new(Spool {
        state: Mutex::new(State {
            pages: VecDeque::new(),
            bytes: 0,
            bytes_max: args.spool_bytes_max,
            pages_max: args.spool_pages_max,
            next_seq: args.first_seq,
            acked_through: args.first_seq - 1,
            pipes_open: 2,
            command_pid: None,
            exit: None,
            terminal_seq: None,
            stopped_seq: None,
            highest_fence: 0,
            cancelled: false,
            stopped: false,
            input_open: false,
            input_seq: args.first_input_seq - 1,
            input_eof: false,
            input_queue: VecDeque::new(),
            input_queued_bytes: 0,
        }),
        changed: Condvar::new(),
    });
    // Held: the first connection served is the provider's start
    // handshake; the release is awaited right after it, before any other
    // connection is accepted, so every later request finds the command
    // started (or never to start).
    let mut release = match args.release_fd {
        None => {
            launch(&spool, &args.argv, args.stdin_open);
            None
        }
        Some(fd) => match adopt_release_pipe(fd) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("lc-supervisor: release_fd_unusable: {e}");
                return 1;
            }
        },
    };
    // One connection at a time; the instance's lifetime bounds this loop.
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if !args.any_peer && !peer_is_outside(&conn) {
            // The command (or anything else inside the sandbox) reached the
            // socket: closed at once, never read, so it can neither ack
            // pages nor hold the one connection the provider needs.
            continue;
        }
        let finished = serve_connection(&spool, conn, done.as_ref());
        if let Some(r) = release.take() {
            await_release(&spool, r, &args.argv, args.stdin_open);
        }
        if finished {
            if let Some(socket) = &args.socket {
                let _ = std::fs::remove_file(socket);
            }
            return 0;
        }
    }
    1
}

/// Starts the command under `spool` (its pipes pumped, its stdin fed, its
/// status reaped), or, when it cannot be started, spools the reason as a
/// stderr page and a terminal page with exit code [`START_FAILED_CODE`].
fn launch(spool: &Arc<Spool>, argv: &[String], stdin_open: bool) {
    match start(argv, stdin_open) {
        Ok((mut child, out, err)) => {
            let pid = child.id() as libc::pid_t;
            if let Some(stdin) = child.stdin.take() {
                spool.lock().input_open = true;
                let s = spool.clone();
                std::thread::spawn(move || feed(s, stdin));
            }
            // The reaper owns the wait; `child` is not waited on through std.
            std::mem::forget(child);
            spool.lock().command_pid = Some(pid);
            let s = spool.clone();
            std::thread::spawn(move || pump(s, out, err));
            let s = spool.clone();
            std::thread::spawn(move || reap(s, pid));
        }
        Err(e) => never_started(
            spool,
            format!("lc-supervisor: cannot start {:?}: {e}\n", argv[0]),
        ),
    }
}

/// Ends the stream of a command that never started: `msg` as one stderr
/// page (cut to the page and spool bounds), then the terminal page with
/// exit code [`START_FAILED_CODE`].
fn never_started(spool: &Spool, msg: String) {
    let mut bytes = msg.into_bytes();
    let mut st = spool.lock();
    bytes.truncate((PAGE_BYTES_MAX as u64).min(st.bytes_max) as usize);
    Spool::push(&mut st, PageKind::Stderr, bytes);
    st.pipes_open = 0;
    st.exit = Some(ExitStatus::exited(START_FAILED_CODE));
    Spool::maybe_finish(&mut st);
    drop(st);
    spool.changed.notify_all();
}

/// Waits for the provider's release byte on `release`, then starts the
/// command; a pipe closed (or failing) before that byte ends the stream
/// without ever starting it. One read, bounded by the provider's start:
/// it writes the byte once it has the handshake's answer, or closes the
/// pipe when it gives the start up (or dies).
fn await_release(
    spool: &Arc<Spool>,
    mut release: std::fs::File,
    argv: &[String],
    stdin_open: bool,
) {
    let mut byte = [0u8; 1];
    // EINTR retries; every other outcome ends the wait.
    let outcome = loop {
        match release.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    drop(release);
    match outcome {
        Ok(1) => launch(spool, argv, stdin_open),
        Ok(_) => never_started(
            spool,
            "lc-supervisor: the provider gave the start up before releasing the command\n"
                .to_owned(),
        ),
        Err(e) => never_started(
            spool,
            format!(
                "lc-supervisor: the release pipe failed before the command was released: {e}\n"
            ),
        ),
    }
}

/// Takes the inherited descriptor `fd` as the release pipe's read end.
fn adopt_release_pipe(fd: i32) -> Result<std::fs::File, String> {
    use std::os::fd::FromRawFd as _;
    close_on_exec(fd).map_err(|e| format!("descriptor {fd}: {e}"))?;
    // SAFETY: `fd` is open (fcntl succeeded) and owned by nothing else here.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Binds a listening socket at `socket`. A socket file exists from bind on
/// but refuses connections until listen: bound under a temporary name, it
/// appears at its name only once it listens.
fn bind_listener(socket: &std::path::Path) -> std::io::Result<UnixListener> {
    let binding = socket.with_file_name(BINDING_NAME);
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_file(&binding);
    let bound =
        UnixListener::bind(&binding).and_then(|l| std::fs::rename(&binding, socket).map(|()| l));
    if bound.is_err() {
        let _ = std::fs::remove_file(&binding);
    }
    bound
}

/// Marks the inherited descriptor `fd` close-on-exec, so the command never
/// inherits it.
fn close_on_exec(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl on an integer descriptor touches no memory.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Takes the inherited descriptor `fd` as the listening socket: it must
/// be an open unix stream socket that listens.
fn adopt_listener(fd: i32) -> Result<UnixListener, String> {
    use std::os::fd::FromRawFd as _;
    let what = |e: &dyn std::fmt::Display| format!("descriptor {fd}: {e}");
    close_on_exec(fd).map_err(|e| what(&e))?;
    let int_opt = |opt: libc::c_int| -> std::io::Result<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are valid for writes of the sizes given.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast::<libc::c_void>(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(v)
    };
    let domain = int_opt(libc::SO_DOMAIN).map_err(|e| what(&e))?;
    let kind = int_opt(libc::SO_TYPE).map_err(|e| what(&e))?;
    let listening = int_opt(libc::SO_ACCEPTCONN).map_err(|e| what(&e))?;
    if domain != libc::AF_UNIX || kind != libc::SOCK_STREAM || listening != 1 {
        return Err(what(&"not a listening unix stream socket"));
    }
    // SAFETY: `fd` is an open socket nothing else in this process owns.
    Ok(unsafe { UnixListener::from_raw_fd(fd) })
}

/// Takes the inherited descriptor `fd` as the done file.
fn adopt_done_file(fd: i32) -> Result<std::fs::File, String> {
    use std::os::fd::FromRawFd as _;
    close_on_exec(fd).map_err(|e| format!("descriptor {fd}: {e}"))?;
    // SAFETY: `fd` is open (fcntl succeeded) and owned by nothing else here.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Whether the peer of `conn` lives outside this process's PID namespace:
/// the kernel reports its pid as 0 there (`SO_PEERCRED` translates pids
/// into the reader's namespace, and one it cannot name is 0). Inside a
/// sandbox that is exactly the provider on the host; every process of the
/// sandbox, the command's included, has a pid here. `false` when the
/// credentials cannot be read.
fn peer_is_outside(conn: &std::os::unix::net::UnixStream) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut cred = libc::ucred {
        pid: -1,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and
    // the descriptor is open for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    rc == 0 && cred.pid == 0
}
