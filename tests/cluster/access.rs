//! S3 over HTTPS and access keys: aws-sdk-s3 clients trusting a test CA
//! against a gateway with a test certificate; keys created through the
//! meta `Admin` service; per-bucket authorization (AccessDenied,
//! InvalidAccessKeyId, filtered ListBuckets, grants, key deletion); the
//! certificate reloaded on SIGHUP.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use sluice_meta_client::new_op_id;
use sluice_proto::admin::{self as apb, admin_client::AdminClient};

use super::fixtures::{Setup, TestCa, TestCluster, wait_until};
use super::{expect_error, put};

/// Longer than the gateway's key cache TTL (5 s): how long a grant change
/// or a key deletion may take to reach the gateway, plus slack.
const KEY_CHANGE_TIMEOUT: Duration = Duration::from_secs(20);

fn https_setup() -> Setup {
    Setup {
        https: true,
        ..Setup::default()
    }
}

async fn create_key(c: &TestCluster, name: &str) -> Result<(String, String)> {
    let req = apb::CreateKeyRequest {
        name: name.into(),
        op_id: new_op_id(),
    };
    let resp = c
        .admin()
        .call_on("CreateKey", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).create_key(req).await }
        })
        .await?;
    let key = resp.key.context("CreateKey without a key")?;
    ensure!(key.name == name && !resp.secret.is_empty());
    Ok((key.id, resp.secret))
}

async fn allow(c: &TestCluster, id: &str, bucket: &str, read: bool, write: bool) -> Result<()> {
    let req = apb::KeyGrantRequest {
        id: id.into(),
        bucket: bucket.into(),
        read,
        write,
        owner: false,
        op_id: new_op_id(),
    };
    c.admin()
        .call_on("AllowKey", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).allow_key(req).await }
        })
        .await?;
    Ok(())
}

async fn bucket_names(s3: &aws_sdk_s3::Client) -> Result<Vec<String>> {
    let out = s3.list_buckets().send().await?;
    Ok(out
        .buckets()
        .iter()
        .filter_map(|b| b.name().map(str::to_string))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn https_access_keys_and_bucket_permissions() -> Result<()> {
    let c = TestCluster::start_setup(1, 6, https_setup()).await?;
    ensure!(c.s3_endpoint().starts_with("https://"));
    let root = c.s3();
    root.create_bucket().bucket("root-bucket").send().await?;

    let (alice_id, alice_secret) = create_key(&c, "alice").await?;
    let (bob_id, bob_secret) = create_key(&c, "bob").await?;
    let alice = c.s3_with(&alice_id, &alice_secret);
    let bob = c.s3_with(&bob_id, &bob_secret);

    // A key creating a bucket owns it: it may write, read and list it at
    // once (the gateway forgets its cached grants after the create).
    alice.create_bucket().bucket("alice-bucket").send().await?;
    let data = Bytes::from_static(b"alice's data");
    put(&alice, "alice-bucket", "a.txt", &data).await?;
    let got = super::get_all(&alice, "alice-bucket", "a.txt").await?;
    ensure!(got == data);

    // ListBuckets shows only the buckets a key has a grant on.
    ensure!(bucket_names(&alice).await? == ["alice-bucket"]);
    ensure!(bucket_names(&bob).await?.is_empty());
    ensure!(bucket_names(&root).await? == ["alice-bucket", "root-bucket"]);

    // No grant: GET, PUT, LIST and DeleteBucket are AccessDenied.
    expect_error(
        "bob GET",
        bob.get_object()
            .bucket("alice-bucket")
            .key("a.txt")
            .send()
            .await,
        403,
        Some("AccessDenied"),
    )?;
    expect_error(
        "bob PUT",
        bob.put_object()
            .bucket("alice-bucket")
            .key("b.txt")
            .body(Bytes::from_static(b"x").into())
            .send()
            .await,
        403,
        Some("AccessDenied"),
    )?;
    expect_error(
        "bob LIST",
        bob.list_objects_v2().bucket("alice-bucket").send().await,
        403,
        Some("AccessDenied"),
    )?;
    expect_error(
        "bob DeleteBucket",
        bob.delete_bucket().bucket("alice-bucket").send().await,
        403,
        Some("AccessDenied"),
    )?;
    // Re-creating someone else's bucket.
    expect_error(
        "bob CreateBucket of alice-bucket",
        bob.create_bucket().bucket("alice-bucket").send().await,
        409,
        Some("BucketAlreadyExists"),
    )?;
    // Alice has no grant on the root key's bucket either.
    expect_error(
        "alice GET root-bucket",
        alice.list_objects_v2().bucket("root-bucket").send().await,
        403,
        Some("AccessDenied"),
    )?;

    // Read granted: GET and LIST work (within the cache TTL), PUT does not.
    allow(&c, &bob_id, "alice-bucket", true, false).await?;
    let bob_ref = &bob;
    wait_until(
        "bob's read grant to reach the gateway",
        KEY_CHANGE_TIMEOUT,
        || async move {
            bob_ref
                .get_object()
                .bucket("alice-bucket")
                .key("a.txt")
                .send()
                .await
                .map(|_| ())
                .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
        },
    )
    .await?;
    let listed = bob.list_objects_v2().bucket("alice-bucket").send().await?;
    ensure!(listed.contents().len() == 1);
    ensure!(bucket_names(&bob).await? == ["alice-bucket"]);
    expect_error(
        "bob PUT with read only",
        bob.put_object()
            .bucket("alice-bucket")
            .key("b.txt")
            .body(Bytes::from_static(b"x").into())
            .send()
            .await,
        403,
        Some("AccessDenied"),
    )?;
    // CopyObject into his own bucket needs read on the source: allowed;
    // out of the root bucket: denied.
    bob.create_bucket().bucket("bob-bucket").send().await?;
    bob.copy_object()
        .bucket("bob-bucket")
        .key("copy.txt")
        .copy_source("alice-bucket/a.txt")
        .send()
        .await?;
    put(&root, "root-bucket", "secret.txt", &data).await?;
    expect_error(
        "bob CopyObject from root-bucket",
        bob.copy_object()
            .bucket("bob-bucket")
            .key("stolen.txt")
            .copy_source("root-bucket/secret.txt")
            .send()
            .await,
        403,
        Some("AccessDenied"),
    )?;

    // An unknown key.
    let stranger = c.s3_with("SKNOSUCHKEY0000000000000", "whatever");
    expect_error(
        "unknown key",
        stranger.list_buckets().send().await,
        403,
        Some("InvalidAccessKeyId"),
    )?;

    // ListKeys: no secrets, alice owns her bucket.
    let keys = c
        .admin()
        .call_on("ListKeys", |ch| async move {
            AdminClient::new(ch)
                .list_keys(apb::ListKeysRequest {})
                .await
        })
        .await?
        .keys;
    let alice_info = keys
        .iter()
        .find(|k| k.id == alice_id)
        .context("alice listed")?;
    ensure!(
        alice_info
            .grants
            .iter()
            .any(|g| g.bucket == "alice-bucket" && g.read && g.write && g.owner),
        "{alice_info:?}"
    );
    let listed_json = serde_json::to_string(&keys)?;
    ensure!(!listed_json.contains(&alice_secret) && !listed_json.contains(&bob_secret));

    // A deleted key stops working within the cache TTL.
    let req = apb::DeleteKeyRequest {
        id: bob_id.clone(),
        op_id: new_op_id(),
    };
    c.admin()
        .call_on("DeleteKey", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).delete_key(req).await }
        })
        .await?;
    wait_until(
        "bob's deleted key to be refused",
        KEY_CHANGE_TIMEOUT,
        || async move {
            match bob_ref.list_buckets().send().await {
                Ok(_) => Err("still accepted".to_string()),
                Err(e) => {
                    use aws_sdk_s3::error::ProvideErrorMetadata;
                    match e.code() {
                        Some("InvalidAccessKeyId") => Ok(()),
                        other => Err(format!("error {other:?}")),
                    }
                }
            }
        },
    )
    .await?;
    // Alice still works.
    ensure!(bucket_names(&alice).await? == ["alice-bucket"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_reloads_the_s3_certificate() -> Result<()> {
    let c = TestCluster::start_setup(1, 6, https_setup()).await?;
    let tls = c.s3_tls.as_ref().context("https cluster")?;
    let (ak, sk) = (super::fixtures::ACCESS_KEY, super::fixtures::SECRET_KEY);
    let new_ca = TestCa::new("second test CA")?;
    // Not trusted yet: the gateway serves a certificate of the first CA.
    let trusting_new = c.s3_trusting(ak, sk, Some(&new_ca.cert_pem));
    ensure!(
        trusting_new.list_buckets().send().await.is_err(),
        "a client trusting only the new CA connected before the reload"
    );

    // Files replaced with a broken certificate: SIGHUP keeps the old one.
    std::fs::write(&tls.cert, "garbage")?;
    nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGHUP)?;
    let old = c.s3();
    // (A new client: no pooled connection.)
    wait_until(
        "the old certificate to keep serving",
        KEY_CHANGE_TIMEOUT,
        || async {
            c.s3()
                .list_buckets()
                .send()
                .await
                .map(|_| ())
                .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
        },
    )
    .await?;

    new_ca.issue(&tls.cert, &tls.key)?;
    nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGHUP)?;
    wait_until(
        "the new certificate after SIGHUP",
        KEY_CHANGE_TIMEOUT,
        || async {
            c.s3_trusting(ak, sk, Some(&new_ca.cert_pem))
                .list_buckets()
                .send()
                .await
                .map(|_| ())
                .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
        },
    )
    .await?;
    // New connections of a client trusting only the first CA now fail.
    ensure!(
        c.s3().list_buckets().send().await.is_err(),
        "a new connection still got the old certificate"
    );
    drop(old);
    Ok(())
}
