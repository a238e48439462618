//! Re-framing of `aws-chunked` request bodies whose chunks are unsigned
//! (`x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER`), so that no
//! chunk s3s decodes is larger than [`MAX_CHUNK_BYTES`].
//!
//! s3s 0.14 decodes an `aws-chunked` body chunk by chunk and holds a whole
//! chunk before it yields any of it (it must, for signed chunks: the
//! signature covers the chunk). The chunk size is the client's choice: the
//! AWS SDKs for Rust and others send an in-memory part as *one* chunk, so an
//! 8 MiB `UploadPart` sat whole in the gateway before the write budget was
//! asked for a byte of it, and eighty such requests held 640 MiB outside
//! every budget. Unsigned chunks carry no per-chunk signature, so cutting
//! them smaller changes nothing s3s verifies (the seed signature covers the
//! headers, and the trailer checksum covers the decoded payload, not the
//! framing). This adapter sits between hyper and s3s and rewrites
//!
//! ```text
//! <hex size>\r\n <data> \r\n ... 0\r\n <trailers> \r\n
//! ```
//!
//! into the same payload in chunks of at most [`MAX_CHUNK_BYTES`], each a
//! zero-copy slice of the frame hyper read. It holds at most the frame being
//! cut (hyper's read buffer) plus the chunk header line being read.
//!
//! The final zero-length chunk, the trailers after it, and anything it does
//! not recognise (a chunk extension such as `chunk-signature`, an
//! unparseable size line) are passed on verbatim, so s3s sees and rejects
//! malformed input exactly as it would have. Data not followed by `\r\n` is
//! passed on as a chunk header s3s cannot parse, which it rejects as a
//! format error. Signed chunked bodies are not touched: their chunks are
//! held whole by s3s (clients that sign chunks send small ones: 64 KiB to
//! 128 KiB).
//!
//! Format: <https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html>
//! and `sigv4-streaming-trailers.html`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame};

/// Largest chunk this adapter passes to s3s (bytes of data per chunk).
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// Longest chunk header line it reads before giving up and passing the
/// body on verbatim (s3s's own limit is the same).
const MAX_META_BYTES: usize = 1024;
/// The `x-amz-content-sha256` value of unsigned `aws-chunked` bodies.
pub const STREAMING_UNSIGNED_PAYLOAD_TRAILER: &str = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

/// Whether `headers` announce an `aws-chunked` body of unsigned chunks.
pub fn is_unsigned_chunked(headers: &http::HeaderMap) -> bool {
    headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes() == STREAMING_UNSIGNED_PAYLOAD_TRAILER.as_bytes())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk header line (`<hex size>\r\n`).
    Meta,
    /// Inside a chunk's data; bytes still to come.
    Data(u64),
    /// After a chunk's data: how many bytes of its `\r\n` were seen.
    DataEnd(u8),
    /// Everything from here on is passed on as it is.
    Verbatim,
}

/// An `aws-chunked` body re-framed into chunks of at most
/// [`MAX_CHUNK_BYTES`] (see the module docs).
pub struct Rechunked<B> {
    inner: B,
    state: State,
    /// The chunk header line read so far (at most [`MAX_META_BYTES`]).
    meta: Vec<u8>,
    /// Output not yet polled: slices of one input frame and chunk headers.
    out: VecDeque<Bytes>,
    inner_done: bool,
}

impl<B> Rechunked<B> {
    /// Wraps the raw (still `aws-chunked`) request body `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            state: State::Meta,
            meta: Vec::new(),
            out: VecDeque::new(),
            inner_done: false,
        }
    }

    fn verbatim(&mut self, rest: Bytes) {
        if !self.meta.is_empty() {
            self.out
                .push_back(Bytes::from(std::mem::take(&mut self.meta)));
        }
        if !rest.is_empty() {
            self.out.push_back(rest);
        }
        self.state = State::Verbatim;
    }

    fn emit_data(&mut self, mut data: Bytes) {
        while !data.is_empty() {
            let piece = data.split_to(data.len().min(MAX_CHUNK_BYTES));
            self.out
                .push_back(Bytes::from(format!("{:x}\r\n", piece.len())));
            self.out.push_back(piece);
            self.out.push_back(Bytes::from_static(b"\r\n"));
        }
    }

    /// Consumes one input frame.
    fn feed(&mut self, mut buf: Bytes) {
        while !buf.is_empty() {
            match self.state {
                State::Verbatim => {
                    self.out.push_back(buf);
                    return;
                }
                State::Meta => match buf.iter().position(|&b| b == b'\n') {
                    Some(i) if self.meta.len() + i < MAX_META_BYTES => {
                        self.meta.extend_from_slice(&buf[..=i]);
                        buf.advance(i + 1);
                        match chunk_size(&self.meta) {
                            Some(n) if n > 0 => {
                                self.meta.clear();
                                self.state = State::Data(n);
                            }
                            // The last chunk (trailers follow) or a line s3s
                            // should judge itself.
                            _ => return self.verbatim(buf),
                        }
                    }
                    Some(_) => return self.verbatim(buf),
                    None if self.meta.len() + buf.len() <= MAX_META_BYTES => {
                        self.meta.extend_from_slice(&buf);
                        return;
                    }
                    None => return self.verbatim(buf),
                },
                State::Data(remaining) => {
                    let n = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
                    let piece = buf.split_to(n);
                    self.emit_data(piece);
                    let left = remaining - n as u64;
                    self.state = if left == 0 {
                        State::DataEnd(0)
                    } else {
                        State::Data(left)
                    };
                }
                State::DataEnd(seen) => {
                    let expected = b"\r\n"[usize::from(seen)];
                    if buf[0] != expected {
                        // Not the end of the declared chunk: a header s3s
                        // cannot parse makes it reject the body.
                        self.out.push_back(Bytes::from_static(b"!\r\n"));
                        return self.verbatim(buf);
                    }
                    buf.advance(1);
                    self.state = if seen == 1 {
                        State::Meta
                    } else {
                        State::DataEnd(1)
                    };
                }
            }
        }
    }
}

/// The size of a chunk header line `<hex digits>\r\n` without extensions;
/// `None` for anything else (left to s3s).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.strip_suffix(b"\r\n")?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

impl<B> Body for Rechunked<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        loop {
            if let Some(b) = self.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if self.inner_done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                None => {
                    self.inner_done = true;
                    // A body cut off mid-chunk must stay incomplete for s3s:
                    // announce the missing data, or pass on the cut-off
                    // header line.
                    match self.state {
                        State::Data(n) => self.out.push_back(Bytes::from(format!("{n:x}\r\n"))),
                        State::DataEnd(_) => self.out.push_back(Bytes::from_static(b"!\r\n")),
                        State::Meta if !self.meta.is_empty() => self.verbatim(Bytes::new()),
                        State::Meta | State::Verbatim => {}
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.feed(data),
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    type TestBody = StreamBody<
        futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>,
    >;

    fn body_of(frames: Vec<Bytes>) -> TestBody {
        StreamBody::new(futures::stream::iter(
            frames
                .into_iter()
                .map(|b| Ok(Frame::data(b)))
                .collect::<Vec<_>>(),
        ))
    }

    /// Splits `wire` into frames of `sizes` (cycled).
    fn frames(wire: &[u8], sizes: &[usize]) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut at = 0;
        for size in sizes.iter().cycle() {
            if at >= wire.len() {
                break;
            }
            let end = (at + size).min(wire.len());
            out.push(Bytes::copy_from_slice(&wire[at..end]));
            at = end;
        }
        out
    }

    fn encode(chunks: &[&[u8]], trailer: &[u8]) -> Vec<u8> {
        let mut wire = Vec::new();
        for c in chunks {
            wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            wire.extend_from_slice(c);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n");
        wire.extend_from_slice(trailer);
        wire
    }

    async fn rechunk(frames: Vec<Bytes>) -> Vec<u8> {
        let body = Rechunked::new(body_of(frames));
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    /// Decodes `wire`: (payload, chunk sizes, rest after the last chunk).
    fn decode(wire: &[u8]) -> (Vec<u8>, Vec<usize>, Vec<u8>) {
        let mut payload = Vec::new();
        let mut sizes = Vec::new();
        let mut at = 0;
        loop {
            let nl = at + wire[at..].iter().position(|&b| b == b'\n').unwrap();
            let size = chunk_size(&wire[at..=nl]).unwrap() as usize;
            at = nl + 1;
            if size == 0 {
                return (payload, sizes, wire[at..].to_vec());
            }
            sizes.push(size);
            payload.extend_from_slice(&wire[at..at + size]);
            assert_eq!(&wire[at + size..at + size + 2], b"\r\n");
            at += size + 2;
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn large_chunks_are_cut_and_payload_and_trailers_survive() {
        let big = pattern(8 * 1024 * 1024 + 123);
        let small = pattern(5);
        let trailer = b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n";
        let wire = encode(&[&big, &small], trailer);
        for sizes in [
            &[65_536][..],
            &[1, 2, 3, 100_000],
            &[408_000],
            &[wire.len()],
        ] {
            let out = rechunk(frames(&wire, sizes)).await;
            let (payload, chunk_sizes, rest) = decode(&out);
            assert_eq!(payload.len(), big.len() + small.len());
            assert!(payload[..big.len()] == big[..] && payload[big.len()..] == small[..]);
            assert!(
                chunk_sizes.iter().all(|&s| s <= MAX_CHUNK_BYTES),
                "{sizes:?}"
            );
            assert!(chunk_sizes.len() >= big.len() / MAX_CHUNK_BYTES);
            assert_eq!(rest, trailer);
        }
    }

    #[tokio::test]
    async fn chunk_extensions_and_bad_sizes_pass_verbatim() {
        let signed = b"5;chunk-signature=abc\r\nhello\r\n0\r\n\r\n".to_vec();
        assert_eq!(rechunk(frames(&signed, &[3])).await, signed);
        let bad = b"zz\r\nhello\r\n".to_vec();
        assert_eq!(rechunk(frames(&bad, &[4])).await, bad);
        let long = vec![b'1'; 2000];
        assert_eq!(rechunk(frames(&long, &[700])).await, long);
    }

    #[tokio::test]
    async fn data_longer_than_declared_turns_into_a_bad_header() {
        let wire = b"3\r\nabcdef\r\n0\r\n\r\n".to_vec();
        let out = rechunk(frames(&wire, &[wire.len()])).await;
        assert_eq!(out, b"3\r\nabc\r\n!\r\ndef\r\n0\r\n\r\n".to_vec());
    }

    #[tokio::test]
    async fn a_cut_off_body_stays_cut_off() {
        // Ends inside a header line and inside data: s3s must still see
        // an incomplete body.
        let out = rechunk(frames(b"a\r\nhel", &[6])).await;
        assert_eq!(out, b"3\r\nhel\r\n7\r\n".to_vec());
        // Split across frames, the data goes on as one chunk per frame.
        let out = rechunk(frames(b"a\r\nhel", &[4])).await;
        assert_eq!(out, b"1\r\nh\r\n2\r\nel\r\n7\r\n".to_vec());
        let out = rechunk(frames(b"5\r\nhello\r", &[9])).await;
        assert_eq!(out, b"5\r\nhello\r\n!\r\n".to_vec());
        let out = rechunk(frames(b"5\r\nhello\r\n1", &[8, 4])).await;
        assert_eq!(out, b"5\r\nhello\r\n1".to_vec());
    }
}
