//! Scraping `/metrics`: a minimal HTTP/1.0 GET over a loopback TCP stream
//! (the bench has no HTTP client of its own) and the Prometheus text
//! exposition format reduced to one sum per metric name.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest `/metrics` response read, bytes; a longer one is an error (a
/// process exports a few hundred series, tens of KiB).
pub const MAX_METRICS_BYTES: usize = 4 << 20;
/// Time limit of one scrape (connect, request and response).
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The URL is not `http://HOST:PORT/PATH`.
    #[error("unsupported metrics URL `{0}` (want http://host:port/path)")]
    Url(String),
    /// Connecting, writing or reading failed.
    #[error("GET {url}")]
    Io {
        /// The URL.
        url: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No complete answer within [`SCRAPE_TIMEOUT`].
    #[error("GET {url}: no answer within {SCRAPE_TIMEOUT:?}")]
    Timeout {
        /// The URL.
        url: String,
    },
    /// The answer is not `200` with a body.
    #[error("GET {url}: {reason}")]
    Response {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Splits `http://host:port/path` into (`host:port`, `/path`).
fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    authority.contains(':').then_some((authority, path))
}

/// The body of an HTTP/1.x response, after checking for status 200;
/// de-chunks a `Transfer-Encoding: chunked` body.
pub fn response_body(raw: &[u8]) -> Result<Vec<u8>, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        return Err(format!("status line `{status}`"));
    }
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return Ok(body.to_vec());
    }
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line cut off")?;
        let size_text = String::from_utf8_lossy(&rest[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size `{size_hex}`"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size {
            return Err("chunk cut off".to_owned());
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).ok_or("chunk end cut off")?;
    }
}

/// GETs `url` (plain HTTP on loopback) and returns the body as text.
///
/// # Errors
/// [`ScrapeError`].
pub async fn scrape(url: &str) -> Result<String, ScrapeError> {
    let (authority, path) = split_url(url).ok_or_else(|| ScrapeError::Url(url.to_owned()))?;
    let io = |source| ScrapeError::Io {
        url: url.to_owned(),
        source,
    };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(io)?;
        // HTTP/1.0: the server answers with a plain body and closes.
        let request =
            format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: text/plain\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(io)?;
        // Bounded: at most MAX_METRICS_BYTES + 1 bytes are read (`take`).
        let mut raw = Vec::new();
        let mut limited = (&mut stream).take(MAX_METRICS_BYTES as u64 + 1);
        limited.read_to_end(&mut raw).await.map_err(io)?;
        Ok::<_, ScrapeError>(raw)
    };
    let raw = tokio::time::timeout(SCRAPE_TIMEOUT, exchange)
        .await
        .map_err(|_| ScrapeError::Timeout {
            url: url.to_owned(),
        })??;
    if raw.len() > MAX_METRICS_BYTES {
        return Err(ScrapeError::Response {
            url: url.to_owned(),
            reason: format!("longer than {MAX_METRICS_BYTES} bytes"),
        });
    }
    let body = response_body(&raw).map_err(|reason| ScrapeError::Response {
        url: url.to_owned(),
        reason,
    })?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Every metric of a Prometheus text exposition, summed over its label
/// sets: `name{a="1"} 2` and `name{a="2"} 3` give `name -> 5`. Comments,
/// blank lines and unparsable values are skipped; a histogram's or
/// summary's series keep their own names (`x_bucket`, `x_sum`, `x_count`).
pub fn parse_sums(text: &str) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ', '\t']) {
            Some(i) if line.as_bytes()[i] == b'{' => {
                // Label values may hold spaces and braces, quoted.
                let Some(close) = label_end(&line[i..]) else {
                    continue;
                };
                (&line[..i], &line[i + close + 1..])
            }
            Some(i) => (&line[..i], &line[i..]),
            None => continue,
        };
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        if value.is_nan() {
            continue;
        }
        *sums.entry(name.to_owned()).or_insert(0.0) += value;
    }
    sums
}

/// Index of the `}` closing a label set that starts at `text[0] == '{'`.
fn label_end(text: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY: &str = "# HELP sluice_heal_bytes_total Shard bytes written by heal\n\
        # TYPE sluice_heal_bytes_total counter\n\
        sluice_heal_bytes_total 12582912\n\
        sluice_heal_healed_blobs_total{result=\"ok\"} 30\n\
        sluice_heal_healed_blobs_total{result=\"placement_changed\"} 2\n\
        sluice_heal_degraded_blobs{reason=\"missing\",node=\"1\"} 5\n\
        sluice_heal_degraded_blobs{reason=\"odd } \\\" label\",node=\"2\"} 1 1700000000000\n\
        sluice_heal_queue_blobs 0\n\
        sluice_gateway_request_seconds_bucket{le=\"0.1\"} 4\n\
        sluice_gateway_request_seconds_bucket{le=\"+Inf\"} 9\n\
        sluice_gateway_request_seconds_sum 1.5\n\
        broken_line_without_value\n\
        nan_metric NaN\n";

    #[test]
    fn sums_each_metric_over_its_labels() {
        let m = parse_sums(GATEWAY);
        assert_eq!(m["sluice_heal_bytes_total"], 12_582_912.0);
        assert_eq!(m["sluice_heal_healed_blobs_total"], 32.0);
        // A quoted brace and escaped quote in a label value do not end the set.
        assert_eq!(m["sluice_heal_degraded_blobs"], 6.0);
        assert_eq!(m["sluice_heal_queue_blobs"], 0.0);
        assert_eq!(m["sluice_gateway_request_seconds_bucket"], 13.0);
        assert_eq!(m["sluice_gateway_request_seconds_sum"], 1.5);
        assert!(!m.contains_key("broken_line_without_value"));
        assert!(!m.contains_key("nan_metric"));
        assert!(!m.contains_key("sluice_gateway_request_seconds"));
    }

    #[test]
    fn response_bodies_plain_and_chunked() {
        let plain = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nx 1\n";
        assert_eq!(response_body(plain).expect("plain"), b"x 1\n");
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nx 1\n\r\n5;ext=1\r\ny 22\n\r\n0\r\n\r\n";
        assert_eq!(response_body(chunked).expect("chunked"), b"x 1\ny 22\n");
        assert!(
            response_body(b"HTTP/1.1 404 Not Found\r\n\r\n")
                .expect_err("404")
                .contains("404")
        );
        assert!(response_body(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(
            response_body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab").is_err()
        );
    }

    #[test]
    fn urls_split_into_authority_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:9100/metrics"),
            Some(("127.0.0.1:9100", "/metrics"))
        );
        assert_eq!(
            split_url("http://127.0.0.1:9100"),
            Some(("127.0.0.1:9100", "/"))
        );
        assert_eq!(split_url("https://127.0.0.1:9100/metrics"), None);
        assert_eq!(split_url("http://localhost/metrics"), None);
    }

    #[tokio::test]
    async fn scrapes_a_served_exposition() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 1024];
            let n = socket.read(&mut buf).await.expect("read");
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            socket
                .write_all(b"HTTP/1.0 200 OK\r\n\r\nsluice_heal_queue_blobs{a=\"b\"} 7\n")
                .await
                .expect("write");
            request
        });
        let text = scrape(&url).await.expect("scrape");
        assert_eq!(parse_sums(&text)["sluice_heal_queue_blobs"], 7.0);
        let request = server.await.expect("server");
        assert!(
            request.starts_with("GET /metrics HTTP/1.0\r\n"),
            "{request}"
        );
        // Nothing listens any more.
        assert!(matches!(scrape(&url).await, Err(ScrapeError::Io { .. })));
    }
}
