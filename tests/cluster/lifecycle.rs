//! Bucket lifecycle rules executed by the meta leader: objects expired and
//! incomplete multipart uploads aborted after their (shortened) days, the
//! rest left alone; the configuration's S3 round trip and errors.

use std::time::Duration;

use anyhow::{Result, ensure};
use aws_sdk_s3::types::{
    AbortIncompleteMultipartUpload, BucketLifecycleConfiguration, ExpirationStatus,
    LifecycleExpiration, LifecycleRule, LifecycleRuleFilter,
};
use bytes::Bytes;

use super::fixtures::{Setup, TestCluster, wait_until};
use super::{expect_error, put};

/// A lifecycle "day" in this test.
const DAY: Duration = Duration::from_secs(2);

fn setup() -> Setup {
    Setup {
        meta: Some(|c| {
            c.lifecycle_check_interval = Duration::from_millis(300);
            c.lifecycle_day = DAY;
        }),
        ..Setup::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lifecycle_rules_expire_objects_and_abort_uploads() -> Result<()> {
    let c = TestCluster::start_setup(1, 6, setup()).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("lc-b").send().await?;
    let data = Bytes::from_static(b"expiring");
    put(&s3, "lc-b", "logs/a", &data).await?;
    put(&s3, "lc-b", "logs/b", &data).await?;
    put(&s3, "lc-b", "keep/c", &data).await?;
    let logs_upload = s3
        .create_multipart_upload()
        .bucket("lc-b")
        .key("logs/big")
        .send()
        .await?;
    let keep_upload = s3
        .create_multipart_upload()
        .bucket("lc-b")
        .key("keep/big")
        .send()
        .await?;

    let r = s3
        .get_bucket_lifecycle_configuration()
        .bucket("lc-b")
        .send()
        .await;
    expect_error(
        "no configuration",
        r,
        404,
        Some("NoSuchLifecycleConfiguration"),
    )?;
    let logs = LifecycleRule::builder()
        .id("logs")
        .status(ExpirationStatus::Enabled)
        .filter(LifecycleRuleFilter::builder().prefix("logs/").build())
        .expiration(LifecycleExpiration::builder().days(1).build())
        .abort_incomplete_multipart_upload(
            AbortIncompleteMultipartUpload::builder()
                .days_after_initiation(1)
                .build(),
        )
        .build()?;
    let bad = LifecycleRule::builder()
        .id("bad")
        .status(ExpirationStatus::Enabled)
        .filter(LifecycleRuleFilter::builder().prefix("x/").build())
        .expiration(LifecycleExpiration::builder().days(0).build())
        .build()?;
    let r = s3
        .put_bucket_lifecycle_configuration()
        .bucket("lc-b")
        .lifecycle_configuration(BucketLifecycleConfiguration::builder().rules(bad).build()?)
        .send()
        .await;
    expect_error("zero days", r, 400, Some("InvalidArgument"))?;
    s3.put_bucket_lifecycle_configuration()
        .bucket("lc-b")
        .lifecycle_configuration(
            BucketLifecycleConfiguration::builder()
                .rules(logs)
                .build()?,
        )
        .send()
        .await?;
    let got = s3
        .get_bucket_lifecycle_configuration()
        .bucket("lc-b")
        .send()
        .await?;
    let rule = &got.rules()[0];
    ensure!(
        rule.id() == Some("logs")
            && rule.expiration().and_then(|e| e.days()) == Some(1)
            && rule.filter().and_then(|f| f.prefix()) == Some("logs/"),
        "{got:?}"
    );

    // After a day (2 s here) and a sweep, logs/ is gone, keep/ is not.
    wait_until("logs/ expired", Duration::from_secs(30), || async {
        let listed = s3
            .list_objects_v2()
            .bucket("lc-b")
            .send()
            .await
            .map_err(|e| format!("{e:?}"))?;
        let keys: Vec<String> = listed
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect();
        if keys == ["keep/c"] {
            Ok(())
        } else {
            Err(format!("keys {keys:?}"))
        }
    })
    .await?;
    let r = s3.get_object().bucket("lc-b").key("logs/a").send().await;
    expect_error("expired", r, 404, Some("NoSuchKey"))?;
    let uploads = s3.list_multipart_uploads().bucket("lc-b").send().await?;
    let ids: Vec<&str> = uploads
        .uploads()
        .iter()
        .filter_map(|u| u.upload_id())
        .collect();
    ensure!(
        ids == [keep_upload.upload_id().unwrap_or_default()],
        "only the keep/ upload remains: {ids:?} (logs: {:?})",
        logs_upload.upload_id()
    );
    // A new object under logs/ lives its own day.
    put(&s3, "lc-b", "logs/new", &data).await?;
    ensure!(
        s3.head_object()
            .bucket("lc-b")
            .key("logs/new")
            .send()
            .await
            .is_ok()
    );

    s3.delete_bucket_lifecycle().bucket("lc-b").send().await?;
    let r = s3
        .get_bucket_lifecycle_configuration()
        .bucket("lc-b")
        .send()
        .await;
    expect_error("deleted", r, 404, Some("NoSuchLifecycleConfiguration"))?;
    // Absence of an effect: two days and several sweeps pass.
    tokio::time::sleep(DAY * 2).await;
    ensure!(
        s3.head_object()
            .bucket("lc-b")
            .key("logs/new")
            .send()
            .await
            .is_ok(),
        "no rule, no expiry"
    );
    Ok(())
}
