//! Error bodies the gateway writes or completes: the `503 SlowDown` of a
//! request refused admission, S3 errors answered before s3s sees the
//! request, and the `Resource`, `RequestId` and standard `Message` added to
//! s3s's own error bodies (S3 API Reference, "Error responses").

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::{Reader, Writer};
use s3s::{HttpResponse, S3ErrorCode};

use super::precheck::has_body;
use crate::s3::error::{RETRY_AFTER_SECONDS, standard_message};

/// The `503 SlowDown` of a request refused admission: S3 error XML with
/// `Code`, `Message`, `Resource` and `RequestId`, and `Retry-After`.
pub(super) fn inflight_slow_down<B>(
    req: &Request<B>,
    request_id: &str,
    resource: &str,
) -> HttpResponse {
    let mut resp = error_response(
        req,
        StatusCode::SERVICE_UNAVAILABLE,
        "SlowDown",
        standard_message(&S3ErrorCode::SlowDown).unwrap_or("Please reduce your request rate."),
        request_id,
        resource,
    );
    resp.headers_mut().insert(
        http::header::RETRY_AFTER,
        HeaderValue::from(RETRY_AFTER_SECONDS),
    );
    resp
}

/// An S3 error answered before s3s sees the request: error XML with
/// `Code`, `Message`, `Resource` and `RequestId`, `x-amz-request-id`, and
/// for an HTTP/1 request with a body `Connection: close` (its body is not
/// read).
pub(super) fn error_response<B>(
    req: &Request<B>,
    status: StatusCode,
    code: &str,
    message: &str,
    request_id: &str,
    resource: &str,
) -> HttpResponse {
    let body = error_xml(&[
        ("Code", code),
        ("Message", message),
        ("Resource", resource),
        ("RequestId", request_id),
    ]);
    let mut resp = HttpResponse::new(s3s::Body::from(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    if let Ok(v) = HeaderValue::from_str(request_id) {
        headers.insert("x-amz-request-id", v);
    }
    if has_body(req) && req.version() < http::Version::HTTP_2 {
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Adds `x-amz-request-id`, completes error bodies with `Resource` and
/// `RequestId`, and strips the body of a 304.
pub(super) fn finish_response(resp: &mut HttpResponse, request_id: &str, resource: &str) {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("x-amz-request-id", v);
    }
    let status = resp.status();
    if status == StatusCode::NOT_MODIFIED {
        *resp.body_mut() = s3s::Body::empty();
        resp.headers_mut().remove(http::header::CONTENT_TYPE);
        return;
    }
    if !(status.is_client_error() || status.is_server_error()) {
        return;
    }
    let Some(body) = resp.body_mut().take_bytes() else {
        return;
    };
    let body = complete_error_body(&body, request_id, resource).unwrap_or(body);
    *resp.body_mut() = s3s::Body::from(body);
}

/// Inserts `<Resource>` and `<RequestId>` at the end of an S3 error body
/// that lacks them, and S3's standard `<Message>` after `<Code>` when there
/// is none; `None` when `body` is not such a body (not XML, or its root is
/// not `Error`). The elements already there are kept as written.
pub(super) fn complete_error_body(body: &[u8], request_id: &str, resource: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    let (declared, children) = error_children(text)?;
    let has = |name: &str| children.iter().any(|(n, _)| n == name);
    let mut writer = Writer::new(Vec::with_capacity(body.len() + 128));
    let mut write = || -> std::io::Result<()> {
        if declared {
            writer.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
        }
        writer.write_event(Event::Start(BytesStart::new("Error")))?;
        for (name, raw) in &children {
            writer
                .create_element(name.as_str())
                .write_text_content(BytesText::from_escaped(*raw))?;
            if name == "Code"
                && !has("Message")
                && let Some(message) = quick_xml::escape::unescape(raw).ok().and_then(|code| {
                    standard_message(
                        &code
                            .parse::<S3ErrorCode>()
                            .unwrap_or(S3ErrorCode::InternalError),
                    )
                })
            {
                writer
                    .create_element("Message")
                    .write_text_content(BytesText::new(message))?;
            }
        }
        for (name, value) in [("Resource", resource), ("RequestId", request_id)] {
            if !has(name) {
                writer
                    .create_element(name)
                    .write_text_content(BytesText::new(value))?;
            }
        }
        writer.write_event(Event::End(BytesEnd::new("Error")))
    };
    write().ok()?;
    Some(Bytes::from(writer.into_inner()))
}

/// An S3 error document: `<Error>` with `elements` (name, unescaped text)
/// in order, after the XML declaration.
fn error_xml(elements: &[(&str, &str)]) -> String {
    let mut writer = Writer::new(Vec::with_capacity(256));
    let mut write = || -> std::io::Result<()> {
        writer.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
        writer.write_event(Event::Start(BytesStart::new("Error")))?;
        for (name, value) in elements {
            writer
                .create_element(*name)
                .write_text_content(BytesText::new(value))?;
        }
        writer.write_event(Event::End(BytesEnd::new("Error")))
    };
    write().expect("writing XML into a Vec cannot fail");
    String::from_utf8(writer.into_inner()).expect("quick-xml writes UTF-8 from &str")
}

/// Whether `text` has an XML declaration, and the child elements of its
/// `<Error>` root as (name, raw escaped text); `None` when `text` is not
/// well-formed XML with an `Error` root. A child's content is kept as
/// written (nested markup included).
fn error_children(text: &str) -> Option<(bool, Vec<(String, &str)>)> {
    let mut reader = Reader::from_str(text);
    let mut depth = 0usize;
    let mut root = false;
    let mut declared = false;
    let mut open: Option<(String, usize)> = None;
    let mut children = Vec::new();
    loop {
        let before = usize::try_from(reader.buffer_position()).ok()?;
        match reader.read_event().ok()? {
            Event::Start(e) => {
                depth += 1;
                let name = std::str::from_utf8(e.name().as_ref()).ok()?.to_string();
                if depth == 1 {
                    if name != "Error" {
                        return None;
                    }
                    root = true;
                } else if depth == 2 {
                    open = Some((name, usize::try_from(reader.buffer_position()).ok()?));
                }
            }
            Event::End(_) => {
                if depth == 2 {
                    let (name, start) = open.take()?;
                    children.push((name, text.get(start..before)?));
                }
                depth = depth.checked_sub(1)?;
            }
            Event::Empty(e) => {
                if depth == 0 {
                    return None;
                }
                if depth == 1 {
                    let name = std::str::from_utf8(e.name().as_ref()).ok()?.to_string();
                    children.push((name, ""));
                }
            }
            Event::Decl(_) => declared = true,
            Event::Eof => break,
            _ => {}
        }
    }
    (root && depth == 0).then_some((declared, children))
}
