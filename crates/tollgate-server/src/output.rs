//! Standard output of the `tollgate` binary: one line at a time, never a
//! panic, and never a silent loss.
//!
//! `println!` panics when the reader went away (`tollgate audit | head -1`).
//! Here:
//!
//! * [`line()`] writes and flushes one line and returns any failure;
//! * [`print()`] is [`line()`] for the CLI's results: a reader that went away
//!   (broken pipe) ends the output quietly, as a shell pipeline expects;
//!   any other failure (a full disk) is remembered, and [`failure()`] makes
//!   the command exit 1 instead of 0 with its output lost;
//! * [`discarded()`] tells whether standard output goes to `/dev/null`. A
//!   descriptor 1 that was closed at start (`tollgate serve >&-`) is one of
//!   those: Rust's runtime reopens a closed standard descriptor on
//!   `/dev/null` before `main`. Output meant to be seen exactly once (a
//!   generated admin token) checks it.

use std::io::Write as _;
use std::sync::Mutex;

/// The first output failure that was not a broken pipe.
static FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Whether standard output is `/dev/null` (or was closed at start, which
/// the runtime turns into `/dev/null`), so whatever is written is lost.
/// Linux only, through `/proc/self/fd/1`; elsewhere `false`.
pub fn discarded() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_link("/proc/self/fd/1")
            .is_ok_and(|target| target == std::path::Path::new("/dev/null"))
}

/// Writes one line to standard output and flushes it.
///
/// # Errors
/// The write's or the flush's error.
pub fn line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{args}")?;
    out.flush()
}

/// [`line()`] for a command's result: a broken pipe is ignored, any other
/// failure is remembered for [`failure()`].
pub fn print(args: std::fmt::Arguments<'_>) {
    match line(args) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            let mut f = FAILURE.lock().unwrap_or_else(|p| p.into_inner());
            f.get_or_insert_with(|| e.to_string());
        }
    }
}

/// The first output failure [`print()`] met (not a broken pipe), if any.
pub fn failure() -> Option<String> {
    FAILURE.lock().unwrap_or_else(|p| p.into_inner()).clone()
}
