use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;

use super::*;
use crate::fake_s3::{FakeS3, Fault};

fn options(endpoint: String, max_attempts: u32) -> ClientOptions {
    ClientOptions {
        endpoint,
        ca_bundle: None,
        region: "us-east-1".into(),
        access_key: "ak".into(),
        secret_key: "sk".into(),
        max_attempts,
        initial_backoff: Duration::from_millis(5),
        attempt_timeout: Duration::from_secs(10),
        checksum: ChecksumMode::WhenSupported,
    }
}

async fn upload_part(client: &aws_sdk_s3::Client) -> Result<(), String> {
    client
        .upload_part()
        .bucket("b")
        .key("k")
        .upload_id("u")
        .part_number(1)
        .body(ByteStream::from(vec![7u8; 4096]))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| e.code().unwrap_or("no code").to_owned())
}

#[tokio::test]
async fn retried_slowdowns_are_each_counted() {
    let fake = FakeS3::start(vec![Fault::SlowDown, Fault::SlowDown], 0).await;
    let tally = Arc::new(ErrorTally::default());
    let client = build_client(&options(fake.endpoint(), 3), Arc::clone(&tally));
    tokio::time::timeout(Duration::from_secs(30), upload_part(&client))
        .await
        .expect("in time")
        .expect("third attempt succeeds");
    assert_eq!(tally.count(SLOW_DOWN), 2);
    assert_eq!(tally.total(), 2);
    assert_eq!(
        fake.state
            .upload_part_requests
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test]
async fn final_failure_is_counted_once_per_attempt() {
    let fake = FakeS3::start(vec![Fault::InternalError, Fault::InternalError], 0).await;
    let tally = Arc::new(ErrorTally::default());
    let client = build_client(&options(fake.endpoint(), 2), Arc::clone(&tally));
    let code = tokio::time::timeout(Duration::from_secs(30), upload_part(&client))
        .await
        .expect("in time")
        .expect_err("both attempts fail");
    assert_eq!(code, "InternalError");
    assert_eq!(
        tally.snapshot(),
        BTreeMap::from([("InternalError".to_owned(), 2)])
    );
}

#[tokio::test]
async fn connection_refused_is_counted_without_s3_code() {
    // Bind and drop a listener so that the port is (very likely) closed.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let tally = Arc::new(ErrorTally::default());
    let client = build_client(&options(format!("http://{addr}"), 1), Arc::clone(&tally));
    let result = tokio::time::timeout(Duration::from_secs(30), upload_part(&client))
        .await
        .expect("in time");
    assert!(result.is_err());
    assert_eq!(tally.total(), 1);
    let codes = tally.snapshot();
    assert!(
        codes.contains_key("IoError") || codes.contains_key("ConnectorError"),
        "unexpected classification {codes:?}"
    );
}

#[tokio::test]
async fn ensure_bucket_accepts_existing_bucket() {
    let fake = FakeS3::start(vec![], 0).await;
    let tally = Arc::new(ErrorTally::default());
    let client = build_client(&options(fake.endpoint(), 1), tally);
    let created = ensure_bucket(&client, "b", "us-east-1")
        .await
        .expect("bucket");
    assert!(!created, "HeadBucket 200 means it exists");
}

#[test]
fn tally_reset_forgets_everything() {
    let tally = ErrorTally::default();
    tally.record("SlowDown");
    tally.record("SlowDown");
    tally.record("Timeout");
    assert_eq!(tally.count("SlowDown"), 2);
    assert_eq!(tally.total(), 3);
    tally.reset();
    assert_eq!(tally.total(), 0);
    assert!(tally.snapshot().is_empty());
}
