//! Bucket policies: a subset of the IAM JSON policy language, parsed and
//! evaluated as pure code (no I/O).
//!
//! Supported: `Version`, `Id`, `Statement` (an object or an array), and per
//! statement `Sid`, `Effect`, `Principal`, `Action`, `Resource`. Refused with
//! `MalformedPolicy` rather than ignored: `Condition`, `NotPrincipal`,
//! `NotAction`, `NotResource`, unknown elements and policy variables, since
//! dropping any of them silently would widen or narrow access unnoticed.
//!
//! Sources:
//! * <https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements.html>
//! * <https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html>
//! * <https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html>
//! * <https://docs.aws.amazon.com/AmazonS3/latest/userguide/example-bucket-policies.html>

use s3s::{S3Error, S3ErrorCode};
use serde_json::{Map, Value};

/// Largest bucket policy S3 accepts, in bytes (20 KB):
/// <https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-policies.html>.
pub const MAX_POLICY_BYTES: usize = 20 * 1024;

/// The action of a request S3 has no policy action for; only `*` and
/// `s3:*` match it.
pub const UNKNOWN_ACTION: &str = "s3:Unknown";

/// Object-scoped S3 actions (resource `arn:aws:s3:::bucket/key`), without
/// the `s3:` prefix, from the Service Authorization Reference
/// (<https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html>).
const OBJECT_ACTIONS: &str = "AbortMultipartUpload BypassGovernanceRetention DeleteObject
    DeleteObjectTagging DeleteObjectVersion DeleteObjectVersionTagging GetObject GetObjectAcl
    GetObjectAttributes GetObjectLegalHold GetObjectRetention GetObjectTagging GetObjectTorrent
    GetObjectVersion GetObjectVersionAcl GetObjectVersionAttributes GetObjectVersionForReplication
    GetObjectVersionTagging GetObjectVersionTorrent InitiateReplication ListMultipartUploadParts
    ObjectOwnerOverrideToBucketOwner PutObject PutObjectAcl PutObjectLegalHold PutObjectRetention
    PutObjectTagging PutObjectVersionAcl PutObjectVersionTagging ReplicateDelete ReplicateObject
    ReplicateTags RestoreObject";

/// Bucket-scoped S3 actions (resource `arn:aws:s3:::bucket`), same source.
const BUCKET_ACTIONS: &str = "CreateBucket DeleteBucket DeleteBucketOwnershipControls
    DeleteBucketPolicy DeleteBucketWebsite GetAccelerateConfiguration GetAnalyticsConfiguration
    GetBucketAcl GetBucketCORS GetBucketLocation GetBucketLogging GetBucketNotification
    GetBucketObjectLockConfiguration GetBucketOwnershipControls GetBucketPolicy
    GetBucketPolicyStatus GetBucketPublicAccessBlock GetBucketRequestPayment GetBucketTagging
    GetBucketVersioning GetBucketWebsite GetEncryptionConfiguration
    GetIntelligentTieringConfiguration GetInventoryConfiguration GetLifecycleConfiguration
    GetMetricsConfiguration GetReplicationConfiguration ListBucket ListBucketMultipartUploads
    ListBucketVersions PutAccelerateConfiguration PutAnalyticsConfiguration PutBucketAcl
    PutBucketCORS PutBucketLogging PutBucketNotification PutBucketObjectLockConfiguration
    PutBucketOwnershipControls PutBucketPolicy PutBucketPublicAccessBlock PutBucketRequestPayment
    PutBucketTagging PutBucketVersioning PutBucketWebsite PutEncryptionConfiguration
    PutIntelligentTieringConfiguration PutInventoryConfiguration PutLifecycleConfiguration
    PutMetricsConfiguration PutReplicationConfiguration";

const ARN_PREFIX: &str = "arn:aws:s3:::";

/// Who a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal<'a> {
    /// An unsigned request.
    Anonymous,
    /// A request signed with this access key id.
    Key(&'a str),
}

/// The outcome of evaluating a policy for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A matching statement allows it and none denies it.
    Allow,
    /// A matching statement denies it (an explicit deny always wins).
    Deny,
    /// No statement matches: the policy neither grants nor refuses.
    NotApplicable,
}

/// The principals of one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    /// `"*"` or `{"AWS": "*"}`: every key and anonymous requests.
    Everyone,
    /// These access key ids.
    Keys(Vec<String>),
}

#[derive(Debug, Clone)]
struct Statement {
    deny: bool,
    who: Who,
    /// Action patterns, ASCII-lowercased (IAM action names are case-insensitive).
    actions: Vec<String>,
    /// Resource ARN patterns (case-sensitive).
    resources: Vec<String>,
}

/// A parsed bucket policy and its original JSON text.
#[derive(Debug, Clone)]
pub struct BucketPolicy {
    json: String,
    statements: Vec<Statement>,
}

fn malformed(msg: impl Into<std::borrow::Cow<'static, str>>) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedPolicy, msg)
}

/// `Action`/`Resource`/`AWS` values: a string or a non-empty array of strings.
fn strings(value: &Value, err: fn() -> S3Error) -> Result<Vec<String>, S3Error> {
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(err))
            .collect(),
        _ => Err(err()),
    }
}

fn invalid_action() -> S3Error {
    malformed("Policy has invalid action")
}
fn invalid_resource() -> S3Error {
    malformed("Policy has invalid resource")
}
fn invalid_principal() -> S3Error {
    malformed("Invalid principal in policy")
}

/// Whether `text` matches `pattern`, where `*` matches any run of
/// characters (also none) and `?` exactly one; exact otherwise.
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // Position of the last `*` seen and of the text it is resumed at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    star = Some((sp, st + 1));
                    pi = sp + 1;
                    ti = st + 1;
                }
                None => return false,
            },
        }
    }
    p[pi.min(p.len())..].iter().all(|&c| c == '*')
}

/// Whether the lowercased action pattern `action` (`*` or `s3:...`) matches
/// some action of `table`.
fn matches_any(action: &str, table: &str) -> bool {
    let name = match action.strip_prefix("s3:") {
        Some(name) => name,
        None => return action == "*",
    };
    table
        .split_whitespace()
        .any(|known| glob(name, &known.to_ascii_lowercase()))
}

/// The access key id a principal string names: a bare id or
/// `arn:aws:iam::<account>:user/<id>`.
fn key_of(principal: &str) -> Result<String, S3Error> {
    let id = match principal.strip_prefix("arn:") {
        Some(rest) => rest
            .strip_prefix("aws:iam::")
            .and_then(|r| r.split_once(':'))
            .and_then(|(_account, r)| r.strip_prefix("user/"))
            .ok_or_else(invalid_principal)?,
        None => principal,
    };
    if id.is_empty() || id.contains(['*', '?', '/', ':']) {
        return Err(invalid_principal());
    }
    Ok(id.to_owned())
}

fn parse_principal(value: &Value) -> Result<Who, S3Error> {
    let aws = match value {
        Value::String(s) if s == "*" => return Ok(Who::Everyone),
        Value::Object(map) if map.len() == 1 => map.get("AWS").ok_or_else(invalid_principal)?,
        _ => return Err(invalid_principal()),
    };
    let ids = strings(aws, invalid_principal)?;
    if ids.iter().any(|id| id == "*") {
        return Ok(Who::Everyone);
    }
    Ok(Who::Keys(
        ids.iter().map(|id| key_of(id)).collect::<Result<_, _>>()?,
    ))
}

/// The pattern of `arn:aws:s3:::BUCKET` or `arn:aws:s3:::BUCKET/KEY-PATTERN`.
fn parse_resource(resource: &str, bucket: &str, variables: bool) -> Result<String, S3Error> {
    let path = resource
        .strip_prefix(ARN_PREFIX)
        .ok_or_else(invalid_resource)?;
    let name = path.split_once('/').map_or(path, |(name, _key)| name);
    if name != bucket {
        return Err(invalid_resource());
    }
    if variables && resource.contains("${") {
        return Err(malformed("Policy variables are not supported"));
    }
    Ok(resource.to_owned())
}

/// Whether a resource pattern names objects (`arn:aws:s3:::bucket/...`).
fn is_object_arn(resource: &str) -> bool {
    resource
        .strip_prefix(ARN_PREFIX)
        .is_some_and(|path| path.contains('/'))
}

fn parse_statement(value: &Value, bucket: &str, variables: bool) -> Result<Statement, S3Error> {
    let map = value
        .as_object()
        .ok_or_else(|| malformed("This policy contains invalid Json"))?;
    for key in map.keys() {
        match key.as_str() {
            "Sid" | "Effect" | "Principal" | "Action" | "Resource" => {}
            "Condition" => return Err(malformed("Conditions are not supported")),
            "NotPrincipal" | "NotAction" | "NotResource" => {
                return Err(malformed(format!("{key} is not supported")));
            }
            _ => return Err(malformed(format!("Unknown field {key}"))),
        }
    }
    if map.get("Sid").is_some_and(|sid| !sid.is_string()) {
        return Err(malformed("Statement IDs (SID) must be strings"));
    }
    let field = |name: &str| {
        map.get(name)
            .ok_or_else(|| malformed(format!("Missing required field {name}")))
    };
    let deny = match field("Effect")? {
        Value::String(e) if e == "Allow" => false,
        Value::String(e) if e == "Deny" => true,
        Value::String(e) => return Err(malformed(format!("Invalid effect: {e}"))),
        other => return Err(malformed(format!("Invalid effect: {other}"))),
    };
    let who = parse_principal(field("Principal")?)?;
    let mut actions = strings(field("Action")?, invalid_action)?;
    for action in &mut actions {
        action.make_ascii_lowercase();
        if !matches_any(action, OBJECT_ACTIONS) && !matches_any(action, BUCKET_ACTIONS) {
            return Err(invalid_action());
        }
    }
    let resources = strings(field("Resource")?, invalid_resource)?
        .iter()
        .map(|r| parse_resource(r, bucket, variables))
        .collect::<Result<Vec<_>, _>>()?;
    // S3 refuses an action none of the statement's resources can apply to
    // (an object action on the bucket ARN only, or the reverse).
    let object_arn = resources.iter().any(|r| is_object_arn(r));
    let bucket_arn = resources.iter().any(|r| !is_object_arn(r));
    for action in &actions {
        if !(object_arn && matches_any(action, OBJECT_ACTIONS)
            || bucket_arn && matches_any(action, BUCKET_ACTIONS))
        {
            return Err(malformed(
                "Action does not apply to any resource(s) in statement",
            ));
        }
    }
    Ok(Statement {
        deny,
        who,
        actions,
        resources,
    })
}

/// Parses the policy `json` of `bucket` (PutBucketPolicy), keeping the text.
///
/// Errors are `MalformedPolicy` with S3's messages: "Policies must be less
/// than 20 KB" (over [`MAX_POLICY_BYTES`]), "This policy contains invalid
/// Json", "Missing required field Statement|Effect|Principal|Action|Resource",
/// "The policy must contain a valid version string" (`Version` other than
/// `2012-10-17` / `2008-10-17`; absent means `2008-10-17`), "Invalid effect:
/// X", "Policy has invalid action" (not `*`, `s3:*` or a known bucket or
/// object `s3:` action, wildcards allowed), "Policy has invalid resource"
/// (not `arn:aws:s3:::BUCKET` or `arn:aws:s3:::BUCKET/KEY-PATTERN`), "Invalid
/// principal in policy" (not `"*"`, `{"AWS": "*"}` or `{"AWS": ID | [ID...]}`
/// where ID is an access key id or `arn:aws:iam::<account>:user/<key id>`),
/// "Action does not apply to any resource(s) in statement"; and Sluice's own
/// refusals of `Condition`, `NotPrincipal`, `NotAction`, `NotResource`,
/// unknown elements and (under `2012-10-17`) `${...}` policy variables.
pub fn parse(json: &str, bucket: &str) -> Result<BucketPolicy, S3Error> {
    if json.len() > MAX_POLICY_BYTES {
        return Err(malformed("Policies must be less than 20 KB"));
    }
    let invalid_json = || malformed("This policy contains invalid Json");
    let value: Value = serde_json::from_str(json).map_err(|_| invalid_json())?;
    let map: &Map<String, Value> = value.as_object().ok_or_else(invalid_json)?;
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "Version" | "Id" | "Statement"))
    {
        return Err(malformed(format!("Unknown field {key}")));
    }
    let variables = match map.get("Version") {
        None => false,
        Some(Value::String(v)) if v == "2008-10-17" => false,
        Some(Value::String(v)) if v == "2012-10-17" => true,
        Some(_) => return Err(malformed("The policy must contain a valid version string")),
    };
    let statements = match map.get("Statement") {
        None => return Err(malformed("Missing required field Statement")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(malformed("Could not parse the policy: Statement is empty!"));
        }
        Some(Value::Array(items)) => items.iter().collect(),
        Some(single) => vec![single],
    };
    let statements = statements
        .into_iter()
        .map(|s| parse_statement(s, bucket, variables))
        .collect::<Result<_, _>>()?;
    Ok(BucketPolicy {
        json: json.to_owned(),
        statements,
    })
}

/// The IAM actions S3 checks for the s3s operation `op`
/// (`S3Operation::name()`); a request needs every one of them. Per
/// <https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html>:
/// HeadObject needs `s3:GetObject`; HeadBucket and the listings
/// `s3:ListBucket`; every multipart step and copy destination `s3:PutObject`
/// (the copy source's `s3:GetObject` is checked separately); deleting a
/// bucket's CORS, lifecycle or tagging needs its `Put` action;
/// GetObjectAttributes needs `s3:GetObject` and `s3:GetObjectAttributes`.
/// An operation not listed here needs [`UNKNOWN_ACTION`].
pub fn actions_of(op: &str) -> &'static [&'static str] {
    match op {
        "GetObject" | "HeadObject" | "SelectObjectContent" => &["s3:GetObject"],
        "GetObjectAttributes" => &["s3:GetObject", "s3:GetObjectAttributes"],
        "HeadBucket" | "ListObjects" | "ListObjectsV2" => &["s3:ListBucket"],
        "PutObject"
        | "PostObject"
        | "CopyObject"
        | "UploadPartCopy"
        | "CreateMultipartUpload"
        | "UploadPart"
        | "CompleteMultipartUpload" => &["s3:PutObject"],
        "AbortMultipartUpload" => &["s3:AbortMultipartUpload"],
        "ListParts" => &["s3:ListMultipartUploadParts"],
        "ListMultipartUploads" => &["s3:ListBucketMultipartUploads"],
        "ListObjectVersions" => &["s3:ListBucketVersions"],
        "DeleteObject" | "DeleteObjects" => &["s3:DeleteObject"],
        "GetObjectTagging" => &["s3:GetObjectTagging"],
        "PutObjectTagging" => &["s3:PutObjectTagging"],
        "DeleteObjectTagging" => &["s3:DeleteObjectTagging"],
        "GetObjectAcl" => &["s3:GetObjectAcl"],
        "PutObjectAcl" => &["s3:PutObjectAcl"],
        "ListBuckets" => &["s3:ListAllMyBuckets"],
        "CreateBucket" => &["s3:CreateBucket"],
        "DeleteBucket" => &["s3:DeleteBucket"],
        "GetBucketLocation" => &["s3:GetBucketLocation"],
        "GetBucketVersioning" => &["s3:GetBucketVersioning"],
        "PutBucketVersioning" => &["s3:PutBucketVersioning"],
        "GetBucketTagging" => &["s3:GetBucketTagging"],
        "PutBucketTagging" | "DeleteBucketTagging" => &["s3:PutBucketTagging"],
        "GetBucketCors" => &["s3:GetBucketCORS"],
        "PutBucketCors" | "DeleteBucketCors" => &["s3:PutBucketCORS"],
        "GetBucketPolicy" => &["s3:GetBucketPolicy"],
        "PutBucketPolicy" => &["s3:PutBucketPolicy"],
        "DeleteBucketPolicy" => &["s3:DeleteBucketPolicy"],
        "GetBucketAcl" => &["s3:GetBucketAcl"],
        "PutBucketAcl" => &["s3:PutBucketAcl"],
        "GetBucketLifecycleConfiguration" => &["s3:GetLifecycleConfiguration"],
        "PutBucketLifecycleConfiguration" | "DeleteBucketLifecycle" => {
            &["s3:PutLifecycleConfiguration"]
        }
        _ => &[UNKNOWN_ACTION],
    }
}

/// The main IAM action of `op`: the first of [`actions_of`] (for
/// GetObjectAttributes `s3:GetObject`; use [`BucketPolicy::evaluate_all`]
/// with [`actions_of`] to also check `s3:GetObjectAttributes` as S3 does).
pub fn action_of(op: &str) -> &'static str {
    actions_of(op).first().copied().unwrap_or(UNKNOWN_ACTION)
}

/// The ARN a request acts on: `arn:aws:s3:::bucket` without a key,
/// `arn:aws:s3:::bucket/key` with one.
pub fn resource_of(bucket: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{ARN_PREFIX}{bucket}/{key}"),
        None => format!("{ARN_PREFIX}{bucket}"),
    }
}

impl BucketPolicy {
    /// The JSON text the policy was parsed from, verbatim (GetBucketPolicy).
    pub fn json(&self) -> &str {
        &self.json
    }

    /// Whether some statement allows everyone (`"*"`), anonymous included.
    pub fn is_public(&self) -> bool {
        self.statements
            .iter()
            .any(|s| !s.deny && s.who == Who::Everyone)
    }

    /// The access key ids the statements name (for checking they exist).
    pub fn key_principals(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = Vec::new();
        for s in &self.statements {
            if let Who::Keys(ids) = &s.who {
                keys.extend(ids.iter().map(String::as_str));
            }
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The decision for `who` doing `action` (an IAM action such as
    /// `s3:GetObject`, see [`action_of`]) on `resource` (see
    /// [`resource_of`]). A statement matches when its principal, one of its
    /// action patterns (case-insensitive) and one of its resource patterns
    /// (case-sensitive) match; a matching Deny wins over any Allow
    /// (IAM evaluation logic).
    pub fn evaluate(&self, who: Principal, action: &str, resource: &str) -> Decision {
        let action = action.to_ascii_lowercase();
        let mut allowed = false;
        for s in &self.statements {
            let principal = match (&s.who, who) {
                (Who::Everyone, _) => true,
                (Who::Keys(ids), Principal::Key(key)) => ids.iter().any(|id| id == key),
                (Who::Keys(_), Principal::Anonymous) => false,
            };
            if principal
                && s.actions.iter().any(|p| glob(p, &action))
                && s.resources.iter().any(|p| glob(p, resource))
            {
                if s.deny {
                    return Decision::Deny;
                }
                allowed = true;
            }
        }
        if allowed {
            Decision::Allow
        } else {
            Decision::NotApplicable
        }
    }

    /// The decision for a request needing every one of `actions`: Deny if
    /// any is denied, Allow if all are allowed, else NotApplicable.
    pub fn evaluate_all(&self, who: Principal, actions: &[&str], resource: &str) -> Decision {
        let decisions: Vec<Decision> = actions
            .iter()
            .map(|a| self.evaluate(who, a, resource))
            .collect();
        if decisions.contains(&Decision::Deny) {
            Decision::Deny
        } else if !decisions.is_empty() && decisions.iter().all(|d| *d == Decision::Allow) {
            Decision::Allow
        } else {
            Decision::NotApplicable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Decision::{Allow, Deny, NotApplicable as NA};
    use super::*;

    const PUBLIC_READ: &str = r#"{"Version":"2012-10-17","Statement":[{"Sid":"PublicRead","Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::b/*"]}]}"#;
    const ANON: Principal = Principal::Anonymous;
    const OBJ: &str = "arn:aws:s3:::b/k";
    const BKT: &str = "arn:aws:s3:::b";

    /// A 2012-10-17 policy of bucket `b` with these statements.
    fn policy(statements: &str) -> BucketPolicy {
        let json = format!(r#"{{"Version":"2012-10-17","Statement":[{statements}]}}"#);
        parse(&json, "b").unwrap_or_else(|e| panic!("{json}: {e:?}"))
    }

    /// The message of the MalformedPolicy refusing `json`.
    fn refused(json: &str) -> String {
        let err = parse(json, "b")
            .err()
            .unwrap_or_else(|| panic!("accepted: {json}"));
        assert_eq!(*err.code(), S3ErrorCode::MalformedPolicy, "{json}");
        err.message().unwrap_or_default().to_owned()
    }

    #[test]
    fn public_read_allows_anonymous_get_only() {
        let p = parse(PUBLIC_READ, "b").expect("public-read policy");
        assert_eq!(resource_of("b", Some("k")), OBJ);
        assert_eq!(resource_of("b", None), BKT);
        assert_eq!(p.evaluate(ANON, "s3:GetObject", OBJ), Allow);
        assert_eq!(
            p.evaluate(Principal::Key("AK"), action_of("HeadObject"), OBJ),
            Allow
        );
        assert_eq!(p.evaluate(ANON, "s3:ListBucket", BKT), NA);
        assert_eq!(p.evaluate(ANON, "s3:PutObject", OBJ), NA);
        assert_eq!(p.evaluate(ANON, "s3:GetObject", "arn:aws:s3:::c/k"), NA);
        assert!(p.is_public());
        assert_eq!(p.json(), PUBLIC_READ);
        assert!(p.key_principals().is_empty());
    }

    #[test]
    fn list_bucket_statement_applies_to_the_bucket_arn() {
        let p = policy(
            r#"{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"s3:ListBucket","Resource":"arn:aws:s3:::b"}"#,
        );
        for op in ["ListObjectsV2", "ListObjects", "HeadBucket"] {
            assert_eq!(p.evaluate(ANON, action_of(op), BKT), Allow, "{op}");
        }
        assert_eq!(p.evaluate(ANON, "s3:ListBucket", OBJ), NA);
        assert_eq!(p.evaluate(ANON, "s3:GetObject", OBJ), NA);
    }

    #[test]
    fn deny_overrides_allow_in_any_order() {
        let allow = r#"{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]}"#;
        let deny = r#"{"Effect":"Deny","Principal":"*","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::b/locked/*"}"#;
        for p in [
            policy(&format!("{allow},{deny}")),
            policy(&format!("{deny},{allow}")),
        ] {
            let (who, del) = (Principal::Key("AK"), action_of("DeleteObjects"));
            assert_eq!(p.evaluate(who, del, "arn:aws:s3:::b/locked/x"), Deny);
            assert_eq!(p.evaluate(who, del, "arn:aws:s3:::b/open/x"), Allow);
            assert_eq!(
                p.evaluate(who, "s3:GetObject", "arn:aws:s3:::b/locked/x"),
                Allow
            );
        }
    }

    #[test]
    fn key_principals_match_only_their_key() {
        let p = policy(
            r#"{"Effect":"Allow","Principal":{"AWS":["AK1","arn:aws:iam::123456789012:user/AK2"]},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"},
               {"Effect":"Allow","Principal":{"AWS":"AK3"},"Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*"}"#,
        );
        let key = Principal::Key;
        assert_eq!(p.evaluate(key("AK1"), "s3:GetObject", OBJ), Allow);
        assert_eq!(p.evaluate(key("AK2"), "s3:GetObject", OBJ), Allow);
        assert_eq!(p.evaluate(key("AK3"), "s3:GetObject", OBJ), NA);
        assert_eq!(p.evaluate(key("AK3"), "s3:PutObject", OBJ), Allow);
        assert_eq!(p.evaluate(key("ak1"), "s3:GetObject", OBJ), NA);
        assert_eq!(p.evaluate(ANON, "s3:GetObject", OBJ), NA);
        assert_eq!(p.key_principals(), ["AK1", "AK2", "AK3"]);
        assert!(!p.is_public());
        let any = policy(
            r#"{"Effect":"Allow","Principal":{"AWS":["AK1","*"]},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}"#,
        );
        assert_eq!(any.evaluate(ANON, "s3:GetObject", OBJ), Allow);
    }

    #[test]
    fn action_patterns_are_case_insensitive_wildcards() {
        let stmt = |action: &str| {
            policy(&format!(
                r#"{{"Effect":"Allow","Principal":"*","Action":"{action}","Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]}}"#
            ))
        };
        let get = stmt("s3:Get*");
        assert_eq!(get.evaluate(ANON, "s3:GetObject", OBJ), Allow);
        assert_eq!(get.evaluate(ANON, "s3:GetObjectTagging", OBJ), Allow);
        assert_eq!(get.evaluate(ANON, "s3:PutObject", OBJ), NA);
        assert_eq!(get.evaluate(ANON, UNKNOWN_ACTION, OBJ), NA);
        assert_eq!(
            stmt("S3:GETOBJECT").evaluate(ANON, "s3:GetObject", OBJ),
            Allow
        );
        assert_eq!(
            stmt("s3:Get?bject").evaluate(ANON, "s3:GetObject", OBJ),
            Allow
        );
        for all in ["s3:*", "*"] {
            let p = stmt(all);
            assert_eq!(p.evaluate(ANON, "s3:PutObject", OBJ), Allow);
            assert_eq!(p.evaluate(ANON, action_of("NoSuchOp"), OBJ), Allow);
        }
    }

    #[test]
    fn resource_patterns_are_case_sensitive_wildcards() {
        let p = policy(
            r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":["arn:aws:s3:::b/photos/*.jpg","arn:aws:s3:::b/doc?"]}"#,
        );
        let get = |key| p.evaluate(ANON, "s3:GetObject", &resource_of("b", Some(key)));
        assert_eq!(get("photos/2024/a.jpg"), Allow);
        assert_eq!(get("photos/a.JPG"), NA);
        assert_eq!(get("Photos/a.jpg"), NA);
        assert_eq!(get("doc1"), Allow);
        assert_eq!(get("doc12"), NA);
        assert!(glob("a*b*c", "axxbyyc") && glob("*", "") && !glob("?", "") && glob("é?", "éü"));
    }

    #[test]
    fn malformed_policies_are_refused_with_s3_messages() {
        let st = |body: &str| format!(r#"{{"Version":"2012-10-17","Statement":[{{{body}}}]}}"#);
        let ok = r#""Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*""#;
        let bad = |from: &str, to: &str| st(&ok.replace(from, to));
        let principal = |to: &str| bad(r#""*""#, to);
        let with = |extra: &str| st(&format!("{ok},{extra}"));
        let (action, resource) = ("Policy has invalid action", "Policy has invalid resource");
        let (who, nothing) = (
            "Invalid principal in policy",
            "Action does not apply to any resource(s) in statement",
        );
        #[rustfmt::skip]
        let cases = [
            ("not json".to_owned(), "This policy contains invalid Json"),
            ("[]".to_owned(), "This policy contains invalid Json"),
            (r#"{"Version":"2012-10-17"}"#.to_owned(), "Missing required field Statement"),
            (r#"{"Statement":[]}"#.to_owned(), "Could not parse the policy: Statement is empty!"),
            (r#"{"Version":"2020-01-01","Statement":{}}"#.to_owned(), "The policy must contain a valid version string"),
            (r#"{"Foo":1,"Statement":{}}"#.to_owned(), "Unknown field Foo"),
            (bad("Allow", "allow"), "Invalid effect: allow"),
            (bad("s3:GetObject", "s3:GetObjekt"), action),
            (bad("s3:GetObject", "iam:GetUser"), action),
            (bad("s3:GetObject", "s3:Foo*"), action),
            (bad("arn:aws:s3:::b/*", "arn:aws:s3:::c/*"), resource),
            (bad("arn:aws:s3:::b/*", "arn:aws:s3:::b*"), resource),
            (bad("arn:aws:s3:::b/*", "*"), resource),
            (bad("arn:aws:s3:::b/*", "arn:aws:s3:::b"), nothing),
            (bad("b/*", "b/${aws:username}"), "Policy variables are not supported"),
            (bad(r#""Principal":"*","#, ""), "Missing required field Principal"),
            (principal(r#"{"Service":"s3.amazonaws.com"}"#), who),
            (principal(r#"{"CanonicalUser":"x"}"#), who),
            (principal(r#"{"AWS":"arn:aws:iam::1:root"}"#), who),
            (principal(r#"{"AWS":[]}"#), who),
            (principal(r#""AK1""#), who),
            (with(r#""Condition":{"Bool":{"aws:SecureTransport":"false"}}"#), "Conditions are not supported"),
            (bad(r#""Principal""#, r#""NotPrincipal""#), "NotPrincipal is not supported"),
            (bad(r#""Action""#, r#""NotAction""#), "NotAction is not supported"),
            (bad(r#""Resource""#, r#""NotResource""#), "NotResource is not supported"),
            (bad(r#""Action":"s3:GetObject","#, ""), "Missing required field Action"),
            (bad(r#","Resource":"arn:aws:s3:::b/*""#, ""), "Missing required field Resource"),
            (with(r#""Sid":1"#), "Statement IDs (SID) must be strings"),
            (with(r#""Effect2":1"#), "Unknown field Effect2"),
        ];
        for (json, message) in cases {
            assert_eq!(refused(&json), message, "{json}");
        }
    }

    #[test]
    fn accepted_forms() {
        // No Version (2008-10-17: `${...}` is literal), one statement object.
        let json = r#"{"Id":"x","Statement":{"Effect":"Deny","Principal":"*","Action":"*","Resource":"arn:aws:s3:::b/${x}"}}"#;
        let p = parse(json, "b").expect("2008 policy");
        assert_eq!(
            p.evaluate(ANON, "s3:PutObject", "arn:aws:s3:::b/${x}"),
            Deny
        );
        assert_eq!(p.evaluate(ANON, "s3:PutObject", "arn:aws:s3:::b/y"), NA);
        assert!(!p.is_public());
        assert!(parse(&PUBLIC_READ.replace("2012-10-17", "2008-10-17"), "b").is_ok());
    }

    #[test]
    fn size_limit() {
        let pad = " ".repeat(MAX_POLICY_BYTES - PUBLIC_READ.len());
        let at_limit = format!("{PUBLIC_READ}{pad}");
        assert_eq!(at_limit.len(), MAX_POLICY_BYTES);
        assert_eq!(
            parse(&at_limit, "b").expect("at the limit").json(),
            at_limit
        );
        assert_eq!(
            refused(&format!("{at_limit} ")),
            "Policies must be less than 20 KB"
        );
    }

    #[test]
    fn operations_map_to_s3_actions() {
        let cases = [
            ("GetObject HeadObject GetObjectAttributes", "s3:GetObject"),
            ("ListObjectsV2 ListObjects HeadBucket", "s3:ListBucket"),
            (
                "PutObject CreateMultipartUpload UploadPart CompleteMultipartUpload",
                "s3:PutObject",
            ),
            ("CopyObject UploadPartCopy", "s3:PutObject"),
            ("AbortMultipartUpload", "s3:AbortMultipartUpload"),
            ("ListParts", "s3:ListMultipartUploadParts"),
            ("ListMultipartUploads", "s3:ListBucketMultipartUploads"),
            ("DeleteObject DeleteObjects", "s3:DeleteObject"),
            ("GetObjectTagging", "s3:GetObjectTagging"),
            ("PutObjectTagging", "s3:PutObjectTagging"),
            ("DeleteObjectTagging", "s3:DeleteObjectTagging"),
            ("GetBucketLocation", "s3:GetBucketLocation"),
            ("GetBucketVersioning", "s3:GetBucketVersioning"),
            ("PutBucketVersioning", "s3:PutBucketVersioning"),
            ("GetBucketTagging", "s3:GetBucketTagging"),
            (
                "PutBucketTagging DeleteBucketTagging",
                "s3:PutBucketTagging",
            ),
            ("GetBucketCors", "s3:GetBucketCORS"),
            ("PutBucketCors DeleteBucketCors", "s3:PutBucketCORS"),
            ("GetBucketPolicy", "s3:GetBucketPolicy"),
            ("PutBucketPolicy", "s3:PutBucketPolicy"),
            ("DeleteBucketPolicy", "s3:DeleteBucketPolicy"),
            ("GetBucketAcl", "s3:GetBucketAcl"),
            ("PutBucketAcl", "s3:PutBucketAcl"),
            ("GetObjectAcl", "s3:GetObjectAcl"),
            ("PutObjectAcl", "s3:PutObjectAcl"),
            ("DeleteBucket", "s3:DeleteBucket"),
            ("ListObjectVersions", "s3:ListBucketVersions"),
            (
                "GetBucketLifecycleConfiguration",
                "s3:GetLifecycleConfiguration",
            ),
            (
                "PutBucketLifecycleConfiguration DeleteBucketLifecycle",
                "s3:PutLifecycleConfiguration",
            ),
            ("GetBucketWebsite NoSuchOp", UNKNOWN_ACTION),
        ];
        for (ops, action) in cases {
            for op in ops.split(' ') {
                assert_eq!(action_of(op), action, "{op}");
            }
            // Every mapped action is one a policy may name.
            let known = |table| matches_any(&action.to_ascii_lowercase(), table);
            assert_eq!(
                known(OBJECT_ACTIONS) || known(BUCKET_ACTIONS),
                action != UNKNOWN_ACTION
            );
        }
        assert_eq!(
            actions_of("GetObjectAttributes"),
            ["s3:GetObject", "s3:GetObjectAttributes"]
        );
    }

    #[test]
    fn get_object_attributes_needs_both_actions() {
        let attrs = actions_of("GetObjectAttributes");
        let read = parse(PUBLIC_READ, "b").expect("public-read policy");
        assert_eq!(read.evaluate_all(ANON, attrs, OBJ), NA);
        let both = policy(
            r#"{"Effect":"Allow","Principal":"*","Action":["s3:GetObject","s3:GetObjectAttributes"],"Resource":"arn:aws:s3:::b/*"}"#,
        );
        assert_eq!(both.evaluate_all(ANON, attrs, OBJ), Allow);
        let deny = policy(
            r#"{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"},
               {"Effect":"Deny","Principal":"*","Action":"s3:GetObjectAttributes","Resource":"arn:aws:s3:::b/*"}"#,
        );
        assert_eq!(deny.evaluate_all(ANON, attrs, OBJ), Deny);
        assert_eq!(deny.evaluate_all(ANON, &[], OBJ), NA);
    }
}
