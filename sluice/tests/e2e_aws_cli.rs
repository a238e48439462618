//! End to end: the built `sluice` binary started as `sluice dev`, driven by
//! the aws CLI and curl exactly as a user would (README quickstart).
//!
//! Needs `aws` (aws-cli), `curl`, `s3cmd`, `rclone` and python's boto3
//! and minio on PATH; `.ci/run` installs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use sluice_harness::cluster::reserve_port_range;
use sluice_harness::dev::{Dev, DevOptions};

const ACCESS_KEY: &str = "SLUICEE2ETESTKEY";
const SECRET_KEY: &str = "e2e-secret-key-0123456789abcdef";

/// Starts `sluice dev` and checks that its banner names the endpoint, the
/// metrics endpoint, and the CA bundle iff `https`.
fn start_dev(data_dir: &Path, s3_port: u16, grpc_base: u16, metrics_port: u16, https: bool) -> Dev {
    let options = DevOptions::new(
        Path::new(env!("CARGO_BIN_EXE_sluice")),
        data_dir,
        s3_port,
        grpc_base,
        (ACCESS_KEY, SECRET_KEY),
    )
    .metrics_port(metrics_port)
    .https(https);
    let dev = Dev::start(options).expect("start sluice dev");
    let scheme = if https { "https" } else { "http" };
    assert_eq!(dev.endpoint, format!("{scheme}://127.0.0.1:{s3_port}"));
    assert_eq!(
        dev.ca_bundle.is_some(),
        https,
        "the banner names the CA iff --https"
    );
    assert_eq!(
        dev.metrics_url.as_deref(),
        Some(format!("http://127.0.0.1:{metrics_port}/metrics").as_str()),
        "banner names the metrics endpoint"
    );
    dev
}

/// GET /metrics with curl; the Prometheus text exposition.
fn scrape(dev: &Dev) -> String {
    let url = dev.metrics_url.as_deref().expect("metrics on");
    run_ok(&format!("curl {url}"), "curl", &["-sS", "-f", url], &[])
}

/// Sends SIGINT (Ctrl-C) and expects a clean exit.
fn stop(dev: Dev) {
    let status = dev
        .stop(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status.success(),
        "sluice dev exited with {status} after Ctrl-C"
    );
}

fn aws(dev: &Dev, args: &[&str]) -> Output {
    aws_as(dev, (ACCESS_KEY, SECRET_KEY), args)
}

fn aws_as(dev: &Dev, (access_key, secret_key): (&str, &str), args: &[&str]) -> Output {
    let mut command = Command::new("aws");
    if let Some(ca) = &dev.ca_bundle {
        command.arg("--ca-bundle").arg(ca);
    }
    command
        .arg("--endpoint-url")
        .arg(&dev.endpoint)
        .args(args)
        .env("AWS_ACCESS_KEY_ID", access_key)
        .env("AWS_SECRET_ACCESS_KEY", secret_key)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("run aws (is aws-cli installed? .ci/run installs it)")
}

/// boto3 (default flexible checksums on) against the HTTPS endpoint with
/// the dev CA as its `verify` bundle: put, head, get byte-identical,
/// list, delete; a FULL_OBJECT CRC32 multipart upload (type fixed at create,
/// wrong whole-object CRC refused), a conditional Complete, partNumber of a
/// single-part object, GetObjectAttributes, GetBucketVersioning, object
/// tagging, canned ACLs read anonymously (urllib, as curl), a bucket
/// policy, bucket tagging, CORS and lifecycle configuration,
/// ListBuckets pages and presigned-URL expiry rules. `.ci/run` installs
/// boto3 beside the aws CLI.
fn boto3_round_trip(dev: &Dev, ca: &str) {
    const SCRIPT: &str = r#"
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], verify=sys.argv[2], region_name="us-east-1",
                  aws_access_key_id=os.environ["AK"], aws_secret_access_key=os.environ["SK"])
s3.create_bucket(Bucket="boto3-tls")
body = os.urandom(3 * 1024 * 1024 + 17)
s3.put_object(Bucket="boto3-tls", Key="k", Body=body)
assert s3.head_object(Bucket="boto3-tls", Key="k")["ContentLength"] == len(body)
assert s3.get_object(Bucket="boto3-tls", Key="k")["Body"].read() == body
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="boto3-tls")["Contents"]]
assert keys == ["k"], keys
s3.delete_object(Bucket="boto3-tls", Key="k")

import base64, ssl, urllib.request, urllib.error, zlib
from botocore.exceptions import ClientError
def code(call):
    try:
        call()
    except ClientError as e:
        return e.response["Error"]["Code"]
    raise AssertionError("succeeded")
# Multipart with a FULL_OBJECT CRC32: the type is fixed at create.
up = s3.create_multipart_upload(Bucket="boto3-tls", Key="mp", ChecksumAlgorithm="CRC32",
                                ChecksumType="FULL_OBJECT")["UploadId"]
chunks = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
parts = []
for n, chunk in enumerate(chunks, 1):
    r = s3.upload_part(Bucket="boto3-tls", Key="mp", UploadId=up, PartNumber=n, Body=chunk,
                       ChecksumAlgorithm="CRC32")
    parts.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
whole = b"".join(chunks)
crc = base64.b64encode(zlib.crc32(whole).to_bytes(4, "big")).decode()
wrong = base64.b64encode(zlib.crc32(b"other").to_bytes(4, "big")).decode()
assert code(lambda: s3.complete_multipart_upload(Bucket="boto3-tls", Key="mp", UploadId=up,
            MultipartUpload={"Parts": parts}, ChecksumCRC32=wrong)) == "BadDigest"
done = s3.complete_multipart_upload(Bucket="boto3-tls", Key="mp", UploadId=up,
                                    MultipartUpload={"Parts": parts})
assert done["ChecksumCRC32"] == crc and done["ChecksumType"] == "FULL_OBJECT", done
head = s3.head_object(Bucket="boto3-tls", Key="mp", ChecksumMode="ENABLED")
assert head["ChecksumCRC32"] == crc and head["ChecksumType"] == "FULL_OBJECT", head
assert s3.get_object(Bucket="boto3-tls", Key="mp")["Body"].read() == whole
# GetObjectAttributes: the whole-object checksum and a page of parts.
a = s3.get_object_attributes(Bucket="boto3-tls", Key="mp", MaxParts=1,
                             ObjectAttributes=["ETag", "Checksum", "ObjectParts", "ObjectSize"])
assert a["ETag"].strip('"') == done["ETag"].strip('"') and a["ObjectSize"] == len(whole), a
assert a["Checksum"] == {"ChecksumCRC32": crc, "ChecksumType": "FULL_OBJECT"}, a
op = a["ObjectParts"]
assert op["TotalPartsCount"] == 2 and op["IsTruncated"] and op["NextPartNumberMarker"] == 1, op
assert [(p["PartNumber"], p["Size"]) for p in op["Parts"]] == [(1, len(chunks[0]))], op
assert "Status" not in s3.get_bucket_versioning(Bucket="boto3-tls")
# Versioning: ids on PUT, GET by id, delete markers, listing, delete by id.
s3.create_bucket(Bucket="boto3-ver")
s3.put_bucket_versioning(Bucket="boto3-ver", VersioningConfiguration={"Status": "Enabled"})
assert s3.get_bucket_versioning(Bucket="boto3-ver")["Status"] == "Enabled"
v1 = s3.put_object(Bucket="boto3-ver", Key="k", Body=b"one")["VersionId"]
v2 = s3.put_object(Bucket="boto3-ver", Key="k", Body=b"two")["VersionId"]
assert v1 != v2
assert s3.get_object(Bucket="boto3-ver", Key="k", VersionId=v1)["Body"].read() == b"one"
d = s3.delete_object(Bucket="boto3-ver", Key="k")
assert d["DeleteMarker"] and d["VersionId"] not in (v1, v2), d
assert code(lambda: s3.get_object(Bucket="boto3-ver", Key="k")) == "NoSuchKey"
lv = s3.list_object_versions(Bucket="boto3-ver")
assert sorted(v["VersionId"] for v in lv["Versions"]) == sorted([v1, v2]), lv
assert [(m["VersionId"], m["IsLatest"]) for m in lv["DeleteMarkers"]] == [(d["VersionId"], True)], lv
s3.delete_object(Bucket="boto3-ver", Key="k", VersionId=d["VersionId"])
assert s3.get_object(Bucket="boto3-ver", Key="k")["Body"].read() == b"two"
r = s3.delete_objects(Bucket="boto3-ver", Delete={"Objects": [
    {"Key": "k", "VersionId": v1}, {"Key": "k", "VersionId": v2}]})
assert len(r["Deleted"]) == 2, r
s3.delete_bucket(Bucket="boto3-ver")
# Object tagging: on PUT, replaced by PutObjectTagging, limits enforced.
s3.put_object(Bucket="boto3-tls", Key="tags", Body=b"t", Tagging="a=1&b=two%20words")
assert s3.get_object_tagging(Bucket="boto3-tls", Key="tags")["TagSet"] == [
    {"Key": "a", "Value": "1"}, {"Key": "b", "Value": "two words"}]
assert s3.get_object(Bucket="boto3-tls", Key="tags")["TagCount"] == 2
s3.put_object_tagging(Bucket="boto3-tls", Key="tags", Tagging={"TagSet": [{"Key": "c", "Value": "3"}]})
assert s3.get_object_tagging(Bucket="boto3-tls", Key="tags")["TagSet"] == [{"Key": "c", "Value": "3"}]
eleven = [{"Key": "k%d" % i, "Value": "v"} for i in range(11)]
assert code(lambda: s3.put_object_tagging(Bucket="boto3-tls", Key="tags",
                                          Tagging={"TagSet": eleven})) == "BadRequest"
s3.delete_object_tagging(Bucket="boto3-tls", Key="tags")
assert s3.get_object_tagging(Bucket="boto3-tls", Key="tags")["TagSet"] == []
s3.delete_object(Bucket="boto3-tls", Key="tags")
# Conditional Complete onto an existing key.
up2 = s3.create_multipart_upload(Bucket="boto3-tls", Key="mp")["UploadId"]
r = s3.upload_part(Bucket="boto3-tls", Key="mp", UploadId=up2, PartNumber=1, Body=b"late")
assert code(lambda: s3.complete_multipart_upload(Bucket="boto3-tls", Key="mp", UploadId=up2,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": r["ETag"]}]},
            IfNoneMatch="*")) == "PreconditionFailed"
assert s3.get_object(Bucket="boto3-tls", Key="mp")["Body"].read() == whole
s3.abort_multipart_upload(Bucket="boto3-tls", Key="mp", UploadId=up2)
# A part number other than 1 of a single-part object.
s3.put_object(Bucket="boto3-tls", Key="single", Body=b"one part")
assert code(lambda: s3.get_object(Bucket="boto3-tls", Key="single", PartNumber=2)) == "InvalidPart"
# ListBuckets pages.
s3.create_bucket(Bucket="boto3-tls-2")
page = s3.list_buckets(MaxBuckets=1, Prefix="boto3-tls")
assert [b["Name"] for b in page["Buckets"]] == ["boto3-tls"] and page.get("ContinuationToken"), page
page = s3.list_buckets(MaxBuckets=1, Prefix="boto3-tls", ContinuationToken=page["ContinuationToken"])
assert [b["Name"] for b in page["Buckets"]] == ["boto3-tls-2"] and "ContinuationToken" not in page, page
s3.delete_bucket(Bucket="boto3-tls-2")
# Presigned URLs: valid for 300 s works; over 7 days or negative is 403.
ctx = ssl.create_default_context(cafile=sys.argv[2])
def fetch(url):
    try:
        with urllib.request.urlopen(url, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
# boto3 presigns with SigV2 (Expires=<time>) by default, SigV4 (X-Amz-Expires) when asked.
from botocore.config import Config
v4 = boto3.client("s3", endpoint_url=sys.argv[1], verify=sys.argv[2], region_name="us-east-1",
                  aws_access_key_id=os.environ["AK"], aws_secret_access_key=os.environ["SK"],
                  config=Config(signature_version="s3v4"))
for client, marker in ((s3, "Expires="), (v4, "X-Amz-Expires=")):
    url = client.generate_presigned_url("get_object", Params={"Bucket": "boto3-tls", "Key": "single"},
                                        ExpiresIn=300)
    assert marker in url and fetch(url) == (200, b"one part"), (url, fetch(url))
    for expires in (609901, -7):
        url = client.generate_presigned_url("get_object",
                                            Params={"Bucket": "boto3-tls", "Key": "single"},
                                            ExpiresIn=expires)
        status, body = fetch(url)
        assert status == 403 and b"<Code>AccessDenied</Code>" in body, (url, status, body)
# Anonymous access: a public-read object is readable unsigned (urllib as curl
# would), a private one and a missing bucket are not.
s3.put_object(Bucket="boto3-tls", Key="pub", Body=b"for all", ACL="public-read")
base = sys.argv[1] + "/boto3-tls/"
assert fetch(base + "pub") == (200, b"for all"), fetch(base + "pub")
status, body = fetch(base + "single")
assert status == 403 and b"<Code>AccessDenied</Code>" in body, (status, body)
status, body = fetch(sys.argv[1] + "/no-such-bucket/k")
assert status == 404 and b"<Code>NoSuchBucket</Code>" in body, (status, body)
grants = s3.get_object_acl(Bucket="boto3-tls", Key="pub")["Grants"]
assert {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"} in [g["Grantee"] for g in grants], grants
s3.put_object_acl(Bucket="boto3-tls", Key="pub", ACL="private")
assert fetch(base + "pub")[0] == 403
# A bucket policy opening one prefix.
import json
policy = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*",
    "Action": "s3:GetObject", "Resource": "arn:aws:s3:::boto3-tls/pub*"}]})
s3.put_bucket_policy(Bucket="boto3-tls", Policy=policy)
assert s3.get_bucket_policy(Bucket="boto3-tls")["Policy"] == policy
assert fetch(base + "pub") == (200, b"for all")
assert code(lambda: s3.put_bucket_policy(Bucket="boto3-tls", Policy="{")) == "MalformedPolicy"
s3.delete_bucket_policy(Bucket="boto3-tls")
assert fetch(base + "pub")[0] == 403
# Bucket tagging, CORS and lifecycle round trips.
s3.put_bucket_tagging(Bucket="boto3-tls", Tagging={"TagSet": [{"Key": "team", "Value": "s"}]})
assert s3.get_bucket_tagging(Bucket="boto3-tls")["TagSet"] == [{"Key": "team", "Value": "s"}]
s3.delete_bucket_tagging(Bucket="boto3-tls")
assert code(lambda: s3.get_bucket_tagging(Bucket="boto3-tls")) == "NoSuchTagSet"
rule = {"AllowedOrigins": ["https://app.example.com"], "AllowedMethods": ["GET"], "MaxAgeSeconds": 60}
s3.put_bucket_cors(Bucket="boto3-tls", CORSConfiguration={"CORSRules": [rule]})
assert s3.get_bucket_cors(Bucket="boto3-tls")["CORSRules"] == [rule]
s3.delete_bucket_cors(Bucket="boto3-tls")
lc = {"Rules": [{"ID": "tmp", "Status": "Enabled", "Filter": {"Prefix": "tmp/"},
                 "Expiration": {"Days": 7}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]}
s3.put_bucket_lifecycle_configuration(Bucket="boto3-tls", LifecycleConfiguration=lc)
got = s3.get_bucket_lifecycle_configuration(Bucket="boto3-tls")["Rules"][0]
assert got["ID"] == "tmp" and got["Expiration"] == {"Days": 7} and got["Filter"]["Prefix"] == "tmp/", got
s3.delete_bucket_lifecycle(Bucket="boto3-tls")
for key in ("mp", "single", "pub"):
    s3.delete_object(Bucket="boto3-tls", Key=key)
print("boto3 ok")
"#;
    let out = Command::new("python3")
        .args(["-c", SCRIPT, &dev.endpoint, ca])
        .env("AK", ACCESS_KEY)
        .env("SK", SECRET_KEY)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("run python3 (boto3; .ci/run installs it)");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("boto3 ok"),
        "boto3 over HTTPS failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn aws_ok(dev: &Dev, args: &[&str]) -> String {
    let out = aws(dev, args);
    assert!(
        out.status.success(),
        "aws {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The value of the sample whose line starts with `series` (name and labels).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// /metrics of a running `sluice dev`: process RSS and budgets, and the
/// roles' own metrics through the same recorder.
fn check_metrics(dev: &Dev) {
    let metrics = scrape(dev);
    let rss = sample(&metrics, "sluice_process_resident_memory_bytes")
        .unwrap_or_else(|| panic!("no RSS gauge in /metrics:\n{metrics}"));
    assert!(
        rss > 1024.0 * 1024.0 && rss < 64.0 * 1024.0 * 1024.0 * 1024.0,
        "implausible RSS {rss}"
    );
    let limit = sample(&metrics, "sluice_process_memory_limit_bytes").expect("memory limit gauge");
    let write_budgets: Vec<f64> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("sluice_process_budget_bytes{") && l.contains("budget=\"datanode_write\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(
        write_budgets.len(),
        6,
        "one write budget per datanode:\n{metrics}"
    );
    for b in write_budgets {
        assert!(
            (8.0 * 1024.0 * 1024.0..=256.0 * 1024.0 * 1024.0).contains(&b) && b <= limit,
            "dev datanode write budget {b} outside 8..=256 MiB (limit {limit})"
        );
    }
    assert!(
        metrics.contains("budget=\"gateway_buffer\"")
            && metrics.contains("budget=\"meta_sled_cache\""),
        "{metrics}"
    );
    assert!(metrics.contains("sluice_build_info{"), "{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with("sluice_datanode_")),
        "datanode metrics share the endpoint:\n{metrics}"
    );
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("bad JSON from aws ({e}): {text}"))
}

fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).expect("read file")))
}

fn write_random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0; len];
    sluice_harness::data::fill(seed, &mut data);
    std::fs::write(path, &data).expect("write file");
    data
}

/// A probe file of 128 KiB starting with `line`: above the 64 KiB most a
/// gateway stores inline in meta, so writing it needs the datanodes.
fn probe_body(line: &[u8]) -> Vec<u8> {
    line.iter().copied().cycle().take(128 * 1024).collect()
}

/// Waits until the cluster accepts a write (meta leader elected, datanodes registered).
fn wait_until_writable(dev: &Dev, bucket: &str, probe: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let created = aws(dev, &["s3api", "create-bucket", "--bucket", bucket])
            .status
            .success();
        if created
            && aws(
                dev,
                &[
                    "s3",
                    "cp",
                    probe.to_str().unwrap(),
                    &format!("s3://{bucket}/probe"),
                ],
            )
            .status
            .success()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sluice dev not writable within 60s"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn aws_cli_against_sluice_dev() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data_dir: PathBuf = tmp.path().join("data");
    // S3, then meta and six datanodes, then metrics.
    let base = reserve_port_range(9).expect("free ports");
    let (s3_port, grpc_base, metrics_port) = (base, base + 1, base + 8);
    let dev = start_dev(&data_dir, s3_port, grpc_base, metrics_port, false);

    let probe = tmp.path().join("probe.txt");
    // Larger than any inline_max_bytes: a write that needs the datanodes.
    std::fs::write(&probe, probe_body(b"hello sluice\n")).unwrap();
    wait_until_writable(&dev, "e2e", &probe);
    check_metrics(&dev);

    // aws s3 cp of a 65 MiB file: the CLI uploads it by multipart (8 MiB parts).
    let big = tmp.path().join("big.bin");
    write_random_file(&big, 65 * 1024 * 1024, 42);
    aws_ok(
        &dev,
        &["s3", "cp", big.to_str().unwrap(), "s3://e2e/dir/big.bin"],
    );
    let back = tmp.path().join("big.back");
    aws_ok(
        &dev,
        &["s3", "cp", "s3://e2e/dir/big.bin", back.to_str().unwrap()],
    );
    assert_eq!(
        sha256_file(&back),
        sha256_file(&big),
        "65 MiB object read back differs"
    );
    let head = json(&aws_ok(
        &dev,
        &[
            "s3api",
            "head-object",
            "--bucket",
            "e2e",
            "--key",
            "dir/big.bin",
        ],
    ));
    assert_eq!(head["ContentLength"], 65 * 1024 * 1024);
    assert!(
        head["ETag"].as_str().unwrap().ends_with("-9\""),
        "multipart ETag: {}",
        head["ETag"]
    );

    // The s3api multipart sequence by hand: two parts (5 MiB + 1 KiB).
    let part1 = tmp.path().join("part1");
    let part2 = tmp.path().join("part2");
    let p1 = write_random_file(&part1, 5 * 1024 * 1024, 7);
    let p2 = write_random_file(&part2, 1024, 8);
    let created = json(&aws_ok(
        &dev,
        &[
            "s3api",
            "create-multipart-upload",
            "--bucket",
            "e2e",
            "--key",
            "manual",
        ],
    ));
    let upload_id = created["UploadId"].as_str().expect("UploadId").to_string();
    let mut etags = Vec::new();
    for (n, file) in [(1, &part1), (2, &part2)] {
        let out = json(&aws_ok(
            &dev,
            &[
                "s3api",
                "upload-part",
                "--bucket",
                "e2e",
                "--key",
                "manual",
                "--upload-id",
                &upload_id,
                "--part-number",
                &n.to_string(),
                "--body",
                file.to_str().unwrap(),
            ],
        ));
        etags.push(out["ETag"].as_str().expect("ETag").to_string());
    }
    let parts = serde_json::json!({ "Parts": [
        { "PartNumber": 1, "ETag": etags[0] },
        { "PartNumber": 2, "ETag": etags[1] },
    ]});
    let done = json(&aws_ok(
        &dev,
        &[
            "s3api",
            "complete-multipart-upload",
            "--bucket",
            "e2e",
            "--key",
            "manual",
            "--upload-id",
            &upload_id,
            "--multipart-upload",
            &parts.to_string(),
        ],
    ));
    assert!(
        done["ETag"].as_str().unwrap().ends_with("-2\""),
        "complete ETag: {}",
        done["ETag"]
    );
    let manual_back = tmp.path().join("manual.back");
    aws_ok(
        &dev,
        &["s3", "cp", "s3://e2e/manual", manual_back.to_str().unwrap()],
    );
    let mut expected = p1;
    expected.extend_from_slice(&p2);
    assert_eq!(std::fs::read(&manual_back).unwrap(), expected);

    // aws s3 ls lists what is there.
    let ls = aws_ok(&dev, &["s3", "ls", "s3://e2e/"]);
    assert!(ls.contains("PRE dir/"), "ls: {ls}");
    assert!(ls.contains("manual") && ls.contains("probe"), "ls: {ls}");
    let ls_buckets = aws_ok(&dev, &["s3", "ls"]);
    assert!(ls_buckets.contains("e2e"), "ls buckets: {ls_buckets}");

    // A presigned GET with curl, no credentials.
    let url = aws_ok(
        &dev,
        &["s3", "presign", "s3://e2e/manual", "--expires-in", "300"],
    );
    let fetched = tmp.path().join("presigned.back");
    run_ok(
        "curl presigned GET",
        "curl",
        &["-sS", "-f", "-o", fetched.to_str().unwrap(), url.trim()],
        &[],
    );
    assert_eq!(std::fs::read(&fetched).unwrap(), expected);

    // A wrong secret key is refused.
    let bad = Command::new("aws")
        .args(["--endpoint-url", &dev.endpoint, "s3api", "list-buckets"])
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", "wrong-secret")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SignatureDoesNotMatch"));

    // Leave one multipart upload open, then restart on the same data dir.
    let open = json(&aws_ok(
        &dev,
        &[
            "s3api",
            "create-multipart-upload",
            "--bucket",
            "e2e",
            "--key",
            "open",
        ],
    ));
    let open_id = open["UploadId"].as_str().unwrap().to_string();
    aws_ok(
        &dev,
        &[
            "s3api",
            "upload-part",
            "--bucket",
            "e2e",
            "--key",
            "open",
            "--upload-id",
            &open_id,
            "--part-number",
            "1",
            "--body",
            part2.to_str().unwrap(),
        ],
    );
    stop(dev);

    let dev = start_dev(&data_dir, s3_port, grpc_base, metrics_port, false);
    let deadline = Instant::now() + Duration::from_secs(60);
    let back2 = tmp.path().join("big.back2");
    while !aws(
        &dev,
        &["s3", "cp", "s3://e2e/dir/big.bin", back2.to_str().unwrap()],
    )
    .status
    .success()
    {
        assert!(
            Instant::now() < deadline,
            "object not readable within 60s of restart"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        sha256_file(&back2),
        sha256_file(&big),
        "object changed across restart"
    );
    let uploads = json(&aws_ok(
        &dev,
        &["s3api", "list-multipart-uploads", "--bucket", "e2e"],
    ));
    let ids: Vec<&str> = uploads["Uploads"]
        .as_array()
        .expect("Uploads")
        .iter()
        .map(|u| u["UploadId"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![open_id.as_str()],
        "open upload kept across restart"
    );
    let parts = json(&aws_ok(
        &dev,
        &[
            "s3api",
            "list-parts",
            "--bucket",
            "e2e",
            "--key",
            "open",
            "--upload-id",
            &open_id,
        ],
    ));
    assert_eq!(parts["Parts"][0]["Size"], 1024);
    other_clients(&dev, tmp.path());
    stop(dev);
}

/// Runs `program` with `args` (explicit keys in the arguments or config,
/// no instance-metadata probing); its stdout, or a panic naming what failed.
fn run_ok(what: &str, program: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    run_ok_with_stderr(what, program, args, envs).0
}

/// [`run_ok`], with the program's stderr as well: (stdout, stderr).
fn run_ok_with_stderr(
    what: &str,
    program: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (String, String) {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env_remove("AWS_CA_BUNDLE");
    for (k, v) in envs {
        command.env(k, v);
    }
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: run {program} (.ci/run installs it): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status,
    );
    (stdout, stderr)
}

/// s3cmd, minio-py and rclone as their users run them: `s3cmd
/// info` of a bucket and an object with no `501`, `s3cmd setacl
/// --acl-public` then a plain `curl` of the object, minio-py's object tags
/// and bucket policy, rclone with a versioning query. `.ci/run` installs
/// all three.
fn other_clients(dev: &Dev, dir: &Path) {
    let host = dev.endpoint.trim_start_matches("http://");
    let cfg = dir.join("s3cfg");
    std::fs::write(
        &cfg,
        format!(
            "[default]\naccess_key = {ACCESS_KEY}\nsecret_key = {SECRET_KEY}\nhost_base = {host}\nhost_bucket = {host}\nuse_https = False\nsignature_v2 = False\nbucket_location = us-east-1\n"
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let file = dir.join("s3cmd.txt");
    std::fs::write(&file, b"from s3cmd\n").unwrap();
    let s3cmd = |args: &[&str]| {
        let mut all = vec!["-c", cfg];
        all.extend_from_slice(args);
        run_ok(&format!("s3cmd {args:?}"), "s3cmd", &all, &[])
    };
    s3cmd(&["mb", "s3://clients"]);
    s3cmd(&["put", file.to_str().unwrap(), "s3://clients/obj"]);
    // s3cmd prints "none" for a sub-resource the server answers 501 to, so
    // the statuses are read from its debug log (stderr), which prints each
    // response as a Python dict with `'status': N`. (Matching "501" in the
    // printed info is wrong: the object's s3cmd-attrs hold Unix timestamps.)
    for target in ["s3://clients", "s3://clients/obj"] {
        let (info, debug) = run_ok_with_stderr(
            &format!("s3cmd info {target}"),
            "s3cmd",
            &["-c", cfg, "--debug", "info", target],
            &[],
        );
        assert!(
            debug.contains("'status': 200"),
            "s3cmd info {target}: its debug log shows no response status:\n{debug}"
        );
        assert!(
            !debug.contains("'status': 501"),
            "s3cmd info {target}: a 501 in its debug log:\n{info}\n{debug}"
        );
    }
    let url = format!("{}/clients/obj", dev.endpoint);
    let curl = |url: &str| {
        run_ok(
            "curl",
            "curl",
            &["-s", "-o", "/dev/null", "-w", "%{http_code}", url],
            &[],
        )
    };
    assert_eq!(curl(&url), "403", "private before setacl");
    s3cmd(&["setacl", "--acl-public", "s3://clients/obj"]);
    assert_eq!(curl(&url), "200", "public after setacl --acl-public");
    s3cmd(&["setacl", "--acl-private", "s3://clients/obj"]);
    assert_eq!(curl(&url), "403", "private again");

    const MINIO: &str = r#"
import io, json, sys
from minio import Minio
from minio.commonconfig import Tags
c = Minio(sys.argv[1], access_key=sys.argv[2], secret_key=sys.argv[3], secure=False, region="us-east-1")
c.put_object("clients", "tagged", io.BytesIO(b"minio"), 5)
tags = Tags.new_object_tags()
tags["team"] = "storage"
c.set_object_tags("clients", "tagged", tags)
assert dict(c.get_object_tags("clients", "tagged")) == {"team": "storage"}
c.delete_object_tags("clients", "tagged")
assert not c.get_object_tags("clients", "tagged")
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]},
          "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::clients/tagged"]}]}
c.set_bucket_policy("clients", json.dumps(policy))
assert json.loads(c.get_bucket_policy("clients")) == policy
c.delete_bucket_policy("clients")
c.remove_object("clients", "tagged")
print("minio ok")
"#;
    let out = run_ok(
        "minio-py",
        "python3",
        &["-c", MINIO, host, ACCESS_KEY, SECRET_KEY],
        &[],
    );
    assert!(out.contains("minio ok"), "{out}");

    // rclone's remote from the environment (no config file): `sl:`.
    let rclone_env = [
        ("RCLONE_CONFIG", "/dev/null"),
        ("RCLONE_CONFIG_SL_TYPE", "s3"),
        ("RCLONE_CONFIG_SL_PROVIDER", "Other"),
        ("RCLONE_CONFIG_SL_ENV_AUTH", "false"),
        ("RCLONE_CONFIG_SL_ACCESS_KEY_ID", ACCESS_KEY),
        ("RCLONE_CONFIG_SL_SECRET_ACCESS_KEY", SECRET_KEY),
        ("RCLONE_CONFIG_SL_ENDPOINT", dev.endpoint.as_str()),
        ("RCLONE_CONFIG_SL_FORCE_PATH_STYLE", "true"),
        ("RCLONE_CONFIG_SL_REGION", "us-east-1"),
    ];
    let remote = "sl:";
    let rclone = |args: &[&str]| {
        let mut all = vec!["--retries", "1", "--low-level-retries", "1"];
        all.extend_from_slice(args);
        run_ok(&format!("rclone {args:?}"), "rclone", &all, &rclone_env)
    };
    rclone(&[
        "copyto",
        file.to_str().unwrap(),
        &format!("{remote}clients/rc.txt"),
    ]);
    let listed = rclone(&["lsf", &format!("{remote}clients")]);
    assert!(listed.lines().any(|l| l == "rc.txt"), "{listed}");
    let versioning = rclone(&["backend", "versioning", &format!("{remote}clients")]);
    assert_eq!(versioning.trim(), "Unversioned");
    let versions = rclone(&["lsf", "--s3-versions", &format!("{remote}clients")]);
    assert!(versions.lines().any(|l| l == "rc.txt"), "{versions}");
    // Versioning on: an overwrite keeps the old version, which rclone
    // lists with a version suffix and can read back.
    let enabled = rclone(&[
        "backend",
        "versioning",
        &format!("{remote}clients"),
        "Enabled",
    ]);
    assert_eq!(enabled.trim(), "Enabled");
    std::fs::write(&file, b"second version").expect("rewrite");
    rclone(&[
        "copyto",
        file.to_str().unwrap(),
        &format!("{remote}clients/rc.txt"),
    ]);
    let versions = rclone(&["lsf", "--s3-versions", &format!("{remote}clients")]);
    let lines: Vec<&str> = versions.lines().filter(|l| l.starts_with("rc")).collect();
    assert_eq!(lines.len(), 2, "{versions}");
    let old = lines
        .iter()
        .find(|l| **l != "rc.txt")
        .expect("an old version");
    assert!(
        old.starts_with("rc-v") && old.ends_with(".txt"),
        "{versions}"
    );
    let current = rclone(&["cat", &format!("{remote}clients/rc.txt")]);
    assert_eq!(current, "second version");
    // Purging with versions deletes every version by id, so the bucket
    // can go.
    rclone(&["purge", "--s3-versions", &format!("{remote}clients")]);
}

/// `sluice dev --https`: the aws CLI with `--ca-bundle` of the dev CA;
/// `sluice admin key` makes a second user who sees only what it is
/// granted. Small objects only (runtime).
#[test]
fn aws_cli_over_https_with_access_keys() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data_dir: PathBuf = tmp.path().join("data");
    let base = reserve_port_range(9).expect("free ports");
    let (s3_port, grpc_base, metrics_port) = (base, base + 1, base + 8);
    let dev = start_dev(&data_dir, s3_port, grpc_base, metrics_port, true);
    let ca = dev.ca_bundle.clone().unwrap();
    assert!(Path::new(&ca).exists(), "CA bundle {ca}");
    // Files holding secrets are mode 0600.
    use std::os::unix::fs::PermissionsExt;
    for secret in ["credentials.toml", "s3-tls/s3.key", "s3-tls/ca.key"] {
        let mode = std::fs::metadata(data_dir.join(secret))
            .unwrap_or_else(|e| panic!("{secret}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{secret} has mode {mode:o}");
    }

    let probe = tmp.path().join("probe.txt");
    std::fs::write(&probe, probe_body(b"hello sluice over https\n")).unwrap();
    wait_until_writable(&dev, "secure", &probe);
    let ls = aws_ok(&dev, &["s3", "ls", "s3://secure/"]);
    assert!(ls.contains("probe"), "ls: {ls}");
    boto3_round_trip(&dev, &ca);

    // A second user through the admin CLI.
    let admin = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["admin", "key", "--meta", &dev.meta_url()])
            .args(args)
            // The admin certificate `sluice dev` made.
            .envs(dev.admin_env())
            .output()
            .expect("run sluice admin");
        assert!(
            out.status.success(),
            "sluice admin key {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let created = json(&admin(&["create", "carol", "--json"]));
    let id = created["id"].as_str().unwrap().to_string();
    let secret = created["secret"].as_str().unwrap().to_string();
    let carol = (id.as_str(), secret.as_str());
    let listed = admin(&["list"]);
    assert!(listed.contains(&id) && listed.contains("carol"), "{listed}");
    assert!(!listed.contains(&secret), "list shows a secret");

    // Carol sees no bucket and may not read the root key's bucket.
    let ls = aws_as(&dev, carol, &["s3", "ls"]);
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    assert!(!String::from_utf8_lossy(&ls.stdout).contains("secure"));
    let denied = aws_as(&dev, carol, &["s3", "ls", "s3://secure/"]);
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("AccessDenied"),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    // Granted read: listing works (the gateway's key cache holds 5 s).
    admin(&["allow", &id, "--bucket", "secure", "--read"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = aws_as(&dev, carol, &["s3", "ls", "s3://secure/"]);
        if out.status.success() {
            assert!(String::from_utf8_lossy(&out.stdout).contains("probe"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "read grant not effective in 20 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    stop(dev);
}
