//! The clap types of `lc`. Nothing here runs anything.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[path = "../ports.rs"]
mod ports;

/// Default server when neither `--server`, `LC_SERVER` nor `--data-dir`
/// names one: the appliance's (and `serve`'s) default port on loopback.
pub const DEFAULT_SERVER: &str = ports::DEFAULT_CONTROL_PLANE_URL;

/// `lc`: the Little Compute client.
#[derive(Debug, Parser)]
#[command(
    name = "lc",
    version,
    about = "lc: the Little Compute client (tenants, runtimes, execs, workspaces, scoped tokens and operation keys over the control plane's HTTP API)",
    after_help = "Exit status: 0 on success; 1 when the server refused or the request failed; exec create --wait and exec output --follow: the command's exit code (128 + signal), or 1 when the exec ended otherwise; exec hibernate/resume --wait: 0 once hibernated / running again, 1 when the exec ended instead or its restore was refused; 124 when a --wait, --follow or exec send gave up after --wait-timeout-s.",
    max_term_width = 100
)]
pub struct Cli {
    /// Where and as whom.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Print the server's JSON answer instead of a human table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The server, the credential and the acting tenant.
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// The control plane's base URL.
    #[arg(long, env = "LC_SERVER", value_name = "URL", global = true)]
    pub server: Option<String>,
    /// Bearer credential: the admin token, a tenant API key (`lc_...`) or
    /// a scoped token (`lct_...`).
    #[arg(
        long,
        env = "LC_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,
    /// An appliance's data directory: the URL and the admin token file come
    /// from `DIR/appliance.json` (`--server` and `--token` still win).
    #[arg(long, value_name = "DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    /// With the admin token: act for this tenant (`Lc-Tenant`).
    #[arg(long, value_name = "N", global = true)]
    pub tenant: Option<i64>,
    /// The `Idempotency-Key` of a mutating command (default: a fresh random
    /// key per invocation); the same key with the same request replays
    /// the original answer.
    #[arg(long, value_name = "KEY", global = true)]
    pub idempotency_key: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tenants: Tollgate accounts with capacity units.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Runtimes: root filesystem trees, by name and digest.
    #[command(subcommand)]
    Runtime(RuntimeCmd),
    /// Execs: sandboxed commands.
    #[command(subcommand)]
    Exec(ExecCmd),
    /// Operation keys and their recorded results.
    #[command(subcommand)]
    Operation(OperationCmd),
    /// Workspaces: the snapshots hibernation keeps of an exec's files.
    #[command(subcommand)]
    Workspace(WorkspaceCmd),
    /// Workers' claims on work items (admin token).
    #[command(subcommand)]
    Claim(ClaimCmd),
    /// Scoped tokens: credentials limited to some operations (and maybe
    /// one exec) until a deadline on the cut, to hand to an agent (which
    /// passes it as `--token` or `LC_TOKEN`).
    #[command(subcommand)]
    Token(TokenCmd),
    /// Approvals: execs that wait in `awaiting_approval`, holding no
    /// units, until approved (see `lc tenant approval-policy`).
    #[command(subcommand)]
    Approval(ApprovalCmd),
}

/// `lc token`.
#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Mint a token of the acting tenant (with its API key, or the admin
    /// token and --tenant); prints its secret once and its deadline.
    Mint {
        /// Bind it to this exec: it then acts only on that exec.
        #[arg(long, value_name = "N")]
        exec: Option<i64>,
        /// An operation it may perform (repeat for more): exec.create,
        /// exec.read, exec.input, exec.cancel, exec.hibernate, exec.resume,
        /// workspace.read, approval.decide.
        #[arg(long = "op", value_name = "OP", required = true)]
        ops: Vec<String>,
        /// How long it is accepted, on the cut: a number with a unit,
        /// `ms`, `s`, `m`, `h` or `d` (`90s`, `1h`, `7d`).
        #[arg(long, value_name = "DURATION", value_parser = parse_ttl_ms)]
        ttl: u64,
    },
    /// The acting tenant's tokens (never their secrets), oldest first.
    List {
        /// Only tokens after this id.
        #[arg(long)]
        after: Option<i64>,
        /// At most this many.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Revoke a token: it is refused from now on (revoking it again
    /// answers the same record).
    Revoke {
        /// The token.
        id: i64,
    },
}

/// Parses a `--ttl`: digits and one unit of `ms`, `s`, `m`, `h`, `d`,
/// into milliseconds (at least 1, without overflow).
///
/// # Errors
/// A message naming the accepted form.
pub fn parse_ttl_ms(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration such as 500ms, 90s, 15m, 1h or 7d");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    match n.checked_mul(per) {
        Some(ms) if ms >= 1 => Ok(ms),
        _ => Err(bad()),
    }
}

/// `lc claim`.
#[derive(Debug, Subcommand)]
pub enum ClaimCmd {
    /// Workers' claims on Leases, by Lease id: holder, generation, expiry
    /// on the cut, and whether the current cut has expired it or lets
    /// another worker take it (admin token).
    List {
        /// Only claims on Leases with a larger id.
        #[arg(long)]
        after_lease: Option<i64>,
        /// At most this many (1..=1000; default 100).
        #[arg(long)]
        limit: Option<usize>,
    },
}

/// `lc approval`.
#[derive(Debug, Subcommand)]
pub enum ApprovalCmd {
    /// The acting tenant's execs awaiting approval and its newest
    /// decisions.
    List {
        /// At most this many of each.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Approve an exec awaiting approval: it is admitted at once (its
    /// units held) and may start only while the cut is before the
    /// approval's `valid_until`; after that it ends `approval_expired`.
    Approve {
        /// The exec.
        exec: i64,
        /// How long the approval is valid on the cut: a number with `ms`,
        /// `s`, `m` or `h` (at most 1h; default: the server's, 15m unless
        /// configured).
        #[arg(long, value_name = "DURATION", value_parser = validity_ms)]
        valid_for: Option<u64>,
    },
    /// Deny an exec awaiting approval: it ends `denied`.
    Deny {
        /// The exec.
        exec: i64,
        /// Why (at most 512 bytes).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Parses `--valid-for`: a positive whole number followed by `ms`, `s`,
/// `m` or `h`, as milliseconds.
///
/// # Errors
/// A message naming the accepted form.
pub fn validity_ms(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration such as 500ms, 90s, 15m or 1h");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    match n.checked_mul(per) {
        Some(ms) if ms > 0 => Ok(ms),
        _ => Err(bad()),
    }
}

/// `lc workspace`.
#[derive(Debug, Subcommand)]
pub enum WorkspaceCmd {
    /// An exec's workspace: its head (the newest snapshot) and how many
    /// snapshots it holds.
    Show {
        /// The exec.
        id: i64,
    },
    /// An exec's snapshots, oldest first.
    Snapshots {
        /// The exec.
        id: i64,
        /// Only snapshots after this chain seq.
        #[arg(long)]
        after_seq: Option<i64>,
        /// At most this many.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Download a snapshot's files into DIR (which must not exist or be
    /// empty): every file's SHA-256 is verified, modes and symlinks are
    /// written as the snapshot holds them, and nothing is left in DIR
    /// unless every entry was written (they go to a temporary directory
    /// next to it, renamed into place at the end).
    Download {
        /// The exec.
        id: i64,
        /// The snapshot (64 hex digits; default: the workspace's head).
        #[arg(long, value_name = "H")]
        head: Option<String>,
        /// Where to put the files.
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
    },
    /// Delete a terminal exec's workspace: its snapshots are kept for the
    /// deletion grace (7 days by default) and restorable with `lc
    /// workspace undelete` until the purge; prints the deletion with its
    /// `purge_after` cut.
    Delete {
        /// The exec.
        id: i64,
    },
    /// Restore a deleted workspace before its purge, exactly as it was.
    Undelete {
        /// The exec.
        id: i64,
    },
}

/// `lc tenant`.
#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Create a tenant (admin); prints its id and API key.
    Create {
        /// Its name.
        #[arg(long)]
        name: String,
        /// Units to deposit at once (a negative value reaches the server,
        /// which refuses it as `invalid_units`).
        #[arg(long, allow_negative_numbers = true)]
        units: Option<i64>,
    },
    /// Deposit units (admin).
    Deposit {
        /// The tenant (default: `--tenant`).
        id: Option<i64>,
        /// Units to deposit (a negative value reaches the server, which
        /// refuses it as `invalid_units`).
        #[arg(long, allow_negative_numbers = true)]
        units: i64,
    },
    /// A tenant's balances.
    Show {
        /// The tenant (default: `--tenant`).
        id: Option<i64>,
    },
    /// Set which of a tenant's execs need an approval (admin): `--require
    /// off|network|all`, or `--shape NAME` (repeatable) for those shapes.
    ApprovalPolicy {
        /// The tenant (default: `--tenant`).
        id: Option<i64>,
        /// `off` (none), `network` (shapes whose network is on) or `all`.
        #[arg(long, value_parser = ["off", "network", "all"], conflicts_with = "shape",
              required_unless_present = "shape")]
        require: Option<String>,
        /// A shape that needs an approval (repeatable).
        #[arg(long, value_name = "NAME")]
        shape: Vec<String>,
    },
}

/// `lc runtime`.
#[derive(Debug, Subcommand)]
pub enum RuntimeCmd {
    /// Import a root filesystem from a tarball or a directory (admin).
    Import {
        /// The runtime's name.
        #[arg(long)]
        name: String,
        /// A tar file, or a directory (sent as a tarball).
        path: PathBuf,
    },
    /// Every registered runtime.
    List,
}

/// `lc exec`.
#[derive(Debug, Subcommand)]
pub enum ExecCmd {
    /// Admit an exec of COMMAND.
    Create {
        /// Runtime name or digest.
        #[arg(long, default_value = "base")]
        runtime: String,
        /// Shape name (`small`, `medium`, `small-net`).
        #[arg(long, default_value = "small")]
        shape: String,
        /// How long the command may run, milliseconds.
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Keep the command's stdin open for `lc exec send` until an
        /// `--eof` input (default: stdin is empty).
        #[arg(long)]
        stdin_open: bool,
        /// Hibernate the exec after this many milliseconds without
        /// activity (an output page or an input); default: never for
        /// idleness.
        #[arg(long)]
        idle_ttl_ms: Option<u64>,
        /// What `--timeout-ms` does when it runs out: `terminate` (the
        /// exec ends `expired`) or `hibernate` (it hibernates and may be
        /// resumed); default `terminate`.
        #[arg(long, value_parser = ["terminate", "hibernate"])]
        on_timeout: Option<String>,
        /// Wait until the exec is terminal and exit with the command's
        /// exit code.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (exit 124; at most
        /// 31536000, a year).
        #[arg(long, default_value_t = WAIT_SECS_DEFAULT, value_parser = wait_secs())]
        wait_timeout_s: u64,
        /// The argv, after `--`.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// One exec.
    Show {
        /// The exec.
        id: i64,
    },
    /// An exec's milestones, oldest first: the points of its attempts a
    /// recovery can restart from (each hibernation records one), with the
    /// cost and side effects observed up to each (`unknown` where the
    /// provider did not measure) and whether re-executing from it would be
    /// safe.
    Milestones {
        /// The exec.
        id: i64,
        /// Only milestones after this seq.
        #[arg(long)]
        after_seq: Option<u32>,
        /// At most this many.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// The acting tenant's execs, oldest first.
    List {
        /// Only execs after this id.
        #[arg(long)]
        after: Option<i64>,
        /// At most this many.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Write the exec's stdout bytes to stdout, exactly.
    Output {
        /// The exec.
        id: i64,
        /// Also write its stderr bytes to stderr.
        #[arg(long)]
        stderr: bool,
        /// Keep reading until the terminal page.
        #[arg(long)]
        follow: bool,
        /// Start after this page.
        #[arg(long, default_value_t = 0)]
        after_seq: i64,
        /// With `--follow`: give up after this many seconds (exit 124; at
        /// most 31536000, a year).
        #[arg(long, default_value_t = WAIT_SECS_DEFAULT, value_parser = wait_secs())]
        wait_timeout_s: u64,
        /// Instead of reading: delete the terminal exec's output (kept for
        /// the deletion grace, restorable with `--undelete` until the
        /// purge); prints the deletion.
        #[arg(long, conflicts_with_all = ["undelete", "follow", "stderr"])]
        delete: bool,
        /// Instead of reading: restore the deleted output before its
        /// purge, bytes unchanged.
        #[arg(long, conflicts_with_all = ["follow", "stderr"])]
        undelete: bool,
    },
    /// Send bytes to the stdin of an exec created with `--stdin-open`:
    /// `--data TEXT`, `--file PATH`, or `-` to read them from stdin. More
    /// than one input's worth (65536 bytes) is sent as several inputs in
    /// order, each under its own idempotency key derived from
    /// `--idempotency-key` (KEY-1, KEY-2, ...), so running the same command
    /// again with the same key sends nothing twice. Prints a table of the
    /// inputs (with `--json`: `{"inputs": [...]}`, each the server's answer).
    Send {
        /// The exec.
        id: i64,
        /// `-`: read the bytes from stdin (until it ends).
        #[arg(value_name = "-", conflicts_with_all = ["data", "file"])]
        stdin: Option<String>,
        /// The bytes, as this text.
        #[arg(long, value_name = "TEXT", conflicts_with = "file")]
        data: Option<String>,
        /// The bytes of this file.
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Close the command's stdin after the bytes (alone: close it now).
        #[arg(long)]
        eof: bool,
        /// While the exec's input queue is full, keep retrying for this many
        /// seconds, then give up (exit 124; at most 31536000, a year).
        #[arg(long, default_value_t = SEND_WAIT_SECS_DEFAULT, value_parser = wait_secs())]
        wait_timeout_s: u64,
    },
    /// Cancel an exec.
    Cancel {
        /// The exec.
        id: i64,
    },
    /// Hibernate a running exec: its command is stopped, its workspace
    /// snapshotted and its units returned; `lc exec resume` runs it again
    /// from the snapshot. Prints the hibernation.
    Hibernate {
        /// The exec.
        id: i64,
        /// Wait until it is hibernated (exit 124 after --wait-timeout-s).
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (exit 124; at most
        /// 31536000, a year).
        #[arg(long, default_value_t = WAIT_SECS_DEFAULT, value_parser = wait_secs())]
        wait_timeout_s: u64,
    },
    /// Resume a hibernated exec from its workspace's head (or --head H,
    /// which must be the head). Prints the recorded request.
    Resume {
        /// The exec.
        id: i64,
        /// The snapshot to resume from, 64 hex digits.
        #[arg(long, value_name = "H")]
        head: Option<String>,
        /// Wait until it runs again under this request (exit 1 if it ends
        /// instead; 124 after --wait-timeout-s).
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (exit 124; at most
        /// 31536000, a year).
        #[arg(long, default_value_t = WAIT_SECS_DEFAULT, value_parser = wait_secs())]
        wait_timeout_s: u64,
    },
}

/// `lc operation`.
#[derive(Debug, Subcommand)]
pub enum OperationCmd {
    /// An operation key's record.
    Show {
        /// The key.
        key: String,
    },
}

/// Default bound on `exec send` waiting for room in a full input queue:
/// a live gateway drains a full queue within a step (about a second), so
/// a minute of no room means no gateway is delivering.
pub const SEND_WAIT_SECS_DEFAULT: u64 = 60;

/// Default bound on `--wait` and `--follow`: one day, the longest an exec
/// is expected to live in this version.
pub const WAIT_SECS_DEFAULT: u64 = 86_400;

/// The largest `--wait-timeout-s`: a year, far beyond any exec's life (its
/// timeout is at most a day, and a Lease lives only while renewed), and
/// small enough that a deadline that far ahead is representable on the
/// monotonic clock of every platform; a larger value is a usage error
/// (exit 2), so no deadline computation can overflow.
pub const WAIT_SECS_MAX: u64 = 365 * 86_400;

/// The parser of `--wait-timeout-s`: `0..=`[`WAIT_SECS_MAX`].
fn wait_secs() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(0..=WAIT_SECS_MAX)
}
