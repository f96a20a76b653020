//! Runtime import over HTTP: the tarball body is handed to the runtime
//! store shared with the provider on this host
//! ([`lc_provider::runtime::RuntimeStore`]), which validates it (relative
//! clean paths only, no device, fifo, socket or hard link, every symlink
//! inside the tree, entry and byte bounds) and unpacks it into its
//! content-addressed directory, or leaves nothing behind. Its digest (the
//! SHA-256 of the canonical manifest) and manifest are then registered in
//! the store.

use std::path::{Path, PathBuf};

use axum::body::Bytes;
use lc_core::model::Digest;
use lc_provider::runtime::{ImportError, ImportLimits, RuntimeStore};

use crate::error::ApiError;
use crate::state::RUNTIME_TAR_BYTES_MAX;

/// What an import produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// SHA-256 of the canonical manifest.
    pub digest: Digest,
    /// The canonical manifest as JSON.
    pub manifest: serde_json::Value,
}

/// The bounds of an HTTP import: the runtime store's entry bound, and no
/// more file bytes than the largest body ([`RUNTIME_TAR_BYTES_MAX`]).
pub fn http_limits() -> ImportLimits {
    ImportLimits {
        bytes_max: RUNTIME_TAR_BYTES_MAX as u64,
        ..ImportLimits::default()
    }
}

/// Imports the tarball `body` into the runtime directory `dir` (on a
/// blocking thread: it writes files).
///
/// # Errors
/// [`ApiError::InvalidTarball`] (422) for a tarball the runtime store
/// refuses, naming its code; [`ApiError::Internal`] (500) when the store's
/// directory fails.
pub async fn import_tar(dir: &Path, body: Bytes) -> Result<Imported, ApiError> {
    let dir: PathBuf = dir.to_owned();
    let imported = tokio::task::spawn_blocking(move || {
        RuntimeStore::open(&dir)?.import_tar(std::io::Cursor::new(body), http_limits())
    })
    .await
    .map_err(|e| ApiError::Internal(format!("runtime import task: {e}")))?
    .map_err(|e| match e {
        ImportError::Io(m) => ApiError::Internal(m),
        refused => ApiError::InvalidTarball(format!("{}: {refused}", refused.code())),
    })?;
    let manifest = serde_json::from_slice(&imported.manifest.canonical())
        .map_err(|e| ApiError::Internal(format!("manifest JSON: {e}")))?;
    Ok(Imported {
        digest: imported.digest,
        manifest,
    })
}
