//! Disk identity: `<data_dir>/sluice-disk.toml` names the disk and the node
//! that formatted it (`docs/design/durability.md` §7).
//!
//! At first start (no identity file) the datanode writes a random
//! `disk_id` (32 hex digits) and its node id, durably (temp file, fsync,
//! rename, directory fsync). On later starts it reads the file back: a data
//! dir formatted by another node id is a foreign disk and is refused. A
//! data dir that already holds shard files but no identity (written before
//! identities existed) gets one, with a warning. The datanode registers
//! with its `disk_id`; meta bumps the node's disk generation when the id
//! differs from the recorded one (a wiped or replaced disk), and heal then
//! rebuilds the node's shards.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Name of the identity file inside the data dir.
pub const IDENTITY_FILE: &str = "sluice-disk.toml";

/// What the identity file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskIdentity {
    /// Random id of this data dir: 32 lowercase hex digits.
    pub disk_id: String,
    /// The datanode id that formatted it.
    pub node_id: u64,
}

/// How [`load_or_create`] found the data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Identity file read back.
    Existing,
    /// Empty data dir: a new identity was written.
    Formatted,
    /// Shard files without an identity: one was written (upgrade).
    Upgraded,
}

/// Why the identity could not be established.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The data dir was formatted by another datanode.
    #[error(
        "data dir {} belongs to datanode {found} (disk {disk_id}), not to this datanode {expected}: refusing a foreign disk",
        path.display()
    )]
    ForeignDisk {
        path: PathBuf,
        expected: u64,
        found: u64,
        disk_id: String,
    },
    /// The identity file does not parse or holds a bad disk id.
    #[error("identity file {} is damaged: {reason}", path.display())]
    Damaged { path: PathBuf, reason: String },
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + use<> {
    let path = path.to_path_buf();
    move |source| IdentityError::Io { op, path, source }
}

/// A fresh random disk id: 32 lowercase hex digits.
pub fn new_disk_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn valid_disk_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads the identity of `data_dir` (creating the directory if needed), or
/// writes a new one for `node_id`; see the module docs. Blocking file I/O.
///
/// Errors: [`IdentityError::ForeignDisk`], [`IdentityError::Damaged`],
/// [`IdentityError::Io`].
pub fn load_or_create(
    data_dir: &Path,
    node_id: u64,
) -> Result<(DiskIdentity, Provenance), IdentityError> {
    fs::create_dir_all(data_dir).map_err(io("create directory", data_dir))?;
    let path = data_dir.join(IDENTITY_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let id: DiskIdentity = toml::from_str(&text).map_err(|e| IdentityError::Damaged {
                path: path.clone(),
                reason: e.message().to_string(),
            })?;
            if !valid_disk_id(&id.disk_id) {
                return Err(IdentityError::Damaged {
                    path,
                    reason: format!("disk_id {:?} is not 32 hex digits", id.disk_id),
                });
            }
            if id.node_id != node_id {
                return Err(IdentityError::ForeignDisk {
                    path,
                    expected: node_id,
                    found: id.node_id,
                    disk_id: id.disk_id,
                });
            }
            Ok((id, Provenance::Existing))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let upgraded = has_shard_files(&data_dir.join("shards"))?;
            let id = DiskIdentity {
                disk_id: new_disk_id(),
                node_id,
            };
            write_durably(data_dir, &path, &id)?;
            Ok((
                id,
                if upgraded {
                    Provenance::Upgraded
                } else {
                    Provenance::Formatted
                },
            ))
        }
        Err(e) => Err(io("read", &path)(e)),
    }
}

/// Whether any file lies under the shard fan-out directories.
fn has_shard_files(shards: &Path) -> Result<bool, IdentityError> {
    let dirs = match fs::read_dir(shards) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io("read directory", shards)(e)),
    };
    for dir in dirs {
        let dir = dir.map_err(io("read directory", shards))?;
        if !dir.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let path = dir.path();
        let mut files = fs::read_dir(&path).map_err(io("read directory", &path))?;
        if files.next().is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Temp file, fsync, rename, directory fsync.
fn write_durably(dir: &Path, path: &Path, id: &DiskIdentity) -> Result<(), IdentityError> {
    let text = format!(
        "# Identity of this Sluice datanode data dir. Do not copy it to another disk.\n{}",
        toml::to_string(id).map_err(|e| IdentityError::Damaged {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?
    );
    let tmp = path.with_extension("toml.tmp");
    let result = (|| {
        let mut f = File::create(&tmp).map_err(io("create", &tmp))?;
        f.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
        f.sync_all().map_err(io("fsync", &tmp))?;
        fs::rename(&tmp, path).map_err(io("rename", &tmp))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync directory", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_once_then_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let (id, how) = load_or_create(dir.path(), 4).unwrap();
        assert_eq!(how, Provenance::Formatted);
        assert!(valid_disk_id(&id.disk_id), "{}", id.disk_id);
        assert_eq!(id.node_id, 4);
        let (again, how) = load_or_create(dir.path(), 4).unwrap();
        assert_eq!((again, how), (id, Provenance::Existing));
        assert!(!dir.path().join("sluice-disk.toml.tmp").exists());
    }

    #[test]
    fn a_foreign_disk_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (id, _) = load_or_create(dir.path(), 1).unwrap();
        match load_or_create(dir.path(), 2) {
            Err(IdentityError::ForeignDisk {
                expected: 2,
                found: 1,
                disk_id,
                ..
            }) => assert_eq!(disk_id, id.disk_id),
            other => panic!("expected a foreign disk, got {other:?}"),
        }
    }

    #[test]
    fn shards_without_identity_are_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let fan = dir.path().join("shards").join("b7");
        fs::create_dir_all(&fan).unwrap();
        fs::write(fan.join("abc.0"), b"x").unwrap();
        let (_, how) = load_or_create(dir.path(), 1).unwrap();
        assert_eq!(how, Provenance::Upgraded);
        // Empty fan-out directories alone are a fresh format.
        let empty = tempfile::tempdir().unwrap();
        fs::create_dir_all(empty.path().join("shards").join("00")).unwrap();
        assert_eq!(
            load_or_create(empty.path(), 1).unwrap().1,
            Provenance::Formatted
        );
    }

    #[test]
    fn a_damaged_identity_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(IDENTITY_FILE),
            "disk_id = \"zz\"\nnode_id = 1\n",
        )
        .unwrap();
        assert!(matches!(
            load_or_create(dir.path(), 1),
            Err(IdentityError::Damaged { .. })
        ));
    }
}
