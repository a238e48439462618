//! The format version of a datanode's data dir: `<data_dir>/FORMAT`, one
//! line `sluice-datanode-format <version>`.
//!
//! Written (durably: temp file, fsync, rename, directory fsync) when the
//! dir is initialised, before `shards/` exists, and checked at every open
//! of the [`DiskStore`](super::DiskStore). A dir of a newer version is
//! refused, naming both versions; an older one is migrated by the steps of
//! [`steps`], one per version, each followed by the durable write of the
//! version it reached. A dir that has `shards/` but no `FORMAT` was not
//! written by a release and is refused. Shard files carry their own
//! version in their header (see `format.rs`).

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::Path;

use sluice_proto::format::{self, DATANODE_STORE_FORMAT, Step};

use super::StoreError;

/// Name of the format file inside the data dir.
pub const FORMAT_FILE: &str = "FORMAT";
/// What the format file's one line starts with, before the version.
const PREFIX: &str = "sluice-datanode-format";

/// A migration step of a datanode's data dir. It must make its own
/// changes durable before it returns.
pub type DirStep = Step<Path, StoreError>;

/// The migration steps of the data dir, one per format version before
/// [`DATANODE_STORE_FORMAT`]. Format 1 is the first: there are none yet.
pub fn steps() -> Vec<DirStep> {
    Vec::new()
}

fn store_name(data_dir: &Path) -> String {
    format!("datanode data dir at {}", data_dir.display())
}

/// The format version `data_dir` records, if it has a format file.
///
/// Errors: [`StoreError::BadFormatFile`] when the file is not one line
/// `sluice-datanode-format <u32>`; [`StoreError::Io`].
pub fn read_format(data_dir: &Path) -> Result<Option<u32>, StoreError> {
    let path = data_dir.join(FORMAT_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("read", &path)(e)),
    };
    let version = text
        .trim_end()
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|v| v.parse::<u32>().ok())
        .ok_or_else(|| StoreError::BadFormatFile {
            path: path.clone(),
            found: text.chars().take(64).collect(),
        })?;
    Ok(Some(version))
}

/// Writes `version` to the format file of `data_dir`, durably.
fn write_format(data_dir: &Path, version: u32) -> Result<(), StoreError> {
    let path = data_dir.join(FORMAT_FILE);
    let tmp = data_dir.join(format!("{FORMAT_FILE}.tmp"));
    let mut f = File::create(&tmp).map_err(StoreError::io("create", &tmp))?;
    f.write_all(format!("{PREFIX} {version}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(StoreError::io("write", &tmp))?;
    fs::rename(&tmp, &path).map_err(StoreError::io("rename", &path))?;
    File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io("fsync directory", data_dir))
}

/// Checks the format of `data_dir` (created if missing) and brings it to
/// [`DATANODE_STORE_FORMAT`]; returns the version found (`None`: a new
/// dir, now versioned). Run before anything else reads the dir.
///
/// Errors: [`StoreError::DirFormat`] (newer, unversioned, or no step),
/// [`StoreError::BadFormatFile`], a step's error, [`StoreError::Io`].
pub fn open_format(data_dir: &Path) -> Result<Option<u32>, StoreError> {
    open_format_with(data_dir, DATANODE_STORE_FORMAT, &steps())
}

/// [`open_format`] with the version understood and its steps given
/// (tests run a chain of their own).
pub(crate) fn open_format_with(
    data_dir: &Path,
    understood: u32,
    steps: &[DirStep],
) -> Result<Option<u32>, StoreError> {
    fs::create_dir_all(data_dir).map_err(StoreError::io("create directory", data_dir))?;
    let store = store_name(data_dir);
    let found = match read_format(data_dir)? {
        Some(v) => v,
        None if !data_dir.join("shards").exists() => {
            write_format(data_dir, understood)?;
            tracing::info!(store, format = understood, "new datanode data dir");
            return Ok(None);
        }
        None => 0,
    };
    let plan: Vec<&DirStep> =
        format::plan(&store, found, understood, steps).map_err(StoreError::DirFormat)?;
    for step in plan {
        tracing::info!(
            store,
            from = step.from,
            to = step.from + 1,
            what = step.what,
            "migrating the datanode data dir"
        );
        (step.run)(data_dir)?;
        write_format(data_dir, step.from + 1)?;
    }
    Ok(Some(found))
}

#[cfg(test)]
mod tests {
    use sluice_proto::format::FormatError;

    use super::*;

    const MARK: &str = "reached";

    /// A test-only chain 1 -> 2 -> 3: each step appends the version it
    /// reaches to a file, after checking the dir is at its `from`.
    fn step_to(dir: &Path, from: u32) -> Result<(), StoreError> {
        assert_eq!(read_format(dir).unwrap(), Some(from));
        let path = dir.join(MARK);
        let mut text = fs::read_to_string(&path).unwrap_or_default();
        text.push_str(&format!("{}\n", from + 1));
        fs::write(&path, text).map_err(StoreError::io("write", &path))
    }

    fn to_2(dir: &Path) -> Result<(), StoreError> {
        step_to(dir, 1)
    }

    fn to_3(dir: &Path) -> Result<(), StoreError> {
        step_to(dir, 2)
    }

    fn chain() -> Vec<DirStep> {
        vec![
            Step {
                from: 1,
                what: "one to two",
                run: to_2,
            },
            Step {
                from: 2,
                what: "two to three",
                run: to_3,
            },
        ]
    }

    fn dir_at(version: u32) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write_format(dir.path(), version).unwrap();
        fs::create_dir(dir.path().join("shards")).unwrap();
        dir
    }

    #[test]
    fn a_new_dir_gets_the_current_version() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dn");
        assert_eq!(open_format(&dir).unwrap(), None);
        assert_eq!(
            fs::read_to_string(dir.join(FORMAT_FILE)).unwrap(),
            format!("sluice-datanode-format {DATANODE_STORE_FORMAT}\n")
        );
        assert_eq!(open_format(&dir).unwrap(), Some(DATANODE_STORE_FORMAT));
    }

    #[test]
    fn older_dirs_run_each_step_in_order() {
        let dir = dir_at(1);
        assert_eq!(open_format_with(dir.path(), 3, &chain()).unwrap(), Some(1));
        assert_eq!(read_format(dir.path()).unwrap(), Some(3));
        assert_eq!(fs::read_to_string(dir.path().join(MARK)).unwrap(), "2\n3\n");

        let dir = dir_at(2);
        open_format_with(dir.path(), 3, &chain()).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join(MARK)).unwrap(), "3\n");

        let dir = dir_at(3);
        open_format_with(dir.path(), 3, &chain()).unwrap();
        assert!(
            !dir.path().join(MARK).exists(),
            "no step at the current version"
        );
    }

    #[test]
    fn a_newer_dir_is_refused_naming_both_versions() {
        let dir = dir_at(DATANODE_STORE_FORMAT + 1);
        let e = open_format(dir.path()).unwrap_err();
        assert!(
            matches!(e, StoreError::DirFormat(FormatError::Newer { .. })),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "datanode data dir at {} has format version {}; this binary understands up to {}: use a newer sluice release",
                dir.path().display(),
                DATANODE_STORE_FORMAT + 1,
                DATANODE_STORE_FORMAT
            )
        );
        assert_eq!(
            read_format(dir.path()).unwrap(),
            Some(DATANODE_STORE_FORMAT + 1)
        );
    }

    #[test]
    fn shards_without_a_format_file_or_a_garbled_one_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("shards")).unwrap();
        assert!(matches!(
            open_format(dir.path()),
            Err(StoreError::DirFormat(FormatError::Unversioned { .. }))
        ));
        fs::write(dir.path().join(FORMAT_FILE), "sluice-datanode-format x\n").unwrap();
        assert!(matches!(
            open_format(dir.path()),
            Err(StoreError::BadFormatFile { .. })
        ));
    }
}
