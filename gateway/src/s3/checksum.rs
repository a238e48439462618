//! Body integrity: the MD5 behind every ETag, `Content-MD5`, and the
//! `x-amz-checksum-*` algorithms (CRC32, CRC32C, CRC64NVME, SHA1, SHA256).
//!
//! [`DigestingBody`] wraps a request body and updates every hasher chunk by
//! chunk as the data path pulls it, so the body is never buffered. When the
//! body ends it compares the digests with what the client sent (headers, or
//! an aws-chunked trailer, which s3s exposes only once the body is consumed)
//! and, on a mismatch, ends the stream with a [`DigestMismatch`] error instead
//! of a clean end, so the data path never commits a bad body.
//!
//! Checksum values travel as S3 sends them: base64 of the big-endian digest
//! (<https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html>).
//! s3s checks chunk and trailer *signatures* of aws-chunked bodies but not
//! checksum values, so nothing here is checked twice.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::Stream;
use http::HeaderMap;
use md5_many::{Digest as _, Md5};
use s3s::{S3Error, S3ErrorCode, TrailingHeaders};
use sha2::Digest as _;
use sluice_proto::meta::Checksums;

/// A checksum algorithm S3 clients may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumAlgorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl ChecksumAlgorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [ChecksumAlgorithm; 5] = [
        Self::Crc32,
        Self::Crc32c,
        Self::Crc64Nvme,
        Self::Sha1,
        Self::Sha256,
    ];

    /// The name S3 uses (`x-amz-checksum-algorithm` values).
    pub fn name(self) -> &'static str {
        match self {
            Self::Crc32 => "CRC32",
            Self::Crc32c => "CRC32C",
            Self::Crc64Nvme => "CRC64NVME",
            Self::Sha1 => "SHA1",
            Self::Sha256 => "SHA256",
        }
    }

    /// The header carrying a value of this algorithm.
    pub fn header(self) -> &'static str {
        match self {
            Self::Crc32 => "x-amz-checksum-crc32",
            Self::Crc32c => "x-amz-checksum-crc32c",
            Self::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Self::Sha1 => "x-amz-checksum-sha1",
            Self::Sha256 => "x-amz-checksum-sha256",
        }
    }

    /// Parses an S3 algorithm name, case-insensitively.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Crc32 | Self::Crc32c => 4,
            Self::Crc64Nvme => 8,
            Self::Sha1 => 20,
            Self::Sha256 => 32,
        }
    }

    /// The CRC flavour, for the CRC algorithms.
    fn crc(self) -> Option<crc_fast::CrcAlgorithm> {
        match self {
            Self::Crc32 => Some(crc_fast::CrcAlgorithm::Crc32IsoHdlc),
            Self::Crc32c => Some(crc_fast::CrcAlgorithm::Crc32Iscsi),
            Self::Crc64Nvme => Some(crc_fast::CrcAlgorithm::Crc64Nvme),
            Self::Sha1 | Self::Sha256 => None,
        }
    }

    /// Whether S3 keeps a full-object checksum for multipart uploads by
    /// default (CRC64NVME); the others default to composite.
    pub fn full_object_by_default(self) -> bool {
        self == Self::Crc64Nvme
    }
}

/// Reads the stored value of `algorithm` from `checksums`.
pub fn get(checksums: &Checksums, algorithm: ChecksumAlgorithm) -> Option<&str> {
    match algorithm {
        ChecksumAlgorithm::Crc32 => checksums.crc32.as_deref(),
        ChecksumAlgorithm::Crc32c => checksums.crc32c.as_deref(),
        ChecksumAlgorithm::Crc64Nvme => checksums.crc64nvme.as_deref(),
        ChecksumAlgorithm::Sha1 => checksums.sha1.as_deref(),
        ChecksumAlgorithm::Sha256 => checksums.sha256.as_deref(),
    }
}

/// Stores `value` as the `algorithm` checksum in `checksums`.
pub fn set(checksums: &mut Checksums, algorithm: ChecksumAlgorithm, value: String) {
    let slot = match algorithm {
        ChecksumAlgorithm::Crc32 => &mut checksums.crc32,
        ChecksumAlgorithm::Crc32c => &mut checksums.crc32c,
        ChecksumAlgorithm::Crc64Nvme => &mut checksums.crc64nvme,
        ChecksumAlgorithm::Sha1 => &mut checksums.sha1,
        ChecksumAlgorithm::Sha256 => &mut checksums.sha256,
    };
    *slot = Some(value);
}

/// The algorithms that have a value in `checksums`.
pub fn present(checksums: &Checksums) -> impl Iterator<Item = ChecksumAlgorithm> + '_ {
    ChecksumAlgorithm::ALL
        .into_iter()
        .filter(|a| get(checksums, *a).is_some())
}

/// An incremental hasher for one algorithm.
pub enum Hasher {
    Crc(crc_fast::Digest, ChecksumAlgorithm),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
}

impl Hasher {
    pub fn new(algorithm: ChecksumAlgorithm) -> Self {
        match algorithm.crc() {
            Some(crc) => Hasher::Crc(crc_fast::Digest::new(crc), algorithm),
            None if algorithm == ChecksumAlgorithm::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            None => Hasher::Sha256(sha2::Sha256::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Crc(d, _) => d.update(data),
            Hasher::Sha1(d) => d.update(data),
            Hasher::Sha256(d) => d.update(data),
        }
    }

    /// The big-endian digest bytes.
    pub fn finalize(self) -> Vec<u8> {
        match self {
            Hasher::Crc(d, algorithm) => crc_bytes(algorithm, d.finalize()),
            Hasher::Sha1(d) => d.finalize().to_vec(),
            Hasher::Sha256(d) => d.finalize().to_vec(),
        }
    }
}

fn crc_bytes(algorithm: ChecksumAlgorithm, value: u64) -> Vec<u8> {
    match algorithm.digest_len() {
        // The 32-bit CRCs live in the low half of crc_fast's u64.
        4 => (value as u32).to_be_bytes().to_vec(),
        _ => value.to_be_bytes().to_vec(),
    }
}

/// Digest of `data` under `algorithm`, big-endian.
pub fn digest(algorithm: ChecksumAlgorithm, data: &[u8]) -> Vec<u8> {
    let mut h = Hasher::new(algorithm);
    h.update(data);
    h.finalize()
}

/// The S3 ETag of a single-PUT body: lowercase hex of its MD5 (unquoted).
pub fn etag_hex(md5: &[u8]) -> String {
    hex::encode(md5)
}

/// The S3 ETag of a multipart object: hex MD5 of the concatenated binary
/// part MD5s, then `-<part count>` (unquoted).
pub fn multipart_etag<'a>(part_md5s: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut md5 = Md5::new();
    let mut count = 0usize;
    for part in part_md5s {
        md5.update(part);
        count += 1;
    }
    format!("{}-{count}", hex::encode(md5.finalize()))
}

/// A composite multipart checksum: base64 of `algorithm` over the
/// concatenated binary part checksums, then `-<part count>`.
/// `parts` are the part checksums as stored (base64); `None` when one does not decode.
pub fn composite_checksum<'a>(
    algorithm: ChecksumAlgorithm,
    parts: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let mut h = Hasher::new(algorithm);
    let mut count = 0usize;
    for part in parts {
        let raw = BASE64.decode(part).ok()?;
        if raw.len() != algorithm.digest_len() {
            return None;
        }
        h.update(&raw);
        count += 1;
    }
    Some(format!("{}-{count}", BASE64.encode(h.finalize())))
}

/// A full-object CRC of a multipart object, combined from the part CRCs
/// (base64, as stored) and part sizes in bytes. `None` for the SHA
/// algorithms, for no parts, or when a part value does not decode.
pub fn full_object_crc<'a>(
    algorithm: ChecksumAlgorithm,
    parts: impl IntoIterator<Item = (&'a str, u64)>,
) -> Option<String> {
    let crc = algorithm.crc()?;
    let mut combined: Option<u64> = None;
    for (value, size) in parts {
        let raw = BASE64.decode(value).ok()?;
        let part = match raw.len() {
            4 if algorithm.digest_len() == 4 => u64::from(u32::from_be_bytes(raw.try_into().ok()?)),
            8 if algorithm.digest_len() == 8 => u64::from_be_bytes(raw.try_into().ok()?),
            _ => return None,
        };
        combined = Some(match combined {
            None => part,
            Some(acc) => crc_fast::checksum_combine(crc, acc, part, size),
        });
    }
    combined.map(|v| BASE64.encode(crc_bytes(algorithm, v)))
}

/// Why a body was refused after it was read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestMismatch {
    #[error("The Content-MD5 you specified did not match what we received.")]
    ContentMd5,
    #[error("The {} you specified did not match the calculated checksum.", .0.name())]
    Checksum(ChecksumAlgorithm),
}

impl DigestMismatch {
    /// The S3 error a client gets for this mismatch (`BadDigest`, 400).
    pub fn to_s3(&self) -> S3Error {
        S3Error::with_message(S3ErrorCode::BadDigest, self.to_string())
    }
}

/// What the client claims about a body, and which checksums to compute.
#[derive(Debug, Default)]
pub struct Expected {
    /// Decoded `Content-MD5`.
    pub content_md5: Option<[u8; 16]>,
    /// Values sent in `x-amz-checksum-*` headers (base64).
    pub values: Vec<(ChecksumAlgorithm, String)>,
    /// Algorithms to compute and store even without a value to check.
    pub compute: Vec<ChecksumAlgorithm>,
    /// Algorithm whose value arrives in an aws-chunked trailer, and the handle to read it.
    pub trailer: Option<(ChecksumAlgorithm, TrailingHeaders)>,
}

impl Expected {
    /// Reads `Content-MD5`, `x-amz-checksum-*`, `x-amz-sdk-checksum-algorithm`
    /// / `x-amz-checksum-algorithm` and `x-amz-trailer` from request headers.
    ///
    /// Errors: `InvalidDigest` for a malformed `Content-MD5`; `BadDigest`
    /// for a malformed checksum value; `InvalidRequest` for an unknown
    /// algorithm.
    pub fn from_headers(
        headers: &HeaderMap,
        trailing: Option<TrailingHeaders>,
    ) -> Result<Self, S3Error> {
        let mut expected = Expected::default();
        if let Some(v) = headers.get("content-md5") {
            let raw = v
                .to_str()
                .ok()
                .and_then(|s| BASE64.decode(s.trim()).ok())
                .and_then(|b| <[u8; 16]>::try_from(b).ok())
                .ok_or_else(|| {
                    S3Error::with_message(
                        S3ErrorCode::InvalidDigest,
                        "The Content-MD5 you specified is not valid.",
                    )
                })?;
            expected.content_md5 = Some(raw);
        }
        for algorithm in ChecksumAlgorithm::ALL {
            if let Some(v) = headers.get(algorithm.header()) {
                let value = v.to_str().map(str::trim).unwrap_or_default();
                check_value_shape(algorithm, value)?;
                expected.values.push((algorithm, value.to_string()));
            }
        }
        for name in ["x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm"] {
            if let Some(v) = headers.get(name) {
                let algorithm = v
                    .to_str()
                    .ok()
                    .and_then(ChecksumAlgorithm::parse)
                    .ok_or_else(|| {
                        S3Error::with_message(
                            S3ErrorCode::InvalidRequest,
                            format!("Value for {name} header is invalid."),
                        )
                    })?;
                expected.compute.push(algorithm);
            }
        }
        if let (Some(v), Some(trailing)) = (headers.get("x-amz-trailer"), trailing) {
            let name = v.to_str().unwrap_or_default().trim().to_ascii_lowercase();
            if let Some(algorithm) = ChecksumAlgorithm::ALL
                .into_iter()
                .find(|a| a.header() == name)
            {
                expected.trailer = Some((algorithm, trailing));
            }
        }
        Ok(expected)
    }

    /// Also computes `algorithm` (e.g. the one a multipart upload was created with).
    pub fn also_compute(&mut self, algorithm: ChecksumAlgorithm) {
        self.compute.push(algorithm);
    }

    fn algorithms(&self) -> Vec<ChecksumAlgorithm> {
        let mut all: Vec<ChecksumAlgorithm> = self
            .values
            .iter()
            .map(|(a, _)| *a)
            .chain(self.compute.iter().copied())
            .chain(self.trailer.as_ref().map(|(a, _)| *a))
            .collect();
        all.sort_by_key(|a| a.name());
        all.dedup();
        all
    }
}

/// Whether `value` is base64 of an `algorithm` digest (its length).
pub fn is_value_shape(algorithm: ChecksumAlgorithm, value: &str) -> bool {
    BASE64
        .decode(value)
        .is_ok_and(|raw| raw.len() == algorithm.digest_len())
}

/// A body's `x-amz-checksum-*` value that is not base64 of a digest of the
/// algorithm's length can match no body: `BadDigest`, as S3 answers.
fn check_value_shape(algorithm: ChecksumAlgorithm, value: &str) -> Result<(), S3Error> {
    if is_value_shape(algorithm, value) {
        Ok(())
    } else {
        Err(S3Error::with_message(
            S3ErrorCode::BadDigest,
            format!(
                "The {} you specified did not match the calculated checksum.",
                algorithm.name()
            ),
        ))
    }
}

/// What [`DigestingBody`] learned about a body that ended cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyDigests {
    /// Payload bytes.
    pub size: u64,
    /// Binary MD5 (the ETag source).
    pub md5: [u8; 16],
    /// Every computed checksum, base64.
    pub checksums: Checksums,
}

/// Where a [`DigestingBody`] leaves its result once the body has ended and verified.
pub type DigestSlot = Arc<Mutex<Option<BodyDigests>>>;

/// A body stream that hashes as it goes and verifies at the end (see module docs).
pub struct DigestingBody<S> {
    inner: S,
    md5: Md5,
    hashers: Vec<(ChecksumAlgorithm, Hasher)>,
    expected: Expected,
    size: u64,
    slot: DigestSlot,
    finished: bool,
}

impl<S> DigestingBody<S> {
    /// Wraps `inner`; the verified digests land in the returned slot.
    pub fn new(inner: S, expected: Expected) -> (Self, DigestSlot) {
        let slot: DigestSlot = Arc::new(Mutex::new(None));
        let hashers = expected
            .algorithms()
            .into_iter()
            .map(|a| (a, Hasher::new(a)))
            .collect();
        let body = DigestingBody {
            inner,
            md5: Md5::new(),
            hashers,
            expected,
            size: 0,
            slot: slot.clone(),
            finished: false,
        };
        (body, slot)
    }

    fn finish(&mut self) -> Result<(), DigestMismatch> {
        let md5: [u8; 16] = std::mem::take(&mut self.md5).finalize().into();
        if let Some(want) = self.expected.content_md5
            && want != md5
        {
            return Err(DigestMismatch::ContentMd5);
        }
        let mut checksums = Checksums::default();
        for (algorithm, hasher) in std::mem::take(&mut self.hashers) {
            set(&mut checksums, algorithm, BASE64.encode(hasher.finalize()));
        }
        let mut claims: Vec<(ChecksumAlgorithm, String)> =
            std::mem::take(&mut self.expected.values);
        if let Some((algorithm, trailing)) = &self.expected.trailer
            && let Some(Some(value)) = trailing.read(|h| {
                h.get(algorithm.header())
                    .and_then(|v| v.to_str().ok())
                    .map(|s| s.trim().to_string())
            })
        {
            claims.push((*algorithm, value));
        }
        for (algorithm, claimed) in claims {
            if get(&checksums, algorithm) != Some(claimed.as_str()) {
                return Err(DigestMismatch::Checksum(algorithm));
            }
        }
        let digests = BodyDigests {
            size: self.size,
            md5,
            checksums,
        };
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(digests);
        Ok(())
    }
}

impl<S> Stream for DigestingBody<S>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => {
                this.md5.update(&chunk);
                for (_, h) in &mut this.hashers {
                    h.update(&chunk);
                }
                this.size += chunk.len() as u64;
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finished = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.finished = true;
                match this.finish() {
                    Ok(()) => Poll::Ready(None),
                    Err(mismatch) => Poll::Ready(Some(Err(std::io::Error::other(mismatch)))),
                }
            }
        }
    }
}

/// Takes the digests out of a slot filled by a finished [`DigestingBody`].
pub fn take(slot: &DigestSlot) -> Option<BodyDigests> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn b64(bytes: &[u8]) -> String {
        BASE64.encode(bytes)
    }

    #[test]
    fn check_values_match_the_standard_vectors() {
        // "123456789" is the check input of the CRC catalogue.
        assert_eq!(
            digest(ChecksumAlgorithm::Crc32, b"123456789"),
            0xCBF4_3926u32.to_be_bytes()
        );
        assert_eq!(
            digest(ChecksumAlgorithm::Crc32c, b"123456789"),
            0xE306_9283u32.to_be_bytes()
        );
        assert_eq!(
            digest(ChecksumAlgorithm::Crc64Nvme, b"123456789"),
            0xAE8B_1486_0A79_9888u64.to_be_bytes()
        );
        assert_eq!(
            hex::encode(digest(ChecksumAlgorithm::Sha1, b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex::encode(digest(ChecksumAlgorithm::Sha256, b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // As S3 shows them: base64 of the big-endian value.
        assert_eq!(
            b64(&digest(ChecksumAlgorithm::Crc32, b"123456789")),
            "y/Q5Jg=="
        );
        assert_eq!(
            b64(&digest(ChecksumAlgorithm::Crc32c, b"123456789")),
            "4waSgw=="
        );
    }

    #[test]
    fn etag_rules() {
        let empty: [u8; 16] = Md5::digest(b"").into();
        assert_eq!(etag_hex(&empty), "d41d8cd98f00b204e9800998ecf8427e");
        let hello: [u8; 16] = Md5::digest(b"hello").into();
        assert_eq!(etag_hex(&hello), "5d41402abc4b2a76b9719d911017c592");
        // Multipart: md5 of the concatenated binary part md5s, then -N.
        let mut concat = Vec::new();
        concat.extend_from_slice(&hello);
        concat.extend_from_slice(&empty);
        let expected = format!("{}-2", hex::encode(Md5::digest(&concat)));
        assert_eq!(multipart_etag([&hello[..], &empty[..]]), expected);
        assert_eq!(
            multipart_etag([&hello[..]]),
            format!("{}-1", hex::encode(Md5::digest(hello)))
        );
        assert!(multipart_etag([&hello[..], &empty[..]]).ends_with("-2"));
    }

    #[test]
    fn composite_and_full_object_multipart_checksums() {
        let p1 = b"1234";
        let p2 = b"56789";
        let c1 = b64(&digest(ChecksumAlgorithm::Crc32, p1));
        let c2 = b64(&digest(ChecksumAlgorithm::Crc32, p2));
        // Full object: the CRC of the whole body.
        assert_eq!(
            full_object_crc(
                ChecksumAlgorithm::Crc32,
                [(c1.as_str(), 4), (c2.as_str(), 5)]
            ),
            Some(b64(&digest(ChecksumAlgorithm::Crc32, b"123456789")))
        );
        let n1 = b64(&digest(ChecksumAlgorithm::Crc64Nvme, p1));
        let n2 = b64(&digest(ChecksumAlgorithm::Crc64Nvme, p2));
        assert_eq!(
            full_object_crc(
                ChecksumAlgorithm::Crc64Nvme,
                [(n1.as_str(), 4), (n2.as_str(), 5)]
            ),
            Some(b64(&digest(ChecksumAlgorithm::Crc64Nvme, b"123456789")))
        );
        assert_eq!(full_object_crc(ChecksumAlgorithm::Sha256, [("x", 1)]), None);
        // Composite: the checksum of the concatenated binary checksums, -N.
        let mut concat = digest(ChecksumAlgorithm::Crc32, p1);
        concat.extend(digest(ChecksumAlgorithm::Crc32, p2));
        assert_eq!(
            composite_checksum(ChecksumAlgorithm::Crc32, [c1.as_str(), c2.as_str()]),
            Some(format!(
                "{}-2",
                b64(&digest(ChecksumAlgorithm::Crc32, &concat))
            ))
        );
        assert_eq!(
            composite_checksum(ChecksumAlgorithm::Crc32, ["not base64!"]),
            None
        );
    }

    fn body(chunks: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
        futures::stream::iter(
            chunks
                .iter()
                .map(|c| Ok(Bytes::from_static(c)))
                .collect::<Vec<_>>(),
        )
    }

    async fn drain<S: Stream<Item = Result<Bytes, std::io::Error>> + Unpin>(
        mut s: S,
    ) -> Result<Vec<u8>, std::io::Error> {
        let mut out = Vec::new();
        while let Some(chunk) = s.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    #[test]
    fn md5_matches_rfc_1321_and_an_independent_implementation() {
        // RFC 1321, appendix A.5 (the test suite).
        for (input, hex) in [
            (&b""[..], "d41d8cd98f00b204e9800998ecf8427e"),
            (b"a", "0cc175b9c0f1b6a831c399e269772661"),
            (b"abc", "900150983cd24fb0d6963f7d28e17f72"),
            (b"message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                b"abcdefghijklmnopqrstuvwxyz",
                "c3fcd3d76192e4007dfb496cca67e13b",
            ),
            (
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "d174ab98d277d9f5a5611c2c9f419d9f",
            ),
            (
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ] {
            assert_eq!(hex::encode(Md5::digest(input)), hex);
        }
        // Bodies arrive in chunks of any size: every length around the
        // 64-byte block and its padding boundary (55/56/63/64 bytes), in
        // chunks that straddle blocks, against md-5 as the oracle.
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for len in (0..200).chain([4095, 4096, 65_536, 70_000]) {
            let input = &data[..len];
            let oracle: [u8; 16] = <md5::Md5 as md5::Digest>::digest(input).into();
            for chunk in [1, 7, 63, 64, 65, 1000] {
                let mut h = Md5::new();
                for c in input.chunks(chunk) {
                    h.update(c);
                }
                let got: [u8; 16] = h.finalize().into();
                assert_eq!(got, oracle, "{len} bytes in chunks of {chunk}");
            }
        }
    }

    #[tokio::test]
    async fn digesting_body_computes_and_verifies() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-md5",
            b64(&Md5::digest(b"123456789")).parse().unwrap(),
        );
        headers.insert("x-amz-checksum-crc32c", "4waSgw==".parse().unwrap());
        headers.insert("x-amz-sdk-checksum-algorithm", "crc32".parse().unwrap());
        let expected = Expected::from_headers(&headers, None).expect("headers");
        let (stream, slot) = DigestingBody::new(body(&[b"1234", b"56789"]), expected);
        assert_eq!(drain(stream).await.expect("verified"), b"123456789");
        let d = take(&slot).expect("digests");
        assert_eq!(d.size, 9);
        assert_eq!(etag_hex(&d.md5), "25f9e794323b453885f5181f1b624d0b");
        assert_eq!(d.checksums.crc32.as_deref(), Some("y/Q5Jg=="));
        assert_eq!(d.checksums.crc32c.as_deref(), Some("4waSgw=="));
        assert_eq!(d.checksums.sha256, None);
    }

    #[tokio::test]
    async fn digesting_body_fails_on_mismatch() {
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-checksum-crc32", "AAAAAA==".parse().unwrap());
        let (stream, slot) = DigestingBody::new(
            body(&[b"123456789"]),
            Expected::from_headers(&headers, None).unwrap(),
        );
        let err = drain(stream).await.expect_err("mismatch");
        let mismatch = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<DigestMismatch>())
            .expect("typed");
        assert_eq!(
            mismatch,
            &DigestMismatch::Checksum(ChecksumAlgorithm::Crc32)
        );
        assert!(take(&slot).is_none());

        let mut headers = HeaderMap::new();
        headers.insert("content-md5", b64(&Md5::digest(b"other")).parse().unwrap());
        let (stream, _) = DigestingBody::new(
            body(&[b"123456789"]),
            Expected::from_headers(&headers, None).unwrap(),
        );
        let err = drain(stream).await.expect_err("mismatch");
        assert_eq!(
            err.get_ref()
                .and_then(|e| e.downcast_ref::<DigestMismatch>()),
            Some(&DigestMismatch::ContentMd5)
        );
    }

    #[test]
    fn malformed_claims_are_rejected_up_front() {
        let mut headers = HeaderMap::new();
        headers.insert("content-md5", "nope".parse().unwrap());
        assert_eq!(
            Expected::from_headers(&headers, None).unwrap_err().code(),
            &S3ErrorCode::InvalidDigest
        );
        for bad in ["y/Q5Jg==", "bad"] {
            let mut headers = HeaderMap::new();
            headers.insert("x-amz-checksum-sha256", bad.parse().unwrap());
            assert_eq!(
                Expected::from_headers(&headers, None).unwrap_err().code(),
                &S3ErrorCode::BadDigest,
                "{bad}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-sdk-checksum-algorithm", "MD4".parse().unwrap());
        assert_eq!(
            Expected::from_headers(&headers, None).unwrap_err().code(),
            &S3ErrorCode::InvalidRequest
        );
    }
}
