//! Free disk space of the work dir (statvfs(2), as `df` reports "Avail").

use std::path::Path;

use super::error::SoakError;

/// Bytes available to an unprivileged user on the file system holding
/// `path`: `f_bavail x f_frsize`.
///
/// # Errors
/// [`SoakError::Statvfs`] when statvfs fails (e.g. `path` does not exist).
pub fn available_bytes(path: &Path) -> Result<u64, SoakError> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(|source| SoakError::Statvfs {
        path: path.to_owned(),
        source,
    })?;
    // Both are u64 on 64-bit Linux; the conversion keeps 32-bit targets compiling.
    #[allow(clippy::useless_conversion)]
    let (blocks, fragment) = (
        u64::from(stat.blocks_available()),
        u64::from(stat.fragment_size()),
    );
    Ok(blocks.saturating_mul(fragment))
}

/// `path` itself if it exists, else its nearest existing ancestor (the
/// file system it would be created on); `.` for a relative path none of
/// whose components exist.
pub fn nearest_existing(path: &Path) -> &Path {
    path.ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        .unwrap_or(Path::new("."))
}

/// Checks that the file system `path` is (or would be created) on has at
/// least `required` bytes free; returns the free bytes.
///
/// # Errors
/// [`SoakError::NotEnoughDisk`] when it has less; [`SoakError::Statvfs`].
pub fn require_free(path: &Path, required: u64) -> Result<u64, SoakError> {
    let free = available_bytes(nearest_existing(path))?;
    if free < required {
        return Err(SoakError::NotEnoughDisk {
            path: path.to_owned(),
            free,
            required,
        });
    }
    Ok(free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_free_space_and_refuses_absurd_requirements() {
        let dir = tempfile::tempdir().expect("tempdir");
        let free = require_free(dir.path(), 1).expect("a file system with a free byte");
        assert!(free >= 1);
        match require_free(dir.path(), u64::MAX) {
            Err(SoakError::NotEnoughDisk {
                free: f, required, ..
            }) => {
                assert_eq!(required, u64::MAX);
                assert!(f < u64::MAX);
            }
            other => panic!("expected NotEnoughDisk, got {other:?}"),
        }
        assert!(matches!(
            available_bytes(&dir.path().join("missing")),
            Err(SoakError::Statvfs { .. })
        ));
        // A work dir that does not exist yet is judged by its parent.
        let missing = dir.path().join("a/b");
        assert_eq!(nearest_existing(&missing), dir.path());
        assert!(require_free(&missing, 1).is_ok());
        assert!(!missing.exists());
        assert_eq!(nearest_existing(Path::new("no-such-dir/x")), Path::new("."));
    }
}
