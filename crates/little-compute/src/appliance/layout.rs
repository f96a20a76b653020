//! What the appliance keeps in its data directory, and the files it writes.
//!
//! ```text
//! DIR/                       0711: PostgreSQL's account must reach DIR/pg
//!   appliance.conf.json      ports chosen at the first `up`, reused after
//!   appliance.json           written by a running `up`: url, admin_token_file, pids
//!   secrets/                 0700, each file 0600, generated once
//!     admin-token            the control plane's admin bearer token
//!     server-secret          256 random bits (API key derivation, Tollgate's capability key)
//!     provider-token         the provider API's bearer token
//!     pg-superuser  pg-owner  pg-sampler   database passwords
//!   pg/                      the cluster (owned by PostgreSQL's account)
//!   provider/                the provider's state (keys, instances, fences, workspaces)
//!   runtimes/                the provider's runtime store
//!   logs/                    one log per process, appended
//! ```
//!
//! The sampler's account owns nothing here: its password reaches it in its
//! environment, and no path of the sampler lies under `provider/` or
//! `runtimes/`, the only trees any sandbox sees.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ApplianceError;

/// Bytes of a generated password or token before encoding: 256 bits.
const SECRET_BYTES: usize = 32;

/// The file layout of one data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `DIR`, absolute.
    pub root: PathBuf,
}

/// Ports chosen at the first `up` and reused by every later one, so URLs
/// (and the cluster's port) stay the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ports {
    /// PostgreSQL on 127.0.0.1.
    pub postgres: u16,
    /// The control plane on 127.0.0.1.
    pub control_plane: u16,
    /// The provider on 127.0.0.1 (0 until [`Layout::provider_port`]
    /// chooses it, just before the provider first starts).
    pub provider: u16,
}

/// `DIR/appliance.json`: what scripts (and `lc --data-dir`) read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// The control plane's base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// Absolute path of the admin token file.
    pub admin_token_file: PathBuf,
    /// The pids started, by name: `appliance` (the `up` process itself),
    /// `postgres`, `sampler` (absent with `--sampler external`), `serve`,
    /// `provider`, `worker`, `gateway`.
    pub pids: std::collections::BTreeMap<String, u32>,
}

impl Layout {
    /// The layout of `dir`, made absolute.
    ///
    /// # Errors
    /// [`ApplianceError::Io`] when the current directory cannot be read.
    pub fn new(dir: &Path) -> Result<Layout, ApplianceError> {
        let root = if dir.is_absolute() {
            dir.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| ApplianceError::io("reading the current directory", e))?
                .join(dir)
        };
        Ok(Layout { root })
    }

    /// `DIR/secrets`.
    pub fn secrets(&self) -> PathBuf {
        self.root.join("secrets")
    }
    /// The admin token file.
    pub fn admin_token_file(&self) -> PathBuf {
        self.secrets().join("admin-token")
    }
    /// The server secret file.
    pub fn server_secret_file(&self) -> PathBuf {
        self.secrets().join("server-secret")
    }
    /// The provider API's bearer token file.
    pub fn provider_token_file(&self) -> PathBuf {
        self.secrets().join("provider-token")
    }
    /// A database password file.
    pub fn password_file(&self, role: &str) -> PathBuf {
        self.secrets().join(format!("pg-{role}"))
    }
    /// `DIR/pg`.
    pub fn pg(&self) -> PathBuf {
        self.root.join("pg")
    }
    /// `DIR/provider`.
    pub fn provider(&self) -> PathBuf {
        self.root.join("provider")
    }
    /// `DIR/runtimes`.
    pub fn runtimes(&self) -> PathBuf {
        self.root.join("runtimes")
    }
    /// `DIR/blobs`: the sink of output pages, written by the gateway, and
    /// the blobs of workspace snapshots, written by the provider's
    /// quiescence and read by its restores; the control plane reads both.
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }
    /// `DIR/logs`.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// `DIR/appliance.json`.
    pub fn running_file(&self) -> PathBuf {
        self.root.join("appliance.json")
    }
    /// `DIR/appliance.conf.json`.
    pub fn ports_file(&self) -> PathBuf {
        self.root.join("appliance.conf.json")
    }

    /// Checks that every existing ancestor of `DIR` is searchable by
    /// others (when `pg_needs_access`: PostgreSQL's account must reach
    /// `DIR/pg`), then creates `DIR` (0711), `secrets/` (0700),
    /// `provider/`, `runtimes/`, `blobs/` and `logs/` (0700) when missing,
    /// then checks every ancestor again (one created now under a strict
    /// umask may not be searchable). A refusal found before creating
    /// anything leaves the file system as it was.
    ///
    /// # Errors
    /// [`ApplianceError::Io`]; [`ApplianceError::Setup`] naming an ancestor
    /// that others cannot search.
    pub fn prepare(&self, pg_needs_access: bool) -> Result<(), ApplianceError> {
        self.check_reachable(pg_needs_access)?;
        mkdir(&self.root, 0o711)?;
        for d in [
            self.secrets(),
            self.provider(),
            self.runtimes(),
            self.blobs(),
            self.logs(),
        ] {
            mkdir(&d, 0o700)?;
        }
        if pg_needs_access {
            self.check_ancestors(false)?;
        }
        Ok(())
    }

    /// Checks, before anything else of an `up` (a busy port may pass, an
    /// unreachable directory does not), that every existing ancestor of
    /// `DIR` is searchable by others when `pg_needs_access`.
    ///
    /// # Errors
    /// As [`Layout::prepare`]'s first check.
    pub fn check_reachable(&self, pg_needs_access: bool) -> Result<(), ApplianceError> {
        if pg_needs_access {
            self.check_ancestors(true)?;
        }
        Ok(())
    }

    /// Every ancestor of `DIR` is searchable by others; with
    /// `existing_only`, ancestors that do not exist yet are skipped.
    fn check_ancestors(&self, existing_only: bool) -> Result<(), ApplianceError> {
        {
            let mut p = self.root.parent();
            while let Some(dir) = p {
                let meta = match std::fs::metadata(dir) {
                    Err(e) if existing_only && e.kind() == std::io::ErrorKind::NotFound => {
                        p = dir.parent();
                        continue;
                    }
                    m => m,
                };
                let mode = meta
                    .map_err(|e| ApplianceError::io(format!("reading {}", dir.display()), e))?
                    .permissions()
                    .mode();
                if mode & 0o001 == 0 {
                    return Err(ApplianceError::Setup(format!(
                        "{} is not searchable by other users (mode {:o}), so PostgreSQL's \
                         account cannot reach {}; choose a data directory under a searchable \
                         path or chmod o+x it",
                        dir.display(),
                        mode & 0o7777,
                        self.pg().display()
                    )));
                }
                p = dir.parent();
            }
        }
        Ok(())
    }

    /// The secret in `path`, generated once (256 random bits, base64url
    /// with `prefix`, mode 0600) when the file does not exist.
    ///
    /// # Errors
    /// [`ApplianceError::Io`]; [`ApplianceError::Setup`] for an empty or
    /// non-UTF-8 file, or a file readable by others.
    pub fn secret(&self, path: &Path, prefix: &str) -> Result<String, ApplianceError> {
        if !path.exists() {
            let token = format!("{prefix}{}", random_b64url()?);
            write_private(path, token.as_bytes())?;
            return Ok(token);
        }
        let meta = std::fs::metadata(path)
            .map_err(|e| ApplianceError::io(format!("reading {}", path.display()), e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(ApplianceError::Setup(format!(
                "{} is readable by other users; chmod 600 it",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| ApplianceError::io(format!("reading {}", path.display()), e))?;
        let t = text.trim();
        if t.is_empty() {
            return Err(ApplianceError::Setup(format!(
                "{} is empty",
                path.display()
            )));
        }
        Ok(t.to_owned())
    }

    /// The ports: those recorded at the first `up`, or (first `up`) the
    /// control plane's `requested` port (0: a free one) and a free port for
    /// PostgreSQL, recorded now. The provider's is chosen later
    /// ([`Layout::provider_port`]).
    ///
    /// # Errors
    /// [`ApplianceError::Io`]; a malformed record.
    pub fn ports(&self, requested_control_plane: Option<u16>) -> Result<Ports, ApplianceError> {
        let path = self.ports_file();
        let mut ports = if path.exists() {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ApplianceError::io(format!("reading {}", path.display()), e))?;
            serde_json::from_str(&text).map_err(|e| {
                ApplianceError::Setup(format!("{} is malformed: {e}", path.display()))
            })?
        } else {
            Ports {
                postgres: free_port()?,
                control_plane: 0,
                provider: 0,
            }
        };
        match requested_control_plane {
            Some(0) => ports.control_plane = free_port()?,
            Some(p) => ports.control_plane = p,
            None if ports.control_plane == 0 => ports.control_plane = DEFAULT_CONTROL_PLANE_PORT,
            None => {}
        }
        let json = serde_json::to_vec_pretty(&ports).expect("ports serialize");
        write_replace(&path, &json, 0o644)?;
        Ok(ports)
    }

    /// The ports recorded by an earlier `up`, if any (nothing is written).
    ///
    /// # Errors
    /// [`ApplianceError::Io`]; a malformed record.
    pub fn recorded_ports(&self) -> Result<Option<Ports>, ApplianceError> {
        let path = self.ports_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                ApplianceError::Setup(format!("{} is malformed: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ApplianceError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// The provider's port: the recorded one, or (the first time) a free
    /// port chosen now and recorded. It is chosen just before the provider
    /// starts rather than at the first `ports` call, so the seconds
    /// PostgreSQL, the migrations and the control plane take to start are
    /// not a window in which another process's connection can take the
    /// port between its choice and the provider's bind.
    ///
    /// # Errors
    /// [`ApplianceError::Io`]; a malformed record.
    pub fn provider_port(&self, ports: &mut Ports) -> Result<u16, ApplianceError> {
        if ports.provider == 0 {
            ports.provider = free_port()?;
            let json = serde_json::to_vec_pretty(&*ports).expect("ports serialize");
            write_replace(&self.ports_file(), &json, 0o644)?;
        }
        Ok(ports.provider)
    }

    /// Reads `DIR/appliance.json`; `Ok(None)` when absent.
    ///
    /// # Errors
    /// [`ApplianceError::Io`]; a malformed file.
    pub fn read_running(&self) -> Result<Option<Running>, ApplianceError> {
        let path = self.running_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                ApplianceError::Setup(format!("{} is malformed: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ApplianceError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Writes `DIR/appliance.json` atomically (mode 0644: it holds no secret).
    ///
    /// # Errors
    /// [`ApplianceError::Io`].
    pub fn write_running(&self, running: &Running) -> Result<(), ApplianceError> {
        let json = serde_json::to_vec_pretty(running).expect("appliance.json serializes");
        write_replace(&self.running_file(), &json, 0o644)
    }
}

/// The control plane's port when `--listen` is not given at the first `up`
/// (the port `lc` looks at by default).
pub const DEFAULT_CONTROL_PLANE_PORT: u16 = crate::ports::DEFAULT_CONTROL_PLANE_PORT;

fn mkdir(dir: &Path, mode: u32) -> Result<(), ApplianceError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ApplianceError::io(format!("creating {}", dir.display()), e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ApplianceError::io(format!("chmod {}", dir.display()), e))
}

/// 256 random bits as unpadded base64url (43 characters).
///
/// # Errors
/// [`ApplianceError::Setup`] when the random source fails.
pub fn random_b64url() -> Result<String, ApplianceError> {
    let mut b = [0u8; SECRET_BYTES];
    getrandom::fill(&mut b).map_err(|e| ApplianceError::Setup(format!("random source: {e}")))?;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(43);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for byte in b {
        acc = (acc << 8) | u32::from(byte);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    Ok(out)
}

/// Creates `path` with mode 0600 and `bytes` (it must not exist).
///
/// # Errors
/// [`ApplianceError::Io`].
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ApplianceError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| ApplianceError::io(format!("creating {}", path.display()), e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| ApplianceError::io(format!("writing {}", path.display()), e))
}

/// Replaces `path` atomically (a temporary file beside it, renamed).
fn write_replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ApplianceError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| ApplianceError::io(format!("creating {}", tmp.display()), e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| ApplianceError::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| ApplianceError::io(format!("renaming {}", tmp.display()), e))
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> Result<u16, ApplianceError> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| ApplianceError::io("finding a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| ApplianceError::io("finding a free port", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_43_base64url_characters_and_generated_once() {
        let s = random_b64url().unwrap();
        assert_eq!(s.len(), 43);
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let dir = tempfile::tempdir().unwrap();
        let l = Layout::new(dir.path()).unwrap();
        l.prepare(false).unwrap();
        let a = l.secret(&l.admin_token_file(), "lcadm_").unwrap();
        let b = l.secret(&l.admin_token_file(), "lcadm_").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 6 + 43);
        let mode = std::fs::metadata(l.admin_token_file())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn ports_are_chosen_once() {
        let dir = tempfile::tempdir().unwrap();
        let l = Layout::new(dir.path()).unwrap();
        l.prepare(false).unwrap();
        let mut first = l.ports(Some(0)).unwrap();
        assert_ne!(first.control_plane, 0);
        assert_eq!(first.provider, 0);
        let provider = l.provider_port(&mut first).unwrap();
        assert_ne!(provider, 0);
        assert_eq!(l.provider_port(&mut first).unwrap(), provider);
        let again = l.ports(None).unwrap();
        assert_eq!(first, again);
    }
}
