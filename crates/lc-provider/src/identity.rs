//! The provider's Ed25519 identity: a 32-byte seed in `provider.key`
//! (64 lowercase hex digits and a newline), created `0600` on first start
//! and refused later if anyone but the owner can read it or its owner is
//! not the provider's user (a key a sandbox account owned, it could read).

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use ed25519_dalek::SigningKey;

use crate::ProviderError;

/// The key file's name inside the state directory.
pub const KEY_FILE: &str = "provider.key";

/// Loads the signing key at `path`, creating it (mode `0600`, fsynced) when
/// it does not exist.
///
/// # Errors
/// [`ProviderError::Io`] when the file cannot be read or written, is
/// readable by group or others, owned by another user than the caller's
/// effective one, or does not hold 64 hex digits.
pub fn load_or_create(path: &Path) -> Result<SigningKey, ProviderError> {
    match std::fs::metadata(path) {
        Ok(meta) => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if meta.uid() != me {
                return Err(ProviderError::io(
                    path.display(),
                    format!(
                        "key file is owned by uid {}, not by the provider (uid {me})",
                        meta.uid()
                    ),
                ));
            }
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(ProviderError::io(
                    path.display(),
                    "key file is accessible to group or others (want 0600)",
                ));
            }
            let text =
                std::fs::read_to_string(path).map_err(|e| ProviderError::io(path.display(), e))?;
            let mut seed = [0u8; 32];
            hex::decode_to_slice(text.trim_end(), &mut seed)
                .map_err(|_| ProviderError::io(path.display(), "key file is not 64 hex digits"))?;
            Ok(SigningKey::from_bytes(&seed))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| ProviderError::io("getrandom", e))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| ProviderError::io(path.display(), e))?;
            f.write_all(format!("{}\n", hex::encode(seed)).as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| ProviderError::io(path.display(), e))?;
            Ok(SigningKey::from_bytes(&seed))
        }
        Err(e) => Err(ProviderError::io(path.display(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_0600_and_reloaded() {
        let dir = std::env::temp_dir().join(format!("lc-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(KEY_FILE);
        let k1 = load_or_create(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap().len(), 65);
        let k2 = load_or_create(&path).unwrap();
        assert_eq!(k1.to_bytes(), k2.to_bytes());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load_or_create(&path).unwrap_err().code(), "provider_io");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        assert_eq!(
            load_or_create(&path).unwrap_err().to_string(),
            format!(
                "provider state: {}: key file is owned by uid 65534, not by the provider (uid 0)",
                path.display()
            )
        );
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
        std::fs::write(&path, "zz\n").unwrap();
        assert_eq!(load_or_create(&path).unwrap_err().code(), "provider_io");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
