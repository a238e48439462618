//! S3 requests through the gateway's S3 service on a [`MemCluster`]
//! (aws-sdk-s3, SigV4, the real handlers, meta and datanodes), no sockets.

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketVersioningStatus, CompletedMultipartUpload, CompletedPart, VersioningConfiguration,
};
use sluice_net::faults::{Action, Rule};
use sluice_test_support::payload;
use sluice_tests::mem_cluster::{MemCluster, datanode_addr};
use sluice_tests::s3::{expect_error, get_all};

async fn put(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, data: &[u8]) -> Result<()> {
    s3.put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .with_context(|| format!("PUT {bucket}/{key}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_objects_conditions_multipart_and_errors_without_sockets() -> Result<()> {
    let c = MemCluster::start().await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("bkt").send().await?;

    // An inline body and one of many stripes read back as written.
    let small = payload(1000, 1);
    let large = payload(300_000, 2);
    put(&s3, "bkt", "small", &small).await?;
    put(&s3, "bkt", "large", &large).await?;
    ensure!(
        get_all(&s3, "bkt", "small").await? == small,
        "small object differs"
    );
    ensure!(
        get_all(&s3, "bkt", "large").await? == large,
        "large object differs"
    );

    // If-None-Match: * against an existing key.
    let conditional = s3
        .put_object()
        .bucket("bkt")
        .key("large")
        .if_none_match("*")
        .body(ByteStream::from(small.clone()))
        .send()
        .await;
    expect_error(
        "conditional PUT",
        conditional,
        412,
        Some("PreconditionFailed"),
    )?;
    ensure!(
        get_all(&s3, "bkt", "large").await? == large,
        "the refused PUT landed"
    );

    // Missing keys and buckets.
    expect_error(
        "GET missing key",
        s3.get_object().bucket("bkt").key("nope").send().await,
        404,
        Some("NoSuchKey"),
    )?;
    expect_error(
        "GET missing bucket",
        s3.get_object().bucket("nobucket").key("k").send().await,
        404,
        Some("NoSuchBucket"),
    )?;

    // Multipart: a part under 5 MiB that is not the last is refused at
    // completion, as are parts out of order; the last part may be small.
    let upload = s3
        .create_multipart_upload()
        .bucket("bkt")
        .key("mp")
        .send()
        .await?;
    let id = upload.upload_id().context("no upload id")?;
    let mut parts = Vec::new();
    for (n, seed) in [(1, 10), (2, 11)] {
        let data = payload(100_000, seed);
        let out = s3
            .upload_part()
            .bucket("bkt")
            .key("mp")
            .upload_id(id)
            .part_number(n)
            .body(ByteStream::from(data))
            .send()
            .await?;
        parts.push(
            CompletedPart::builder()
                .part_number(n)
                .e_tag(out.e_tag().context("no part ETag")?)
                .build(),
        );
    }
    let complete = |parts: Vec<CompletedPart>| {
        s3.complete_multipart_upload()
            .bucket("bkt")
            .key("mp")
            .upload_id(id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
    };
    let reversed: Vec<_> = parts.iter().rev().cloned().collect();
    expect_error(
        "complete out of order",
        complete(reversed).await,
        400,
        Some("InvalidPartOrder"),
    )?;
    expect_error(
        "complete with a small first part",
        complete(parts.clone()).await,
        400,
        Some("EntityTooSmall"),
    )?;
    complete(parts[..1].to_vec())
        .await
        .context("complete with one small last part")?;
    ensure!(
        get_all(&s3, "bkt", "mp").await? == payload(100_000, 10),
        "multipart object differs"
    );
    c.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_too_few_datanodes_take_is_refused_and_not_listed() -> Result<()> {
    let c = MemCluster::start().await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("bkt").send().await?;
    // Two of six datanodes fail every PutShard: four shards are below the
    // write quorum (k+1 = 5). The SDK retries the 503 and gets it again.
    for id in [5, 6] {
        c.faults().add(
            Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).on(&datanode_addr(id)),
        );
    }
    let data = payload(300_000, 3);
    let refused = s3
        .put_object()
        .bucket("bkt")
        .key("k")
        .body(ByteStream::from(data.clone()))
        .send()
        .await;
    expect_error(
        "PUT with two datanodes failing",
        refused,
        503,
        Some("ServiceUnavailable"),
    )?;
    let listed = s3.list_objects_v2().bucket("bkt").send().await?;
    ensure!(
        listed.contents().is_empty(),
        "a refused PUT is listed: {:?}",
        listed.contents()
    );
    // One datanode failing is within the quorum.
    c.faults().clear();
    c.faults()
        .add(Rule::new("PutShard", Action::Fail(tonic::Code::Unavailable)).on(&datanode_addr(6)));
    put(&s3, "bkt", "k", &data).await?;
    ensure!(get_all(&s3, "bkt", "k").await? == data, "object differs");
    c.shut_down().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_leaves_one_version() -> Result<()> {
    let c = MemCluster::start().await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("ver").send().await?;
    s3.put_bucket_versioning()
        .bucket("ver")
        .versioning_configuration(
            VersioningConfiguration::builder()
                .status(BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await?;
    // Meta commits the version and its answer is lost: the gateway's
    // retry (same operation id) must not write a second version.
    let dropped = c
        .faults()
        .add(Rule::new("PutObject", Action::Drop).times(1));
    let data = payload(20_000, 4);
    let out = s3
        .put_object()
        .bucket("ver")
        .key("k")
        .body(ByteStream::from(data.clone()))
        .send()
        .await?;
    ensure!(dropped.fired() == 1, "no answer was dropped");
    let versions = s3.list_object_versions().bucket("ver").send().await?;
    let ids: Vec<_> = versions
        .versions()
        .iter()
        .map(|v| v.version_id().unwrap_or_default().to_string())
        .collect();
    ensure!(
        ids == vec![out.version_id().unwrap_or_default().to_string()],
        "versions {ids:?}, PUT answered {:?}",
        out.version_id()
    );
    ensure!(get_all(&s3, "ver", "k").await? == data, "object differs");
    c.shut_down().await
}
