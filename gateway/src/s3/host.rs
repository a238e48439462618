//! Virtual-hosted-style addressing
//! (<https://docs.aws.amazon.com/AmazonS3/latest/userguide/VirtualHosting.html>):
//! with root domains configured (`root_domains = ["s3.example.test"]`), a
//! request to `Host: b.s3.example.test` for `/k` addresses bucket `b`, key
//! `k`. Every other host (the root domain itself, an IP address,
//! `localhost`, a load balancer's name) is path style, `/b/k`, as without
//! root domains. Unlike s3s's `MultiDomain`, an unknown host is never taken
//! as a bucket name (CNAME style), so path-style clients behind any name
//! keep working.

use s3s::S3Result;
use s3s::host::{S3Host, VirtualHost};

/// The configured root domains, lowercase, without a port.
#[derive(Debug, Clone)]
pub struct RootDomains(Vec<String>);

impl RootDomains {
    /// `domains` as given (already checked by [`is_valid_root_domain`]),
    /// lowercased.
    pub fn new(domains: &[String]) -> Self {
        RootDomains(domains.iter().map(|d| d.to_ascii_lowercase()).collect())
    }

    /// The bucket a `Host` header names, if it is `<bucket>.<root domain>`
    /// (a port after the name is ignored; so is case).
    pub fn bucket<'a>(&self, host: &'a str) -> Option<&'a str> {
        let name = strip_port(host);
        self.0.iter().find_map(|root| {
            let cut = name.len().checked_sub(root.len() + 1)?;
            let bucket = name.get(..cut)?;
            let suffix = name.get(cut + 1..)?;
            (!bucket.is_empty()
                && name.as_bytes()[cut] == b'.'
                && suffix.eq_ignore_ascii_case(root))
            .then_some(bucket)
        })
    }
}

impl S3Host for RootDomains {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        Ok(match self.bucket(host) {
            // Host names are case-insensitive; bucket names are lowercase.
            Some(bucket) => VirtualHost::new(host).with_bucket(bucket.to_ascii_lowercase()),
            None => VirtualHost::new(host),
        })
    }
}

/// `host` without a trailing `:port`.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether `domain` can be a root domain: dot-separated labels of 1 to 63
/// ASCII letters, digits and hyphens, not beginning or ending with a hyphen
/// (RFC 1123), at most 253 characters, no port.
pub fn is_valid_root_domain(domain: &str) -> bool {
    !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether one root domain is another's subdomain (or equal to it): then a
/// host could name a bucket under either.
pub fn overlapping(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    a == b || a.ends_with(&format!(".{b}")) || b.ends_with(&format!(".{a}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_under_a_root_domain_name_a_bucket() {
        let roots = RootDomains::new(&["s3.example.test".into(), "S3.Other.Test".into()]);
        assert_eq!(roots.bucket("b.s3.example.test"), Some("b"));
        assert_eq!(roots.bucket("b.s3.example.test:9000"), Some("b"));
        assert_eq!(
            roots.bucket("my.dotted.bucket.s3.example.test"),
            Some("my.dotted.bucket")
        );
        assert_eq!(roots.bucket("B.S3.EXAMPLE.TEST"), Some("B"));
        assert_eq!(roots.bucket("logs.s3.other.test"), Some("logs"));
        // Path style: the root itself, other names, addresses.
        for host in [
            "s3.example.test",
            "s3.example.test:9000",
            ".s3.example.test",
            "bs3.example.test",
            "localhost:9000",
            "lb.internal",
            "127.0.0.1:9000",
            "[::1]:9000",
            "example.test",
        ] {
            assert_eq!(roots.bucket(host), None, "{host}");
        }
        let vh = roots.parse_host_header("b.s3.example.test:9000").unwrap();
        assert_eq!(vh.bucket(), Some("b"));
        let vh = roots.parse_host_header("Logs.S3.Example.Test").unwrap();
        assert_eq!(vh.bucket(), Some("logs"));
        let vh = roots.parse_host_header("localhost:9000").unwrap();
        assert_eq!(vh.bucket(), None);
    }

    #[test]
    fn root_domain_rules() {
        for good in ["s3.example.test", "localhost", "s3-1.eu.example.com"] {
            assert!(is_valid_root_domain(good), "{good}");
        }
        for bad in [
            "",
            "s3.example.test:9000",
            "-s3.example",
            "s3..example",
            "s3_x.test",
            "a.b.",
        ] {
            assert!(!is_valid_root_domain(bad), "{bad}");
        }
        assert!(overlapping("s3.example.test", "example.test"));
        assert!(overlapping("example.test", "EXAMPLE.test"));
        assert!(!overlapping("s3.example.test", "3.example.test.x"));
        assert!(!overlapping("xs3.test", "s3.test"));
    }
}
