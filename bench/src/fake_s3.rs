//! A minimal in-process S3 endpoint for tests: HTTP/1.1 over a real TCP
//! socket, answering the handful of operations `multipart-put` sends, with
//! scripted error responses. Not a store: bodies are read and dropped.

use std::collections::VecDeque;
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
    pub requests: AtomicU64,
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
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = (&mut stream).take(content_length);
        let Ok(read) = tokio::io::copy(&mut body, &mut tokio::io::sink()).await else {
            return;
        };
        state.body_bytes.fetch_add(read, Ordering::Relaxed);
        let response = respond(&request_line, &state);
        if stream
            .get_mut()
            .write_all(response.as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn respond(request_line: &str, state: &State) -> String {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or("");
    let target = words.next().unwrap_or("");
    let is_part = method == "PUT" && target.contains("partNumber=");
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
        "PUT" => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned(),
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
