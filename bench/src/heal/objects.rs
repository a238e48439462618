//! The data set of the heal benchmark: `--data` bytes as objects of
//! `--object-size`, each with seeded pseudo-random content, so that the
//! read-back regenerates what it compares with ([`crate::verify`]) and
//! nothing is stored on the client.
//!
//! Objects up to [`PUT_OBJECT_MAX`] go in with one PutObject; larger ones
//! as multipart uploads of [`MULTIPART_PART_SIZE`] parts, one part at a
//! time per object, `concurrency` objects at once. Memory held: one part
//! buffer per object in flight.

use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::completed::CompletedUpload;
use crate::error::BenchError;
use crate::stats::mib_per_s;

/// Largest object written with a single PutObject, bytes.
pub const PUT_OBJECT_MAX: u64 = 16 << 20;
/// Part size of the multipart uploads of larger objects, bytes.
pub const MULTIPART_PART_SIZE: u64 = 16 << 20;
/// S3's limit of parts per upload.
const MAX_PARTS: u64 = 10_000;
/// Write errors kept as text in the report; further ones are only counted.
pub const MAX_LISTED_WRITE_ERRORS: usize = 10;

/// How the data set is cut into objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ObjectPlan {
    /// Objects written.
    pub count: u64,
    /// Bytes per object.
    pub object_size: u64,
    /// Parts per object (1 = PutObject).
    pub parts: u32,
    /// Bytes per part (`object_size` for PutObject).
    pub part_size: u64,
}

impl ObjectPlan {
    /// Bytes of the whole data set.
    pub fn bytes(&self) -> u64 {
        self.count * self.object_size
    }

    /// Whether objects are written as multipart uploads.
    pub fn multipart(&self) -> bool {
        self.parts > 1
    }
}

/// Cuts `data` bytes into objects of `object_size` (the remainder below one
/// object is not written).
///
/// # Errors
/// [`BenchError::InvalidOption`] for a zero object size, less data than
/// one object, or a multipart object size that is not a multiple of
/// [`MULTIPART_PART_SIZE`] (every part must have the same size) or has
/// more than 10 000 parts.
pub fn plan_objects(data: u64, object_size: u64) -> Result<ObjectPlan, BenchError> {
    let invalid = |flag: &'static str, reason: String| BenchError::InvalidOption { flag, reason };
    if object_size == 0 {
        return Err(invalid("object-size", "must be positive".to_owned()));
    }
    if data < object_size {
        return Err(invalid(
            "data",
            format!("{data} bytes is less than one object of {object_size}"),
        ));
    }
    let (parts, part_size) = if object_size <= PUT_OBJECT_MAX {
        (1, object_size)
    } else {
        if !object_size.is_multiple_of(MULTIPART_PART_SIZE) {
            return Err(invalid(
                "object-size",
                format!(
                    "above {} MiB it must be a multiple of the {} MiB part size",
                    PUT_OBJECT_MAX >> 20,
                    MULTIPART_PART_SIZE >> 20
                ),
            ));
        }
        let parts = object_size / MULTIPART_PART_SIZE;
        if parts > MAX_PARTS {
            return Err(invalid(
                "object-size",
                format!("{parts} parts exceed S3's {MAX_PARTS}"),
            ));
        }
        (
            u32::try_from(parts).unwrap_or(u32::MAX),
            MULTIPART_PART_SIZE,
        )
    };
    Ok(ObjectPlan {
        count: data / object_size,
        object_size,
        parts,
        part_size,
    })
}

/// The objects of a plan: key `<prefix>/<index>`, content seeded by
/// `run_seed` and the index (worker 0, upload index + 1).
pub fn object_list(plan: &ObjectPlan, prefix: &str, run_seed: u64) -> Vec<CompletedUpload> {
    (0..plan.count)
        .map(|i| CompletedUpload {
            key: format!("{prefix}/{i:06}"),
            run_seed,
            worker: 0,
            upload: i + 1,
            parts: plan.parts,
            part_size: plan.part_size,
        })
        .collect()
}

/// Result of writing the data set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WriteReport {
    /// Objects attempted.
    pub objects: u64,
    /// Objects acknowledged (PutObject or CompleteMultipartUpload 200).
    pub written: u64,
    /// Objects that failed after the SDK's retries.
    pub failed: u64,
    /// Bytes of the written objects.
    pub bytes: u64,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// `bytes` per second of `elapsed_s`, MiB/s.
    pub mib_per_s: f64,
    /// The first [`MAX_LISTED_WRITE_ERRORS`] errors.
    pub errors: Vec<String>,
}

/// Writes every object of `objects` into `bucket`, at most `concurrency`
/// at once; returns the report and the objects that were acknowledged.
pub async fn write_objects(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    objects: Vec<CompletedUpload>,
    concurrency: usize,
) -> (WriteReport, Vec<CompletedUpload>) {
    let started = std::time::Instant::now();
    let mut report = WriteReport {
        objects: objects.len() as u64,
        ..WriteReport::default()
    };
    let mut written = Vec::with_capacity(objects.len());
    let mut tasks: JoinSet<(CompletedUpload, Result<(), String>)> = JoinSet::new();
    let mut pending = objects.into_iter();
    loop {
        while tasks.len() < concurrency.max(1) {
            let Some(object) = pending.next() else { break };
            let client = client.clone();
            let bucket = bucket.to_owned();
            tasks.spawn(async move {
                let result = write_one(&client, &bucket, &object).await;
                (object, result)
            });
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let (object, result) = match joined {
            Ok(done) => done,
            Err(e) => {
                report.failed += 1;
                if report.errors.len() < MAX_LISTED_WRITE_ERRORS {
                    report
                        .errors
                        .push(format!("write task ended abnormally: {e}"));
                }
                continue;
            }
        };
        match result {
            Ok(()) => {
                report.written += 1;
                report.bytes += object.size();
                if report.written.is_multiple_of(16) {
                    tracing::info!(
                        written = report.written,
                        of = report.objects,
                        "objects written"
                    );
                }
                written.push(object);
            }
            Err(e) => {
                tracing::warn!(key = %object.key, error = %e, "object not written");
                report.failed += 1;
                if report.errors.len() < MAX_LISTED_WRITE_ERRORS {
                    report.errors.push(format!("{}: {e}", object.key));
                }
            }
        }
    }
    let elapsed = started.elapsed();
    report.elapsed_s = elapsed.as_secs_f64();
    report.mib_per_s = mib_per_s(report.bytes, elapsed);
    (report, written)
}

fn describe<E>(op: &str, e: &aws_sdk_s3::error::SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match e.code() {
        Some(code) => format!("{op}: {code}: {}", e.message().unwrap_or_default()),
        None => format!("{op}: {}", DisplayErrorContext(e)),
    }
}

fn part_payload(object: &CompletedUpload, part: u32) -> Result<ByteStream, String> {
    let len = usize::try_from(object.part_size).map_err(|_| "part too large".to_owned())?;
    let mut buf = vec![0u8; len];
    object.fill_part(part, &mut buf);
    Ok(ByteStream::from(buf))
}

async fn write_one(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    object: &CompletedUpload,
) -> Result<(), String> {
    if object.parts == 1 {
        client
            .put_object()
            .bucket(bucket)
            .key(&object.key)
            .body(part_payload(object, 1)?)
            .send()
            .await
            .map_err(|e| describe("PutObject", &e))?;
        return Ok(());
    }
    let created = client
        .create_multipart_upload()
        .bucket(bucket)
        .key(&object.key)
        .send()
        .await
        .map_err(|e| describe("CreateMultipartUpload", &e))?;
    let upload_id = created
        .upload_id()
        .ok_or("CreateMultipartUpload: no upload id")?
        .to_owned();
    let mut parts = Vec::with_capacity(object.parts as usize);
    for part in 1..=object.parts {
        let result = client
            .upload_part()
            .bucket(bucket)
            .key(&object.key)
            .upload_id(&upload_id)
            .part_number(i32::try_from(part).unwrap_or(i32::MAX))
            .body(part_payload(object, part)?)
            .send()
            .await;
        match result {
            Ok(out) => parts.push(
                CompletedPart::builder()
                    .part_number(i32::try_from(part).unwrap_or(i32::MAX))
                    .set_e_tag(out.e_tag().map(str::to_owned))
                    .build(),
            ),
            Err(e) => {
                let error = describe("UploadPart", &e);
                // Best effort: the upload's parts are garbage either way.
                let _ = client
                    .abort_multipart_upload()
                    .bucket(bucket)
                    .key(&object.key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                return Err(error);
            }
        }
    }
    client
        .complete_multipart_upload()
        .bucket(bucket)
        .key(&object.key)
        .upload_id(&upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .map_err(|e| describe("CompleteMultipartUpload", &e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_objects_are_single_puts_large_ones_16_mib_parts() {
        let p = plan_objects(256 * MIB, 32 * MIB).expect("smoke");
        assert_eq!((p.count, p.parts, p.part_size), (8, 2, 16 * MIB));
        assert!(p.multipart());
        assert_eq!(p.bytes(), 256 * MIB);
        let p = plan_objects(4 << 30, 64 * MIB).expect("full");
        assert_eq!((p.count, p.parts, p.part_size), (64, 4, 16 * MIB));
        let p = plan_objects(100 * MIB, 16 * MIB).expect("put");
        assert_eq!((p.count, p.parts, p.part_size), (6, 1, 16 * MIB));
        assert!(!p.multipart());
        let p = plan_objects(10 * MIB, 3 * MIB).expect("odd small");
        assert_eq!((p.count, p.parts, p.part_size), (3, 1, 3 * MIB));
    }

    #[test]
    fn rejects_plans_that_cannot_be_written_evenly() {
        assert!(plan_objects(MIB, 0).is_err());
        assert!(plan_objects(MIB, 2 * MIB).is_err());
        assert!(plan_objects(100 * MIB, 40 * MIB).is_err());
        assert!(plan_objects(u64::MAX, 10_001 * 16 * MIB).is_err());
    }

    #[test]
    fn objects_have_distinct_keys_and_contents() {
        let plan = plan_objects(64 * MIB, 32 * MIB).expect("plan");
        let list = object_list(&plan, "heal/abc", 9);
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].key, "heal/abc/000000");
        assert_eq!(list[1].key, "heal/abc/000001");
        assert_eq!(list[0].size(), 32 * MIB);
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        list[0].fill_part(1, &mut a);
        list[1].fill_part(1, &mut b);
        assert_ne!(a, b);
        list[0].fill_part(2, &mut b);
        assert_ne!(a, b);
    }
}
