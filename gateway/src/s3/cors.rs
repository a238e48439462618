//! Bucket CORS: what PutBucketCors accepts ([`validate`]) and how a stored
//! configuration answers a browser, for a preflight `OPTIONS` ([`preflight`])
//! and for an actual request that carries `Origin` ([`actual`]).
//!
//! Pure functions over s3s's DTOs, following "Using cross-origin resource
//! sharing (CORS)" / "How Amazon S3 evaluates the CORS configuration"
//! (<https://docs.aws.amazon.com/AmazonS3/latest/userguide/cors.html>),
//! PutBucketCors (<https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutBucketCors.html>)
//! and OPTIONS object (<https://docs.aws.amazon.com/AmazonS3/latest/API/RESTOPTIONSobject.html>).
//! Where those pages are silent (error codes and messages, `*` versus the
//! echoed origin, `Access-Control-Allow-Credentials`), this follows Scality
//! CloudServer, whose CORS code and functional tests are written against S3
//! (`lib/api/apiUtils/bucket/bucketCors.js`,
//! `lib/api/apiUtils/object/corsResponse.js`, `lib/api/corsPreflight.js`).

use http::header::{self, HeaderName, HeaderValue};
use s3s::dto::{CORSConfiguration, CORSRule};
use s3s::{S3Error, S3ErrorCode};

/// Most rules one CORS configuration may hold (PutBucketCors: "up to 100 rules").
pub const MAX_CORS_RULES: usize = 100;

/// Longest rule `ID`, in characters (CORSRule: "cannot be longer than 255 characters").
pub const MAX_RULE_ID_CHARS: usize = 255;

/// The methods an `AllowedMethod` may name, compared case-sensitively (CORSRule).
pub const ALLOWED_METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

/// The message of the 403 `AccessDenied` S3 answers to a preflight no rule
/// allows (S3's wording, typo included; CloudServer `corsPreflight.js`).
pub const PREFLIGHT_DENIED: &str = "CORSResponse: This CORS request is not allowed. This is usually because the evalution of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec.";

/// The `Vary` S3 sends with every CORS answer, preflight or actual.
pub const VARY: &str = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method";

/// Checks a configuration as PutBucketCors does, rule by rule in order.
///
/// # Errors
/// * `MalformedXML`: no rule, more than [`MAX_CORS_RULES`] rules (moto's
///   choice; CloudServer answers `InvalidRequest` there), a rule without
///   `AllowedMethod` or `AllowedOrigin`, an empty `AllowedOrigin` or
///   `AllowedHeader`, a negative `MaxAgeSeconds`.
/// * `InvalidRequest`: an `AllowedMethod` outside [`ALLOWED_METHODS`]
///   ("Found unsupported HTTP method in CORS config. Unsupported method is
///   X", moto's wording); an `AllowedOrigin` or `AllowedHeader` with more
///   than one `*`; an `ID` longer than [`MAX_RULE_ID_CHARS`] characters; an
///   `ExposeHeader` with a `*` or a character not allowed in a header name.
pub fn validate(config: &CORSConfiguration) -> Result<(), S3Error> {
    let rules = &config.cors_rules;
    if rules.is_empty() {
        return Err(malformed(
            "A CORS configuration must have at least one CORSRule.",
        ));
    }
    if rules.len() > MAX_CORS_RULES {
        return Err(malformed(
            "The number of CORS rules should not exceed allowed limit of 100 rules.",
        ));
    }
    rules.iter().try_for_each(validate_rule)
}

fn validate_rule(rule: &CORSRule) -> Result<(), S3Error> {
    if rule.allowed_methods.is_empty() || rule.allowed_origins.is_empty() {
        return Err(malformed(
            "Each CORSRule must identify at least one origin and one method.",
        ));
    }
    if let Some(m) = rule
        .allowed_methods
        .iter()
        .find(|m| !ALLOWED_METHODS.contains(&m.as_str()))
    {
        return Err(invalid(format!(
            "Found unsupported HTTP method in CORS config. Unsupported method is {m}"
        )));
    }
    let headers = rule.allowed_headers.as_deref().unwrap_or_default();
    for (kind, values) in [
        ("AllowedOrigin", &rule.allowed_origins[..]),
        ("AllowedHeader", headers),
    ] {
        for value in values {
            if value.is_empty() {
                return Err(malformed(format!("{kind} can not be empty.")));
            }
            if value.matches('*').count() > 1 {
                return Err(invalid(format!(
                    "{kind} \"{value}\" can not have more than one wildcard."
                )));
            }
        }
    }
    if let Some(id) = &rule.id
        && id.chars().count() > MAX_RULE_ID_CHARS
    {
        return Err(invalid(
            "The ID of a CORSRule can not be longer than 255 characters.",
        ));
    }
    if let Some(age) = rule.max_age_seconds
        && age < 0
    {
        return Err(malformed(format!(
            "MaxAgeSeconds \"{age}\" is not a valid value."
        )));
    }
    for h in rule.expose_headers.as_deref().unwrap_or_default() {
        if h.contains('*') {
            return Err(invalid(format!(
                "ExposeHeader {h} contains a wildcard. Wildcards are currently not supported for ExposeHeader."
            )));
        }
        if HeaderName::from_bytes(h.as_bytes()).is_err() {
            return Err(invalid(format!(
                "ExposeHeader {h} contains invalid character."
            )));
        }
    }
    Ok(())
}

fn malformed(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedXML, msg.into())
}

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg.into())
}

/// Whether `value` matches `pattern`, where one `*` in the pattern stands for
/// any run of characters (possibly empty), so `https://*.example.com` matches
/// `https://a.example.com` and `*` matches everything. Case-sensitive.
pub fn wildcard_match(pattern: &str, value: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == value,
        Some((prefix, suffix)) => {
            value.len() >= prefix.len() + suffix.len()
                && value.starts_with(prefix)
                && value.ends_with(suffix)
        }
    }
}

/// Whether `origin` is not empty and matches one of the rule's
/// `AllowedOrigin`s (case-sensitive, as S3).
fn origin_allowed(rule: &CORSRule, origin: &str) -> bool {
    !origin.is_empty()
        && rule
            .allowed_origins
            .iter()
            .any(|p| wildcard_match(p, origin))
}

/// Whether the header name `name` matches one of the rule's `AllowedHeader`s
/// (case-insensitive; a rule without `AllowedHeader` allows none).
fn header_allowed(rule: &CORSRule, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    rule.allowed_headers
        .iter()
        .flatten()
        .any(|p| wildcard_match(&p.to_ascii_lowercase(), &name))
}

/// What the matched `rule` answers `origin`. `Access-Control-Allow-Origin`
/// is `*`, without `Access-Control-Allow-Credentials`, when the rule lists
/// the origin `*`; otherwise it is the request's origin, with
/// `Access-Control-Allow-Credentials: true` (CloudServer
/// `generateCorsResHeaders`, which checks the rule's whole list, not only
/// the pattern that matched).
fn answer(rule: &CORSRule, origin: &str) -> Actual {
    let star = rule.allowed_origins.iter().any(|o| o == "*");
    Actual {
        allow_origin: if star { "*" } else { origin }.to_string(),
        allow_methods: join(&rule.allowed_methods),
        expose_headers: rule.expose_headers.as_deref().map(join),
        max_age: rule.max_age_seconds,
        allow_credentials: !star,
        vary: VARY,
    }
}

fn join(values: &[String]) -> String {
    values.join(", ")
}

/// The CORS headers of a successful preflight (200, empty body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preflight {
    /// `Access-Control-Allow-Origin`: the request's `Origin`, or `*` (see [`preflight`]).
    pub allow_origin: String,
    /// `Access-Control-Allow-Methods`: the matched rule's methods, joined by ", ".
    pub allow_methods: String,
    /// `Access-Control-Allow-Headers`: the requested headers, lowercased, in
    /// request order, joined by ", "; `None` when none were requested.
    pub allow_headers: Option<String>,
    /// `Access-Control-Expose-Headers`: the rule's `ExposeHeader`s joined by ", ".
    pub expose_headers: Option<String>,
    /// `Access-Control-Max-Age`, seconds: the rule's `MaxAgeSeconds`.
    pub max_age: Option<i32>,
    /// Whether to send `Access-Control-Allow-Credentials: true` (when `allow_origin` is not `*`).
    pub allow_credentials: bool,
    /// `Vary`: always [`VARY`].
    pub vary: &'static str,
}

/// Evaluates a preflight `OPTIONS` against `rules`: the first rule, in order,
/// whose `AllowedOrigin`s match `origin`, whose `AllowedMethod`s contain
/// `method` (the `Access-Control-Request-Method` value, case-sensitive) and
/// whose `AllowedHeader`s match every name in `request_headers` (the
/// comma-separated `Access-Control-Request-Headers` value; names trimmed,
/// empty ones ignored, compared case-insensitively).
///
/// `allow_origin` is `*` when the rule allows the origin `*`, else the
/// request's origin, which S3 echoes ("The origin you sent in your
/// request", RESTOPTIONSobject; CloudServer `generateCorsResHeaders`).
///
/// `None` means S3 answers 403 `AccessDenied` with [`PREFLIGHT_DENIED`]; so
/// does an empty `origin`. The caller answers the other refusals first: no
/// CORS configuration → 403; no `Origin` header → 400 `BadRequest`
/// ("Insufficient information. Origin request header needed.").
pub fn preflight(
    rules: &[CORSRule],
    origin: &str,
    method: &str,
    request_headers: &str,
) -> Option<Preflight> {
    let requested: Vec<String> = request_headers
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let rule = rules.iter().find(|r| {
        origin_allowed(r, origin)
            && r.allowed_methods.iter().any(|m| m == method)
            && requested.iter().all(|h| header_allowed(r, h))
    })?;
    let allow_headers = (!requested.is_empty()).then(|| join(&requested));
    Some(answer(rule, origin).with_allow_headers(allow_headers))
}

/// The CORS headers S3 adds to an actual (non-`OPTIONS`) request's response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actual {
    /// `Access-Control-Allow-Origin`: the request's `Origin`, or `*` (see [`actual`]).
    pub allow_origin: String,
    /// `Access-Control-Allow-Methods`: the matched rule's methods, joined by ", ".
    pub allow_methods: String,
    /// `Access-Control-Expose-Headers`: the rule's `ExposeHeader`s joined by ", ".
    pub expose_headers: Option<String>,
    /// `Access-Control-Max-Age`, seconds: the rule's `MaxAgeSeconds`.
    pub max_age: Option<i32>,
    /// Whether to send `Access-Control-Allow-Credentials: true` (when `allow_origin` is not `*`).
    pub allow_credentials: bool,
    /// `Vary`: always [`VARY`].
    pub vary: &'static str,
}

/// Evaluates a request that carries `Origin` and is not a preflight: the
/// first rule whose origins match `origin` and whose methods contain the
/// request's own `method` (`HEAD` for HeadObject, `GET` for GetObject).
/// Headers play no part. `allow_origin`/`allow_credentials` as in
/// [`preflight`]. `None` (or an empty `origin`): the response gets no CORS
/// headers and is otherwise unchanged.
pub fn actual(rules: &[CORSRule], origin: &str, method: &str) -> Option<Actual> {
    rules
        .iter()
        .find(|r| origin_allowed(r, origin) && r.allowed_methods.iter().any(|m| m == method))
        .map(|rule| answer(rule, origin))
}

impl Preflight {
    /// The response headers, in a fixed order; a value that is not a valid
    /// header value (e.g. a control character in an origin) is left out.
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let max_age = self.max_age.map(|a| a.to_string());
        let credentials = self.allow_credentials.then_some("true");
        [
            (
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                Some(&*self.allow_origin),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                Some(&self.allow_methods),
            ),
            (header::ACCESS_CONTROL_ALLOW_CREDENTIALS, credentials),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                self.allow_headers.as_deref(),
            ),
            (
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                self.expose_headers.as_deref(),
            ),
            (header::ACCESS_CONTROL_MAX_AGE, max_age.as_deref()),
            (header::VARY, Some(self.vary)),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, HeaderValue::from_str(value?).ok()?)))
        .collect()
    }
}

impl Actual {
    /// The response headers, in a fixed order; a value that is not a valid
    /// header value is left out.
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        self.clone().with_allow_headers(None).headers()
    }

    fn with_allow_headers(self, allow_headers: Option<String>) -> Preflight {
        Preflight {
            allow_origin: self.allow_origin,
            allow_methods: self.allow_methods,
            allow_headers,
            expose_headers: self.expose_headers,
            max_age: self.max_age,
            allow_credentials: self.allow_credentials,
            vary: self.vary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use S3ErrorCode::{InvalidRequest, MalformedXML};

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    fn rule(origins: &[&str], methods: &[&str], headers: &[&str]) -> CORSRule {
        CORSRule {
            allowed_origins: strings(origins),
            allowed_methods: strings(methods),
            allowed_headers: (!headers.is_empty()).then(|| strings(headers)),
            ..Default::default()
        }
    }

    /// `rule` with `ExposeHeader`s and `MaxAgeSeconds`.
    fn full(o: &[&str], m: &[&str], h: &[&str], expose: &[&str], age: i32) -> CORSRule {
        CORSRule {
            expose_headers: Some(strings(expose)),
            max_age_seconds: Some(age),
            ..rule(o, m, h)
        }
    }

    fn check(rules: Vec<CORSRule>) -> Result<(), (S3ErrorCode, String)> {
        validate(&CORSConfiguration { cors_rules: rules }).map_err(|e| {
            (
                e.code().clone(),
                e.message().unwrap_or_default().to_string(),
            )
        })
    }

    fn lines(h: Vec<(HeaderName, HeaderValue)>) -> Vec<String> {
        h.iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
            .collect()
    }

    const VARY_LINE: &str =
        "vary: Origin, Access-Control-Request-Headers, Access-Control-Request-Method";

    #[test]
    fn valid_configuration_passes() {
        let all = ["GET", "PUT", "POST", "DELETE", "HEAD"];
        let mut r = full(
            &["https://*.example.com", "*"],
            &all,
            &["x-amz-*"],
            &["ETag"],
            0,
        );
        r.id = Some("a".repeat(255));
        assert_eq!(check(vec![r.clone()]), Ok(()));
        assert_eq!(check(vec![r; MAX_CORS_RULES]), Ok(()));
    }

    #[test]
    fn validation_errors_have_s3_codes() {
        let ok = || rule(&["*"], &["GET"], &[]);
        let many = "The number of CORS rules should not exceed allowed limit of 100 rules.";
        let none = "A CORS configuration must have at least one CORSRule.";
        assert_eq!(check(vec![]), Err((MalformedXML, none.into())));
        assert_eq!(check(vec![ok(); 101]), Err((MalformedXML, many.into())));
        let one = "Each CORSRule must identify at least one origin and one method.";
        let method = "Found unsupported HTTP method in CORS config. Unsupported method is";
        let cases: Vec<(CORSRule, S3ErrorCode, String)> = vec![
            (rule(&["*"], &["GET", "get"], &[]), InvalidRequest, format!("{method} get")),
            (rule(&["*"], &["OPTIONS"], &[]), InvalidRequest, format!("{method} OPTIONS")),
            (
                rule(&["http://*.*.com"], &["GET"], &[]),
                InvalidRequest,
                "AllowedOrigin \"http://*.*.com\" can not have more than one wildcard.".into(),
            ),
            (
                rule(&["*"], &["GET"], &["*-amz-*"]),
                InvalidRequest,
                "AllowedHeader \"*-amz-*\" can not have more than one wildcard.".into(),
            ),
            (rule(&["*"], &[], &[]), MalformedXML, one.into()),
            (rule(&[], &["GET"], &[]), MalformedXML, one.into()),
            (rule(&[""], &["GET"], &[]), MalformedXML, "AllowedOrigin can not be empty.".into()),
            (
                CORSRule { max_age_seconds: Some(-1), ..ok() },
                MalformedXML,
                "MaxAgeSeconds \"-1\" is not a valid value.".into(),
            ),
            (
                CORSRule { id: Some("é".repeat(256)), ..ok() },
                InvalidRequest,
                "The ID of a CORSRule can not be longer than 255 characters.".into(),
            ),
            (
                CORSRule { expose_headers: Some(strings(&["x-amz-*"])), ..ok() },
                InvalidRequest,
                "ExposeHeader x-amz-* contains a wildcard. Wildcards are currently not supported for ExposeHeader.".into(),
            ),
            (
                CORSRule { expose_headers: Some(strings(&["a b"])), ..ok() },
                InvalidRequest,
                "ExposeHeader a b contains invalid character.".into(),
            ),
        ];
        for (r, code, msg) in cases {
            assert_eq!(check(vec![ok(), r]), Err((code, msg)));
        }
    }

    #[test]
    fn wildcards_match_one_run_of_characters() {
        let p = "https://*.example.com";
        assert!(wildcard_match(p, "https://a.example.com"));
        assert!(wildcard_match(p, "https://a.b.example.com"));
        assert!(!wildcard_match(p, "http://a.example.com"));
        assert!(!wildcard_match(p, "https://example.com"));
        assert!(!wildcard_match(
            "https://A.example.com",
            "https://a.example.com"
        ));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("ab*ba", "abba"));
        assert!(!wildcard_match("ab*ba", "aba"));
    }

    #[test]
    fn preflight_echoes_origin_matched_by_a_wildcard_pattern() {
        let expose = ["ETag", "x-amz-version-id"];
        let rules = [full(
            &["https://*.example.com"],
            &["PUT", "GET"],
            &["x-amz-*", "Content-Type"],
            &expose,
            3000,
        )];
        let origin = "https://a.example.com";
        let p = preflight(
            &rules,
            origin,
            "PUT",
            " X-Amz-Date, content-type,,X-AMZ-META-K ",
        );
        let p = p.expect("allowed");
        assert_eq!(
            p,
            Preflight {
                allow_origin: origin.into(),
                allow_methods: "PUT, GET".into(),
                allow_headers: Some("x-amz-date, content-type, x-amz-meta-k".into()),
                expose_headers: Some("ETag, x-amz-version-id".into()),
                max_age: Some(3000),
                allow_credentials: true,
                vary: VARY,
            }
        );
        assert_eq!(
            lines(p.headers()),
            [
                "access-control-allow-origin: https://a.example.com",
                "access-control-allow-methods: PUT, GET",
                "access-control-allow-credentials: true",
                "access-control-allow-headers: x-amz-date, content-type, x-amz-meta-k",
                "access-control-expose-headers: ETag, x-amz-version-id",
                "access-control-max-age: 3000",
                VARY_LINE,
            ]
        );
        assert_eq!(preflight(&rules, "http://a.example.com", "PUT", ""), None);
        assert_eq!(
            preflight(&rules, origin, "DELETE", ""),
            None,
            "method not allowed"
        );
        assert_eq!(
            preflight(&rules, origin, "put", ""),
            None,
            "methods are case-sensitive"
        );
        assert_eq!(
            preflight(&rules, origin, "PUT", "x-amz-date, authorization"),
            None
        );
        assert_eq!(preflight(&rules, "", "PUT", ""), None);
    }

    #[test]
    fn star_origin_answers_star_without_credentials() {
        let rules = [rule(&["*"], &["GET"], &[])];
        let p = preflight(&rules, "https://any.test", "GET", "").expect("allowed");
        assert_eq!((p.allow_origin.as_str(), p.allow_credentials), ("*", false));
        assert_eq!(
            (&p.allow_headers, &p.expose_headers, p.max_age),
            (&None, &None, None)
        );
        let want = [
            "access-control-allow-origin: *",
            "access-control-allow-methods: GET",
        ];
        assert_eq!(lines(p.headers()), [want[0], want[1], VARY_LINE]);
        // A rule without AllowedHeader allows no requested header.
        assert_eq!(
            preflight(&rules, "https://any.test", "GET", "x-amz-date"),
            None
        );
    }

    #[test]
    fn first_matching_rule_wins() {
        let narrow = full(&["https://app.test"], &["GET", "PUT"], &["*"], &[], 10);
        let wide = full(&["*"], &["GET", "HEAD"], &["*"], &[], 20);
        let rules = [narrow, wide];
        let p = preflight(&rules, "https://app.test", "GET", "").expect("allowed");
        assert_eq!(
            (&p.allow_origin[..], &p.allow_methods[..], p.max_age),
            ("https://app.test", "GET, PUT", Some(10))
        );
        // HEAD is not in the first rule: the second one answers.
        let p = preflight(&rules, "https://app.test", "HEAD", "").expect("allowed");
        assert_eq!(
            (&p.allow_origin[..], &p.allow_methods[..], p.max_age),
            ("*", "GET, HEAD", Some(20))
        );
        let a = actual(&rules, "https://other.test", "GET").expect("allowed");
        assert_eq!((&a.allow_origin[..], a.max_age), ("*", Some(20)));
    }

    #[test]
    fn header_wildcards_compare_case_insensitively() {
        let rules = [rule(
            &["https://app.test"],
            &["PUT"],
            &["X-AMZ-*", "content-MD5"],
        )];
        let p = preflight(&rules, "https://app.test", "PUT", "x-amz-date,Content-Md5");
        assert_eq!(
            p.and_then(|p| p.allow_headers).as_deref(),
            Some("x-amz-date, content-md5")
        );
        assert!(preflight(&rules, "https://app.test", "PUT", "X-Amz-Meta-Foo").is_some());
        assert_eq!(
            preflight(&rules, "https://app.test", "PUT", "x-custom"),
            None
        );
    }

    #[test]
    fn actual_request_headers() {
        let origins = ["https://app.test", "https://*.app.test"];
        let rules = [full(&origins, &["GET", "HEAD"], &["*"], &["ETag"], 600)];
        let a = actual(&rules, "https://x.app.test", "HEAD").expect("allowed");
        assert_eq!(
            a,
            Actual {
                allow_origin: "https://x.app.test".into(),
                allow_methods: "GET, HEAD".into(),
                expose_headers: Some("ETag".into()),
                max_age: Some(600),
                allow_credentials: true,
                vary: VARY,
            }
        );
        assert_eq!(
            lines(a.headers()),
            [
                "access-control-allow-origin: https://x.app.test",
                "access-control-allow-methods: GET, HEAD",
                "access-control-allow-credentials: true",
                "access-control-expose-headers: ETag",
                "access-control-max-age: 600",
                VARY_LINE,
            ]
        );
        assert_eq!(actual(&rules, "https://x.app.test", "PUT"), None);
        assert_eq!(actual(&rules, "https://evil.test", "GET"), None);
        assert_eq!(actual(&rules, "", "GET"), None);
    }

    #[test]
    fn invalid_header_values_are_skipped() {
        let rules = [rule(&["https://a.test"], &["GET"], &[])];
        let mut a = actual(&rules, "https://a.test", "GET").expect("allowed");
        a.allow_origin = "bad\norigin".into();
        let want = [
            "access-control-allow-methods: GET",
            "access-control-allow-credentials: true",
        ];
        assert_eq!(lines(a.headers()), [want[0], want[1], VARY_LINE]);
    }
}
