//! S3 listener hardening and health checks (`sluice_gateway::listener`,
//! `sluice_gateway::health`), over real sockets against an in-process
//! cluster: silent connections, a stalled body, an oversized signed
//! aws-chunked chunk, bodies failing their signed hash or chunk signature,
//! `/health/live` and `/health/ready` on the S3 port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};
use sluice_util::byte_size::ByteSize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fixtures::{
    ACCESS_KEY, CONVERGE_TIMEOUT, Overrides, REGION, SECRET_KEY, TestCluster, wait_until,
};

/// Silent sockets opened against the gateway.
const SILENT_CONNECTIONS: usize = 2000;

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// A SigV4-signed (header auth) request head for `method path` on `host`
/// with `x-amz-content-sha256: payload_hash` and `extra` headers (all
/// signed; names lower case). Ends with the blank line.
fn signed_head(
    method: &str,
    path: &str,
    host: &str,
    payload_hash: &str,
    extra: &[(&str, String)],
) -> String {
    let now = time::OffsetDateTime::now_utc();
    let date = format!(
        "{:04}{:02}{:02}",
        now.year(),
        u8::from(now.month()),
        now.day()
    );
    let amz_date = format!(
        "{date}T{:02}{:02}{:02}Z",
        now.hour(),
        now.minute(),
        now.second()
    );
    let mut headers: Vec<(String, String)> = vec![
        ("host".into(), host.into()),
        ("x-amz-content-sha256".into(), payload_hash.into()),
        ("x-amz-date".into(), amz_date.clone()),
    ];
    headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical =
        format!("{method}\n{path}\n\n{canonical_headers}\n{signed_headers}\n{payload_hash}");
    let scope = format!("{date}/{REGION}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac_sha256(format!("AWS4{SECRET_KEY}").as_bytes(), date.as_bytes());
    for part in [REGION, "s3", "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac_sha256(&key, to_sign.as_bytes()));
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in &headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "authorization: AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders={signed_headers}, Signature={signature}\r\n\r\n"
    ));
    head
}

/// Reads what the server sends until it closes the connection or `timeout`
/// passes; returns it as text.
async fn read_response(stream: &mut TcpStream, timeout: Duration) -> Result<String> {
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => break,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
        if response_complete(&out) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Whether `bytes` hold a whole response with a `content-length` body.
fn response_complete(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    let Some(end) = text.find("\r\n\r\n") else {
        return false;
    };
    let len = text[..end]
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    bytes.len() >= end + 4 + len
}

/// One unauthenticated `GET path` on the S3 port; (status, body).
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let text = read_response(&mut stream, Duration::from_secs(10)).await?;
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Raises this process's soft open-file limit to its hard limit (the
/// silent-connection test needs two descriptors per socket: ours and the
/// gateway's, in one process).
#[allow(unsafe_code)]
fn raise_fd_limit(needed: u64) -> Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        ensure!(
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0,
            "getrlimit"
        );
        if limit.rlim_cur < needed && limit.rlim_max > limit.rlim_cur {
            limit.rlim_cur = limit.rlim_max;
            ensure!(
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0,
                "setrlimit"
            );
        }
    }
    ensure!(
        limit.rlim_cur >= needed,
        "open-file limit {} is below the {needed} this test needs (ulimit -n)",
        limit.rlim_cur
    );
    Ok(())
}

fn silent_gateway(c: &mut sluice_gateway::Config) {
    // Far fewer slots than silent sockets: if a silent socket took one,
    // the client below could not get in until they are closed.
    c.max_connections = 16;
    c.header_read_timeout = Duration::from_secs(10);
}

/// 2,000 connections that never send a byte do not stop an S3 client from
/// listing buckets, and are closed after `header_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_do_not_lock_out_clients() -> Result<()> {
    raise_fd_limit(SILENT_CONNECTIONS as u64 * 2 + 1000)?;
    let c = TestCluster::start_with(
        1,
        6,
        Overrides {
            gateway: Some(silent_gateway),
            ..Overrides::default()
        },
    )
    .await?;
    let addr = c.gateway.addr();
    let mut silent = Vec::with_capacity(SILENT_CONNECTIONS);
    for _ in 0..SILENT_CONNECTIONS {
        silent.push(
            TcpStream::connect(addr)
                .await
                .context("connect a silent socket")?,
        );
    }
    let started = Instant::now();
    let listed = c.s3_without_retries().list_buckets().send().await;
    let took = started.elapsed();
    listed.context("ListBuckets with 2000 silent connections open")?;
    eprintln!("ListBuckets with {SILENT_CONNECTIONS} silent connections took {took:?}");
    // The silent sockets were still open while the client was served: it
    // did not just wait for them to be closed.
    let mut still_open = 0;
    for s in &silent {
        let mut byte = [0u8; 1];
        if matches!(s.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            still_open += 1;
        }
    }
    ensure!(
        still_open > SILENT_CONNECTIONS / 2,
        "only {still_open} of {SILENT_CONNECTIONS} silent sockets were open when ListBuckets returned"
    );
    // And the gateway closes every one of them after the header timeout.
    let mut closed = 0;
    let deadline = Instant::now() + Duration::from_secs(10) + CONVERGE_TIMEOUT;
    for mut s in silent {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut byte = [0u8; 1];
        match tokio::time::timeout(left, s.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            Ok(Ok(_)) => bail!("the gateway sent bytes to a silent connection"),
            Err(_) => break,
        }
    }
    ensure!(
        closed == SILENT_CONNECTIONS,
        "the gateway closed {closed} of {SILENT_CONNECTIONS} silent connections"
    );
    // Still serving.
    c.s3().list_buckets().send().await?;
    Ok(())
}

fn slow_body_gateway(c: &mut sluice_gateway::Config) {
    c.body_timeout = Duration::from_secs(2);
    c.body_min_bytes = ByteSize(16 * 1024);
}

/// A client that stops sending mid-body is cut off with `400
/// RequestTimeout` after `body_timeout`, and its in-flight slot and write
/// buffers are released (the gauges return to zero).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_body_is_cut_off_and_releases_its_permits() -> Result<()> {
    let c = TestCluster::start_with(
        1,
        6,
        Overrides {
            gateway: Some(slow_body_gateway),
            ..Overrides::default()
        },
    )
    .await?;
    c.s3().create_bucket().bucket("slow").send().await?;
    let addr = c.gateway.addr();
    let mut stream = TcpStream::connect(addr).await?;
    let head = signed_head(
        "PUT",
        "/slow/stalled",
        &addr.to_string(),
        "UNSIGNED-PAYLOAD",
        &[("content-length", (4 * 1024 * 1024).to_string())],
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&vec![7u8; 64 * 1024]).await?;
    let stats = c.gateway_stats().clone();
    // The request is admitted and holds a write buffer while it waits.
    wait_until(
        "the upload to hold its slot and a buffer",
        CONVERGE_TIMEOUT,
        || {
            let stats = stats.clone();
            async move {
                if stats.inflight() == 1 && stats.buffer_in_use() > 0 {
                    Ok(())
                } else {
                    Err(format!(
                        "inflight {}, buffer in use {}",
                        stats.inflight(),
                        stats.buffer_in_use()
                    ))
                }
            }
        },
    )
    .await?;
    let started = Instant::now();
    let response = read_response(&mut stream, Duration::from_secs(30)).await?;
    let took = started.elapsed();
    ensure!(response.starts_with("HTTP/1.1 400"), "response: {response}");
    ensure!(
        response.contains("<Code>RequestTimeout</Code>"),
        "response: {response}"
    );
    ensure!(
        took < Duration::from_secs(20),
        "cut off after {took:?}, body_timeout is 2 s"
    );
    wait_until("the gauges to return to zero", CONVERGE_TIMEOUT, || {
        let stats = stats.clone();
        async move {
            if stats.inflight() == 0 && stats.buffer_in_use() == 0 {
                Ok(())
            } else {
                Err(format!(
                    "inflight {}, buffer in use {}",
                    stats.inflight(),
                    stats.buffer_in_use()
                ))
            }
        }
    })
    .await?;
    ensure!(stats.inflight() == 0 && stats.buffer_in_use() == 0);
    // Nothing was stored.
    let head = c
        .s3()
        .head_object()
        .bucket("slow")
        .key("stalled")
        .send()
        .await;
    ensure!(head.is_err(), "the stalled object exists: {head:?}");
    Ok(())
}

/// The two body checks s3s makes itself, whose errors gateway/src/s3/
/// error.rs can only recognise by their text (s3s 0.14.1 keeps the types
/// private): a body that does not hash to its signed `x-amz-content-sha256`
/// is `400 XAmzContentSHA256Mismatch`, an aws-chunked chunk with a wrong
/// signature is `403 SignatureDoesNotMatch`, and neither object is stored.
/// An s3s upgrade that rewords either error fails here instead of turning
/// it into `IncompleteBody`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bodies_failing_their_signed_hash_or_chunk_signature_are_refused() -> Result<()> {
    let c = TestCluster::start(1, 6).await?;
    let s3 = c.s3();
    s3.create_bucket().bucket("bodies").send().await?;
    let addr = c.gateway.addr();
    let host = addr.to_string();

    let body = b"the body the client sent";
    let claimed = hex::encode(Sha256::digest(b"the body the client signed"));
    let head = signed_head(
        "PUT",
        "/bodies/hashed",
        &host,
        &claimed,
        &[
            ("connection", "close".to_string()),
            ("content-length", body.len().to_string()),
        ],
    );
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let response = read_response(&mut stream, Duration::from_secs(30)).await?;
    ensure!(response.starts_with("HTTP/1.1 400"), "response: {response}");
    ensure!(
        response.contains("<Code>XAmzContentSHA256Mismatch</Code>"),
        "response: {response}"
    );

    let data = vec![7u8; 1024];
    let sig = "0".repeat(64);
    let mut encoded = format!("{:x};chunk-signature={sig}\r\n", data.len()).into_bytes();
    encoded.extend_from_slice(&data);
    encoded.extend_from_slice(format!("\r\n0;chunk-signature={sig}\r\n\r\n").as_bytes());
    let head = signed_head(
        "PUT",
        "/bodies/chunked",
        &host,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        &[
            ("connection", "close".to_string()),
            ("content-encoding", "aws-chunked".to_string()),
            ("content-length", encoded.len().to_string()),
            ("x-amz-decoded-content-length", data.len().to_string()),
        ],
    );
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&encoded).await?;
    let response = read_response(&mut stream, Duration::from_secs(30)).await?;
    ensure!(response.starts_with("HTTP/1.1 403"), "response: {response}");
    ensure!(
        response.contains("<Code>SignatureDoesNotMatch</Code>"),
        "response: {response}"
    );

    for key in ["hashed", "chunked"] {
        let head = s3.head_object().bucket("bodies").key(key).send().await;
        ensure!(
            head.as_ref()
                .err()
                .and_then(|e| e.raw_response())
                .is_some_and(|r| r.status().as_u16() == 404),
            "{key} was stored: {head:?}"
        );
    }
    Ok(())
}

/// A signed aws-chunked chunk larger than `max_aws_chunk_bytes` (16 MiB by
/// default) is refused with `400 InvalidRequest` before its data is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_signed_chunk_is_refused() -> Result<()> {
    let c = TestCluster::start(1, 6).await?;
    c.s3().create_bucket().bucket("chunks").send().await?;
    let addr = c.gateway.addr();
    let chunk: u64 = 17 * 1024 * 1024;
    let sig = "0".repeat(64);
    let chunk_head = format!("{chunk:x};chunk-signature={sig}\r\n");
    let last = format!("0;chunk-signature={sig}\r\n\r\n");
    let encoded = chunk_head.len() as u64 + chunk + 2 + last.len() as u64;
    let head = signed_head(
        "PUT",
        "/chunks/big",
        &addr.to_string(),
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        &[
            ("content-encoding", "aws-chunked".to_string()),
            ("content-length", encoded.to_string()),
            ("x-amz-decoded-content-length", chunk.to_string()),
        ],
    );
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(chunk_head.as_bytes()).await?;
    stream.write_all(&vec![1u8; 256 * 1024]).await?;
    let response = read_response(&mut stream, Duration::from_secs(30)).await?;
    ensure!(response.starts_with("HTTP/1.1 400"), "response: {response}");
    ensure!(
        response.contains("<Code>InvalidRequest</Code>"),
        "response: {response}"
    );
    ensure!(
        response.contains("exceeds the gateway limit of 16777216 bytes"),
        "response: {response}"
    );
    let stats = c.gateway_stats().clone();
    wait_until("the gauges to return to zero", CONVERGE_TIMEOUT, || {
        let stats = stats.clone();
        async move {
            if stats.inflight() == 0 && stats.buffer_in_use() == 0 {
                Ok(())
            } else {
                Err(format!(
                    "inflight {}, buffer in use {}",
                    stats.inflight(),
                    stats.buffer_in_use()
                ))
            }
        }
    })
    .await?;
    Ok(())
}

/// `/health/live` and `/health/ready` on the S3 port, unauthenticated:
/// ready while meta and enough datanodes are up, 503 with meta down; a
/// signed request for the same path is an ordinary S3 request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_checks_on_the_s3_port() -> Result<()> {
    let mut c = TestCluster::start(1, 6).await?;
    let addr = c.gateway.addr();
    let (status, body) = get(addr, "/health/live").await?;
    ensure!(status == 200, "live: {status} {body}");
    ensure!(body == "live: gateway serving\n", "live body {body:?}");
    let (status, body) = get(addr, "/health/ready").await?;
    ensure!(status == 200, "ready: {status} {body}");
    ensure!(
        body.starts_with("ready: meta leader reachable, 6 writable datanodes (write quorum 5)"),
        "ready body {body:?}"
    );
    // Signed: the object `live` of bucket `health` (which does not exist).
    let signed = c
        .s3()
        .get_object()
        .bucket("health")
        .key("live")
        .send()
        .await;
    crate::expect_error("signed GET /health/live", signed, 404, Some("NoSuchBucket"))?;

    // Two datanodes down: 4 writable < write quorum 5.
    c.datanodes[5].stop().await?;
    c.datanodes[4].stop().await?;
    c.wait_datanodes(&[1, 2, 3, 4], &[5, 6]).await?;
    let (status, body) = wait_until(
        "ready to fail without quorum",
        CONVERGE_TIMEOUT,
        || async move {
            let (status, body) = get(addr, "/health/ready")
                .await
                .map_err(|e| e.to_string())?;
            if status == 503 {
                Ok((status, body))
            } else {
                Err(format!("{status} {body}"))
            }
        },
    )
    .await?;
    ensure!(
        body == "not ready: 4 writable datanodes, the write quorum needs 5\n",
        "{status} {body:?}"
    );
    c.datanodes[4].start().await?;
    c.datanodes[5].start().await?;
    c.wait_datanodes_live().await?;
    wait_until("ready again", CONVERGE_TIMEOUT, || async move {
        let (status, body) = get(addr, "/health/ready")
            .await
            .map_err(|e| e.to_string())?;
        if status == 200 {
            Ok(())
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await?;

    // Meta down: live, not ready.
    c.metas[0].stop().await?;
    let body = wait_until(
        "ready to fail with meta down",
        CONVERGE_TIMEOUT,
        || async move {
            let (status, body) = get(addr, "/health/ready")
                .await
                .map_err(|e| e.to_string())?;
            if status == 503 {
                Ok(body)
            } else {
                Err(format!("{status} {body}"))
            }
        },
    )
    .await?;
    ensure!(body.starts_with("not ready: "), "{body:?}");
    let (status, body) = get(addr, "/health/live").await?;
    ensure!(status == 200, "live with meta down: {status} {body}");
    Ok(())
}
