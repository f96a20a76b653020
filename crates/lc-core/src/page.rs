//! Output pages: the numbered chunks of a command's stdout and stderr, the
//! terminal page that carries its exit status, and the stopped page that
//! ends a generation stopped for hibernation.
//!
//! One sequence space per (exec, attempt), without gaps: it starts at 1 and
//! continues across the generations of the attempt (a resumed generation's
//! supervisor starts at the seq after the last stored page). The
//! (exec, attempt) a page belongs to is the context of the stream it is read
//! from (a supervisor runs one command; a provider instance is one attempt),
//! so a [`Page`] carries only what the stream itself numbers: its `seq`, its
//! [`PageKind`], its bytes (at most [`PAGE_BYTES_MAX`]), the SHA-256 of those
//! bytes, and, for the terminal and the stopped page only, the
//! [`ExitStatus`]. The terminal page is the last page of its attempt; the
//! stopped page ([`PageKind::Stopped`]) is the last page of its generation
//! (every process of the command was killed by a `stop`, the exec is not
//! terminal and a later generation continues the seqs). Both have no bytes
//! ([`Page::is_last`]).
//!
//! Two wire forms:
//! * the socket form between a provider and its supervisor: length-prefixed
//!   binary frames ([`SocketRequest`], [`SocketResponse`], [`read_frame`],
//!   [`write_frame`]), each at most [`FRAME_BYTES_MAX`];
//! * the JSON form of the HTTP APIs ([`JsonPage`]):
//!   `{ "seq": 3, "kind": "stdout", "data_b64": "...", "sha256": "<hex>", "exit": null }`.
//!
//! Every decoder checks the invariants again (length bound, digest, the
//! terminal page's shape), so a page that crossed a socket is as trustworthy
//! as one built here.

use std::io::{Read, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::owner::OwnerFence;

/// The most bytes one page carries: 64 KiB, the unit a pipe read fills and a
/// row stores without toasting the page table's hot path.
pub const PAGE_BYTES_MAX: usize = 65536;

/// The spool bound a supervisor keeps when it is given none: 8 MiB of page
/// bytes not yet acknowledged. When the spool is full the supervisor stops
/// reading the command's pipes, so the command blocks (back-pressure); no
/// page is ever dropped.
pub const SPOOL_BYTES_DEFAULT: u64 = 8 * 1024 * 1024;

/// The spool's bound on pages a supervisor keeps when it is given none:
/// 4096 pages not yet acknowledged, the terminal page included. The byte
/// bound alone lets many tiny writes (one byte each, every one its own
/// page) grow the page queue, and the memory each page's header and digest
/// take, far beyond the bytes they carry; this bound caps that at a few
/// hundred KiB of overhead. When it is reached the supervisor stops
/// reading the pipes exactly as for a full byte bound (back-pressure); no
/// page is ever dropped. One slot is always kept for the terminal page.
pub const SPOOL_PAGES_DEFAULT: u64 = 4096;

/// The smallest page bound a spool accepts: one data page plus the slot
/// kept for the terminal page.
pub const SPOOL_PAGES_MIN: u64 = 2;

/// The largest page bound a spool accepts: 1 Mi pages.
pub const SPOOL_PAGES_MAX: u64 = 1 << 20;

/// The largest first page seq and first input seq a supervisor starts a
/// generation at: 2^62, far above what any attempt writes, so a seq never
/// overflows.
pub const FIRST_SEQ_MAX: i64 = 1 << 62;

/// The most pages one socket `pages` request returns: 64 pages, at most
/// 4 MiB of bytes, so one response frame stays bounded.
pub const PAGES_PER_REQUEST_MAX: u32 = 64;

/// The most bytes one socket frame's body holds: a full `pages` response of
/// [`PAGES_PER_REQUEST_MAX`] pages of [`PAGE_BYTES_MAX`] bytes plus their
/// headers.
pub const FRAME_BYTES_MAX: usize =
    16 + PAGES_PER_REQUEST_MAX as usize * (PAGE_BYTES_MAX + PAGE_HEADER_BYTES);

/// Bytes of one page's fixed header in the socket form: seq (8), kind (1),
/// exit flags (1), code (4), signal (4), length (4), SHA-256 (32).
const PAGE_HEADER_BYTES: usize = 8 + 1 + 1 + 4 + 4 + 4 + 32;

/// The longest error code a socket error response carries, in bytes.
const ERROR_CODE_BYTES_MAX: usize = 64;

/// Which stream a page comes from, or the terminal or stopped page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageKind {
    /// Bytes the command wrote to its standard output.
    Stdout,
    /// Bytes the command wrote to its standard error.
    Stderr,
    /// The last page: the command's exit status, no bytes.
    Terminal,
    /// The last page of a generation whose command a `stop` killed: the
    /// status it ended with (the signal), no bytes. The exec is not
    /// terminal; a later generation continues after it.
    Stopped,
}

impl PageKind {
    /// The kind's wire name: `stdout`, `stderr`, `terminal` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            PageKind::Stdout => "stdout",
            PageKind::Stderr => "stderr",
            PageKind::Terminal => "terminal",
            PageKind::Stopped => "stopped",
        }
    }

    /// Whether a page of this kind is the last of its stream and carries
    /// an exit status and no bytes: `terminal` and `stopped`.
    pub fn is_last(self) -> bool {
        matches!(self, PageKind::Terminal | PageKind::Stopped)
    }

    /// The kind's tag in the socket form: 1 stdout, 2 stderr, 3 terminal,
    /// 4 stopped.
    pub fn tag(self) -> u8 {
        match self {
            PageKind::Stdout => 1,
            PageKind::Stderr => 2,
            PageKind::Terminal => 3,
            PageKind::Stopped => 4,
        }
    }

    fn from_tag(tag: u8) -> Result<PageKind, PageError> {
        match tag {
            1 => Ok(PageKind::Stdout),
            2 => Ok(PageKind::Stderr),
            3 => Ok(PageKind::Terminal),
            4 => Ok(PageKind::Stopped),
            _ => Err(PageError::Malformed("unknown page kind")),
        }
    }
}

/// How the command ended: its exit code when it exited, the signal number
/// when a signal killed it. Exactly one of the two is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code (0..=255) when the command exited.
    pub code: Option<i32>,
    /// The signal number when a signal ended the command.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The command exited with `code`.
    pub fn exited(code: i32) -> ExitStatus {
        ExitStatus {
            code: Some(code),
            signal: None,
        }
    }

    /// A signal `signal` ended the command.
    pub fn signaled(signal: i32) -> ExitStatus {
        ExitStatus {
            code: None,
            signal: Some(signal),
        }
    }

    fn check(self) -> Result<ExitStatus, PageError> {
        match (self.code, self.signal) {
            (Some(_), None) | (None, Some(_)) => Ok(self),
            _ => Err(PageError::BadExit),
        }
    }
}

/// A refused page or frame. Codes are stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// More than [`PAGE_BYTES_MAX`] bytes in one page. Code `page_too_large`.
    #[error("a page holds at most {PAGE_BYTES_MAX} bytes, got {0}")]
    TooLarge(usize),
    /// A sequence number below 1. Code `bad_seq`.
    #[error("page seq must be >= 1, got {0}")]
    BadSeq(i64),
    /// The carried SHA-256 is not the SHA-256 of the bytes. Code `digest_mismatch`.
    #[error("page {0}: sha256 does not match its bytes")]
    DigestMismatch(i64),
    /// A terminal or stopped page with bytes or without an exit status, a
    /// data page with one, or an exit status with both or neither of code
    /// and signal. Code `bad_exit`.
    #[error(
        "a terminal or stopped page has no bytes and exactly one of exit code or signal; other pages have no exit"
    )]
    BadExit,
    /// An owner fence below 1 in a request. Code `bad_fence`.
    #[error("an owner fence is >= 1, got {0}")]
    BadFence(i64),
    /// A frame longer than [`FRAME_BYTES_MAX`]. Code `frame_too_large`.
    #[error("a frame holds at most {FRAME_BYTES_MAX} bytes, got {0}")]
    FrameTooLarge(usize),
    /// Bytes that are not a well-formed page, frame or JSON page. Code `malformed_page`.
    #[error("malformed page or frame: {0}")]
    Malformed(&'static str),
    /// The socket failed. Code `page_io`.
    #[error("page socket: {0}")]
    Io(String),
}

impl PageError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            PageError::TooLarge(_) => "page_too_large",
            PageError::BadSeq(_) => "bad_seq",
            PageError::DigestMismatch(_) => "digest_mismatch",
            PageError::BadExit => "bad_exit",
            PageError::BadFence(_) => "bad_fence",
            PageError::FrameTooLarge(_) => "frame_too_large",
            PageError::Malformed(_) => "malformed_page",
            PageError::Io(_) => "page_io",
        }
    }
}

/// One output page; see the module docs. Its fields are private: every
/// page in memory satisfies the invariants its constructors check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    seq: i64,
    kind: PageKind,
    bytes: Vec<u8>,
    sha256: [u8; 32],
    exit: Option<ExitStatus>,
}

/// The SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Page {
    /// A stdout or stderr page `seq` holding `bytes`, its SHA-256 computed.
    ///
    /// # Errors
    /// [`PageError::BadSeq`] for `seq < 1`, [`PageError::TooLarge`] over
    /// [`PAGE_BYTES_MAX`], [`PageError::BadExit`] for a `terminal` or
    /// `stopped` kind.
    pub fn data(seq: i64, kind: PageKind, bytes: Vec<u8>) -> Result<Page, PageError> {
        let sha = sha256(&bytes);
        Page::from_parts(seq, kind, bytes, sha, None)
    }

    /// The terminal page `seq` carrying `exit`.
    ///
    /// # Errors
    /// [`PageError::BadSeq`] for `seq < 1`, [`PageError::BadExit`] unless
    /// exactly one of code and signal is set.
    pub fn terminal(seq: i64, exit: ExitStatus) -> Result<Page, PageError> {
        Page::from_parts(seq, PageKind::Terminal, Vec::new(), sha256(&[]), Some(exit))
    }

    /// The stopped page `seq` carrying `exit`, the status the stopped
    /// command ended with (the signal that killed it).
    ///
    /// # Errors
    /// [`PageError::BadSeq`] for `seq < 1`, [`PageError::BadExit`] unless
    /// exactly one of code and signal is set.
    pub fn stopped(seq: i64, exit: ExitStatus) -> Result<Page, PageError> {
        Page::from_parts(seq, PageKind::Stopped, Vec::new(), sha256(&[]), Some(exit))
    }

    /// A page from its parts, as a decoder read them; every invariant is
    /// checked, the digest against the bytes.
    ///
    /// # Errors
    /// [`PageError::BadSeq`], [`PageError::TooLarge`],
    /// [`PageError::DigestMismatch`], [`PageError::BadExit`].
    pub fn from_parts(
        seq: i64,
        kind: PageKind,
        bytes: Vec<u8>,
        sha256_bytes: [u8; 32],
        exit: Option<ExitStatus>,
    ) -> Result<Page, PageError> {
        if seq < 1 {
            return Err(PageError::BadSeq(seq));
        }
        if bytes.len() > PAGE_BYTES_MAX {
            return Err(PageError::TooLarge(bytes.len()));
        }
        match (kind, exit) {
            (k, Some(e)) if k.is_last() && bytes.is_empty() => {
                e.check()?;
            }
            (k, _) if k.is_last() => return Err(PageError::BadExit),
            (_, Some(_)) => return Err(PageError::BadExit),
            (_, None) => {}
        }
        if sha256(&bytes) != sha256_bytes {
            return Err(PageError::DigestMismatch(seq));
        }
        Ok(Page {
            seq,
            kind,
            bytes,
            sha256: sha256_bytes,
            exit,
        })
    }

    /// The page's sequence number (>= 1).
    pub fn seq(&self) -> i64 {
        self.seq
    }

    /// The page's kind.
    pub fn kind(&self) -> PageKind {
        self.kind
    }

    /// The page's bytes (empty for the terminal and the stopped page).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The SHA-256 of [`Page::bytes`].
    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }

    /// The exit status: `Some` exactly on the terminal and the stopped page.
    pub fn exit(&self) -> Option<ExitStatus> {
        self.exit
    }

    /// Whether this is the terminal page (the attempt's last).
    pub fn is_terminal(&self) -> bool {
        self.kind == PageKind::Terminal
    }

    /// Whether this is the last page of its stream: the terminal page or
    /// the stopped page (the generation's last).
    pub fn is_last(&self) -> bool {
        self.kind.is_last()
    }

    /// The page's JSON form.
    pub fn to_json(&self) -> JsonPage {
        JsonPage {
            seq: self.seq,
            kind: self.kind,
            data_b64: BASE64.encode(&self.bytes),
            sha256: hex::encode(self.sha256),
            exit: self.exit,
        }
    }

    /// Appends the page's socket form to `out`.
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.push(self.kind.tag());
        let (flags, code, signal) = match self.exit {
            None => (0u8, 0, 0),
            Some(e) => (
                u8::from(e.code.is_some()) | (u8::from(e.signal.is_some()) << 1),
                e.code.unwrap_or(0),
                e.signal.unwrap_or(0),
            ),
        };
        out.push(flags);
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&signal.to_be_bytes());
        // A page's length is at most PAGE_BYTES_MAX, which fits in u32.
        out.extend_from_slice(&(self.bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.bytes);
        out.extend_from_slice(&self.sha256);
    }

    fn decode(cur: &mut Cursor<'_>) -> Result<Page, PageError> {
        let seq = cur.i64()?;
        let kind = PageKind::from_tag(cur.u8()?)?;
        let flags = cur.u8()?;
        let code = cur.i32()?;
        let signal = cur.i32()?;
        let len = cur.u32()? as usize;
        if len > PAGE_BYTES_MAX {
            return Err(PageError::TooLarge(len));
        }
        let bytes = cur.take(len)?.to_vec();
        let sha: [u8; 32] = cur
            .take(32)?
            .try_into()
            .map_err(|_| PageError::Malformed("short digest"))?;
        if flags > 3 {
            return Err(PageError::Malformed("unknown exit flags"));
        }
        let exit = (flags != 0).then_some(ExitStatus {
            code: (flags & 1 != 0).then_some(code),
            signal: (flags & 2 != 0).then_some(signal),
        });
        Page::from_parts(seq, kind, bytes, sha, exit)
    }
}

/// The JSON form of a page in the HTTP APIs:
/// `{ "seq": 3, "kind": "stdout", "data_b64": "...", "sha256": "<hex>", "exit": null }`.
/// `data_b64` is standard base64 with padding; `sha256` 64 lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonPage {
    /// Sequence number, >= 1.
    pub seq: i64,
    /// `stdout`, `stderr`, `terminal` or `stopped`.
    pub kind: PageKind,
    /// The page's bytes, base64.
    pub data_b64: String,
    /// SHA-256 of the bytes, lowercase hex.
    pub sha256: String,
    /// The exit status on the terminal and the stopped page, else `null`.
    pub exit: Option<ExitStatus>,
}

impl TryFrom<JsonPage> for Page {
    type Error = PageError;

    /// Decodes and checks a JSON page.
    ///
    /// # Errors
    /// [`PageError::Malformed`] for bad base64 or hex, else as
    /// [`Page::from_parts`].
    fn try_from(j: JsonPage) -> Result<Page, PageError> {
        let bytes = BASE64
            .decode(j.data_b64.as_bytes())
            .map_err(|_| PageError::Malformed("data_b64 is not base64"))?;
        let sha = parse_hex32(&j.sha256).ok_or(PageError::Malformed("sha256 is not 64 hex"))?;
        Page::from_parts(j.seq, j.kind, bytes, sha, j.exit)
    }
}

/// Parses 64 lowercase hex digits into 32 bytes.
pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let v = hex::decode(s).ok()?;
    v.try_into().ok()
}

/// A request from a provider to its supervisor over the unix socket.
///
/// Every request that can change the spool or the command (`pages` too,
/// for uniformity) carries the owner fence of the caller
/// ([`OwnerFence`], >= 1). The supervisor keeps the highest fence it was
/// shown and refuses a lower one with [`SocketResponse::StaleFence`],
/// changing nothing; an equal or higher fence is served (and becomes the
/// highest). `status` changes nothing and carries none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketRequest {
    /// The pages with `seq > after_seq`, in order, at most `max` (capped at
    /// [`PAGES_PER_REQUEST_MAX`]). Socket form: tag 1, fence i64,
    /// after_seq i64, max u32 (big-endian).
    Pages {
        /// The caller's owner fence.
        fence: OwnerFence,
        /// Return pages after this seq (0 = from the first).
        after_seq: i64,
        /// The most pages to return.
        max: u32,
    },
    /// Drop every page with `seq <= through_seq` from the spool. Socket
    /// form: tag 2, fence i64, through_seq i64.
    Ack {
        /// The caller's owner fence.
        fence: OwnerFence,
        /// The last acknowledged seq.
        through_seq: i64,
    },
    /// Kill every process of the command (`SIGKILL`); the terminal page
    /// (signal 9, unless the command had already ended) follows once the
    /// pipes are drained. Idempotent. Socket form: tag 3, fence i64.
    Cancel {
        /// The caller's owner fence.
        fence: OwnerFence,
    },
    /// The spool's occupancy and the command's progress
    /// ([`SpoolStatus`]). Socket form: tag 4.
    Status,
    /// Write `bytes` to the command's stdin as input `input_seq` (the
    /// first is 1), then close stdin when `eof`. Exactly once per
    /// `input_seq`, in order: a repeated seq answers [`SocketResponse::Sent`]
    /// without writing again, a gap is refused `input_gap`. At most
    /// [`INPUT_BYTES_MAX`] bytes. Socket form: tag 5, fence i64,
    /// input_seq i64, eof u8 (0 or 1), u32 length, the bytes.
    Send {
        /// The caller's owner fence.
        fence: OwnerFence,
        /// The input's sequence number, >= 1.
        input_seq: i64,
        /// The bytes to write.
        bytes: Vec<u8>,
        /// Close the command's stdin after these bytes.
        eof: bool,
    },
    /// Kill every process of the command (`SIGKILL`, exactly as `cancel`)
    /// and end the stream with the stopped page ([`PageKind::Stopped`],
    /// the status the command ended with) instead of the terminal page,
    /// once the pipes are drained. Idempotent; a stop after the command
    /// ended (or after a cancel) kills nothing and the terminal page
    /// stays. Answered [`SocketResponse::Stopped`]. Socket form: tag 6,
    /// fence i64.
    Stop {
        /// The caller's owner fence.
        fence: OwnerFence,
    },
}

/// What a `stop` did ([`SocketResponse::Stopped`]). Socket form: u8,
/// 0 `killed`, 1 `already_stopped`, 2 `ended`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopOutcome {
    /// This request killed the command; the stopped page follows.
    Killed,
    /// An earlier stop killed it; nothing changed.
    AlreadyStopped,
    /// The command had ended (or a cancel was accepted) before any stop:
    /// nothing was killed and the terminal page is its last page.
    Ended,
}

impl StopOutcome {
    fn tag(self) -> u8 {
        match self {
            StopOutcome::Killed => 0,
            StopOutcome::AlreadyStopped => 1,
            StopOutcome::Ended => 2,
        }
    }

    fn from_tag(tag: u8) -> Result<StopOutcome, PageError> {
        match tag {
            0 => Ok(StopOutcome::Killed),
            1 => Ok(StopOutcome::AlreadyStopped),
            2 => Ok(StopOutcome::Ended),
            _ => Err(PageError::Malformed("unknown stop outcome")),
        }
    }
}

/// The most bytes one `send` request writes to a command's stdin: 64 KiB,
/// the size of one output page.
pub const INPUT_BYTES_MAX: usize = 65536;

/// A supervisor's spool occupancy and its command's progress, as the
/// `status` socket request reports it (the gateway exports it as a
/// metric). Socket form: thirteen big-endian fields, u64 pages, u64 bytes,
/// u64 pages_max, u64 bytes_max, i64 next_seq, i64 acked_through,
/// i64 highest_fence, i64 terminal_seq (0 = none yet), i64 input_seq,
/// i64 stopped_seq (0 = none yet), u8 command_exited, u8 cancelled,
/// u8 stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolStatus {
    /// Pages spooled and not yet acknowledged (the terminal page included).
    pub pages: u64,
    /// Bytes of page data spooled and not yet acknowledged.
    pub bytes: u64,
    /// The spool's bound on pages.
    pub pages_max: u64,
    /// The spool's bound on bytes.
    pub bytes_max: u64,
    /// The seq the next page gets.
    pub next_seq: i64,
    /// Every page up to this seq has been acknowledged and dropped.
    pub acked_through: i64,
    /// The highest owner fence shown (0 = none yet).
    pub highest_fence: i64,
    /// The terminal page's seq, 0 while it is not appended.
    pub terminal_seq: i64,
    /// Whether the command itself has exited (or was killed) and been reaped.
    pub command_exited: bool,
    /// Whether a `cancel` was accepted while the command ran.
    pub cancelled: bool,
    /// The highest input seq a `send` had accepted (`first_input_seq - 1`
    /// before the first).
    pub input_seq: i64,
    /// The stopped page's seq, 0 while it is not appended.
    #[serde(default)]
    pub stopped_seq: i64,
    /// Whether a `stop` was accepted while the command ran.
    #[serde(default)]
    pub stopped: bool,
}

/// A supervisor's answer to one [`SocketRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketResponse {
    /// The pages asked for (possibly none yet). Tag 1, u32 count, pages.
    Pages(Vec<Page>),
    /// The spool's acknowledged seq after the ack. Tag 2, i64.
    Acked {
        /// Every page with `seq <= acked_through` has been dropped.
        acked_through: i64,
    },
    /// The cancel was accepted. Tag 3, u8.
    Cancelled {
        /// `true` when this request killed the command; `false` for a no-op
        /// (already cancelled, or the command had already ended).
        killed: bool,
    },
    /// The spool's status. Tag 4, the [`SpoolStatus`] form.
    Status(SpoolStatus),
    /// The input is written (now or by an earlier request with the same
    /// seq). Tag 5, i64.
    Sent {
        /// The highest input seq written.
        input_seq: i64,
    },
    /// The stop was accepted. Tag 6, the [`StopOutcome`] form.
    Stopped {
        /// What it did.
        outcome: StopOutcome,
    },
    /// The request's fence is below the highest the supervisor was shown;
    /// nothing changed. Tag 254, presented i64, highest i64.
    StaleFence {
        /// The fence the request carried.
        presented: OwnerFence,
        /// The highest fence the supervisor was shown.
        highest: OwnerFence,
    },
    /// The request was refused. Tag 255, u16 length, the code in ASCII.
    Error {
        /// A stable snake_case code.
        code: String,
    },
}

impl SocketRequest {
    /// The request's frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(21);
        match self {
            SocketRequest::Pages {
                fence,
                after_seq,
                max,
            } => {
                out.push(1);
                out.extend_from_slice(&fence.0.to_be_bytes());
                out.extend_from_slice(&after_seq.to_be_bytes());
                out.extend_from_slice(&max.to_be_bytes());
            }
            SocketRequest::Ack { fence, through_seq } => {
                out.push(2);
                out.extend_from_slice(&fence.0.to_be_bytes());
                out.extend_from_slice(&through_seq.to_be_bytes());
            }
            SocketRequest::Cancel { fence } => {
                out.push(3);
                out.extend_from_slice(&fence.0.to_be_bytes());
            }
            SocketRequest::Status => out.push(4),
            SocketRequest::Send {
                fence,
                input_seq,
                bytes,
                eof,
            } => {
                out.push(5);
                out.extend_from_slice(&fence.0.to_be_bytes());
                out.extend_from_slice(&input_seq.to_be_bytes());
                out.push(u8::from(*eof));
                // At most INPUT_BYTES_MAX is decoded; a longer body is the
                // caller's bug and is refused by the decoder.
                out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
                out.extend_from_slice(bytes);
            }
            SocketRequest::Stop { fence } => {
                out.push(6);
                out.extend_from_slice(&fence.0.to_be_bytes());
            }
        }
        out
    }

    /// The request's owner fence, `None` for `status`.
    pub fn fence(&self) -> Option<OwnerFence> {
        match self {
            SocketRequest::Pages { fence, .. }
            | SocketRequest::Ack { fence, .. }
            | SocketRequest::Cancel { fence }
            | SocketRequest::Stop { fence }
            | SocketRequest::Send { fence, .. } => Some(*fence),
            SocketRequest::Status => None,
        }
    }

    /// Decodes a request frame body.
    ///
    /// # Errors
    /// [`PageError::Malformed`] for an unknown tag, a short body or trailing
    /// bytes; [`PageError::BadFence`] for a fence below 1;
    /// [`PageError::TooLarge`] for input over [`INPUT_BYTES_MAX`].
    pub fn decode(body: &[u8]) -> Result<SocketRequest, PageError> {
        let mut cur = Cursor { buf: body, pos: 0 };
        let fence = |cur: &mut Cursor<'_>| -> Result<OwnerFence, PageError> {
            let f = cur.i64()?;
            if f < 1 {
                return Err(PageError::BadFence(f));
            }
            Ok(OwnerFence(f))
        };
        let req = match cur.u8()? {
            1 => SocketRequest::Pages {
                fence: fence(&mut cur)?,
                after_seq: cur.i64()?,
                max: cur.u32()?,
            },
            2 => SocketRequest::Ack {
                fence: fence(&mut cur)?,
                through_seq: cur.i64()?,
            },
            3 => SocketRequest::Cancel {
                fence: fence(&mut cur)?,
            },
            4 => SocketRequest::Status,
            5 => {
                let fence = fence(&mut cur)?;
                let input_seq = cur.i64()?;
                let eof = match cur.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(PageError::Malformed("eof flag is not 0 or 1")),
                };
                let len = cur.u32()? as usize;
                if len > INPUT_BYTES_MAX {
                    return Err(PageError::TooLarge(len));
                }
                SocketRequest::Send {
                    fence,
                    input_seq,
                    bytes: cur.take(len)?.to_vec(),
                    eof,
                }
            }
            6 => SocketRequest::Stop {
                fence: fence(&mut cur)?,
            },
            _ => return Err(PageError::Malformed("unknown request tag")),
        };
        cur.finish()?;
        Ok(req)
    }
}

impl SpoolStatus {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.pages, self.bytes, self.pages_max, self.bytes_max] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        for v in [
            self.next_seq,
            self.acked_through,
            self.highest_fence,
            self.terminal_seq,
            self.input_seq,
            self.stopped_seq,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.push(u8::from(self.command_exited));
        out.push(u8::from(self.cancelled));
        out.push(u8::from(self.stopped));
    }

    fn decode(cur: &mut Cursor<'_>) -> Result<SpoolStatus, PageError> {
        let flag = |b: u8| match b {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(PageError::Malformed("status flag is not 0 or 1")),
        };
        Ok(SpoolStatus {
            pages: cur.u64()?,
            bytes: cur.u64()?,
            pages_max: cur.u64()?,
            bytes_max: cur.u64()?,
            next_seq: cur.i64()?,
            acked_through: cur.i64()?,
            highest_fence: cur.i64()?,
            terminal_seq: cur.i64()?,
            input_seq: cur.i64()?,
            stopped_seq: cur.i64()?,
            command_exited: flag(cur.u8()?)?,
            cancelled: flag(cur.u8()?)?,
            stopped: flag(cur.u8()?)?,
        })
    }
}

impl SocketResponse {
    /// The response's frame body.
    ///
    /// # Errors
    /// [`PageError::FrameTooLarge`] for more than [`PAGES_PER_REQUEST_MAX`]
    /// pages; [`PageError::Malformed`] for an error code over 64 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, PageError> {
        let mut out = Vec::new();
        match self {
            SocketResponse::Pages(pages) => {
                if pages.len() > PAGES_PER_REQUEST_MAX as usize {
                    return Err(PageError::FrameTooLarge(pages.len()));
                }
                out.push(1);
                out.extend_from_slice(&(pages.len() as u32).to_be_bytes());
                for p in pages {
                    p.encode(&mut out);
                }
            }
            SocketResponse::Acked { acked_through } => {
                out.push(2);
                out.extend_from_slice(&acked_through.to_be_bytes());
            }
            SocketResponse::Cancelled { killed } => {
                out.push(3);
                out.push(u8::from(*killed));
            }
            SocketResponse::Status(s) => {
                out.push(4);
                s.encode(&mut out);
            }
            SocketResponse::Sent { input_seq } => {
                out.push(5);
                out.extend_from_slice(&input_seq.to_be_bytes());
            }
            SocketResponse::Stopped { outcome } => {
                out.push(6);
                out.push(outcome.tag());
            }
            SocketResponse::StaleFence { presented, highest } => {
                out.push(254);
                out.extend_from_slice(&presented.0.to_be_bytes());
                out.extend_from_slice(&highest.0.to_be_bytes());
            }
            SocketResponse::Error { code } => {
                if code.len() > ERROR_CODE_BYTES_MAX {
                    return Err(PageError::Malformed("error code too long"));
                }
                out.push(255);
                out.extend_from_slice(&(code.len() as u16).to_be_bytes());
                out.extend_from_slice(code.as_bytes());
            }
        }
        Ok(out)
    }

    /// Decodes a response frame body; every page is checked.
    ///
    /// # Errors
    /// [`PageError::Malformed`] for a bad shape, else as [`Page::from_parts`].
    pub fn decode(body: &[u8]) -> Result<SocketResponse, PageError> {
        let mut cur = Cursor { buf: body, pos: 0 };
        let resp = match cur.u8()? {
            1 => {
                let n = cur.u32()?;
                if n > PAGES_PER_REQUEST_MAX {
                    return Err(PageError::Malformed("too many pages"));
                }
                let mut pages = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    pages.push(Page::decode(&mut cur)?);
                }
                SocketResponse::Pages(pages)
            }
            2 => SocketResponse::Acked {
                acked_through: cur.i64()?,
            },
            3 => SocketResponse::Cancelled {
                killed: match cur.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(PageError::Malformed("killed flag is not 0 or 1")),
                },
            },
            4 => SocketResponse::Status(SpoolStatus::decode(&mut cur)?),
            5 => SocketResponse::Sent {
                input_seq: cur.i64()?,
            },
            6 => SocketResponse::Stopped {
                outcome: StopOutcome::from_tag(cur.u8()?)?,
            },
            254 => SocketResponse::StaleFence {
                presented: OwnerFence(cur.i64()?),
                highest: OwnerFence(cur.i64()?),
            },
            255 => {
                let len = usize::from(cur.u16()?);
                if len > ERROR_CODE_BYTES_MAX {
                    return Err(PageError::Malformed("error code too long"));
                }
                let code = std::str::from_utf8(cur.take(len)?)
                    .map_err(|_| PageError::Malformed("error code not utf-8"))?
                    .to_owned();
                SocketResponse::Error { code }
            }
            _ => return Err(PageError::Malformed("unknown response tag")),
        };
        cur.finish()?;
        Ok(resp)
    }
}

/// Writes one frame: a big-endian u32 length, then `body`.
///
/// # Errors
/// [`PageError::FrameTooLarge`] over [`FRAME_BYTES_MAX`], [`PageError::Io`].
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> Result<(), PageError> {
    if body.len() > FRAME_BYTES_MAX {
        return Err(PageError::FrameTooLarge(body.len()));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)
        .map_err(|e| PageError::Io(e.to_string()))?;
    w.flush().map_err(|e| PageError::Io(e.to_string()))
}

/// Reads one frame written by [`write_frame`]; `Ok(None)` on a clean end of
/// stream before the length.
///
/// # Errors
/// [`PageError::FrameTooLarge`] for a length over [`FRAME_BYTES_MAX`]
/// (nothing more is read), [`PageError::Io`] for a failed or short read.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, PageError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(PageError::Io("end of stream inside a frame length".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(PageError::Io(e.to_string())),
        }
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(PageError::FrameTooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)
        .map_err(|e| PageError::Io(e.to_string()))?;
    Ok(Some(body))
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PageError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(PageError::Malformed("short frame"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], PageError> {
        self.take(N)?
            .try_into()
            .map_err(|_| PageError::Malformed("short frame"))
    }
    fn u8(&mut self) -> Result<u8, PageError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, PageError> {
        Ok(u16::from_be_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32, PageError> {
        Ok(u32::from_be_bytes(self.arr()?))
    }
    fn i32(&mut self) -> Result<i32, PageError> {
        Ok(i32::from_be_bytes(self.arr()?))
    }
    fn i64(&mut self) -> Result<i64, PageError> {
        Ok(i64::from_be_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, PageError> {
        Ok(u64::from_be_bytes(self.arr()?))
    }
    fn finish(&self) -> Result<(), PageError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(PageError::Malformed("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const HI_SHA: &str = "98ea6e4f216f2fb4b69fff9b3a44842c38686ca685f3f55dc48c5d3fb1107be4";

    #[test]
    fn data_page_has_the_sha256_of_its_bytes() {
        let p = Page::data(1, PageKind::Stdout, b"hi\n".to_vec()).unwrap();
        assert_eq!(hex::encode(p.sha256()), HI_SHA);
        assert_eq!(p.exit(), None);
        let t = Page::terminal(2, ExitStatus::exited(3)).unwrap();
        assert_eq!(hex::encode(t.sha256()), EMPTY_SHA);
        assert!(t.is_terminal());
    }

    #[test]
    fn socket_form_is_exact() {
        let p = Page::data(1, PageKind::Stdout, b"hi\n".to_vec()).unwrap();
        let t = Page::terminal(2, ExitStatus::signaled(9)).unwrap();
        let body = SocketResponse::Pages(vec![p.clone(), t.clone()])
            .encode()
            .unwrap();
        let mut want = vec![1, 0, 0, 0, 2];
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0, 0, 0, 3, b'h', b'i', b'\n']);
        want.extend_from_slice(&hex::decode(HI_SHA).unwrap());
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 2, 3, 2, 0, 0, 0, 0, 0, 0, 0, 9]);
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&hex::decode(EMPTY_SHA).unwrap());
        assert_eq!(body, want);
        assert_eq!(
            SocketResponse::decode(&body).unwrap(),
            SocketResponse::Pages(vec![p, t])
        );
    }

    #[test]
    fn requests_round_trip_exactly() {
        let r = SocketRequest::Pages {
            fence: OwnerFence(3),
            after_seq: 5,
            max: 7,
        };
        assert_eq!(
            r.encode(),
            vec![
                1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 7
            ]
        );
        assert_eq!(SocketRequest::decode(&r.encode()).unwrap(), r);
        let a = SocketRequest::Ack {
            fence: OwnerFence(1),
            through_seq: 256,
        };
        assert_eq!(
            a.encode(),
            vec![2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0]
        );
        assert_eq!(SocketRequest::decode(&a.encode()).unwrap(), a);
        let c = SocketRequest::Cancel {
            fence: OwnerFence(258),
        };
        assert_eq!(c.encode(), vec![3, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(SocketRequest::decode(&c.encode()).unwrap(), c);
        assert_eq!(SocketRequest::Status.encode(), vec![4]);
        assert_eq!(SocketRequest::decode(&[4]).unwrap(), SocketRequest::Status);
        assert_eq!(SocketRequest::Status.fence(), None);
        assert_eq!(c.fence(), Some(OwnerFence(258)));
        let snd = SocketRequest::Send {
            fence: OwnerFence(2),
            input_seq: 1,
            bytes: b"ab".to_vec(),
            eof: true,
        };
        assert_eq!(
            snd.encode(),
            vec![
                5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 2, b'a', b'b'
            ]
        );
        assert_eq!(SocketRequest::decode(&snd.encode()).unwrap(), snd);
        let e = SocketResponse::Error { code: "bad".into() };
        assert_eq!(e.encode().unwrap(), vec![255, 0, 3, b'b', b'a', b'd']);
        assert_eq!(SocketResponse::decode(&e.encode().unwrap()).unwrap(), e);
        let stale = SocketResponse::StaleFence {
            presented: OwnerFence(1),
            highest: OwnerFence(2),
        };
        assert_eq!(
            stale.encode().unwrap(),
            vec![254, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(
            SocketResponse::decode(&stale.encode().unwrap()).unwrap(),
            stale
        );
        let k = SocketResponse::Cancelled { killed: true };
        assert_eq!(k.encode().unwrap(), vec![3, 1]);
        assert_eq!(SocketResponse::decode(&k.encode().unwrap()).unwrap(), k);
        assert_eq!(
            SocketResponse::decode(&[3, 2]).unwrap_err().code(),
            "malformed_page"
        );
        let st = SocketResponse::Status(SpoolStatus {
            pages: 1,
            bytes: 2,
            pages_max: 3,
            bytes_max: 4,
            next_seq: 5,
            acked_through: 6,
            highest_fence: 7,
            terminal_seq: 8,
            command_exited: true,
            cancelled: false,
            input_seq: 9,
            stopped_seq: 10,
            stopped: true,
        });
        let body = st.encode().unwrap();
        assert_eq!(body.len(), 1 + 10 * 8 + 3);
        assert_eq!(&body[..9], &[4, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(
            &body[body.len() - 11..],
            &[0, 0, 0, 0, 0, 0, 0, 10, 1, 0, 1]
        );
        assert_eq!(SocketResponse::decode(&body).unwrap(), st);
        let sent = SocketResponse::Sent { input_seq: 9 };
        assert_eq!(
            SocketResponse::decode(&sent.encode().unwrap()).unwrap(),
            sent
        );
        let stop = SocketRequest::Stop {
            fence: OwnerFence(258),
        };
        assert_eq!(stop.encode(), vec![6, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(SocketRequest::decode(&stop.encode()).unwrap(), stop);
        assert_eq!(stop.fence(), Some(OwnerFence(258)));
        for (outcome, tag) in [
            (StopOutcome::Killed, 0),
            (StopOutcome::AlreadyStopped, 1),
            (StopOutcome::Ended, 2),
        ] {
            let r = SocketResponse::Stopped { outcome };
            assert_eq!(r.encode().unwrap(), vec![6, tag]);
            assert_eq!(SocketResponse::decode(&[6, tag]).unwrap(), r);
        }
        assert_eq!(
            SocketResponse::decode(&[6, 3]).unwrap_err().code(),
            "malformed_page"
        );
        let mut zero = stop.encode();
        zero[7] = 0;
        zero[8] = 0;
        assert_eq!(
            SocketRequest::decode(&zero).unwrap_err(),
            PageError::BadFence(0)
        );
    }

    #[test]
    fn the_stopped_page_is_last_has_no_bytes_and_crosses_both_forms() {
        let s = Page::stopped(41, ExitStatus::signaled(9)).unwrap();
        assert_eq!(
            (s.seq(), s.kind(), s.bytes(), s.exit()),
            (
                41,
                PageKind::Stopped,
                &b""[..],
                Some(ExitStatus::signaled(9))
            )
        );
        assert_eq!(hex::encode(s.sha256()), EMPTY_SHA);
        assert!(s.is_last() && !s.is_terminal());
        assert!(Page::terminal(1, ExitStatus::exited(0)).unwrap().is_last());
        assert!(!Page::data(1, PageKind::Stdout, vec![]).unwrap().is_last());
        assert_eq!(
            (PageKind::Stopped.as_str(), PageKind::Stopped.tag()),
            ("stopped", 4)
        );
        let body = SocketResponse::Pages(vec![s.clone()]).encode().unwrap();
        let mut want = vec![1, 0, 0, 0, 1];
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 41, 4, 2, 0, 0, 0, 0, 0, 0, 0, 9]);
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&hex::decode(EMPTY_SHA).unwrap());
        assert_eq!(body, want);
        assert_eq!(
            SocketResponse::decode(&body).unwrap(),
            SocketResponse::Pages(vec![s.clone()])
        );
        let j = serde_json::to_string(&s.to_json()).unwrap();
        assert_eq!(
            j,
            format!(
                r#"{{"seq":41,"kind":"stopped","data_b64":"","sha256":"{EMPTY_SHA}","exit":{{"code":null,"signal":9}}}}"#
            )
        );
        let back: JsonPage = serde_json::from_str(&j).unwrap();
        assert_eq!(Page::try_from(back).unwrap(), s);
        let check =
            |r: Result<Page, PageError>, code: &str| assert_eq!(r.unwrap_err().code(), code);
        check(Page::data(1, PageKind::Stopped, vec![]), "bad_exit");
        check(Page::stopped(0, ExitStatus::signaled(9)), "bad_seq");
        check(
            Page::from_parts(
                1,
                PageKind::Stopped,
                b"x".to_vec(),
                sha256(b"x"),
                Some(ExitStatus::signaled(9)),
            ),
            "bad_exit",
        );
        check(
            Page::stopped(
                1,
                ExitStatus {
                    code: None,
                    signal: None,
                },
            ),
            "bad_exit",
        );
    }

    #[test]
    fn fences_below_one_and_oversized_input_are_refused() {
        let mut zero = SocketRequest::Cancel {
            fence: OwnerFence(1),
        }
        .encode();
        zero[8] = 0;
        assert_eq!(
            SocketRequest::decode(&zero).unwrap_err(),
            PageError::BadFence(0)
        );
        let neg = SocketRequest::Ack {
            fence: OwnerFence(-1),
            through_seq: 1,
        }
        .encode();
        assert_eq!(SocketRequest::decode(&neg).unwrap_err().code(), "bad_fence");
        let big = SocketRequest::Send {
            fence: OwnerFence(1),
            input_seq: 1,
            bytes: vec![0; INPUT_BYTES_MAX + 1],
            eof: false,
        }
        .encode();
        assert_eq!(
            SocketRequest::decode(&big).unwrap_err(),
            PageError::TooLarge(INPUT_BYTES_MAX + 1)
        );
        let mut bad_eof = SocketRequest::Send {
            fence: OwnerFence(1),
            input_seq: 1,
            bytes: vec![],
            eof: false,
        }
        .encode();
        bad_eof[17] = 2;
        assert_eq!(
            SocketRequest::decode(&bad_eof).unwrap_err().code(),
            "malformed_page"
        );
    }

    #[test]
    fn frames_round_trip_and_refuse_oversize() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abc").unwrap();
        assert_eq!(buf, vec![0, 0, 0, 3, b'a', b'b', b'c']);
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some(b"abc".to_vec()));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        let huge = ((FRAME_BYTES_MAX + 1) as u32).to_be_bytes();
        assert_eq!(
            read_frame(&mut &huge[..]).unwrap_err(),
            PageError::FrameTooLarge(FRAME_BYTES_MAX + 1)
        );
        assert_eq!(
            read_frame(&mut &[0u8, 0][..]).unwrap_err().code(),
            "page_io"
        );
    }

    #[test]
    fn json_form_is_exact_and_checked() {
        let p = Page::data(3, PageKind::Stderr, b"hi\n".to_vec()).unwrap();
        let j = serde_json::to_string(&p.to_json()).unwrap();
        assert_eq!(
            j,
            format!(
                r#"{{"seq":3,"kind":"stderr","data_b64":"aGkK","sha256":"{HI_SHA}","exit":null}}"#
            )
        );
        let back: JsonPage = serde_json::from_str(&j).unwrap();
        assert_eq!(Page::try_from(back).unwrap(), p);
        let t = Page::terminal(4, ExitStatus::exited(0)).unwrap();
        assert_eq!(
            serde_json::to_string(&t.to_json()).unwrap(),
            format!(
                r#"{{"seq":4,"kind":"terminal","data_b64":"","sha256":"{EMPTY_SHA}","exit":{{"code":0,"signal":null}}}}"#
            )
        );
        let mut tampered = p.to_json();
        tampered.data_b64 = "aGkL".into();
        assert_eq!(
            Page::try_from(tampered).unwrap_err(),
            PageError::DigestMismatch(3)
        );
        let mut upper = p.to_json();
        upper.sha256 = HI_SHA.to_uppercase();
        assert_eq!(Page::try_from(upper).unwrap_err().code(), "malformed_page");
    }

    #[test]
    fn invariants_are_refused_with_codes() {
        let check =
            |r: Result<Page, PageError>, code: &str| assert_eq!(r.unwrap_err().code(), code);
        check(Page::data(0, PageKind::Stdout, vec![]), "bad_seq");
        check(
            Page::data(1, PageKind::Stdout, vec![0; PAGE_BYTES_MAX + 1]),
            "page_too_large",
        );
        assert!(Page::data(1, PageKind::Stdout, vec![0; PAGE_BYTES_MAX]).is_ok());
        check(Page::data(1, PageKind::Terminal, vec![]), "bad_exit");
        check(
            Page::terminal(
                1,
                ExitStatus {
                    code: Some(1),
                    signal: Some(2),
                },
            ),
            "bad_exit",
        );
        check(
            Page::terminal(
                1,
                ExitStatus {
                    code: None,
                    signal: None,
                },
            ),
            "bad_exit",
        );
        check(
            Page::from_parts(
                1,
                PageKind::Stdout,
                vec![],
                sha256(&[]),
                Some(ExitStatus::exited(0)),
            ),
            "bad_exit",
        );
        check(
            Page::from_parts(
                1,
                PageKind::Terminal,
                b"x".to_vec(),
                sha256(b"x"),
                Some(ExitStatus::exited(0)),
            ),
            "bad_exit",
        );
    }

    #[test]
    fn tampered_socket_pages_are_refused() {
        let p = Page::data(1, PageKind::Stdout, b"hi\n".to_vec()).unwrap();
        let mut body = SocketResponse::Pages(vec![p]).encode().unwrap();
        // The first data byte sits after tag, count and the page header.
        body[5 + 22] = b'H';
        assert_eq!(
            SocketResponse::decode(&body).unwrap_err(),
            PageError::DigestMismatch(1)
        );
        let mut trailing = SocketRequest::Ack {
            fence: OwnerFence(1),
            through_seq: 1,
        }
        .encode();
        trailing.push(0);
        assert_eq!(
            SocketRequest::decode(&trailing).unwrap_err().code(),
            "malformed_page"
        );
        assert_eq!(
            SocketRequest::decode(&[9]).unwrap_err().code(),
            "malformed_page"
        );
        assert_eq!(
            SocketResponse::decode(&[1, 0]).unwrap_err().code(),
            "malformed_page"
        );
        let too_many = [1, 0, 0, 0, 65];
        assert_eq!(
            SocketResponse::decode(&too_many).unwrap_err().code(),
            "malformed_page"
        );
    }
}
