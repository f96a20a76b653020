//! Little Compute's output sink: a content-addressed blob store.
//!
//! A blob is named by the SHA-256 of its bytes and nothing else. The
//! gateway writes each output page's bytes here before it commits the
//! page's ACK result; the control plane reads them back for clients.
//!
//! # Rules
//!
//! * **Names.** The only path component taken from input is the digest's
//!   64 lower-case hex digits: `DIR/sha256/<first 2 hex>/<64 hex>`. No
//!   caller-chosen name reaches the file system.
//! * **Durable put.** [`LocalBlobStore::put`] writes the bytes to a fresh
//!   temporary file in the blob's own directory, fsyncs it, renames it onto
//!   the blob's name (atomic on one file system) and fsyncs the directory,
//!   so after `put` returns the blob survives a crash of the host. Two
//!   concurrent puts of one blob each rename a complete file of the same
//!   bytes: either wins, both report success.
//! * **Idempotent put.** A put of a blob that already exists re-reads and
//!   verifies it: equal bytes are [`PutOutcome::Existing`]; a corrupt blob
//!   (bytes whose SHA-256 is not its name) is replaced and reported as
//!   [`PutOutcome::Replaced`].
//! * **Verified get.** [`LocalBlobStore::get`] re-checks the digest of what
//!   it read and answers [`BlobError::Corrupt`] (`blob_corrupt`) instead of
//!   wrong bytes.
//!
//! The API is synchronous std I/O; async callers run it on a blocking
//! thread (`tokio::task::spawn_blocking`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use lc_core::Digest;

pub mod tree;

/// The largest blob stored or read, in bytes: 16 MiB, far above one output
/// page (64 KiB), so a damaged file system can never make a read allocate
/// without bound.
pub const BLOB_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The directory under the store's root that holds SHA-256 named blobs.
const SHA256_DIR: &str = "sha256";

/// Random bytes in a temporary file's name (so concurrent puts of one blob
/// never share a temporary file).
const TEMP_NAME_RANDOM_BYTES: usize = 8;

/// A blob store's refusal or failure. Codes are stable: [`BlobError::code`].
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The stored bytes of `digest` do not hash to it (the file was damaged
    /// or replaced outside the store). Code `blob_corrupt`: put the blob
    /// again from its source.
    #[error("blob {digest} is corrupt: its bytes hash to {actual}; put it again from its source")]
    Corrupt {
        /// The blob's name.
        digest: Digest,
        /// What its stored bytes hash to.
        actual: Digest,
    },
    /// A put whose bytes do not hash to the digest given. Code
    /// `blob_digest_mismatch`; nothing was written.
    #[error("bytes hash to {actual}, not to the digest {digest} given; nothing was written")]
    DigestMismatch {
        /// The digest given.
        digest: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
    /// A blob larger than [`BLOB_BYTES_MAX`]. Code `blob_too_large`.
    #[error("blob of {bytes} bytes exceeds the {max}-byte bound")]
    TooLarge {
        /// Its size (or a lower bound of it, when read).
        bytes: usize,
        /// [`BLOB_BYTES_MAX`].
        max: usize,
    },
    /// The file system failed. Code `blob_io`: check the store directory's
    /// space and permissions, then retry.
    #[error("blob store I/O on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl BlobError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            BlobError::Corrupt { .. } => "blob_corrupt",
            BlobError::DigestMismatch { .. } => "blob_digest_mismatch",
            BlobError::TooLarge { .. } => "blob_too_large",
            BlobError::Io { .. } => "blob_io",
        }
    }

    fn io(path: &Path, source: io::Error) -> BlobError {
        BlobError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The blob was new and is now durable.
    Written,
    /// The blob already existed with the right bytes; nothing was written.
    Existing,
    /// The blob existed but was corrupt; it was replaced by the right bytes.
    Replaced,
}

/// A content-addressed blob store; see the crate docs.
pub trait BlobStore: Send + Sync {
    /// Makes `bytes` durable under `digest`.
    ///
    /// # Errors
    /// [`BlobError::DigestMismatch`] when `bytes` do not hash to `digest`,
    /// [`BlobError::TooLarge`], [`BlobError::Io`].
    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<PutOutcome, BlobError>;

    /// The bytes of `digest`, verified, or `None` when the store has no
    /// such blob.
    ///
    /// # Errors
    /// [`BlobError::Corrupt`] when the stored bytes do not hash to
    /// `digest`, [`BlobError::TooLarge`], [`BlobError::Io`].
    fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, BlobError>;
}

/// A [`BlobStore`] in a local directory: `DIR/sha256/ab/<64 hex>`.
#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    root: PathBuf,
}

impl LocalBlobStore {
    /// Opens (creating when missing) the store rooted at `dir`.
    ///
    /// # Errors
    /// [`BlobError::Io`] when `dir/sha256` cannot be created or is not a
    /// directory.
    pub fn open(dir: impl AsRef<Path>) -> Result<LocalBlobStore, BlobError> {
        let root = dir.as_ref().join(SHA256_DIR);
        fs::create_dir_all(&root).map_err(|e| BlobError::io(&root, e))?;
        let meta = fs::metadata(&root).map_err(|e| BlobError::io(&root, e))?;
        if !meta.is_dir() {
            return Err(BlobError::io(
                &root,
                io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        Ok(LocalBlobStore { root })
    }

    /// The file of `digest`: `DIR/sha256/<first 2 hex>/<64 hex>`.
    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        let hex = digest.to_hex();
        self.root.join(&hex[..2]).join(hex)
    }

    /// Reads `path`, at most [`BLOB_BYTES_MAX`] bytes; `None` when absent.
    fn read(path: &Path) -> Result<Option<Vec<u8>>, BlobError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(BlobError::io(path, e)),
        };
        let mut bytes = Vec::new();
        file.take(BLOB_BYTES_MAX as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| BlobError::io(path, e))?;
        if bytes.len() > BLOB_BYTES_MAX {
            return Err(BlobError::TooLarge {
                bytes: bytes.len(),
                max: BLOB_BYTES_MAX,
            });
        }
        Ok(Some(bytes))
    }

    /// Writes `bytes` durably onto `path` (temporary file, fsync, rename,
    /// fsync of the directory).
    fn write_durably(&self, digest: &Digest, path: &Path, bytes: &[u8]) -> Result<(), BlobError> {
        let shard = path.parent().unwrap_or(&self.root);
        if !shard.is_dir() {
            fs::create_dir_all(shard).map_err(|e| BlobError::io(shard, e))?;
            // The shard's own entry must be durable too.
            sync_dir(&self.root)?;
        }
        let mut random = [0u8; TEMP_NAME_RANDOM_BYTES];
        getrandom::fill(&mut random)
            .map_err(|e| BlobError::io(shard, io::Error::other(format!("random source: {e}"))))?;
        let temp = shard.join(format!(".tmp-{}-{}", digest.to_hex(), hex::encode(random)));
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)
                .map_err(|e| BlobError::io(&temp, e))?;
            f.write_all(bytes).map_err(|e| BlobError::io(&temp, e))?;
            f.sync_all().map_err(|e| BlobError::io(&temp, e))?;
            fs::rename(&temp, path).map_err(|e| BlobError::io(path, e))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written?;
        sync_dir(shard)
    }
}

fn sync_dir(dir: &Path) -> Result<(), BlobError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| BlobError::io(dir, e))
}

impl BlobStore for LocalBlobStore {
    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<PutOutcome, BlobError> {
        if bytes.len() > BLOB_BYTES_MAX {
            return Err(BlobError::TooLarge {
                bytes: bytes.len(),
                max: BLOB_BYTES_MAX,
            });
        }
        let actual = Digest::of(bytes);
        if actual != *digest {
            return Err(BlobError::DigestMismatch {
                digest: *digest,
                actual,
            });
        }
        let path = self.path_of(digest);
        let outcome = match Self::read(&path) {
            Ok(Some(existing)) if Digest::of(&existing) == *digest => {
                return Ok(PutOutcome::Existing);
            }
            Ok(Some(_)) | Err(BlobError::TooLarge { .. }) => PutOutcome::Replaced,
            Ok(None) => PutOutcome::Written,
            Err(e) => return Err(e),
        };
        self.write_durably(digest, &path, bytes)?;
        Ok(outcome)
    }

    fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, BlobError> {
        let path = self.path_of(digest);
        let Some(bytes) = Self::read(&path)? else {
            return Ok(None);
        };
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(BlobError::Corrupt {
                digest: *digest,
                actual,
            });
        }
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, LocalBlobStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalBlobStore::open(dir.path()).unwrap();
        (dir, s)
    }

    #[test]
    fn put_then_get_returns_the_exact_bytes_at_the_content_address() {
        let (dir, s) = store();
        let bytes = b"hello\n\xff\x00binary";
        let d = Digest::of(bytes);
        assert_eq!(s.put(&d, bytes).unwrap(), PutOutcome::Written);
        let hex = d.to_hex();
        let path = dir.path().join("sha256").join(&hex[..2]).join(&hex);
        assert_eq!(s.path_of(&d), path);
        assert_eq!(fs::read(&path).unwrap(), bytes.to_vec());
        assert_eq!(s.get(&d).unwrap(), Some(bytes.to_vec()));
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![hex]);
        // The empty blob is a blob too.
        let empty = Digest::of(b"");
        assert_eq!(s.put(&empty, b"").unwrap(), PutOutcome::Written);
        assert_eq!(s.get(&empty).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn a_second_put_is_existing_and_a_missing_blob_is_none() {
        let (_dir, s) = store();
        let d = Digest::of(b"page");
        assert_eq!(s.put(&d, b"page").unwrap(), PutOutcome::Written);
        assert_eq!(s.put(&d, b"page").unwrap(), PutOutcome::Existing);
        assert_eq!(s.get(&Digest::of(b"other")).unwrap(), None);
    }

    #[test]
    fn a_put_whose_bytes_do_not_hash_to_the_digest_writes_nothing() {
        let (_dir, s) = store();
        let d = Digest::of(b"right");
        let e = s.put(&d, b"wrong").unwrap_err();
        assert_eq!(e.code(), "blob_digest_mismatch");
        assert!(matches!(e, BlobError::DigestMismatch { digest, actual }
            if digest == d && actual == Digest::of(b"wrong")));
        assert_eq!(s.get(&d).unwrap(), None);
        assert!(!s.path_of(&d).exists());
    }

    #[test]
    fn a_corrupt_blob_is_refused_on_get_and_replaced_by_put() {
        let (_dir, s) = store();
        let d = Digest::of(b"original bytes");
        s.put(&d, b"original bytes").unwrap();
        fs::write(s.path_of(&d), b"original bytez").unwrap();
        let e = s.get(&d).unwrap_err();
        assert_eq!(e.code(), "blob_corrupt");
        assert!(matches!(e, BlobError::Corrupt { digest, actual }
            if digest == d && actual == Digest::of(b"original bytez")));
        assert_eq!(s.put(&d, b"original bytes").unwrap(), PutOutcome::Replaced);
        assert_eq!(s.get(&d).unwrap(), Some(b"original bytes".to_vec()));
        // A truncated blob likewise.
        fs::write(s.path_of(&d), b"").unwrap();
        assert_eq!(s.get(&d).unwrap_err().code(), "blob_corrupt");
        assert_eq!(s.put(&d, b"original bytes").unwrap(), PutOutcome::Replaced);
        assert_eq!(s.get(&d).unwrap(), Some(b"original bytes".to_vec()));
    }

    #[test]
    fn concurrent_puts_of_one_blob_all_succeed_with_the_same_bytes() {
        let (dir, s) = store();
        let bytes: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
        let d = Digest::of(&bytes);
        let outcomes: Vec<PutOutcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| s.put(&d, &bytes).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outcomes.len(), 8);
        assert!(outcomes.contains(&PutOutcome::Written), "{outcomes:?}");
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, PutOutcome::Written | PutOutcome::Existing)),
            "{outcomes:?}"
        );
        assert_eq!(s.get(&d).unwrap(), Some(bytes));
        let hex = d.to_hex();
        let names: Vec<_> = fs::read_dir(dir.path().join("sha256").join(&hex[..2]))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![hex]);
    }

    #[test]
    fn oversized_blobs_are_refused_with_their_code() {
        let (_dir, s) = store();
        let big = vec![0u8; BLOB_BYTES_MAX + 1];
        let e = s.put(&Digest::of(&big), &big).unwrap_err();
        assert_eq!(e.code(), "blob_too_large");
        assert_eq!(
            e.to_string(),
            format!(
                "blob of {} bytes exceeds the {BLOB_BYTES_MAX}-byte bound",
                BLOB_BYTES_MAX + 1
            )
        );
    }

    #[test]
    fn open_refuses_a_root_that_is_a_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("sha256"), b"x").unwrap();
        let e = LocalBlobStore::open(dir.path()).unwrap_err();
        assert_eq!(e.code(), "blob_io");
    }
}
