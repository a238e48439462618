//! Object records in two rows: the head (everything a listing, HEAD, ACL
//! or tagging read needs: key, size, ETag, last-modified, HTTP metadata,
//! tags, version) in `Objects`/`Versions`, and the manifest (part list
//! with placements and part checksums, inline body) in `Manifests` under
//! the head's space byte and key.
//!
//! A listing therefore reads heads only, and its cost per entry does not
//! grow with the number of parts of the objects listed; GET reads the
//! head and its manifest. The head stores how many parts the manifest
//! holds (`part_count`) and the CRC-64/NVME of the manifest bytes
//! (`manifest_crc64`): read RPCs run beside applies without snapshot reads,
//! so a reader that finds a manifest of another write than its head's
//! (the record was replaced between the two reads) reads both again.
//!
//! A stored head never carries parts or an inline body; one that does is
//! refused as corrupt ([`SmError::Corrupt`]). Writers go through [`put`]
//! and [`delete`], never through the raw spaces.

use prost::Message;
use sluice_proto::meta as pb;

use super::{SmError, decode};
use crate::store::{Batch, KvStore, Space};

/// Times a read fetches a head and its manifest again when the two are of
/// different writes (a write landed between the reads). Each retry sees a
/// newer write, so this bounds a read racing that many overwrites of one
/// key; past it the read fails as unavailable and the client retries.
const MAX_READ_TRIES: usize = 8;

/// `Manifests` key of the record at `key` of `space`: the space byte, then
/// the key, so a record moved between `Objects` and `Versions` moves its
/// manifest with it.
pub fn manifest_key(space: Space, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(space.id());
    k.extend_from_slice(key);
    k
}

fn crc64(bytes: &[u8]) -> u64 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, bytes)
}

/// Adds to `b` the write of `record` at `key` of `space` (`Objects` or
/// `Versions`): its head, and its manifest when it has parts or an inline
/// body (else any manifest row there is removed).
pub(crate) fn put(b: &mut Batch, space: Space, key: Vec<u8>, record: &pb::ObjectRecord) {
    let mut head = record.clone();
    let manifest = pb::ObjectManifest {
        parts: std::mem::take(&mut head.parts),
        inline_data: std::mem::take(&mut head.inline_data),
    };
    let mkey = manifest_key(space, &key);
    if manifest.parts.is_empty() && manifest.inline_data.is_empty() {
        head.part_count = 0;
        head.manifest_crc64 = 0;
        b.delete(Space::Manifests, mkey);
    } else {
        let bytes = manifest.encode_to_vec();
        head.part_count = u32::try_from(manifest.parts.len()).unwrap_or(u32::MAX);
        head.manifest_crc64 = crc64(&bytes);
        b.put(Space::Manifests, mkey, bytes);
    }
    b.put(space, key, head.encode_to_vec());
}

/// Adds to `b` the removal of the record at `key` of `space` and of its
/// manifest.
pub(crate) fn delete(b: &mut Batch, space: Space, key: Vec<u8>) {
    b.delete(Space::Manifests, manifest_key(space, &key));
    b.delete(space, key);
}

/// `true` when the stored head `head` has its parts in a manifest row.
fn split(head: &pb::ObjectRecord) -> bool {
    head.part_count > 0 || head.manifest_crc64 != 0
}

/// A whole record (or a stored head) as a head-only answer: no parts, no
/// inline body, `part_count` set.
pub fn as_head(mut head: pb::ObjectRecord) -> pb::ObjectRecord {
    if !head.parts.is_empty() {
        head.part_count = u32::try_from(head.parts.len()).unwrap_or(u32::MAX);
        head.parts.clear();
    }
    head.inline_data.clear();
    head.manifest_crc64 = 0;
    head
}

/// The stored head `bytes` of a record of `space`.
///
/// Errors: [`SmError::Decode`] when it does not decode, [`SmError::Corrupt`]
/// when it holds parts or an inline body (those live in its manifest).
pub fn decode_head(space: Space, bytes: &[u8]) -> Result<pb::ObjectRecord, SmError> {
    let head: pb::ObjectRecord = decode("object", bytes)?;
    if !head.parts.is_empty() || !head.inline_data.is_empty() {
        return Err(SmError::Corrupt {
            space,
            why: "an object head holds parts or an inline body, which belong in its manifest",
        });
    }
    Ok(head)
}

/// The head of the record at `key` of `space`, as [`as_head`] answers it.
pub fn get_head<K: KvStore>(
    kv: &K,
    space: Space,
    key: &[u8],
) -> Result<Option<pb::ObjectRecord>, SmError> {
    kv.get(space, key)?
        .map(|v| decode_head(space, &v).map(as_head))
        .transpose()
}

/// The whole record at `key` of `space` (head and manifest), if any.
pub fn get<K: KvStore>(
    kv: &K,
    space: Space,
    key: &[u8],
) -> Result<Option<pb::ObjectRecord>, SmError> {
    for _ in 0..MAX_READ_TRIES {
        let Some(head) = kv.get(space, key)? else {
            return Ok(None);
        };
        let head = decode_head(space, &head)?;
        if let Some(whole) = join(kv, space, key, head)? {
            return Ok(Some(whole));
        }
    }
    Err(SmError::Torn(space))
}

/// The whole record of a head `head` a scan read at `key` of `space`; when
/// its manifest is of another write (the record changed after the scan),
/// the record as it is now, which may be gone (`None`).
pub(crate) fn complete<K: KvStore>(
    kv: &K,
    space: Space,
    key: &[u8],
    head: pb::ObjectRecord,
) -> Result<Option<pb::ObjectRecord>, SmError> {
    match join(kv, space, key, head)? {
        Some(whole) => Ok(Some(whole)),
        None => get(kv, space, key),
    }
}

/// `head` with its manifest merged in; `None` when the stored manifest is
/// missing or not the one `head` was written with.
fn join<K: KvStore>(
    kv: &K,
    space: Space,
    key: &[u8],
    mut head: pb::ObjectRecord,
) -> Result<Option<pb::ObjectRecord>, SmError> {
    if !head.parts.is_empty() || !head.inline_data.is_empty() {
        return Err(SmError::Corrupt {
            space,
            why: "an object head holds parts or an inline body, which belong in its manifest",
        });
    }
    if !split(&head) {
        return Ok(Some(head));
    }
    let Some(bytes) = kv.get(Space::Manifests, &manifest_key(space, key))? else {
        return Ok(None);
    };
    if crc64(&bytes) != head.manifest_crc64 {
        return Ok(None);
    }
    let manifest: pb::ObjectManifest = decode("object manifest", &bytes)?;
    head.parts = manifest.parts;
    head.inline_data = manifest.inline_data;
    head.part_count = 0;
    head.manifest_crc64 = 0;
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn record(parts: u32, inline: &[u8]) -> pb::ObjectRecord {
        pb::ObjectRecord {
            bucket: "b".into(),
            key: "k".into(),
            size: u64::from(parts) * 10,
            etag: "e".into(),
            parts: (1..=parts)
                .map(|n| pb::PartRecord {
                    part_number: n,
                    size: 10,
                    placement: Some(pb::Placement {
                        blob_id: format!("blob-{n}"),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            inline_data: inline.to_vec(),
            ..Default::default()
        }
    }

    fn store(b: Batch) -> MemStore {
        let kv = MemStore::new();
        kv.apply(b).unwrap();
        kv
    }

    #[test]
    fn a_record_is_stored_as_head_and_manifest_and_read_back_whole() {
        let r = record(1000, b"");
        let mut b = Batch::new();
        put(&mut b, Space::Objects, b"b\0k".to_vec(), &r);
        let kv = store(b);
        let head: pb::ObjectRecord =
            decode("object", &kv.get(Space::Objects, b"b\0k").unwrap().unwrap()).unwrap();
        assert!(head.parts.is_empty());
        assert_eq!(head.part_count, 1000);
        assert!(
            head.encoded_len() < 100,
            "head is {} bytes",
            head.encoded_len()
        );
        assert_eq!(get(&kv, Space::Objects, b"b\0k").unwrap(), Some(r.clone()));
        let h = get_head(&kv, Space::Objects, b"b\0k").unwrap().unwrap();
        assert_eq!(
            (h.parts.len(), h.part_count, h.manifest_crc64),
            (0, 1000, 0)
        );
        assert_eq!(h.etag, r.etag);
    }

    #[test]
    fn a_record_without_parts_has_no_manifest_and_delete_removes_both() {
        let mut b = Batch::new();
        put(&mut b, Space::Versions, b"x".to_vec(), &record(0, b""));
        put(&mut b, Space::Objects, b"y".to_vec(), &record(1, b"body"));
        let kv = store(b);
        assert_eq!(
            kv.get(Space::Manifests, &manifest_key(Space::Versions, b"x"))
                .unwrap(),
            None
        );
        assert_eq!(
            get(&kv, Space::Versions, b"x").unwrap(),
            Some(record(0, b""))
        );
        assert_eq!(
            get(&kv, Space::Objects, b"y").unwrap(),
            Some(record(1, b"body"))
        );
        // Rewriting a record without parts removes its old manifest.
        let mut b = Batch::new();
        put(&mut b, Space::Objects, b"y".to_vec(), &record(0, b""));
        kv.apply(b).unwrap();
        assert_eq!(
            kv.get(Space::Manifests, &manifest_key(Space::Objects, b"y"))
                .unwrap(),
            None
        );
        let mut b = Batch::new();
        put(&mut b, Space::Objects, b"y".to_vec(), &record(2, b""));
        kv.apply(b).unwrap();
        let mut b = Batch::new();
        delete(&mut b, Space::Objects, b"y".to_vec());
        kv.apply(b).unwrap();
        assert_eq!(kv.get(Space::Objects, b"y").unwrap(), None);
        assert_eq!(
            kv.get(Space::Manifests, &manifest_key(Space::Objects, b"y"))
                .unwrap(),
            None
        );
    }

    /// A head holding its parts or body (the layout before heads and
    /// manifests were split, which no release wrote) is refused as corrupt
    /// by every read.
    #[test]
    fn a_head_holding_parts_or_a_body_is_refused() {
        let mut b = Batch::new();
        b.put(
            Space::Objects,
            b"parts".to_vec(),
            record(3, b"").encode_to_vec(),
        );
        b.put(
            Space::Versions,
            b"body".to_vec(),
            record(0, b"x").encode_to_vec(),
        );
        let kv = store(b);
        for (space, key) in [(Space::Objects, &b"parts"[..]), (Space::Versions, b"body")] {
            let corrupt = |r: Result<Option<pb::ObjectRecord>, SmError>| matches!(r, Err(SmError::Corrupt { space: s, .. }) if s == space);
            assert!(corrupt(get(&kv, space, key)), "{space:?}");
            assert!(corrupt(get_head(&kv, space, key)), "{space:?}");
        }
        let e = get(&kv, Space::Objects, b"parts").unwrap_err();
        assert!(
            e.to_string().contains("holds parts or an inline body"),
            "{e}"
        );
    }

    /// A read whose head and manifest are of different writes (a write
    /// landed between its two reads) never joins them.
    #[test]
    fn a_head_never_joins_the_manifest_of_another_write() {
        let (a, z) = (record(2, b""), record(3, b""));
        let mut b = Batch::new();
        put(&mut b, Space::Objects, b"k".to_vec(), &a);
        let kv = store(b);
        let head_a: pb::ObjectRecord =
            decode("object", &kv.get(Space::Objects, b"k").unwrap().unwrap()).unwrap();
        let mut b = Batch::new();
        put(&mut b, Space::Objects, b"k".to_vec(), &z);
        kv.apply(b).unwrap();
        assert_eq!(
            join(&kv, Space::Objects, b"k", head_a.clone()).unwrap(),
            None
        );
        // A scan's stale head completes to the record as it is now.
        assert_eq!(
            complete(&kv, Space::Objects, b"k", head_a.clone()).unwrap(),
            Some(z)
        );
        // A torn store (the manifest of another write, always) fails the
        // read after its retries instead of answering a mix.
        let mut b = Batch::new();
        b.put(Space::Objects, b"k".to_vec(), head_a.encode_to_vec());
        kv.apply(b).unwrap();
        assert!(matches!(
            get(&kv, Space::Objects, b"k"),
            Err(SmError::Torn(Space::Objects))
        ));
    }
}
