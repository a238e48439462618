//! The format version of meta's store, checked (and written, or migrated)
//! every time the store is opened, before Raft reads anything.
//!
//! The version is kept in [`Space::SmMeta`] under [`FORMAT_KEY`] as a u32
//! big-endian: outside the data spaces a snapshot carries, and kept when a
//! snapshot is installed. An empty store gets
//! [`META_STORE_FORMAT`](sluice_proto::format::META_STORE_FORMAT); a store
//! of a newer version is refused; an older one is migrated by the steps of
//! [`steps`], one per version, each followed by a durable flush and then by
//! the durable write of the version it reached. A store that holds data
//! but no version was not written by a release and is refused.

use std::ops::Bound;

use sluice_proto::format::{self, FormatError, META_STORE_FORMAT, Step};

use super::{Batch, KvError, KvStore, Space};

/// `SmMeta` key of the store's format version (u32 BE).
pub const FORMAT_KEY: &[u8] = b"format";

/// A migration step of meta's store.
pub type MetaStep<K> = Step<K, KvError>;

/// The migration steps of meta's store, one per format version before
/// [`META_STORE_FORMAT`]. Format 1 is the first: there are none yet.
pub fn steps<K: KvStore>() -> Vec<MetaStep<K>> {
    Vec::new()
}

/// Why the store's format is not usable.
#[derive(Debug, thiserror::Error)]
pub enum StoreFormatError {
    /// Newer than this binary, no version, or no step from an old one.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The version key does not hold 4 bytes (corruption).
    #[error("{store}: format version key holds {len} bytes, expected 4")]
    Malformed { store: String, len: usize },
    /// A migration step failed; the store is still at version `from`.
    #[error("{store}: migrating from format version {from} ({what}): {source}")]
    Step {
        store: String,
        from: u32,
        what: &'static str,
        #[source]
        source: KvError,
    },
    /// Reading or writing the store failed.
    #[error("{store}: {source}")]
    Kv {
        store: String,
        #[source]
        source: KvError,
    },
}

/// The format version stored in `kv`, if any.
pub fn read_format<K: KvStore>(kv: &K, store: &str) -> Result<Option<u32>, StoreFormatError> {
    let kv_err = |source| StoreFormatError::Kv {
        store: store.to_string(),
        source,
    };
    match kv.get(Space::SmMeta, FORMAT_KEY).map_err(kv_err)? {
        None => Ok(None),
        Some(v) => {
            let bytes: [u8; 4] =
                v.as_slice()
                    .try_into()
                    .map_err(|_| StoreFormatError::Malformed {
                        store: store.to_string(),
                        len: v.len(),
                    })?;
            Ok(Some(u32::from_be_bytes(bytes)))
        }
    }
}

/// The batch that records format version `version`.
fn format_batch(version: u32) -> Batch {
    let mut b = Batch::new();
    b.put(Space::SmMeta, FORMAT_KEY, version.to_be_bytes().to_vec());
    b
}

/// Checks the format of meta's store `kv` (`store` names it in errors,
/// e.g. "meta store at /var/lib/sluice/meta") and brings it to
/// [`META_STORE_FORMAT`]; returns the version it found (`None`: an empty
/// store, now versioned).
///
/// Errors: see [`StoreFormatError`]; the message of a newer store names
/// both versions.
pub async fn open_format<K: KvStore>(kv: &K, store: &str) -> Result<Option<u32>, StoreFormatError> {
    open_format_with(kv, store, META_STORE_FORMAT, &steps()).await
}

/// [`open_format`] with the version this binary understands and its steps
/// given (tests run a chain of their own).
pub(crate) async fn open_format_with<K: KvStore>(
    kv: &K,
    store: &str,
    understood: u32,
    steps: &[MetaStep<K>],
) -> Result<Option<u32>, StoreFormatError> {
    let kv_err = |source| StoreFormatError::Kv {
        store: store.to_string(),
        source,
    };
    let found = match read_format(kv, store)? {
        Some(v) => v,
        None if is_empty(kv).map_err(kv_err)? => {
            kv.apply(format_batch(understood)).map_err(kv_err)?;
            kv.flush().await.map_err(kv_err)?;
            tracing::info!(store, format = understood, "new meta store");
            return Ok(None);
        }
        None => 0,
    };
    for step in format::plan(store, found, understood, steps)? {
        tracing::info!(
            store,
            from = step.from,
            to = step.from + 1,
            what = step.what,
            "migrating the meta store"
        );
        let failed = |source| StoreFormatError::Step {
            store: store.to_string(),
            from: step.from,
            what: step.what,
            source,
        };
        (step.run)(kv).map_err(failed)?;
        kv.flush().await.map_err(failed)?;
        kv.apply(format_batch(step.from + 1)).map_err(kv_err)?;
        kv.flush().await.map_err(kv_err)?;
    }
    Ok(Some(found))
}

/// `true` when no space of `kv` holds a key: a new store (it gets a
/// version), not one written without a version (refused).
fn is_empty<K: KvStore>(kv: &K) -> Result<bool, KvError> {
    for space in (0..=u8::MAX).filter_map(Space::from_id) {
        if !kv
            .scan(space, Bound::Unbounded, Bound::Unbounded, 1)?
            .is_empty()
        {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    /// A test-only chain 1 -> 2 -> 3: each step writes a marker of the
    /// version it reached, and checks the store is at its `from`.
    fn to_2(kv: &MemStore) -> Result<(), KvError> {
        assert_eq!(read_format(kv, "t").unwrap(), Some(1));
        let mut b = Batch::new();
        b.put(Space::Buckets, b"reached".to_vec(), b"2".to_vec());
        kv.apply(b)
    }

    fn to_3(kv: &MemStore) -> Result<(), KvError> {
        assert_eq!(read_format(kv, "t").unwrap(), Some(2));
        let mut b = Batch::new();
        b.put(Space::Buckets, b"reached".to_vec(), b"3".to_vec());
        kv.apply(b)
    }

    fn chain() -> Vec<MetaStep<MemStore>> {
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

    fn at(version: u32) -> MemStore {
        let kv = MemStore::new();
        kv.apply(format_batch(version)).unwrap();
        kv
    }

    #[tokio::test]
    async fn an_empty_store_gets_the_current_version() {
        let kv = MemStore::new();
        assert_eq!(open_format(&kv, "t").await.unwrap(), None);
        assert_eq!(read_format(&kv, "t").unwrap(), Some(META_STORE_FORMAT));
        assert_eq!(
            open_format(&kv, "t").await.unwrap(),
            Some(META_STORE_FORMAT)
        );
    }

    #[tokio::test]
    async fn older_stores_run_each_step_in_order() {
        let kv = at(1);
        assert_eq!(
            open_format_with(&kv, "t", 3, &chain()).await.unwrap(),
            Some(1)
        );
        assert_eq!(read_format(&kv, "t").unwrap(), Some(3));
        assert_eq!(
            kv.get(Space::Buckets, b"reached").unwrap().as_deref(),
            Some(&b"3"[..])
        );

        let kv = at(2);
        open_format_with(&kv, "t", 3, &chain()).await.unwrap();
        assert_eq!(read_format(&kv, "t").unwrap(), Some(3));
        assert_eq!(
            kv.get(Space::Buckets, b"reached").unwrap().as_deref(),
            Some(&b"3"[..])
        );

        // At the version understood: no step runs.
        let kv = at(3);
        open_format_with(&kv, "t", 3, &chain()).await.unwrap();
        assert_eq!(kv.get(Space::Buckets, b"reached").unwrap(), None);
    }

    #[tokio::test]
    async fn a_newer_store_is_refused_naming_both_versions() {
        let kv = at(META_STORE_FORMAT + 2);
        let e = open_format(&kv, "meta store at /x").await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "meta store at /x has format version {}; this binary understands up to {}: use a newer sluice release",
                META_STORE_FORMAT + 2,
                META_STORE_FORMAT
            )
        );
        assert_eq!(
            read_format(&kv, "t").unwrap(),
            Some(META_STORE_FORMAT + 2),
            "left as it was"
        );
    }

    #[tokio::test]
    async fn a_store_with_data_but_no_version_is_refused() {
        let kv = MemStore::new();
        let mut b = Batch::new();
        b.put(Space::Log, 1u64.to_be_bytes().to_vec(), b"entry".to_vec());
        kv.apply(b).unwrap();
        assert!(matches!(
            open_format(&kv, "t").await,
            Err(StoreFormatError::Format(FormatError::Unversioned { .. }))
        ));
        let mut b = Batch::new();
        b.put(Space::SmMeta, FORMAT_KEY, vec![1]);
        kv.apply(b).unwrap();
        assert!(matches!(
            open_format(&kv, "t").await,
            Err(StoreFormatError::Malformed { len: 1, .. })
        ));
    }
}
