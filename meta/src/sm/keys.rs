//! Key encodings of the state machine keyspaces (see [`Space`](crate::store::Space)).
//!
//! Bucket names, object keys and upload ids never contain a NUL byte
//! (checked before a write), so 0x00 separates components and keys of one
//! bucket sort in UTF-8 binary order of the object key.

/// `Buckets`: the bucket name.
pub fn bucket(name: &str) -> Vec<u8> {
    name.as_bytes().to_vec()
}

/// The prefix of every `Objects`/`Uploads` key of `bucket`: bucket 0x00.
pub fn bucket_base(bucket: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(bucket.len() + 1);
    k.extend_from_slice(bucket.as_bytes());
    k.push(0);
    k
}

/// `Objects`: bucket 0x00 key.
pub fn object(bucket: &str, key: &str) -> Vec<u8> {
    let mut k = bucket_base(bucket);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The prefix of every `Versions` key of (bucket, key): bucket 0x00 key
/// 0x00. Keys hold no NUL, so the versions of one key are contiguous and
/// sort in the same key order as `Objects`.
pub fn versions_of(bucket: &str, key: &str) -> Vec<u8> {
    let mut k = object(bucket, key);
    k.push(0);
    k
}

/// `Versions`: bucket 0x00 key 0x00 (u64::MAX - seq) big-endian, so a
/// key's versions sort newest first.
pub fn version(bucket: &str, key: &str, seq: u64) -> Vec<u8> {
    let mut k = versions_of(bucket, key);
    k.extend_from_slice(&(u64::MAX - seq).to_be_bytes());
    k
}

/// `Uploads`: bucket 0x00 key 0x00 upload id.
pub fn upload(bucket: &str, key: &str, upload_id: &str) -> Vec<u8> {
    let mut k = object(bucket, key);
    k.push(0);
    k.extend_from_slice(upload_id.as_bytes());
    k
}

/// The prefix of every `Parts` key of an upload: upload id 0x00.
pub fn parts_prefix(upload_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(upload_id.len() + 5);
    k.extend_from_slice(upload_id.as_bytes());
    k.push(0);
    k
}

/// `Parts`: upload id 0x00 part number (u32 big-endian).
pub fn part(upload_id: &str, part_number: u32) -> Vec<u8> {
    let mut k = parts_prefix(upload_id);
    k.extend_from_slice(&part_number.to_be_bytes());
    k
}

/// `Datanodes`: the id, big-endian.
pub fn datanode(id: u64) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

/// `Refs`: the blob id.
pub fn reference(blob_id: &str) -> Vec<u8> {
    blob_id.as_bytes().to_vec()
}

/// `Epochs`: the epoch, big-endian.
pub fn epoch(epoch: u64) -> Vec<u8> {
    epoch.to_be_bytes().to_vec()
}

/// `Pending`: the blob id.
pub fn pending(blob_id: &str) -> Vec<u8> {
    blob_id.as_bytes().to_vec()
}

/// `AccessKeys`: the access key id.
pub fn access_key(id: &str) -> Vec<u8> {
    id.as_bytes().to_vec()
}
