//! Reading completed uploads back and checking them byte for byte.
//!
//! Each object is streamed with GetObject and compared, chunk by chunk,
//! with its payload regenerated part by part ([`CompletedUpload::fill_part`]);
//! nothing but one part-size buffer per object in flight is held.

use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::completed::CompletedUpload;

/// Problems listed individually in a [`VerifyReport`]; further ones are
/// only counted.
pub const MAX_LISTED_PROBLEMS: usize = 20;

/// How one object compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Every byte matched and the length is right.
    Identical,
    /// The object was read but differs.
    Mismatch {
        /// Offset of the first differing byte, or the length read when the
        /// object is shorter or longer than written.
        offset: u64,
        /// What differs.
        reason: String,
    },
    /// GetObject failed (after the SDK's retries) or the body broke off.
    ReadFailed {
        /// The SDK or stream error.
        error: String,
    },
}

/// One object that was not identical.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Object key.
    pub key: String,
    /// What went wrong.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Result of reading a set of uploads back.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Objects read.
    pub checked: u64,
    /// Objects identical to what was written.
    pub identical: u64,
    /// Objects that differ.
    pub mismatched: u64,
    /// Objects that could not be read.
    pub read_failed: u64,
    /// Bytes compared.
    pub bytes: u64,
    /// Wall time of the read-back, seconds.
    pub elapsed_s: f64,
    /// The first [`MAX_LISTED_PROBLEMS`] problems.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// Whether every object checked was identical.
    pub fn all_identical(&self) -> bool {
        self.identical == self.checked
    }

    fn add(&mut self, key: String, bytes: u64, outcome: Outcome) {
        self.checked += 1;
        self.bytes += bytes;
        match outcome {
            Outcome::Identical => {
                self.identical += 1;
                return;
            }
            Outcome::Mismatch { .. } => self.mismatched += 1,
            Outcome::ReadFailed { .. } => self.read_failed += 1,
        }
        if self.problems.len() < MAX_LISTED_PROBLEMS {
            self.problems.push(Problem { key, outcome });
        }
    }
}

/// Reads every upload in `uploads` from `bucket`, at most `concurrency`
/// at once, and compares it with what was written.
pub async fn verify_uploads(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    uploads: Vec<CompletedUpload>,
    concurrency: usize,
) -> VerifyReport {
    let started = std::time::Instant::now();
    let concurrency = concurrency.max(1);
    let mut report = VerifyReport::default();
    let mut tasks: JoinSet<(String, u64, Outcome)> = JoinSet::new();
    let mut pending = uploads.into_iter();
    loop {
        while tasks.len() < concurrency {
            let Some(upload) = pending.next() else { break };
            let client = client.clone();
            let bucket = bucket.to_owned();
            tasks.spawn(async move {
                let (bytes, outcome) = verify_one(&client, &bucket, &upload).await;
                (upload.key, bytes, outcome)
            });
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        match joined {
            Ok((key, bytes, outcome)) => {
                if outcome != Outcome::Identical {
                    tracing::warn!(key, ?outcome, "read-back differs");
                }
                report.add(key, bytes, outcome);
            }
            Err(e) => report.add(
                "(task)".to_owned(),
                0,
                Outcome::ReadFailed {
                    error: format!("verification task ended abnormally: {e}"),
                },
            ),
        }
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    report
}

/// Streams one object and compares it; returns the bytes compared.
async fn verify_one(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    upload: &CompletedUpload,
) -> (u64, Outcome) {
    let output = match client
        .get_object()
        .bucket(bucket)
        .key(&upload.key)
        .send()
        .await
    {
        Ok(output) => output,
        Err(e) => {
            // The S3 code and message when the server answered, else the full chain.
            let error = match e.code() {
                Some(code) => format!("GetObject: {code}: {}", e.message().unwrap_or_default()),
                None => format!("GetObject: {}", DisplayErrorContext(&e)),
            };
            return (0, Outcome::ReadFailed { error });
        }
    };
    let size = upload.size();
    if let Some(length) = output.content_length()
        && u64::try_from(length).ok() != Some(size)
    {
        return (
            0,
            Outcome::Mismatch {
                offset: 0,
                reason: format!("Content-Length {length}, written {size}"),
            },
        );
    }
    let Ok(part_size) = usize::try_from(upload.part_size) else {
        return (
            0,
            Outcome::ReadFailed {
                error: "part size does not fit in memory".to_owned(),
            },
        );
    };
    let mut expected = vec![0u8; part_size];
    let mut comparer = Comparer {
        upload,
        expected: &mut expected,
        part: 0,
        in_part: part_size,
        offset: 0,
    };
    let mut body = output.body;
    loop {
        match body.next().await {
            None => break,
            Some(Ok(chunk)) => {
                if let Err(outcome) = comparer.feed(&chunk) {
                    return (comparer.offset, outcome);
                }
            }
            Some(Err(e)) => {
                return (
                    comparer.offset,
                    Outcome::ReadFailed {
                        error: format!("body broke off at byte {}: {e}", comparer.offset),
                    },
                );
            }
        }
    }
    if comparer.offset != size {
        return (
            comparer.offset,
            Outcome::Mismatch {
                offset: comparer.offset,
                reason: format!("read {} bytes, written {size}", comparer.offset),
            },
        );
    }
    (size, Outcome::Identical)
}

/// Compares a byte stream with an upload's regenerated parts.
struct Comparer<'a> {
    upload: &'a CompletedUpload,
    /// Payload of the current part.
    expected: &'a mut [u8],
    /// Current part number (0 before the first byte).
    part: u32,
    /// Bytes of the current part already compared.
    in_part: usize,
    /// Bytes compared in total.
    offset: u64,
}

impl Comparer<'_> {
    fn feed(&mut self, mut chunk: &[u8]) -> Result<(), Outcome> {
        while !chunk.is_empty() {
            if self.in_part == self.expected.len() {
                if self.part == self.upload.parts {
                    return Err(Outcome::Mismatch {
                        offset: self.offset,
                        reason: format!("longer than the {} bytes written", self.upload.size()),
                    });
                }
                self.part += 1;
                self.upload.fill_part(self.part, self.expected);
                self.in_part = 0;
            }
            let n = chunk.len().min(self.expected.len() - self.in_part);
            let want = &self.expected[self.in_part..self.in_part + n];
            if let Some(i) = chunk[..n].iter().zip(want).position(|(a, b)| a != b) {
                return Err(Outcome::Mismatch {
                    offset: self.offset + i as u64,
                    reason: format!("byte differs in part {}", self.part),
                });
            }
            chunk = &chunk[n..];
            self.in_part += n;
            self.offset += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload() -> CompletedUpload {
        CompletedUpload {
            key: "k".into(),
            run_seed: 3,
            worker: 0,
            upload: 1,
            parts: 3,
            part_size: 10,
        }
    }

    fn payload(u: &CompletedUpload) -> Vec<u8> {
        let mut all = Vec::new();
        for part in 1..=u.parts {
            let mut buf = vec![0u8; 10];
            u.fill_part(part, &mut buf);
            all.extend_from_slice(&buf);
        }
        all
    }

    fn compare(u: &CompletedUpload, chunks: &[&[u8]]) -> Result<u64, Outcome> {
        let mut expected = vec![0u8; 10];
        let mut c = Comparer {
            upload: u,
            expected: &mut expected,
            part: 0,
            in_part: 10,
            offset: 0,
        };
        for chunk in chunks {
            c.feed(chunk)?;
        }
        Ok(c.offset)
    }

    #[test]
    fn identical_stream_in_odd_chunks_compares_equal() {
        let u = upload();
        let all = payload(&u);
        // Chunks that straddle part boundaries.
        assert_eq!(compare(&u, &[&all[..7], &all[7..23], &all[23..]]), Ok(30));
    }

    #[test]
    fn first_differing_byte_is_located() {
        let u = upload();
        let mut all = payload(&u);
        all[17] ^= 1;
        match compare(&u, &[&all[..12], &all[12..]]) {
            Err(Outcome::Mismatch { offset, reason }) => {
                assert_eq!(offset, 17);
                assert!(reason.contains("part 2"), "{reason}");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn longer_stream_is_a_mismatch() {
        let u = upload();
        let mut all = payload(&u);
        all.push(0);
        match compare(&u, &[&all]) {
            Err(Outcome::Mismatch { offset, .. }) => assert_eq!(offset, 30),
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn report_counts_and_bounds_its_list() {
        let mut r = VerifyReport::default();
        r.add("a".into(), 5, Outcome::Identical);
        for i in 0..MAX_LISTED_PROBLEMS + 5 {
            r.add(
                format!("m{i}"),
                1,
                Outcome::ReadFailed {
                    error: "gone".into(),
                },
            );
        }
        assert_eq!(r.checked, MAX_LISTED_PROBLEMS as u64 + 6);
        assert_eq!(r.identical, 1);
        assert_eq!(r.read_failed, MAX_LISTED_PROBLEMS as u64 + 5);
        assert_eq!(r.problems.len(), MAX_LISTED_PROBLEMS);
        assert!(!r.all_identical());
    }
}
