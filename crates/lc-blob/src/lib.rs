//! Little Compute's blob store: content-addressed blobs for output pages
//! and workspace snapshots.
//!
//! A blob is named by the SHA-256 of its bytes and nothing else. It has two
//! kinds of user:
//!
//! * **The output sink.** The gateway writes each output page's bytes here
//!   ([`BlobStore::put`]) before it commits the page's ACK result; the
//!   control plane reads them back for clients ([`BlobStore::get`]). A page
//!   is small, so these calls take and give whole byte slices of at most
//!   [`BLOB_BYTES_MAX`].
//! * **Workspace snapshots.** [`tree`] walks a workspace directory into a
//!   manifest whose every file is one blob, and restores a manifest all or
//!   nothing. Workspace files may be far larger than memory, so they go
//!   through the streaming calls [`BlobStore::put_reader`] and
//!   [`BlobStore::copy_to`], which hold blobs up to
//!   [`STREAM_BLOB_BYTES_MAX`] and move their bytes through one buffer of at
//!   most [`STREAM_BUFFER_BYTES`]: memory never holds a whole blob, whatever
//!   its size.
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
//! * **Durable streaming put.** [`LocalBlobStore::put_reader`] copies its
//!   reader into a fresh temporary file `DIR/sha256/.tmp-stream-<16 hex>`,
//!   hashing the bytes as it writes them, fsyncs it, renames it onto the
//!   name of the digest it computed and fsyncs that directory: the same
//!   rule, and the digest it gives is of exactly the bytes stored. A reader
//!   that ends within the first buffer is put as `put` puts a slice (so an
//!   unchanged small file costs no write).
//! * **Idempotent put.** A put of a blob that already exists re-reads and
//!   verifies it: equal bytes are [`PutOutcome::Existing`]; a corrupt blob
//!   (bytes whose SHA-256 is not its name) is replaced and reported as
//!   [`PutOutcome::Replaced`]. A streaming put of a larger blob that exists
//!   renames its own fresh copy over it instead of reading the old one
//!   ([`PutOutcome::Existing`]): one file either way, and a damaged copy is
//!   healed without a second read.
//! * **Verified get.** [`LocalBlobStore::get`] re-checks the digest of what
//!   it read and answers [`BlobError::Corrupt`] (`blob_corrupt`) instead of
//!   wrong bytes. [`LocalBlobStore::copy_to`] checks the blob's length
//!   before it writes a byte ([`BlobError::WrongSize`], also
//!   `blob_corrupt`) and its SHA-256 after the last: what it wrote is
//!   unverified until it returns `Ok(Some(_))`, so its caller writes where
//!   nothing uses the bytes before then (a restore builds its tree in a
//!   private directory).
//!
//! The API is synchronous std I/O; async callers run it on a blocking
//! thread (`tokio::task::spawn_blocking`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use lc_core::Digest;
use sha2::Digest as _;

pub mod tree;

/// The largest blob [`BlobStore::put`] stores and [`BlobStore::get`] reads,
/// in bytes: 16 MiB, far above one output page (64 KiB), so a damaged file
/// system can never make a read allocate without bound.
pub const BLOB_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The largest blob [`BlobStore::put_reader`] stores and
/// [`BlobStore::copy_to`] reads, in bytes: 8 GiB. A streaming call holds one
/// buffer of at most [`STREAM_BUFFER_BYTES`] whatever the blob's size, so
/// this bound is not on memory but on one blob's disk and time: a put holds
/// a temporary file of up to this size in the store until it is renamed,
/// and a copy writes up to this many bytes before their digest is known.
/// 8 GiB holds the large single files a workspace holds (a 5 GB model-weight
/// shard, a dataset part, a git pack) with room to spare.
pub const STREAM_BLOB_BYTES_MAX: u64 = 8 << 30;

/// The most bytes a streaming call reads or writes at a time: 1 MiB. Its
/// buffer grows to this size (at most twice it) and no further; a put whose
/// reader ends within one buffer is a put of that slice.
pub const STREAM_BUFFER_BYTES: usize = 1 << 20;

// A reader that ends within one buffer is put as a slice.
const _: () = assert!(STREAM_BUFFER_BYTES <= BLOB_BYTES_MAX);

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
    /// The stored blob of `digest` is not as long as expected (it was
    /// truncated or extended outside the store, or is changing while read).
    /// Code `blob_corrupt`, as for wrong bytes: put the blob again from its
    /// source.
    #[error(
        "blob {digest} is corrupt: it holds {actual_bytes} bytes, not the {expected_bytes} expected; put it again from its source"
    )]
    WrongSize {
        /// The blob's name.
        digest: Digest,
        /// The length the caller expected, in bytes.
        expected_bytes: u64,
        /// The length found, in bytes (a lower bound of it when the blob
        /// grew while it was read).
        actual_bytes: u64,
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
    /// A blob over a bound: [`BLOB_BYTES_MAX`] for `put` and `get`, the
    /// caller's `bytes_max` or [`STREAM_BLOB_BYTES_MAX`] for the streaming
    /// calls. Code `blob_too_large`; nothing was stored.
    #[error("blob of {bytes} bytes exceeds the {max}-byte bound")]
    TooLarge {
        /// Its size (or a lower bound of it, when read).
        bytes: u64,
        /// The bound it exceeds.
        max: u64,
    },
    /// Reading the caller's reader during [`BlobStore::put_reader`] failed.
    /// Code `blob_input_io`; nothing was stored: fix the source and put it
    /// again.
    #[error("reading the bytes to put failed: {source}; nothing was stored")]
    Input {
        /// The reader's error.
        #[source]
        source: io::Error,
    },
    /// Writing to the caller's output during [`BlobStore::copy_to`] failed.
    /// Code `blob_output_io`; the output holds part of the blob: discard it,
    /// fix the output (its space, its permissions) and copy again.
    #[error("writing the blob's bytes to the output failed: {source}; discard what was written")]
    Output {
        /// The writer's error.
        #[source]
        source: io::Error,
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
            BlobError::Corrupt { .. } | BlobError::WrongSize { .. } => "blob_corrupt",
            BlobError::DigestMismatch { .. } => "blob_digest_mismatch",
            BlobError::TooLarge { .. } => "blob_too_large",
            BlobError::Input { .. } => "blob_input_io",
            BlobError::Output { .. } => "blob_output_io",
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
    /// The blob already existed. `put` found the right bytes and wrote
    /// nothing; a streaming put of a blob larger than one buffer renamed the
    /// copy it had just written and hashed over it (still one file).
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
    /// [`BlobError::TooLarge`] over [`BLOB_BYTES_MAX`], [`BlobError::Io`].
    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<PutOutcome, BlobError>;

    /// The bytes of `digest`, verified, or `None` when the store has no
    /// such blob.
    ///
    /// # Errors
    /// [`BlobError::Corrupt`] when the stored bytes do not hash to
    /// `digest`, [`BlobError::TooLarge`] over [`BLOB_BYTES_MAX`] (a blob
    /// stored by [`BlobStore::put_reader`] may be larger: read it with
    /// [`BlobStore::copy_to`]), [`BlobError::Io`].
    fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, BlobError>;

    /// Reads `reader` to its end and makes its bytes durable as one blob,
    /// moving them through one buffer of at most [`STREAM_BUFFER_BYTES`]:
    /// no more of the blob is ever in memory. Gives `(digest, size_bytes,
    /// outcome)`, the SHA-256 and length of exactly the bytes stored, which
    /// are durable when it returns.
    ///
    /// The blob may hold at most `bytes_max` bytes, and never more than
    /// [`STREAM_BLOB_BYTES_MAX`]; at most one buffer past that bound is read
    /// before the put is refused.
    ///
    /// # Errors
    /// [`BlobError::TooLarge`] when the reader gives more than the bound
    /// (`bytes` is how many were read, `max` the bound applied);
    /// [`BlobError::Input`] when the reader fails; [`BlobError::Io`]. After
    /// an error no new blob and no temporary file is left (unless removing
    /// it failed too).
    fn put_reader(
        &self,
        reader: &mut dyn Read,
        bytes_max: u64,
    ) -> Result<(Digest, u64, PutOutcome), BlobError>;

    /// Writes the blob `digest`, which must hold `expected_size` bytes, to
    /// `out` through one buffer of at most [`STREAM_BUFFER_BYTES`], and
    /// verifies it: its length before the first byte is written, its SHA-256
    /// after the last. Gives `Some(size_bytes)` once every byte is written
    /// and verified, `None` (nothing written) when the store has no such
    /// blob. `out` is neither flushed nor synced.
    ///
    /// The bytes written are **unverified until this returns
    /// `Ok(Some(_))`**: after an error `out` may hold part of the blob, or
    /// all of wrong bytes, and the caller discards them.
    ///
    /// # Errors
    /// [`BlobError::WrongSize`] when the blob is not `expected_size` bytes
    /// long (found before writing, or when it changes while read);
    /// [`BlobError::Corrupt`] when its bytes do not hash to `digest`;
    /// [`BlobError::TooLarge`] when `expected_size` is over
    /// [`STREAM_BLOB_BYTES_MAX`] (nothing is read); [`BlobError::Output`]
    /// when writing to `out` fails; [`BlobError::Io`].
    fn copy_to(
        &self,
        digest: &Digest,
        expected_size: u64,
        out: &mut dyn Write,
    ) -> Result<Option<u64>, BlobError>;
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
                bytes: bytes.len() as u64,
                max: BLOB_BYTES_MAX as u64,
            });
        }
        Ok(Some(bytes))
    }

    /// The directory of the blob file `path`, created when missing (its
    /// entry then made durable too).
    fn shard_of(&self, path: &Path) -> Result<PathBuf, BlobError> {
        let shard = path.parent().unwrap_or(&self.root).to_owned();
        if !shard.is_dir() {
            fs::create_dir_all(&shard).map_err(|e| BlobError::io(&shard, e))?;
            sync_dir(&self.root)?;
        }
        Ok(shard)
    }

    /// Writes `bytes` durably onto `path` (temporary file, fsync, rename,
    /// fsync of the directory).
    fn write_durably(&self, digest: &Digest, path: &Path, bytes: &[u8]) -> Result<(), BlobError> {
        let shard = self.shard_of(path)?;
        let temp = temp_path(&shard, &digest.to_hex())?;
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
        sync_dir(&shard)
    }

    /// Streams `chunk` (the reader's first bytes) and then the rest of
    /// `reader` into the fresh file `temp` through `chunk`, hashing what it
    /// writes, and renames it onto its digest's name; see
    /// [`BlobStore::put_reader`].
    fn stream_into(
        &self,
        temp: &Path,
        reader: &mut dyn Read,
        chunk: &mut Vec<u8>,
        max: u64,
    ) -> Result<(Digest, u64, PutOutcome), BlobError> {
        let io = |e| BlobError::io(temp, e);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(temp)
            .map_err(io)?;
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        // Every pass stores at least one byte and `size` is bounded by
        // `max`, so the loop ends.
        while !chunk.is_empty() {
            // Both terms are bounded (8 GiB and 1 MiB): no overflow.
            size += chunk.len() as u64;
            if size > max {
                return Err(BlobError::TooLarge { bytes: size, max });
            }
            hasher.update(&chunk[..]);
            file.write_all(chunk).map_err(io)?;
            read_chunk(reader, chunk).map_err(|source| BlobError::Input { source })?;
        }
        file.sync_all().map_err(io)?;
        drop(file);
        let digest = Digest(hasher.finalize().into());
        let path = self.path_of(&digest);
        let shard = self.shard_of(&path)?;
        let existed = match fs::symlink_metadata(&path) {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(BlobError::io(&path, e)),
        };
        // Over an existing blob too: this copy's bytes were just hashed, the
        // old one's were not.
        fs::rename(temp, &path).map_err(|e| BlobError::io(&path, e))?;
        // The blob's new name is in its shard; the temporary name was in the
        // root, and a crash before this leaves at most a stray temporary.
        sync_dir(&shard)?;
        let outcome = if existed {
            PutOutcome::Existing
        } else {
            PutOutcome::Written
        };
        Ok((digest, size, outcome))
    }
}

/// A fresh temporary file name in `dir`: `.tmp-<stem>-<16 hex>`.
fn temp_path(dir: &Path, stem: &str) -> Result<PathBuf, BlobError> {
    let mut random = [0u8; TEMP_NAME_RANDOM_BYTES];
    getrandom::fill(&mut random)
        .map_err(|e| BlobError::io(dir, io::Error::other(format!("random source: {e}"))))?;
    Ok(dir.join(format!(".tmp-{stem}-{}", hex::encode(random))))
}

/// Replaces `chunk` by the next at most [`STREAM_BUFFER_BYTES`] bytes of
/// `reader`; empty at its end. Shorter than the bound only at the end.
fn read_chunk(reader: &mut dyn Read, chunk: &mut Vec<u8>) -> io::Result<()> {
    chunk.clear();
    reader
        .take(STREAM_BUFFER_BYTES as u64)
        .read_to_end(chunk)
        .map(drop)
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
                bytes: bytes.len() as u64,
                max: BLOB_BYTES_MAX as u64,
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

    fn put_reader(
        &self,
        reader: &mut dyn Read,
        bytes_max: u64,
    ) -> Result<(Digest, u64, PutOutcome), BlobError> {
        let max = bytes_max.min(STREAM_BLOB_BYTES_MAX);
        let mut chunk = Vec::new();
        read_chunk(reader, &mut chunk).map_err(|source| BlobError::Input { source })?;
        if chunk.len() as u64 > max {
            return Err(BlobError::TooLarge {
                bytes: chunk.len() as u64,
                max,
            });
        }
        if chunk.len() < STREAM_BUFFER_BYTES {
            // The reader ended within one buffer: the whole blob is this
            // slice.
            let digest = Digest::of(&chunk);
            let outcome = self.put(&digest, &chunk)?;
            return Ok((digest, chunk.len() as u64, outcome));
        }
        let temp = temp_path(&self.root, "stream")?;
        let stored = self.stream_into(&temp, reader, &mut chunk, max);
        if stored.is_err() {
            let _ = fs::remove_file(&temp);
        }
        stored
    }

    fn copy_to(
        &self,
        digest: &Digest,
        expected_size: u64,
        out: &mut dyn Write,
    ) -> Result<Option<u64>, BlobError> {
        if expected_size > STREAM_BLOB_BYTES_MAX {
            return Err(BlobError::TooLarge {
                bytes: expected_size,
                max: STREAM_BLOB_BYTES_MAX,
            });
        }
        let path = self.path_of(digest);
        let io = |e| BlobError::io(&path, e);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let wrong_size = |actual_bytes| BlobError::WrongSize {
            digest: *digest,
            expected_bytes: expected_size,
            actual_bytes,
        };
        let stored = file.metadata().map_err(io)?.len();
        if stored != expected_size {
            return Err(wrong_size(stored));
        }
        // One byte past the size shows a blob that grew while read.
        let mut source = (&file).take(expected_size + 1);
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let mut chunk = Vec::new();
        // Every pass reads at least one byte of a bounded source, so the
        // loop ends.
        loop {
            read_chunk(&mut source, &mut chunk).map_err(io)?;
            if chunk.is_empty() {
                break;
            }
            size += chunk.len() as u64;
            if size > expected_size {
                return Err(wrong_size(size));
            }
            hasher.update(&chunk[..]);
            out.write_all(&chunk)
                .map_err(|source| BlobError::Output { source })?;
        }
        if size != expected_size {
            return Err(wrong_size(size));
        }
        let actual = Digest(hasher.finalize().into());
        if actual != *digest {
            return Err(BlobError::Corrupt {
                digest: *digest,
                actual,
            });
        }
        Ok(Some(size))
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

    /// `len` bytes of a fixed xorshift sequence (no two buffers alike).
    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// A reader that gives `good` bytes, then fails.
    struct FailingReader {
        good: usize,
    }

    impl Read for FailingReader {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.good == 0 {
                return Err(io::Error::other("source gone"));
            }
            let n = buf.len().min(self.good);
            buf[..n].fill(7);
            self.good -= n;
            Ok(n)
        }
    }

    /// A writer that fails.
    struct FailingWriter;

    impl Write for FailingWriter {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("output full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn put_reader_streams_a_blob_of_many_buffers_under_its_digest() {
        let (dir, s) = store();
        let bytes = pattern(3 * STREAM_BUFFER_BYTES + 17, 1);
        let d = Digest::of(&bytes);
        let len = bytes.len() as u64;
        assert_eq!(len, 3_145_745);
        assert_eq!(
            s.put_reader(&mut &bytes[..], u64::MAX).unwrap(),
            (d, len, PutOutcome::Written)
        );
        assert_eq!(fs::read(s.path_of(&d)).unwrap(), bytes);
        // Only the blob's shard is in the root: no temporary file is left.
        let hex = d.to_hex();
        let root = dir.path().join("sha256");
        assert_eq!(names(&root), vec![hex[..2].to_owned()]);
        assert_eq!(names(&root.join(&hex[..2])), vec![hex.clone()]);
        // Out again, verified, byte for byte.
        let mut out = Vec::new();
        assert_eq!(s.copy_to(&d, len, &mut out).unwrap(), Some(len));
        assert_eq!(out, bytes);
        // The same bytes again are one blob.
        assert_eq!(
            s.put_reader(&mut &bytes[..], len).unwrap(),
            (d, len, PutOutcome::Existing)
        );
        assert_eq!(names(&root), vec![hex[..2].to_owned()]);
        assert_eq!(names(&root.join(&hex[..2])), vec![hex]);
        // A blob of exactly one buffer takes the streaming path too.
        let one = pattern(STREAM_BUFFER_BYTES, 2);
        let one_d = Digest::of(&one);
        assert_eq!(
            s.put_reader(&mut &one[..], STREAM_BUFFER_BYTES as u64)
                .unwrap(),
            (one_d, 1_048_576, PutOutcome::Written)
        );
        assert_eq!(s.get(&one_d).unwrap(), Some(one));
    }

    #[test]
    fn put_reader_of_a_reader_within_one_buffer_is_a_put() {
        let (_dir, s) = store();
        let d = Digest::of(b"small file");
        assert_eq!(
            s.put_reader(&mut &b"small file"[..], 10).unwrap(),
            (d, 10, PutOutcome::Written)
        );
        assert_eq!(
            s.put_reader(&mut &b"small file"[..], 10).unwrap(),
            (d, 10, PutOutcome::Existing)
        );
        fs::write(s.path_of(&d), b"small filE").unwrap();
        assert_eq!(
            s.put_reader(&mut &b"small file"[..], 10).unwrap(),
            (d, 10, PutOutcome::Replaced)
        );
        assert_eq!(s.get(&d).unwrap(), Some(b"small file".to_vec()));
        let empty = Digest::of(b"");
        assert_eq!(
            s.put_reader(&mut io::empty(), 0).unwrap(),
            (empty, 0, PutOutcome::Written)
        );
        let mut out = Vec::new();
        assert_eq!(s.copy_to(&empty, 0, &mut out).unwrap(), Some(0));
        assert_eq!(out, Vec::<u8>::new());
    }

    #[test]
    fn put_reader_over_a_damaged_large_blob_heals_it() {
        let (_dir, s) = store();
        let bytes = pattern(2 * STREAM_BUFFER_BYTES, 3);
        let d = Digest::of(&bytes);
        s.put_reader(&mut &bytes[..], u64::MAX).unwrap();
        let mut damaged = bytes.clone();
        damaged[STREAM_BUFFER_BYTES] ^= 0x01;
        fs::write(s.path_of(&d), &damaged).unwrap();
        assert_eq!(
            s.copy_to(&d, bytes.len() as u64, &mut io::sink())
                .unwrap_err()
                .code(),
            "blob_corrupt"
        );
        assert_eq!(
            s.put_reader(&mut &bytes[..], u64::MAX).unwrap(),
            (d, 2_097_152, PutOutcome::Existing)
        );
        assert_eq!(fs::read(s.path_of(&d)).unwrap(), bytes);
    }

    #[test]
    fn put_reader_refuses_more_than_bytes_max_and_stores_nothing() {
        let (dir, s) = store();
        let root = dir.path().join("sha256");
        // At the bound: stored.
        let d = Digest::of(b"0123456789");
        assert_eq!(
            s.put_reader(&mut &b"0123456789"[..], 10).unwrap(),
            (d, 10, PutOutcome::Written)
        );
        // One byte over: refused.
        let e = s.put_reader(&mut &b"0123456789a"[..], 10).unwrap_err();
        assert_eq!(e.code(), "blob_too_large");
        assert!(
            matches!(e, BlobError::TooLarge { bytes: 11, max: 10 }),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "blob of 11 bytes exceeds the 10-byte bound");
        // Over the bound after the first buffer: refused at the buffer
        // that crosses it, its temporary file removed.
        let big = pattern(2 * STREAM_BUFFER_BYTES, 4);
        let max = STREAM_BUFFER_BYTES as u64 + 5;
        let e = s.put_reader(&mut &big[..], max).unwrap_err();
        assert!(
            matches!(
                e,
                BlobError::TooLarge {
                    bytes: 2_097_152,
                    max: 1_048_581
                }
            ),
            "{e:?}"
        );
        let hex = d.to_hex();
        assert_eq!(names(&root), vec![hex[..2].to_owned()]);
        assert_eq!(names(&root.join(&hex[..2])), vec![hex]);
        assert!(!s.path_of(&Digest::of(&big)).exists());
    }

    #[test]
    fn a_failing_reader_is_blob_input_io_and_leaves_nothing() {
        let (dir, s) = store();
        for good in [0, STREAM_BUFFER_BYTES + STREAM_BUFFER_BYTES / 2] {
            let e = s
                .put_reader(&mut FailingReader { good }, u64::MAX)
                .unwrap_err();
            assert_eq!(e.code(), "blob_input_io");
            assert_eq!(
                e.to_string(),
                "reading the bytes to put failed: source gone; nothing was stored"
            );
            assert_eq!(names(&dir.path().join("sha256")), Vec::<String>::new());
        }
    }

    #[test]
    fn copy_to_checks_the_size_before_writing_and_the_digest_after() {
        let (_dir, s) = store();
        let bytes = pattern(2 * STREAM_BUFFER_BYTES + 3, 5);
        let len = bytes.len() as u64;
        let d = Digest::of(&bytes);
        s.put_reader(&mut &bytes[..], u64::MAX).unwrap();
        // A size other than the blob's: refused before a byte is written.
        let mut out = Vec::new();
        let e = s.copy_to(&d, len - 1, &mut out).unwrap_err();
        assert_eq!(e.code(), "blob_corrupt");
        assert!(
            matches!(e, BlobError::WrongSize { digest, expected_bytes: 2_097_154, actual_bytes: 2_097_155 }
                if digest == d),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "blob {d} is corrupt: it holds 2097155 bytes, not the 2097154 expected; put it again from its source"
            )
        );
        assert_eq!(out.len(), 0);
        // One byte flipped in the middle: every byte written, then refused.
        let mut damaged = bytes.clone();
        damaged[STREAM_BUFFER_BYTES] ^= 0x80;
        fs::write(s.path_of(&d), &damaged).unwrap();
        let e = s.copy_to(&d, len, &mut out).unwrap_err();
        assert!(
            matches!(e, BlobError::Corrupt { digest, actual }
                if digest == d && actual == Digest::of(&damaged)),
            "{e:?}"
        );
        assert_eq!(out, damaged);
        // Truncated: refused before writing.
        fs::write(s.path_of(&d), &bytes[..STREAM_BUFFER_BYTES]).unwrap();
        let mut out = Vec::new();
        let e = s.copy_to(&d, len, &mut out).unwrap_err();
        assert!(
            matches!(
                e,
                BlobError::WrongSize {
                    expected_bytes: 2_097_155,
                    actual_bytes: 1_048_576,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(out.len(), 0);
        // Missing: none, nothing written.
        assert_eq!(
            s.copy_to(&Digest::of(b"absent"), 6, &mut out).unwrap(),
            None
        );
        assert_eq!(out.len(), 0);
        // A size over the streaming bound is refused before any read.
        let e = s
            .copy_to(&d, STREAM_BLOB_BYTES_MAX + 1, &mut out)
            .unwrap_err();
        assert!(
            matches!(
                e,
                BlobError::TooLarge {
                    bytes: 8_589_934_593,
                    max: 8_589_934_592
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_failing_output_is_blob_output_io() {
        let (_dir, s) = store();
        let d = Digest::of(b"page");
        s.put(&d, b"page").unwrap();
        let e = s.copy_to(&d, 4, &mut FailingWriter).unwrap_err();
        assert_eq!(e.code(), "blob_output_io");
        assert_eq!(
            e.to_string(),
            "writing the blob's bytes to the output failed: output full; discard what was written"
        );
    }

    #[test]
    fn concurrent_streaming_puts_of_one_blob_all_succeed_as_one_file() {
        let (dir, s) = store();
        let bytes = pattern(2 * STREAM_BUFFER_BYTES + 1, 6);
        let d = Digest::of(&bytes);
        let outcomes: Vec<(Digest, u64, PutOutcome)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| s.put_reader(&mut &bytes[..], u64::MAX).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outcomes.len(), 4);
        assert!(
            outcomes.iter().all(|o| o.0 == d && o.1 == 2_097_153),
            "{outcomes:?}"
        );
        assert!(
            outcomes.iter().any(|o| o.2 == PutOutcome::Written),
            "{outcomes:?}"
        );
        let hex = d.to_hex();
        let root = dir.path().join("sha256");
        assert_eq!(names(&root), vec![hex[..2].to_owned()]);
        assert_eq!(names(&root.join(&hex[..2])), vec![hex]);
        assert_eq!(fs::read(s.path_of(&d)).unwrap(), bytes);
    }

    #[test]
    fn open_refuses_a_root_that_is_a_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("sha256"), b"x").unwrap();
        let e = LocalBlobStore::open(dir.path()).unwrap_err();
        assert_eq!(e.code(), "blob_io");
    }
}
