//! Finding stale multipart uploads for the sweeper, one bounded page of
//! the `Uploads` keyspace at a time (every bucket, in key order).

use std::ops::Bound;

use sluice_proto::meta as pb;

use super::{SmError, decode};
use crate::store::{KvStore, Space};

/// One page of [`stale_uploads`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StalePage {
    /// The uploads of the page initiated before the cutoff.
    pub stale: Vec<pb::UploadKey>,
    /// Where the next page starts (exclusive); `None` after the last page.
    pub next: Option<Vec<u8>>,
}

/// Reads up to `limit` (at least 1) upload records after the store key
/// `after` (from the start when `None`) and returns those whose
/// `initiated_ms` is before `cutoff_ms`, i.e. older than the expiry when
/// `cutoff_ms = now - expiry`.
pub fn stale_uploads<K: KvStore>(
    kv: &K,
    after: Option<&[u8]>,
    cutoff_ms: i64,
    limit: usize,
) -> Result<StalePage, SmError> {
    let limit = limit.max(1);
    let start = match after {
        Some(k) => Bound::Excluded(k),
        None => Bound::Unbounded,
    };
    let rows = kv.scan(Space::Uploads, start, Bound::Unbounded, limit)?;
    let full = rows.len() == limit;
    let mut page = StalePage::default();
    let mut last = None;
    for (k, v) in rows {
        let upload: pb::UploadRecord = decode("upload", &v)?;
        if upload.initiated_ms < cutoff_ms {
            page.stale.push(pb::UploadKey {
                bucket: upload.bucket,
                key: upload.key,
                upload_id: upload.upload_id,
                op_id: String::new(),
            });
        }
        last = Some(k);
    }
    page.next = if full { last } else { None };
    Ok(page)
}
