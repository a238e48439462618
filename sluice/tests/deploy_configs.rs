//! Every example config shipped in `deploy/` parses into its role's
//! `Config` and passes `validate()`, so the examples cannot rot. Their
//! `[cluster_tls]` files (`/etc/sluice/tls/...`) are pointed at a test CA
//! holding the certificates the examples name.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sluice_net::{Identity, Role};
use sluice_util::byte_size::ByteSize;

const TLS_DIR: &str = "/etc/sluice/tls/";

/// A CA and the certificates the examples name (meta 1, datanode 1,
/// gateway gw-1; meta 4 for the `join` example), made once per test process.
fn pki_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        sluice_net::pki::ensure_dir(
            dir.path(),
            &[
                Identity::new(Role::Meta, "1").unwrap(),
                Identity::new(Role::Meta, "4").unwrap(),
                Identity::new(Role::Datanode, "1").unwrap(),
                Identity::new(Role::Gateway, "gw-1").unwrap(),
            ],
        )
        .expect("test PKI");
        dir
    })
    .path()
}

/// The example as shipped.
fn shipped(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The example with its TLS files in the test CA's directory.
fn deploy(name: &str) -> String {
    let text = shipped(name);
    assert!(
        text.contains(TLS_DIR),
        "{name} has no [cluster_tls] example"
    );
    text.replace(TLS_DIR, &format!("{}/", pki_dir().display()))
}

/// The `[cluster_tls]` examples name the right certificates; uncommenting
/// `insecure_cluster` alongside them is refused, and without the section it
/// is the plaintext opt-in.
#[test]
fn cluster_tls_examples() {
    let meta: sluice_meta::Config = toml::from_str(&shipped("meta.toml")).unwrap();
    let tls = meta.cluster_tls.expect("meta.toml [cluster_tls]");
    assert_eq!(tls.cert_file, PathBuf::from("/etc/sluice/tls/meta-1.pem"));
    assert_eq!(tls.ca_file, PathBuf::from("/etc/sluice/tls/ca.pem"));
    assert!(!meta.insecure_cluster);

    let insecure =
        |text: String| text.replace("# insecure_cluster = true", "insecure_cluster = true");
    let without_tls = |text: String| {
        let start = text.find("\n[cluster_tls]\n").unwrap() + 1;
        let rest = &text[start..];
        // The section is three keys long.
        let end = start
            + rest
                .match_indices('\n')
                .nth(3)
                .map_or(rest.len(), |(i, _)| i);
        format!("{}{}", &text[..start], &text[end..])
    };
    let both: sluice_datanode::Config = toml::from_str(&insecure(deploy("datanode.toml"))).unwrap();
    assert!(
        both.validate().is_err(),
        "TLS and insecure_cluster together"
    );
    let plain: sluice_datanode::Config =
        toml::from_str(&without_tls(insecure(deploy("datanode.toml")))).unwrap();
    assert!(plain.insecure_cluster && plain.cluster_tls.is_none());
    plain.validate().expect("insecure datanode.toml valid");
    let neither: sluice_gateway::Config =
        toml::from_str(&without_tls(deploy("gateway.toml"))).unwrap();
    assert!(
        neither.validate().is_err(),
        "neither TLS nor insecure_cluster"
    );
    let gateway: sluice_gateway::Config = toml::from_str(&deploy("gateway.toml")).unwrap();
    gateway.validate().expect("gateway.toml with TLS valid");
}

#[test]
fn meta_example_parses() {
    let config: sluice_meta::Config =
        toml::from_str(&deploy("meta.toml")).expect("parse meta.toml");
    config.validate().expect("meta.toml valid");
    assert_eq!(config.voters.len(), 3);
    assert_eq!(config.sled_cache_bytes, ByteSize(64 * 1024 * 1024));
}

/// The commented `join` example is off by default; uncommented, a node
/// outside the initial voters validates.
#[test]
fn meta_join_example() {
    let meta: sluice_meta::Config = toml::from_str(&deploy("meta.toml")).unwrap();
    assert!(!meta.join);
    let text = deploy("meta.toml")
        .replace("# join = true", "join = true")
        .replace("node_id = 1", "node_id = 4")
        .replace("meta-1.", "meta-4.");
    let joining: sluice_meta::Config = toml::from_str(&text).expect("parse joining meta.toml");
    assert!(joining.join);
    joining
        .validate()
        .expect("a joining node need not be an initial voter");
}

#[test]
fn datanode_example_parses() {
    let config: sluice_datanode::Config =
        toml::from_str(&deploy("datanode.toml")).expect("parse datanode.toml");
    config.validate().expect("datanode.toml valid");
    assert_eq!(config.meta_endpoints.len(), 3);
    assert_eq!(config.heartbeat_interval, std::time::Duration::from_secs(2));
}

#[test]
fn gateway_example_parses() {
    let config: sluice_gateway::Config =
        toml::from_str(&deploy("gateway.toml")).expect("parse gateway.toml");
    config.validate().expect("gateway.toml valid");
    assert_eq!((config.data_shards, config.parity_shards), (4, 2));
    assert_eq!(config.effective_write_quorum(), 5);
    // HTTPS by default; plaintext only instead of `[s3_tls]`.
    let tls = config.s3_tls.expect("[s3_tls]");
    assert_eq!(tls.cert_file, std::path::Path::new("/etc/sluice/s3.crt"));
    assert!(!config.s3_plaintext);
    let text = deploy("gateway.toml").replace("# s3_plaintext", "s3_plaintext");
    let both: sluice_gateway::Config = toml::from_str(&text).unwrap();
    assert!(both.validate().is_err(), "both transports set");
    let (head, _) = text.split_once("\n[s3_tls]\n").unwrap();
    let plain: sluice_gateway::Config = toml::from_str(head).unwrap();
    plain.validate().expect("plaintext gateway.toml valid");
}

#[test]
fn unknown_fields_are_rejected() {
    let err = toml::from_str::<sluice_gateway::Config>("no_such_knob = 1").unwrap_err();
    assert!(err.to_string().contains("no_such_knob"), "{err}");
}

/// The commented `metrics_listen` examples are off by default and parse
/// when uncommented.
#[test]
fn metrics_listen_examples() {
    let uncomment = |text: String| text.replace("# metrics_listen", "metrics_listen");
    let addr = |s: &str| Some(s.parse::<std::net::SocketAddr>().unwrap());

    let meta: sluice_meta::Config = toml::from_str(&deploy("meta.toml")).unwrap();
    assert_eq!(meta.metrics_listen, None);
    let meta: sluice_meta::Config = toml::from_str(&uncomment(deploy("meta.toml"))).unwrap();
    assert_eq!(meta.metrics_listen, addr("0.0.0.0:7091"));

    let datanode: sluice_datanode::Config = toml::from_str(&deploy("datanode.toml")).unwrap();
    assert_eq!(datanode.metrics_listen, None);
    let datanode: sluice_datanode::Config =
        toml::from_str(&uncomment(deploy("datanode.toml"))).unwrap();
    assert_eq!(datanode.metrics_listen, addr("0.0.0.0:7191"));

    let gateway: sluice_gateway::Config = toml::from_str(&deploy("gateway.toml")).unwrap();
    assert_eq!(gateway.metrics_listen, None);
    let gateway: sluice_gateway::Config =
        toml::from_str(&uncomment(deploy("gateway.toml"))).unwrap();
    assert_eq!(gateway.metrics_listen, addr("0.0.0.0:9090"));
    gateway.validate().expect("gateway.toml with metrics valid");
}

/// The S3 listener and datanode stream bounds in the examples are the defaults.
#[test]
fn listener_and_stream_bounds_are_the_defaults() {
    let gateway: sluice_gateway::Config = toml::from_str(&deploy("gateway.toml")).unwrap();
    let defaults = sluice_gateway::Config::default();
    assert_eq!(gateway.listener_limits(), defaults.listener_limits());
    assert_eq!(gateway.body_limits(), defaults.body_limits());
    assert_eq!(gateway.max_aws_chunk_bytes, ByteSize(16 * 1024 * 1024));
    assert!(!gateway.http2);
    let datanode: sluice_datanode::Config = toml::from_str(&deploy("datanode.toml")).unwrap();
    let defaults = sluice_datanode::Config::default();
    assert_eq!(datanode.max_shard_streams, defaults.max_shard_streams);
    assert_eq!(
        datanode.max_streams_per_connection,
        defaults.max_streams_per_connection
    );
}
