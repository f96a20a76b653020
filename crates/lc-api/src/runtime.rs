//! Runtime import over HTTP: the tarball body is handed to the runtime
//! store shared with the provider on this host, which validates and
//! unpacks it into its content-addressed directory and returns the
//! runtime's digest and canonical manifest.

use std::path::Path;

use axum::body::Bytes;
use lc_core::model::Digest;

use crate::error::ApiError;

/// What an import produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// SHA-256 of the canonical manifest.
    pub digest: Digest,
    /// The manifest.
    pub manifest: serde_json::Value,
}

/// Imports the tarball `body` into the runtime directory `dir`.
///
/// # Errors
/// [`ApiError::InvalidTarball`] for a tarball the runtime store refuses.
pub async fn import_tar(dir: &Path, body: Bytes) -> Result<Imported, ApiError> {
    let _ = (dir, body);
    Err(ApiError::RuntimeImportDisabled)
}
