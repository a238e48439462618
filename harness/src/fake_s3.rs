//! A minimal in-process S3 endpoint for tests: HTTP/1.1 over a real TCP
//! socket, answering the handful of operations `multipart-put`, `put` and
//! `get` send, with scripted error responses. Not a store: bodies are read
//! and dropped; PutObject only remembers each key's size, and GetObject
//! answers that many filler bytes.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// An error response the fake sends instead of the normal one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `503 SlowDown`.
    SlowDown,
    /// `500 InternalError`.
    InternalError,
}

impl Fault {
    fn response(self) -> String {
        let (status, code) = match self {
            Fault::SlowDown => ("503 Service Unavailable", "SlowDown"),
            Fault::InternalError => ("500 Internal Server Error", "InternalError"),
        };
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>fake</Message></Error>"
        );
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }
}

#[derive(Debug, Default)]
pub struct State {
    /// Faults for the next requests, in order, whatever their operation.
    script: Mutex<VecDeque<Fault>>,
    /// Every n-th UploadPart request gets `SlowDown` (0 = never).
    slowdown_every_nth_part: u64,
    /// Every PutObject gets `InternalError` while set.
    pub fail_put_objects: std::sync::atomic::AtomicBool,
    /// Every n-th GetObject answers one byte short (0 = never).
    pub short_every_nth_get: AtomicU64,
    /// Size of every object PutObject wrote, by request path; DeleteObjects removes them.
    pub objects: Mutex<HashMap<String, u64>>,
    pub requests: AtomicU64,
    pub put_object_requests: AtomicU64,
    pub get_object_requests: AtomicU64,
    pub upload_part_requests: AtomicU64,
    pub completes: AtomicU64,
    pub deletes: AtomicU64,
    pub body_bytes: AtomicU64,
}

/// A running fake endpoint; stops with the test's runtime.
#[derive(Debug)]
pub struct FakeS3 {
    addr: SocketAddr,
    pub state: Arc<State>,
}

impl FakeS3 {
    /// Binds port 0 and serves until the runtime shuts down.
    pub async fn start(script: Vec<Fault>, slowdown_every_nth_part: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake S3");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            script: Mutex::new(script.into()),
            slowdown_every_nth_part,
            ..State::default()
        });
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&shared)));
            }
        });
        Self { addr, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Objects PutObject wrote that no DeleteObjects removed.
    pub fn stored_objects(&self) -> usize {
        self.state
            .objects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// What [`respond`] needs of a request.
struct Request {
    line: String,
    /// The payload length: `x-amz-decoded-content-length` of an aws-chunked
    /// body, else `Content-Length`.
    payload_length: u64,
    /// The body of a DeleteObjects request (others are dropped).
    body: Vec<u8>,
}

async fn serve(stream: TcpStream, state: Arc<State>) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match stream.read_line(&mut request_line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut content_length: u64 = 0;
        let mut decoded_length: Option<u64> = None;
        loop {
            let mut header = String::new();
            match stream.read_line(&mut header).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("x-amz-decoded-content-length") {
                    decoded_length = value.trim().parse().ok();
                }
            }
        }
        let mut body = (&mut stream).take(content_length);
        let mut kept = Vec::new();
        let read = if request_line.starts_with("POST ") && request_line.contains("?delete") {
            // Bounded by `take(content_length)`: a DeleteObjects body of the
            // bench's own (at most 1000 keys).
            body.read_to_end(&mut kept).await.map(|n| n as u64)
        } else {
            tokio::io::copy(&mut body, &mut tokio::io::sink()).await
        };
        let Ok(read) = read else {
            return;
        };
        state.body_bytes.fetch_add(read, Ordering::Relaxed);
        let request = Request {
            line: request_line,
            payload_length: decoded_length.unwrap_or(content_length),
            body: kept,
        };
        let response = respond(&request, &state);
        if stream.get_mut().write_all(&response).await.is_err() {
            return;
        }
    }
}

fn respond(request: &Request, state: &State) -> Vec<u8> {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let mut words = request.line.split_whitespace();
    let method = words.next().unwrap_or("");
    let target = words.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    // Path-style: /bucket/key; an object request has a key.
    let has_key = path
        .trim_start_matches('/')
        .split_once('/')
        .is_some_and(|(_, key)| !key.is_empty());
    let is_part = method == "PUT" && target.contains("partNumber=");
    if method == "GET" && has_key {
        return get_object(path, state).into_bytes();
    }
    respond_text(method, target, path, has_key, is_part, request, state).into_bytes()
}

/// GetObject: the stored size in filler bytes, one short every n-th time.
fn get_object(path: &str, state: &State) -> String {
    let n = state.get_object_requests.fetch_add(1, Ordering::Relaxed) + 1;
    if let Some(fault) = state
        .script
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front()
    {
        return fault.response();
    }
    let size = state
        .objects
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(path)
        .copied();
    let Some(mut size) = size else {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchKey</Code><Message>fake</Message></Error>";
        return format!(
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    };
    let short = state.short_every_nth_get.load(Ordering::Relaxed);
    if short > 0 && n.is_multiple_of(short) {
        size = size.saturating_sub(1);
    }
    format!(
        "HTTP/1.1 200 OK\r\nETag: \"fake-etag\"\r\nContent-Length: {size}\r\n\r\n{}",
        "x".repeat(usize::try_from(size).unwrap_or(0))
    )
}

fn respond_text(
    method: &str,
    target: &str,
    path: &str,
    has_key: bool,
    is_part: bool,
    request: &Request,
    state: &State,
) -> String {
    if is_part {
        let n = state.upload_part_requests.fetch_add(1, Ordering::Relaxed) + 1;
        if state.slowdown_every_nth_part > 0 && n.is_multiple_of(state.slowdown_every_nth_part) {
            return Fault::SlowDown.response();
        }
    }
    if let Some(fault) = state
        .script
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front()
    {
        return fault.response();
    }
    let xml = |body: String| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    match method {
        "HEAD" => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned(),
        "PUT" if is_part => "HTTP/1.1 200 OK\r\nETag: \"0123456789abcdef\"\r\nContent-Length: 0\r\n\r\n".to_owned(),
        "PUT" if has_key => {
            state.put_object_requests.fetch_add(1, Ordering::Relaxed);
            if state.fail_put_objects.load(Ordering::Relaxed) {
                return Fault::InternalError.response();
            }
            state
                .objects
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(path.to_owned(), request.payload_length);
            "HTTP/1.1 200 OK\r\nETag: \"fake-etag\"\r\nContent-Length: 0\r\n\r\n".to_owned()
        }
        "PUT" => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned(),
        "POST" if target.contains("?delete") => {
            // Quiet DeleteObjects: remove every <Key>, report no error.
            let body = String::from_utf8_lossy(&request.body);
            let bucket = path.trim_end_matches('/');
            let mut objects = state.objects.lock().unwrap_or_else(PoisonError::into_inner);
            for key in body.split("<Key>").skip(1).filter_map(|k| k.split("</Key>").next()) {
                objects.remove(&format!("{bucket}/{key}"));
                state.deletes.fetch_add(1, Ordering::Relaxed);
            }
            xml("<DeleteResult></DeleteResult>".to_owned())
        }
        "POST" if target.contains("uploads") => xml(
            "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>fake-upload</UploadId>\
             </InitiateMultipartUploadResult>"
                .to_owned(),
        ),
        "POST" if target.contains("uploadId=") => {
            state.completes.fetch_add(1, Ordering::Relaxed);
            xml("<CompleteMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><ETag>\"x-1\"</ETag>\
                 </CompleteMultipartUploadResult>"
                .to_owned())
        }
        "DELETE" => {
            state.deletes.fetch_add(1, Ordering::Relaxed);
            "HTTP/1.1 204 No Content\r\n\r\n".to_owned()
        }
        _ => Fault::InternalError.response(),
    }
}
