//! Error bodies the gateway writes or completes: the `503 SlowDown` of a
//! request refused admission, S3 errors answered before s3s sees the
//! request, and the `Resource`, `RequestId` and standard `Message` added to
//! s3s's own error bodies (S3 API Reference, "Error responses").

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
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
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>{}</Message><Resource>{}</Resource><RequestId>{}</RequestId></Error>",
        xml_escape(code),
        xml_escape(message),
        xml_escape(resource),
        xml_escape(request_id),
    );
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

/// Inserts `<Resource>` and `<RequestId>` before `</Error>` of an S3 error
/// body that lacks them, and S3's standard `<Message>` after `</Code>` when
/// there is none; `None` when `body` is not such a body.
pub(super) fn complete_error_body(body: &[u8], request_id: &str, resource: &str) -> Option<Bytes> {
    let text = std::str::from_utf8(body).ok()?;
    let mut at = text.rfind("</Error>")?;
    if !text.contains("<Error>") {
        return None;
    }
    let mut text = text.to_string();
    if !text.contains("<Message>")
        && let (Some(start), Some(end)) = (text.find("<Code>"), text.find("</Code>"))
        && let Some(code) = text.get(start + "<Code>".len()..end)
        && let Some(message) = standard_message(
            &code
                .parse::<S3ErrorCode>()
                .unwrap_or(S3ErrorCode::InternalError),
        )
    {
        let element = format!("<Message>{}</Message>", xml_escape(message));
        text.insert_str(end + "</Code>".len(), &element);
        at += element.len();
    }
    let mut extra = String::new();
    if !text.contains("<Resource>") {
        extra.push_str(&format!("<Resource>{}</Resource>", xml_escape(resource)));
    }
    if !text.contains("<RequestId>") {
        extra.push_str(&format!(
            "<RequestId>{}</RequestId>",
            xml_escape(request_id)
        ));
    }
    let mut out = String::with_capacity(text.len() + extra.len());
    out.push_str(&text[..at]);
    out.push_str(&extra);
    out.push_str(&text[at..]);
    Some(Bytes::from(out))
}

pub(super) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}
