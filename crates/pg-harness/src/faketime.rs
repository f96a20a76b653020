//! A wall clock that a test can step while the server runs (libfaketime).
//!
//! **How.** The postmaster, and only the postmaster (not `initdb`, not
//! `pg_isready`, not `setpriv`), is started with `LD_PRELOAD=<libfaketime.so.1>`
//! and `FAKETIME_TIMESTAMP_FILE=<server dir>/faketime.rc`. That file holds
//! one offset relative to the real clock, written by [`offset_spec`] as
//! `"+3600.000000000\n"` (sign, whole seconds, a nine-digit fraction).
//! `FAKETIME_NO_CACHE=1` makes libfaketime read the file on *every* clock
//! call of every server process (backends inherit the preload from the
//! postmaster's fork), so a rewrite is seen by the next `clock_timestamp()`,
//! in already open sessions too, without a restart. The file is replaced by
//! writing a temp file and renaming it over the old one, so a reader sees
//! the old offset or the new one, never a half-written line (a missing or
//! unparsable file would silently mean "real time" to libfaketime, or make
//! it print an error per call).
//!
//! **Only the wall clock.** `FAKETIME_DONT_FAKE_MONOTONIC=1` leaves
//! `CLOCK_MONOTONIC` alone (PostgreSQL's `instr_time`, used for EXPLAIN
//! ANALYZE and some waits), and `NO_FAKE_STAT=1` leaves file times alone:
//! with stat faking on, libfaketime takes a semaphore shared by all server
//! processes around every `stat()`, which a killed backend could leave
//! held. `CLOCK_REALTIME`, `gettimeofday` and `time` are faked: `now()`,
//! `clock_timestamp()`, the log's timestamps and every wall-clock deadline
//! of the server.
//!
//! **Why not `LD_PRELOAD` on `setpriv`.** When running as root the server
//! is started through `setpriv`. If `setpriv` itself loaded libfaketime,
//! the library's constructor would create its process-shared semaphore
//! (`/dev/shm/sem.faketime_sem_<pid>`, mode 0600) as *root* and export its
//! name in `FAKETIME_SHARED`; the postmaster, exec'd as `postgres`, then
//! fails to open it ("sem_open failed and recreation attempts failed:
//! Permission denied") and exits. So the variables are handed over by
//! `setpriv ... -- /usr/bin/env LD_PRELOAD=... postgres ...`: `env` execs
//! the postmaster in the same process, and only it loads the library.
//!
//! **Failure modes.** A step backwards delays every deadline the server
//! computes from the wall clock (`statement_timeout`, `lock_timeout`,
//! `deadlock_timeout`, `pg_sleep`, autovacuum and checkpoint scheduling) by
//! the step; a step forwards makes them fire early. libfaketime parses the
//! offset as a `double`, so whole seconds are exact but the fraction of a
//! large offset may be off by some nanoseconds. The offset stays in the
//! file across [`stop`](crate::PgServer::stop)/[`start`](crate::PgServer::start).

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::HarnessError;

/// Environment variable naming the `libfaketime.so.1` to preload, instead of
/// looking in [`FAKETIME_LIB_CANDIDATES`].
pub const FAKETIME_LIB_ENV: &str = "TOLLGATE_FAKETIME_LIB";

/// Where `libfaketime.so.1` is looked for, in order, when
/// [`FAKETIME_LIB_ENV`] is not set: Debian's and Ubuntu's multiarch
/// directories (package `libfaketime`), then the upstream `make install`
/// locations.
pub const FAKETIME_LIB_CANDIDATES: [&str; 6] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/libfaketime.so.1",
];

/// Name of the offset file inside the server's temp directory.
pub(crate) const OFFSET_FILE: &str = "faketime.rc";

/// Nanoseconds per second.
const NS_PER_S: u64 = 1_000_000_000;

/// The `libfaketime.so.1` the harness preloads: the file named by
/// [`FAKETIME_LIB_ENV`] if that is set and non-empty, otherwise the first
/// existing one of [`FAKETIME_LIB_CANDIDATES`].
///
/// # Errors
/// [`HarnessError::FaketimeNotFound`] naming what was tried and saying to
/// install the `libfaketime` package.
///
/// # Panics
/// Never.
///
/// ```no_run
/// let lib = tollgate_pg_harness::libfaketime().unwrap();
/// assert!(lib.ends_with("libfaketime.so.1"));
/// ```
pub fn libfaketime() -> Result<PathBuf, HarnessError> {
    let candidates: Vec<PathBuf> = FAKETIME_LIB_CANDIDATES.iter().map(PathBuf::from).collect();
    locate(std::env::var_os(FAKETIME_LIB_ENV), &candidates)
}

/// [`libfaketime`] with the override and the candidates given.
fn locate(env_override: Option<OsString>, candidates: &[PathBuf]) -> Result<PathBuf, HarnessError> {
    if let Some(path) = env_override.filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(HarnessError::FaketimeNotFound {
                detail: format!(
                    "{FAKETIME_LIB_ENV} is set to {}, which is not a file; install \
                     libfaketime (Debian: apt-get install libfaketime) or fix {FAKETIME_LIB_ENV}",
                    path.display()
                ),
            })
        };
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(HarnessError::FaketimeNotFound {
        detail: format!(
            "none of {} exists; install libfaketime (Debian: apt-get install libfaketime; \
             scripts/test.sh does) or set {FAKETIME_LIB_ENV} to its libfaketime.so.1",
            tried.join(", ")
        ),
    })
}

/// The libfaketime offset line for `offset_ns` nanoseconds: `+` or `-`,
/// whole seconds, `.`, nine fraction digits. `0` is `"+0.000000000"`.
pub(crate) fn offset_spec(offset_ns: i64) -> String {
    let sign = if offset_ns < 0 { '-' } else { '+' };
    let abs_ns = offset_ns.unsigned_abs();
    format!("{sign}{}.{:09}", abs_ns / NS_PER_S, abs_ns % NS_PER_S)
}

/// The fake clock of one server: the library to preload, the offset file
/// and the offset last written to it.
#[derive(Debug)]
pub(crate) struct FakeClock {
    lib: PathBuf,
    file: PathBuf,
    offset_ns: i64,
}

impl FakeClock {
    /// Writes offset 0 to `<dir>/faketime.rc`.
    pub(crate) fn create(lib: PathBuf, dir: &Path) -> Result<Self, HarnessError> {
        let mut clock = Self {
            lib,
            file: dir.join(OFFSET_FILE),
            offset_ns: 0,
        };
        clock.set_offset_ns(0)?;
        Ok(clock)
    }

    /// The offset last written, in nanoseconds (fake minus real).
    pub(crate) fn offset_ns(&self) -> i64 {
        self.offset_ns
    }

    /// Replaces the offset file atomically (temp file, then rename), mode
    /// 0644 so that the server account can read it.
    pub(crate) fn set_offset_ns(&mut self, offset_ns: i64) -> Result<(), HarnessError> {
        let tmp = self.file.with_extension("rc.tmp");
        let line = format!("{}\n", offset_spec(offset_ns));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(line.as_bytes())?;
            f.set_permissions(fs::Permissions::from_mode(0o644))
        });
        written.map_err(|e| HarnessError::io(format!("writing {}", tmp.display()), e))?;
        fs::rename(&tmp, &self.file).map_err(|e| {
            HarnessError::io(
                format!("renaming {} to {}", tmp.display(), self.file.display()),
                e,
            )
        })?;
        self.offset_ns = offset_ns;
        Ok(())
    }

    /// The variables the postmaster is started with.
    pub(crate) fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_PRELOAD", self.lib.clone().into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
            ("NO_FAKE_STAT", "1".into()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_spec_table() {
        for (offset_ns, expected) in [
            (0, "+0.000000000"),
            (1, "+0.000000001"),
            (-1, "-0.000000001"),
            (999_999_999, "+0.999999999"),
            (1_000_000_000, "+1.000000000"),
            (-1_500_000_000, "-1.500000000"),
            (3_600_000_000_000, "+3600.000000000"),
            (-3_600_000_000_000, "-3600.000000000"),
            (i64::MAX, "+9223372036.854775807"),
            (i64::MAX - 1, "+9223372036.854775806"),
            (i64::MIN, "-9223372036.854775808"),
            (i64::MIN + 1, "-9223372036.854775807"),
        ] {
            assert_eq!(offset_spec(offset_ns), expected, "{offset_ns}");
        }
    }

    #[test]
    fn library_lookup_prefers_the_override_then_the_first_existing_candidate() {
        let dir = std::env::temp_dir().join(format!("tollgate-pg-unit-{}-ft", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.so");
        let b = dir.join("b.so");
        fs::write(&b, "").unwrap();
        let missing = dir.join("missing.so");

        assert_eq!(locate(None, &[a.clone(), b.clone()]).unwrap(), b);
        assert_eq!(
            locate(Some("".into()), std::slice::from_ref(&b)).unwrap(),
            b
        );
        assert_eq!(
            locate(Some(b.clone().into()), std::slice::from_ref(&a)).unwrap(),
            b
        );

        let err = locate(Some(missing.clone().into()), std::slice::from_ref(&b)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "libfaketime not found: TOLLGATE_FAKETIME_LIB is set to {}, which is not a \
                 file; install libfaketime (Debian: apt-get install libfaketime) or fix \
                 TOLLGATE_FAKETIME_LIB",
                missing.display()
            )
        );
        let err = locate(None, &[a.clone(), missing.clone()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "libfaketime not found: none of {}, {} exists; install libfaketime (Debian: \
                 apt-get install libfaketime; scripts/test.sh does) or set \
                 TOLLGATE_FAKETIME_LIB to its libfaketime.so.1",
                a.display(),
                missing.display()
            )
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn offset_file_is_replaced_whole_and_world_readable() {
        let dir = std::env::temp_dir().join(format!("tollgate-pg-unit-{}-ftf", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut clock = FakeClock::create(PathBuf::from("/lib/x.so"), &dir).unwrap();
        let file = dir.join(OFFSET_FILE);
        assert_eq!(fs::read_to_string(&file).unwrap(), "+0.000000000\n");
        assert_eq!(clock.offset_ns(), 0);
        clock.set_offset_ns(-120_000_000_000).unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "-120.000000000\n");
        assert_eq!(clock.offset_ns(), -120_000_000_000);
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec![OFFSET_FILE.to_owned()]);
        let env: Vec<(&str, String)> = clock
            .env()
            .into_iter()
            .map(|(k, v)| (k, v.into_string().unwrap()))
            .collect();
        assert_eq!(
            env,
            vec![
                ("LD_PRELOAD", "/lib/x.so".to_owned()),
                ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
                ("FAKETIME_NO_CACHE", "1".to_owned()),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
                ("NO_FAKE_STAT", "1".to_owned()),
            ]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
