//! Stored format versions: what this binary writes, and how a store of
//! another version is treated at open.
//!
//! Every store Sluice keeps on disk carries the version of its format:
//!
//! | store | constant | where the version is kept |
//! | --- | --- | --- |
//! | meta's sled database | [`META_STORE_FORMAT`] | `SmMeta` key `format` (u32 BE) |
//! | a datanode's data dir | [`DATANODE_STORE_FORMAT`] | `<data_dir>/FORMAT` |
//! | a shard file | [`SHARD_FORMAT`] | header bytes 4..6 (u16 LE) |
//! | a meta snapshot file (and its transfer) | [`SNAPSHOT_FORMAT`] | `SnapshotBlob.format`, the file's first field |
//!
//! A store of a newer version than the binary understands is refused at
//! open with [`FormatError::Newer`], which names both versions: the
//! operator runs a newer release (or restores the data the newer release
//! wrote from). A store of an older version is brought up to date by
//! [`Step`]s, one per version (`from -> from + 1`), run in order at open;
//! [`plan`] checks the version and picks the steps, the store runs them
//! and records each new version durably before the next step. A store
//! with no version at all was not written by any release and is refused.
//!
//! Bump a constant only with a migration step from the previous version
//! (or, for a format read by peers, such as the snapshot, behind the
//! cluster's version gate), and add a row to docs/design/formats.md.

/// The format of meta's store (its sled database): the key layout of the
/// spaces and the encoding of every record the state machine keeps.
pub const META_STORE_FORMAT: u32 = 1;
/// The layout of a datanode's data dir (`shards/`, `quarantine/`, the
/// identity file) apart from the shard files themselves.
pub const DATANODE_STORE_FORMAT: u32 = 1;
/// The shard file format: header, blocks and their checksums.
pub const SHARD_FORMAT: u32 = 1;
/// The format of a meta snapshot file: the records of the data spaces,
/// each as meta's store keeps it.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Why a stored format cannot be used by this binary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Written by a newer release.
    #[error(
        "{store} has format version {found}; this binary understands up to {understood}: use a newer sluice release"
    )]
    Newer {
        store: String,
        found: u32,
        understood: u32,
    },
    /// Version 0 or none: no release writes that.
    #[error(
        "{store} has no format version (found {found}); it was not written by a sluice release"
    )]
    Unversioned { store: String, found: u32 },
    /// Older, but this binary has no step from `from`.
    #[error(
        "{store} has format version {found}; this binary understands {understood} but has no migration from version {from}"
    )]
    NoStep {
        store: String,
        found: u32,
        understood: u32,
        from: u32,
    },
}

/// One migration step of a store of type `S`: brings a store of format
/// version `from` to `from + 1`. `run` must be safe to repeat: a crash
/// after it ran but before the new version was recorded runs it again.
pub struct Step<S: ?Sized, E> {
    /// The version this step starts from.
    pub from: u32,
    /// What the step changes (logged when it runs).
    pub what: &'static str,
    /// The step itself.
    pub run: fn(&S) -> Result<(), E>,
}

/// The steps that bring a store of version `found` to `understood`, in
/// order; empty when it is current. `store` names the store in errors
/// (e.g. "meta store at /var/lib/sluice/meta").
///
/// Errors: [`FormatError::Newer`] when `found > understood`,
/// [`FormatError::Unversioned`] when `found == 0`, [`FormatError::NoStep`]
/// when a version in between has no step in `steps`.
pub fn plan<'a, S: ?Sized, E>(
    store: &str,
    found: u32,
    understood: u32,
    steps: &'a [Step<S, E>],
) -> Result<Vec<&'a Step<S, E>>, FormatError> {
    check(store, found, understood)?;
    (found..understood)
        .map(|from| {
            steps
                .iter()
                .find(|s| s.from == from)
                .ok_or_else(|| FormatError::NoStep {
                    store: store.to_string(),
                    found,
                    understood,
                    from,
                })
        })
        .collect()
}

/// Refuses a version newer than `understood` (or 0) for a format that has
/// no migration of its own (a shard header or a snapshot is read as it
/// is, never rewritten).
pub fn check(store: &str, found: u32, understood: u32) -> Result<(), FormatError> {
    if found == 0 {
        return Err(FormatError::Unversioned {
            store: store.to_string(),
            found,
        });
    }
    if found > understood {
        return Err(FormatError::Newer {
            store: store.to_string(),
            found,
            understood,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: &()) -> Result<(), ()> {
        Ok(())
    }

    const STEPS: [Step<(), ()>; 2] = [
        Step {
            from: 2,
            what: "two to three",
            run: noop,
        },
        Step {
            from: 1,
            what: "one to two",
            run: noop,
        },
    ];

    #[test]
    fn plan_picks_one_step_per_version_in_order() {
        let whats = |found| {
            plan("s", found, 3, &STEPS)
                .unwrap()
                .iter()
                .map(|s| s.what)
                .collect::<Vec<_>>()
        };
        assert_eq!(whats(1), ["one to two", "two to three"]);
        assert_eq!(whats(2), ["two to three"]);
        assert!(whats(3).is_empty());
    }

    #[test]
    fn plan_refuses_newer_unversioned_and_gaps() {
        let e = plan("meta store at /x", 4, 3, &STEPS).err().unwrap();
        assert_eq!(
            e.to_string(),
            "meta store at /x has format version 4; this binary understands up to 3: use a newer sluice release"
        );
        assert!(matches!(
            plan("s", 0, 3, &STEPS),
            Err(FormatError::Unversioned { found: 0, .. })
        ));
        assert!(matches!(
            plan("s", 1, 4, &STEPS),
            Err(FormatError::NoStep { from: 3, .. })
        ));
    }

    #[test]
    fn check_accepts_up_to_understood() {
        assert_eq!(check("shard", 1, 1), Ok(()));
        assert_eq!(check("shard", 1, 2), Ok(()));
        assert!(matches!(
            check("shard", 2, 1),
            Err(FormatError::Newer {
                found: 2,
                understood: 1,
                ..
            })
        ));
        assert!(matches!(
            check("shard", 0, 1),
            Err(FormatError::Unversioned { .. })
        ));
    }
}
