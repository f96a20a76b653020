//! Persisted fences: `fences/<lease_id>` holds the highest fenced generation
//! of that lease in ASCII decimal. A fence only grows; it is written to a
//! temporary file, fsynced and renamed over the old one, and the directory
//! is fsynced, so after a crash either the old or the new fence is there,
//! never less. A provider refuses to allocate any generation `<=` the fence.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::ProviderError;

/// The fences of one provider, in `dir`.
#[derive(Debug, Clone)]
pub struct Fences {
    dir: PathBuf,
}

impl Fences {
    /// The fences kept in `dir` (created if missing).
    ///
    /// # Errors
    /// [`ProviderError::Io`].
    pub fn open(dir: &Path) -> Result<Fences, ProviderError> {
        std::fs::create_dir_all(dir).map_err(|e| ProviderError::io(dir.display(), e))?;
        Ok(Fences {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, lease_id: i64) -> PathBuf {
        self.dir.join(lease_id.to_string())
    }

    /// The highest fenced generation of `lease_id`, 0 when none is.
    ///
    /// # Errors
    /// [`ProviderError::Io`] for an unreadable or corrupt fence file.
    pub fn get(&self, lease_id: i64) -> Result<i64, ProviderError> {
        let path = self.path(lease_id);
        match std::fs::read_to_string(&path) {
            Ok(s) => s
                .trim_end()
                .parse::<i64>()
                .map_err(|_| ProviderError::io(path.display(), "fence file is not a generation")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(ProviderError::io(path.display(), e)),
        }
    }

    /// Raises the fence of `lease_id` to at least `generation`, durably;
    /// returns the fence now in force.
    ///
    /// # Errors
    /// [`ProviderError::Io`].
    pub fn raise(&self, lease_id: i64, generation: i64) -> Result<i64, ProviderError> {
        let current = self.get(lease_id)?;
        if current >= generation {
            return Ok(current);
        }
        let path = self.path(lease_id);
        let tmp = self.dir.join(format!(".{lease_id}.tmp"));
        let io = |e: std::io::Error| ProviderError::io(path.display(), e);
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(format!("{generation}\n").as_bytes())
            .map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_only_grow_and_persist() {
        let dir = std::env::temp_dir().join(format!("lc-fences-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let f = Fences::open(&dir).unwrap();
        assert_eq!(f.get(7).unwrap(), 0);
        assert_eq!(f.raise(7, 2).unwrap(), 2);
        assert_eq!(f.raise(7, 1).unwrap(), 2);
        assert_eq!(Fences::open(&dir).unwrap().get(7).unwrap(), 2);
        assert_eq!(std::fs::read_to_string(dir.join("7")).unwrap(), "2\n");
        assert_eq!(f.raise(7, 3).unwrap(), 3);
        assert_eq!(f.get(8).unwrap(), 0);
        std::fs::write(dir.join("9"), "x").unwrap();
        assert_eq!(f.get(9).unwrap_err().code(), "provider_io");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
