//! Locating the PostgreSQL server binaries.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::HarnessError;

/// Environment variable that overrides binary discovery: a directory that
/// must contain `initdb` and `postgres` (and normally `pg_isready`).
pub const PG_BIN_ENV: &str = "TOLLGATE_PG_BIN";

/// Where Debian/Ubuntu's `postgresql-15` package puts the server binaries;
/// the directory used when [`PG_BIN_ENV`] is not set.
pub const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The directory under which other installed major versions are looked for
/// (`/usr/lib/postgresql/<version>/bin`) when [`DEFAULT_PG_BIN`] is unusable.
pub const PG_LIB_ROOT: &str = "/usr/lib/postgresql";

/// The major version the project targets and discovery prefers.
pub const PREFERRED_MAJOR: &str = "15";

/// Executables that a binary directory must contain to be usable.
const REQUIRED: [&str; 2] = ["initdb", "postgres"];

/// A directory holding a PostgreSQL installation's server binaries.
///
/// Construct it with [`PgBinaries::discover`] (the normal way),
/// [`PgBinaries::discover_in`] or [`PgBinaries::from_dir`]; each checks that
/// `initdb` and `postgres` exist and are executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    dir: PathBuf,
}

impl PgBinaries {
    /// Finds the binaries to use.
    ///
    /// If [`PG_BIN_ENV`] (`TOLLGATE_PG_BIN`) is set and non-empty, that
    /// directory is used and nothing else is tried. Otherwise this is
    /// [`PgBinaries::discover_in`]`(`[`PG_LIB_ROOT`]`)`: version 15 first,
    /// then the newest other installed version.
    ///
    /// # Errors
    /// [`HarnessError::BinariesNotFound`] naming every directory tried and
    /// what it lacked.
    pub fn discover() -> Result<Self, HarnessError> {
        match std::env::var_os(PG_BIN_ENV) {
            Some(dir) if !dir.is_empty() => {
                Self::from_dir(PathBuf::from(dir)).map_err(|err| match err {
                    HarnessError::BinariesNotFound { detail } => HarnessError::BinariesNotFound {
                        detail: format!("{PG_BIN_ENV} is set, but {detail}"),
                    },
                    other => other,
                })
            }
            _ => Self::discover_in(Path::new(PG_LIB_ROOT)),
        }
    }

    /// Looks for `<root>/15/bin`, then for `<root>/<version>/bin` for every
    /// other numerically named `<version>` directory, newest first, and
    /// returns the first one that holds `initdb` and `postgres`.
    ///
    /// # Errors
    /// [`HarnessError::BinariesNotFound`] naming every directory tried.
    pub fn discover_in(root: &Path) -> Result<Self, HarnessError> {
        let preferred = root.join(PREFERRED_MAJOR).join("bin");
        let mut tried = Vec::new();
        match Self::from_dir(&preferred) {
            Ok(found) => return Ok(found),
            Err(err) => tried.push(err_detail(err)),
        }

        let mut candidates: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                Some((version_key(&name)?, entry.path().join("bin")))
            })
            .filter(|(_, dir)| *dir != preferred)
            .collect();
        candidates.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, dir) in candidates {
            match Self::from_dir(&dir) {
                Ok(found) => return Ok(found),
                Err(err) => tried.push(err_detail(err)),
            }
        }
        Err(HarnessError::BinariesNotFound {
            detail: format!(
                "tried {}; install PostgreSQL {PREFERRED_MAJOR} (Debian: apt-get install \
                 postgresql-{PREFERRED_MAJOR}) or set {PG_BIN_ENV} to a directory holding \
                 initdb and postgres",
                tried.join("; ")
            ),
        })
    }

    /// Uses exactly `dir`.
    ///
    /// # Errors
    /// [`HarnessError::BinariesNotFound`] if `dir` lacks an executable
    /// `initdb` or `postgres`.
    pub fn from_dir(dir: impl Into<PathBuf>) -> Result<Self, HarnessError> {
        let dir = dir.into();
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|name| !is_executable(&dir.join(name)))
            .collect();
        if missing.is_empty() {
            Ok(Self { dir })
        } else {
            Err(HarnessError::BinariesNotFound {
                detail: format!(
                    "{} lacks an executable {}",
                    dir.display(),
                    missing.join(" and ")
                ),
            })
        }
    }

    /// The binary directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of `initdb`.
    pub fn initdb(&self) -> PathBuf {
        self.dir.join("initdb")
    }

    /// Path of `postgres` (the postmaster).
    pub fn postgres(&self) -> PathBuf {
        self.dir.join("postgres")
    }

    /// Path of `pg_isready`: the one in [`dir`](Self::dir) if present,
    /// otherwise the bare name, to be found on `PATH` (its protocol does not
    /// depend on the server version).
    pub fn pg_isready(&self) -> PathBuf {
        let local = self.dir.join("pg_isready");
        if is_executable(&local) {
            local
        } else {
            PathBuf::from("pg_isready")
        }
    }

    /// Path of `pg_basebackup` in [`dir`](Self::dir), which a
    /// [`PgPair`](crate::PgPair) needs (no fallback to `PATH`: a
    /// `pg_basebackup` older than the server refuses to copy it).
    ///
    /// # Errors
    /// [`HarnessError::BinariesNotFound`] if it is not there or not
    /// executable.
    pub fn pg_basebackup(&self) -> Result<PathBuf, HarnessError> {
        let path = self.dir.join("pg_basebackup");
        if is_executable(&path) {
            Ok(path)
        } else {
            Err(HarnessError::BinariesNotFound {
                detail: format!(
                    "{} lacks an executable pg_basebackup (Debian: it comes with \
                     postgresql-client-{PREFERRED_MAJOR})",
                    self.dir.display()
                ),
            })
        }
    }

    /// The full version reported by `postgres --version`, e.g. `"15.14"`.
    ///
    /// # Errors
    /// [`HarnessError::Io`] if it cannot be run,
    /// [`HarnessError::UnexpectedOutput`] if it fails or prints no version.
    pub fn version(&self) -> Result<String, HarnessError> {
        let program = self.postgres();
        let out = Command::new(&program)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| HarnessError::io(format!("running {} --version", program.display()), e))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match parse_version_output(&text) {
            Some(version) if out.status.success() => Ok(version),
            _ => Err(HarnessError::UnexpectedOutput {
                program,
                detail: format!(
                    "{}; stdout {text:?}; stderr {:?}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            }),
        }
    }

    /// The major version, e.g. `15`.
    ///
    /// # Errors
    /// As for [`version`](Self::version).
    pub fn major_version(&self) -> Result<u32, HarnessError> {
        let version = self.version()?;
        let digits: String = version.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().map_err(|_| HarnessError::UnexpectedOutput {
            program: self.postgres(),
            detail: format!("version {version:?} has no major number"),
        })
    }
}

fn err_detail(err: HarnessError) -> String {
    match err {
        HarnessError::BinariesNotFound { detail } => detail,
        other => other.to_string(),
    }
}

/// `"15"` → `[15]`, `"9.6"` → `[9, 6]`; anything not purely numeric → `None`.
fn version_key(name: &str) -> Option<Vec<u64>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Extracts `"15.14"` from `"postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n"`.
fn parse_version_output(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "(PostgreSQL)")?;
    let version = words.next()?;
    version
        .starts_with(|c: char| c.is_ascii_digit())
        .then(|| version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A scratch directory removed on drop (the crate has no tempfile dependency).
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("tollgate-pg-unit-{}-{tag}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn fake_bin(&self, version: &str, names: &[&str]) -> PathBuf {
            let bin = self.0.join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for name in names {
                let path = bin.join(name);
                fs::write(&path, "#!/bin/sh\n").unwrap();
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            }
            bin
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn prefers_15_even_when_newer_versions_exist() {
        let scratch = Scratch::new("prefer15");
        let v15 = scratch.fake_bin("15", &["initdb", "postgres"]);
        scratch.fake_bin("16", &["initdb", "postgres"]);
        assert_eq!(PgBinaries::discover_in(&scratch.0).unwrap().dir(), v15);
    }

    #[test]
    fn falls_back_to_newest_complete_other_version() {
        let scratch = Scratch::new("fallback");
        scratch.fake_bin("15", &["initdb"]); // incomplete
        scratch.fake_bin("17", &["postgres"]); // incomplete
        let v16 = scratch.fake_bin("16", &["initdb", "postgres"]);
        scratch.fake_bin("9.6", &["initdb", "postgres"]);
        fs::create_dir_all(scratch.0.join("common").join("bin")).unwrap();
        assert_eq!(PgBinaries::discover_in(&scratch.0).unwrap().dir(), v16);
    }

    #[test]
    fn non_executable_files_do_not_count() {
        let scratch = Scratch::new("noexec");
        let bin = scratch.fake_bin("15", &["initdb", "postgres"]);
        fs::set_permissions(bin.join("postgres"), fs::Permissions::from_mode(0o644)).unwrap();
        let err = PgBinaries::from_dir(&bin).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "PostgreSQL binaries not found: {} lacks an executable postgres",
                bin.display()
            )
        );
    }

    #[test]
    fn nothing_found_is_an_error_naming_what_was_tried() {
        let scratch = Scratch::new("empty");
        let err = PgBinaries::discover_in(&scratch.0).unwrap_err();
        let HarnessError::BinariesNotFound { detail } = &err else {
            panic!("wrong variant: {err:?}");
        };
        let expected_start = format!(
            "tried {} lacks an executable initdb and postgres; install PostgreSQL 15",
            scratch.0.join("15").join("bin").display()
        );
        assert!(detail.starts_with(&expected_start), "{detail}");
        assert!(detail.contains("TOLLGATE_PG_BIN"), "{detail}");
    }

    #[test]
    fn pg_basebackup_must_be_in_the_directory() {
        let scratch = Scratch::new("basebackup");
        let bin = scratch.fake_bin("15", &["initdb", "postgres"]);
        let bins = PgBinaries::from_dir(&bin).unwrap();
        assert_eq!(
            bins.pg_basebackup().unwrap_err().to_string(),
            format!(
                "PostgreSQL binaries not found: {} lacks an executable pg_basebackup \
                 (Debian: it comes with postgresql-client-15)",
                bin.display()
            )
        );
        scratch.fake_bin("15", &["pg_basebackup"]);
        assert_eq!(bins.pg_basebackup().unwrap(), bin.join("pg_basebackup"));
    }

    #[test]
    fn missing_directory_is_an_error() {
        let err = PgBinaries::from_dir("/nonexistent/tollgate/bin").unwrap_err();
        assert_eq!(
            err.to_string(),
            "PostgreSQL binaries not found: /nonexistent/tollgate/bin lacks an executable \
             initdb and postgres"
        );
    }

    #[test]
    fn version_keys_and_output_parse() {
        assert_eq!(version_key("15"), Some(vec![15]));
        assert_eq!(version_key("9.6"), Some(vec![9, 6]));
        assert_eq!(version_key("common"), None);
        assert_eq!(
            parse_version_output("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n"),
            Some("15.14".to_owned())
        );
        assert_eq!(
            parse_version_output("postgres (PostgreSQL) 16beta1\n"),
            Some("16beta1".to_owned())
        );
        assert_eq!(parse_version_output("garbage"), None);
    }
}
