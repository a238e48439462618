//! Canned ACLs, bucket policies, anonymous (unsigned) requests, bucket
//! tagging and CORS, end to end through aws-sdk-s3 (an unsigned client for
//! the anonymous requests) and raw HTTP/1.1 for CORS preflights.

use std::collections::HashMap;

use anyhow::{Result, ensure};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketCannedAcl, CorsConfiguration, CorsRule, Delete, ObjectCannedAcl, ObjectIdentifier,
    Permission, Tag, Tagging, Type,
};
use bytes::Bytes;

use super::fixtures::TestCluster;
use super::{expect_error, put, raw_request, raw_request_with_body};

const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";

/// An S3 client that signs nothing (S3's anonymous requests).
fn anonymous(c: &TestCluster) -> aws_sdk_s3::Client {
    let ca = c.s3_tls.as_ref().map(|t| t.ca.cert_pem.as_str());
    let config = aws_sdk_s3::Config::builder()
        .http_client(super::fixtures::s3_http_client(ca))
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .endpoint_url(c.s3_endpoint())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .force_path_style(true)
        .allow_no_auth()
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

async fn get_body(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Bytes> {
    let out = s3.get_object().bucket(bucket).key(key).send().await?;
    Ok(out.body.collect().await?.into_bytes())
}

/// One unsigned HTTP/1.1 request to the gateway: status, headers (names
/// lowercase) and body as text.
async fn raw(
    c: &TestCluster,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, HashMap<String, String>, String)> {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let r = raw_request(method, &format!("{}{path}", c.s3_endpoint()), &headers).await?;
    Ok((
        r.status,
        r.headers,
        String::from_utf8_lossy(&r.body).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acls_policies_anonymous_access_tagging_and_cors() -> Result<()> {
    let c = TestCluster::start(1, 6).await?;
    let root = c.s3();
    let anon = anonymous(&c);
    let data = Bytes::from_static(b"public bytes");

    // A private bucket: anonymous callers get nothing, and cannot tell
    // which keys exist; a missing bucket is 404 to them as to anyone.
    root.create_bucket().bucket("acl-b").send().await?;
    put(&root, "acl-b", "k", &data).await?;
    let r = anon.get_object().bucket("acl-b").key("k").send().await;
    expect_error("anonymous GET, private", r, 403, Some("AccessDenied"))?;
    let r = anon.get_object().bucket("acl-b").key("nokey").send().await;
    expect_error(
        "anonymous GET of a missing key",
        r,
        403,
        Some("AccessDenied"),
    )?;
    let r = anon.list_objects_v2().bucket("acl-b").send().await;
    expect_error("anonymous list, private", r, 403, Some("AccessDenied"))?;
    let r = anon.get_object().bucket("nobucket").key("k").send().await;
    expect_error("anonymous GET, no bucket", r, 404, Some("NoSuchBucket"))?;
    let r = anon
        .put_object()
        .bucket("acl-b")
        .key("x")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    expect_error("anonymous PUT, private", r, 403, Some("AccessDenied"))?;
    let r = anon.list_buckets().send().await;
    expect_error("anonymous ListBuckets", r, 403, Some("AccessDenied"))?;

    // PutObjectAcl public-read: that object only becomes readable.
    root.put_object_acl()
        .bucket("acl-b")
        .key("k")
        .acl(ObjectCannedAcl::PublicRead)
        .send()
        .await?;
    ensure!(get_body(&anon, "acl-b", "k").await? == data);
    let acl = root
        .get_object_acl()
        .bucket("acl-b")
        .key("k")
        .send()
        .await?;
    let groups: Vec<(Option<&str>, Option<&Permission>)> = acl
        .grants()
        .iter()
        .filter(|g| g.grantee().map(|g| g.r#type()) == Some(&Type::Group))
        .map(|g| (g.grantee().and_then(|g| g.uri()), g.permission()))
        .collect();
    ensure!(
        groups == [(Some(ALL_USERS), Some(&Permission::Read))],
        "{groups:?}"
    );
    ensure!(acl.owner().and_then(|o| o.id()).is_some());
    let r = anon.head_object().bucket("acl-b").key("nokey").send().await;
    expect_error("anonymous HEAD of a missing key", r, 403, None)?;

    // x-amz-acl on PUT; a bucket made public-read lists, and a missing key
    // is then 404; writes still need a grant.
    root.put_object()
        .bucket("acl-b")
        .key("p2")
        .acl(ObjectCannedAcl::PublicRead)
        .body(ByteStream::from(data.clone()))
        .send()
        .await?;
    ensure!(get_body(&anon, "acl-b", "p2").await? == data);
    put(&root, "acl-b", "private-one", &data).await?;
    root.put_bucket_acl()
        .bucket("acl-b")
        .acl(BucketCannedAcl::PublicRead)
        .send()
        .await?;
    let listed = anon.list_objects_v2().bucket("acl-b").send().await?;
    ensure!(listed.key_count() == Some(3), "{listed:?}");
    let r = anon.get_object().bucket("acl-b").key("nokey").send().await;
    expect_error("anonymous GET, listable bucket", r, 404, Some("NoSuchKey"))?;
    let r = anon
        .get_object()
        .bucket("acl-b")
        .key("private-one")
        .send()
        .await;
    expect_error(
        "a private object in a public bucket",
        r,
        403,
        Some("AccessDenied"),
    )?;
    let r = anon
        .put_object_acl()
        .bucket("acl-b")
        .key("k")
        .acl(ObjectCannedAcl::Private)
        .send()
        .await;
    expect_error("anonymous PutObjectAcl", r, 403, Some("AccessDenied"))?;
    let bucket_acl = root.get_bucket_acl().bucket("acl-b").send().await?;
    ensure!(bucket_acl.grants().len() == 2, "{bucket_acl:?}");
    let r = root
        .put_bucket_acl()
        .bucket("acl-b")
        .acl(BucketCannedAcl::from("log-delivery-write"))
        .send()
        .await;
    expect_error("log-delivery-write", r, 501, Some("NotImplemented"))?;

    // public-read-write at CreateBucket: anonymous writes and deletes.
    root.create_bucket()
        .bucket("open-b")
        .acl(BucketCannedAcl::PublicReadWrite)
        .send()
        .await?;
    anon.put_object()
        .bucket("open-b")
        .key("drop")
        .body(ByteStream::from(data.clone()))
        .send()
        .await?;
    ensure!(get_body(&root, "open-b", "drop").await? == data);
    anon.delete_object()
        .bucket("open-b")
        .key("drop")
        .send()
        .await?;
    let r = root.head_object().bucket("open-b").key("drop").send().await;
    expect_error("deleted anonymously", r, 404, None)?;
    let r = anon
        .put_bucket_acl()
        .bucket("open-b")
        .acl(BucketCannedAcl::Private)
        .send()
        .await;
    expect_error("anonymous PutBucketAcl", r, 403, Some("AccessDenied"))?;

    // A bucket policy: anonymous GetObject under public/ only.
    root.create_bucket().bucket("pol-b").send().await?;
    put(&root, "pol-b", "public/x", &data).await?;
    put(&root, "pol-b", "secret/x", &data).await?;
    let policy = r#"{"Version":"2012-10-17","Statement":[{"Sid":"PublicRead","Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::pol-b/public/*"]}]}"#;
    root.put_bucket_policy()
        .bucket("pol-b")
        .policy(policy)
        .send()
        .await?;
    ensure!(get_body(&anon, "pol-b", "public/x").await? == data);
    // A copy from a source the policy opens: allowed into a bucket the
    // caller may write; a missing source stays hidden (403, as a GET).
    anon.copy_object()
        .bucket("open-b")
        .key("copied")
        .copy_source("pol-b/public/x")
        .send()
        .await?;
    let r = anon
        .copy_object()
        .bucket("open-b")
        .key("copied2")
        .copy_source("pol-b/public/missing")
        .send()
        .await;
    expect_error("copy of a hidden missing key", r, 403, Some("AccessDenied"))?;
    let r = anon
        .copy_object()
        .bucket("open-b")
        .key("copied3")
        .copy_source("pol-b/secret/x")
        .send()
        .await;
    expect_error("copy from outside the policy", r, 403, Some("AccessDenied"))?;
    // Browser form uploads (PostObject) are not served: key and ACL in the
    // body would pass no check.
    let boundary = "sluiceboundary";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nposted\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"acl\"\r\n\r\npublic-read\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--{boundary}--\r\n"
    );
    let posted = raw_request_with_body(
        "POST",
        &format!("{}/open-b", c.s3_endpoint()),
        &[(
            "Content-Type".to_string(),
            format!("multipart/form-data; boundary={boundary}"),
        )],
        form.as_bytes(),
    )
    .await?;
    ensure!(
        posted.status >= 400,
        "PostObject: {} {}",
        posted.status,
        String::from_utf8_lossy(&posted.body)
    );
    let r = root
        .head_object()
        .bucket("open-b")
        .key("posted")
        .send()
        .await;
    expect_error("nothing posted", r, 404, None)?;
    let status = root
        .get_bucket_policy_status()
        .bucket("pol-b")
        .send()
        .await?;
    ensure!(
        status.policy_status().and_then(|s| s.is_public()) == Some(true),
        "{status:?}"
    );
    // Subresources Sluice does not keep read as never configured.
    let payer = root
        .get_bucket_request_payment()
        .bucket("pol-b")
        .send()
        .await?;
    ensure!(
        payer.payer().map(|p| p.as_str()) == Some("BucketOwner"),
        "{payer:?}"
    );
    let r = root.get_bucket_encryption().bucket("pol-b").send().await;
    expect_error(
        "no encryption",
        r,
        404,
        Some("ServerSideEncryptionConfigurationNotFoundError"),
    )?;
    let r = root
        .get_object_lock_configuration()
        .bucket("pol-b")
        .send()
        .await;
    expect_error(
        "no object lock",
        r,
        404,
        Some("ObjectLockConfigurationNotFoundError"),
    )?;
    let r = root
        .get_bucket_encryption()
        .bucket("no-such-b")
        .send()
        .await;
    expect_error("no bucket", r, 404, Some("NoSuchBucket"))?;
    let r = anon
        .get_object()
        .bucket("pol-b")
        .key("secret/x")
        .send()
        .await;
    expect_error("outside the policy", r, 403, Some("AccessDenied"))?;
    let stored = root.get_bucket_policy().bucket("pol-b").send().await?;
    ensure!(stored.policy() == Some(policy), "{stored:?}");
    let r = root
        .put_bucket_policy()
        .bucket("pol-b")
        .policy(r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}]}"#)
        .send()
        .await;
    expect_error("another bucket's resource", r, 400, Some("MalformedPolicy"))?;
    let r = root
        .put_bucket_policy()
        .bucket("pol-b")
        .policy("{not json")
        .send()
        .await;
    expect_error("not JSON", r, 400, Some("MalformedPolicy"))?;
    root.delete_bucket_policy().bucket("pol-b").send().await?;
    let r = anon
        .get_object()
        .bucket("pol-b")
        .key("public/x")
        .send()
        .await;
    expect_error("policy deleted", r, 403, Some("AccessDenied"))?;
    let r = root.get_bucket_policy().bucket("pol-b").send().await;
    expect_error("no policy", r, 404, Some("NoSuchBucketPolicy"))?;

    // A policy granting everything to "*" still leaves the bucket's
    // configuration (and deletion) to its owner.
    let everything = r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::pol-b","arn:aws:s3:::pol-b/*"]},{"Effect":"Deny","Principal":"*","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::pol-b/secret/*"}]}"#;
    root.put_bucket_policy()
        .bucket("pol-b")
        .policy(everything)
        .send()
        .await?;
    let r = anon
        .put_bucket_policy()
        .bucket("pol-b")
        .policy(everything)
        .send()
        .await;
    expect_error("anonymous PutBucketPolicy", r, 403, Some("AccessDenied"))?;
    let r = anon.get_bucket_policy().bucket("pol-b").send().await;
    expect_error("anonymous GetBucketPolicy", r, 403, Some("AccessDenied"))?;
    let r = anon
        .put_bucket_acl()
        .bucket("pol-b")
        .acl(BucketCannedAcl::PublicReadWrite)
        .send()
        .await;
    expect_error("anonymous PutBucketAcl", r, 403, Some("AccessDenied"))?;
    // DeleteObjects is authorized per key: the Deny on secret/* holds.
    put(&root, "pol-b", "free/z", &data).await?;
    let del = anon
        .delete_objects()
        .bucket("pol-b")
        .delete(
            Delete::builder()
                .objects(ObjectIdentifier::builder().key("secret/x").build()?)
                .objects(ObjectIdentifier::builder().key("free/z").build()?)
                .build()?,
        )
        .send()
        .await?;
    let deleted: Vec<&str> = del.deleted().iter().filter_map(|d| d.key()).collect();
    let refused: Vec<(&str, &str)> = del
        .errors()
        .iter()
        .map(|e| (e.key().unwrap_or_default(), e.code().unwrap_or_default()))
        .collect();
    ensure!(
        deleted == ["free/z"] && refused == [("secret/x", "AccessDenied")],
        "{del:?}"
    );
    ensure!(get_body(&root, "pol-b", "secret/x").await? == data);
    root.delete_bucket_policy().bucket("pol-b").send().await?;

    // Settings cached for a deleted bucket are not a new bucket's.
    root.create_bucket()
        .bucket("reuse-b")
        .acl(BucketCannedAcl::PublicReadWrite)
        .send()
        .await?;
    anon.list_objects_v2().bucket("reuse-b").send().await?;
    root.delete_bucket().bucket("reuse-b").send().await?;
    root.create_bucket().bucket("reuse-b").send().await?;
    let r = anon
        .put_object()
        .bucket("reuse-b")
        .key("planted")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    expect_error(
        "anonymous PUT, recreated private",
        r,
        403,
        Some("AccessDenied"),
    )?;

    // Bucket tagging.
    let r = root.get_bucket_tagging().bucket("pol-b").send().await;
    expect_error("untagged bucket", r, 404, Some("NoSuchTagSet"))?;
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build().expect("tag");
    root.put_bucket_tagging()
        .bucket("pol-b")
        .tagging(
            Tagging::builder()
                .tag_set(tag("team", "storage"))
                .tag_set(tag("env", ""))
                .build()?,
        )
        .send()
        .await?;
    let tags = root.get_bucket_tagging().bucket("pol-b").send().await?;
    let pairs: Vec<(&str, &str)> = tags
        .tag_set()
        .iter()
        .map(|t| (t.key(), t.value()))
        .collect();
    ensure!(pairs == [("team", "storage"), ("env", "")], "{pairs:?}");
    let mut too_many = Tagging::builder();
    for i in 0..51 {
        too_many = too_many.tag_set(tag(&format!("k{i}"), "v"));
    }
    let r = root
        .put_bucket_tagging()
        .bucket("pol-b")
        .tagging(too_many.build()?)
        .send()
        .await;
    expect_error("51 bucket tags", r, 400, Some("InvalidTag"))?;
    root.delete_bucket_tagging().bucket("pol-b").send().await?;
    let r = root.get_bucket_tagging().bucket("pol-b").send().await;
    expect_error("tags deleted", r, 404, Some("NoSuchTagSet"))?;

    // CORS: no configuration, then one rule; preflights and actual requests.
    let preflight = |origin: &'static str, method: &'static str, headers: &'static str| {
        let mut h = vec![
            ("Origin", origin),
            ("Access-Control-Request-Method", method),
        ];
        if !headers.is_empty() {
            h.push(("Access-Control-Request-Headers", headers));
        }
        h
    };
    let (status, _, body) = raw(
        &c,
        "OPTIONS",
        "/acl-b/k",
        &preflight("https://app.example.com", "GET", ""),
    )
    .await?;
    ensure!(
        status == 403 && body.contains("CORS is not enabled"),
        "{status} {body}"
    );
    let r = root.get_bucket_cors().bucket("acl-b").send().await;
    expect_error("no CORS", r, 404, Some("NoSuchCORSConfiguration"))?;
    let rule = CorsRule::builder()
        .allowed_origins("https://*.example.com")
        .allowed_methods("GET")
        .allowed_methods("PUT")
        .allowed_headers("x-amz-*")
        .expose_headers("ETag")
        .max_age_seconds(600)
        .build()?;
    root.put_bucket_cors()
        .bucket("acl-b")
        .cors_configuration(CorsConfiguration::builder().cors_rules(rule).build()?)
        .send()
        .await?;
    let cors = root.get_bucket_cors().bucket("acl-b").send().await?;
    let got = &cors.cors_rules()[0];
    ensure!(
        got.allowed_origins() == ["https://*.example.com"]
            && got.allowed_methods() == ["GET", "PUT"]
            && got.expose_headers() == ["ETag"]
            && got.max_age_seconds() == Some(600),
        "{cors:?}"
    );
    let (status, h, _) = raw(
        &c,
        "OPTIONS",
        "/acl-b/k",
        &preflight(
            "https://app.example.com",
            "PUT",
            "X-Amz-Date, x-amz-content-sha256",
        ),
    )
    .await?;
    ensure!(status == 200, "preflight: {status} {h:?}");
    ensure!(
        h.get("access-control-allow-origin").map(String::as_str) == Some("https://app.example.com")
            && h.get("access-control-allow-methods").map(String::as_str) == Some("GET, PUT")
            && h.get("access-control-allow-headers").map(String::as_str)
                == Some("x-amz-date, x-amz-content-sha256")
            && h.get("access-control-max-age").map(String::as_str) == Some("600"),
        "{h:?}"
    );
    let (status, _, body) = raw(
        &c,
        "OPTIONS",
        "/acl-b/k",
        &preflight("https://evil.test", "GET", ""),
    )
    .await?;
    ensure!(
        status == 403 && body.contains("CORSResponse"),
        "{status} {body}"
    );
    let (status, _, _) = raw(
        &c,
        "OPTIONS",
        "/acl-b/k",
        &preflight("https://app.example.com", "DELETE", ""),
    )
    .await?;
    ensure!(status == 403, "DELETE is not allowed: {status}");
    // An actual (anonymous) GET from an allowed origin carries the headers.
    let (status, h, body) = raw(
        &c,
        "GET",
        "/acl-b/k",
        &[("Origin", "https://app.example.com")],
    )
    .await?;
    ensure!(
        status == 200 && body.as_bytes() == &data[..],
        "{status} {body}"
    );
    ensure!(
        h.get("access-control-allow-origin").map(String::as_str) == Some("https://app.example.com")
            && h.get("access-control-expose-headers").map(String::as_str) == Some("ETag"),
        "{h:?}"
    );
    let (_, h, _) = raw(&c, "GET", "/acl-b/k", &[("Origin", "https://evil.test")]).await?;
    ensure!(!h.contains_key("access-control-allow-origin"), "{h:?}");
    root.delete_bucket_cors().bucket("acl-b").send().await?;
    let (status, _, _) = raw(
        &c,
        "OPTIONS",
        "/acl-b/k",
        &preflight("https://app.example.com", "GET", ""),
    )
    .await?;
    ensure!(status == 403, "CORS deleted: {status}");
    Ok(())
}
