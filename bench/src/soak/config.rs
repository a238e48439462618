//! Role configs of the soak cluster, and which keys a `sluice` binary accepts.
//!
//! Role configs deny unknown fields, and budget and admission keys are
//! being added to the roles over time. So before writing configs the soak
//! asks the binary which keys each role accepts ([`probe_accepted_keys`]:
//! `sluice ROLE --print-config json` lists every key; a binary built before
//! that flag existed is asked with a config holding one unknown key, which
//! makes it list every known one in its parse error). A knob whose key the
//! binary lacks is left out of the config if it was a soak default (and
//! reported as not applied), and is an error if it was given on the command
//! line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use toml::{Table, Value};

use super::error::SoakError;
use super::options::{Knob, Knobs};

/// A config key nothing accepts: makes the binary list the keys it knows.
const PROBE_KEY: &str = "zz_sluice_soak_probe";
/// How long a probe may run; a binary that accepts unknown keys goes on
/// to start the role, and is stopped after this.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long each role is given to finish in-flight work on SIGTERM.
const SHUTDOWN_GRACE: &str = "5s";

pub use sluice_harness::cluster::Role;

/// Config keys each role of a binary accepts; `None` for a role means
/// unknown (the binary did not list them), and every key is then written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AcceptedKeys(pub BTreeMap<Role, Option<BTreeSet<String>>>);

impl AcceptedKeys {
    /// Whether the binary listed `key` among `role`'s keys (false when unknown).
    pub fn lists(&self, role: Role, key: &str) -> bool {
        matches!(self.0.get(&role), Some(Some(keys)) if keys.contains(key))
    }

    /// Whether `role`'s config accepts `key` (true when unknown).
    pub fn accepts(&self, role: Role, key: &str) -> bool {
        match self.0.get(&role) {
            Some(Some(keys)) => keys.contains(key),
            Some(None) | None => true,
        }
    }
}

/// Parses the list of a serde `unknown field` error: "unknown field `x`,
/// expected one of `a`, `b`" (or "expected `a`" for a single field).
pub fn parse_expected_fields(text: &str) -> Option<BTreeSet<String>> {
    let line = text.lines().find(|l| l.contains("unknown field `"))?;
    let (_, list) = line
        .split_once("expected one of ")
        .or_else(|| line.split_once("expected "))?;
    let fields: BTreeSet<String> = list
        .split(',')
        .filter_map(|f| {
            let f = f.trim();
            f.strip_prefix('`')?.strip_suffix('`').map(str::to_owned)
        })
        .collect();
    (!fields.is_empty()).then_some(fields)
}

/// The keys of `sluice ROLE --print-config json`'s output: one JSON object
/// whose keys are every key the role's config accepts.
pub fn parse_printed_config(stdout: &[u8]) -> Option<BTreeSet<String>> {
    let value: serde_json::Value = serde_json::from_slice(stdout).ok()?;
    let keys: BTreeSet<String> = value.as_object()?.keys().cloned().collect();
    (!keys.is_empty()).then_some(keys)
}

/// `bin ROLE --print-config json`'s keys; `None` when the binary does not
/// have the flag (it exits with a usage error) or prints something else.
async fn printed_keys(bin: &Path, role: Role) -> Result<Option<BTreeSet<String>>, SoakError> {
    let output = tokio::process::Command::new(bin)
        .arg(role.as_str())
        .args(["--print-config", "json"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(PROBE_TIMEOUT, output).await {
        Ok(Ok(out)) if out.status.success() => Ok(parse_printed_config(&out.stdout)),
        Ok(Ok(_)) | Err(_) => Ok(None),
        Ok(Err(source)) => Err(SoakError::Spawn {
            name: format!("print-config-{}", role.as_str()),
            path: bin.to_owned(),
            source,
        }),
    }
}

/// Collects the keys each role of `bin` accepts: `--print-config json`, or
/// for older binaries `bin ROLE --config PROBE` with a config (written in
/// `dir`) holding only an unknown key.
///
/// # Errors
/// [`SoakError::Filesystem`] when the probe config cannot be written,
/// [`SoakError::Spawn`] when the binary cannot be started.
pub async fn probe_accepted_keys(bin: &Path, dir: &Path) -> Result<AcceptedKeys, SoakError> {
    let path = dir.join("probe.toml");
    std::fs::write(&path, format!("{PROBE_KEY} = 0\n")).map_err(|source| {
        SoakError::Filesystem {
            action: "write",
            path: path.clone(),
            source,
        }
    })?;
    let mut accepted = AcceptedKeys::default();
    for role in [Role::Meta, Role::Datanode, Role::Gateway] {
        if let Some(keys) = printed_keys(bin, role).await? {
            accepted.0.insert(role, Some(keys));
            continue;
        }
        let output = tokio::process::Command::new(bin)
            .arg(role.as_str())
            .arg("--config")
            .arg(&path)
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let keys = match tokio::time::timeout(PROBE_TIMEOUT, output).await {
            Ok(Ok(out)) => parse_expected_fields(&String::from_utf8_lossy(&out.stderr)),
            Ok(Err(source)) => {
                return Err(SoakError::Spawn {
                    name: format!("probe-{}", role.as_str()),
                    path: bin.to_owned(),
                    source,
                });
            }
            // Still running: it ignored the unknown key (and was killed on drop).
            Err(_) => None,
        };
        if keys.is_none() {
            tracing::warn!(
                role = role.as_str(),
                "the sluice binary did not list its config keys; writing every knob"
            );
        }
        accepted.0.insert(role, keys);
    }
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::debug!(path = %path.display(), error = %e, "cannot remove the probe config");
    }
    Ok(accepted)
}

/// A knob as applied (or not) to a cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnobOutcome {
    /// Role whose config holds it.
    pub role: Role,
    /// Config key.
    pub key: &'static str,
    /// Value, as written in TOML.
    pub value: String,
    /// Written into the config (false: the binary does not know the key).
    pub applied: bool,
}

/// One optional key: role, key, flag, value, explicit.
struct Optional {
    role: Role,
    key: &'static str,
    flag: &'static str,
    value: Value,
    explicit: bool,
}

fn bytes_knob(role: Role, key: &'static str, flag: &'static str, k: Knob<u64>) -> Optional {
    Optional {
        role,
        key,
        flag,
        value: Value::Integer(i64::try_from(k.value).unwrap_or(i64::MAX)),
        explicit: k.explicit,
    }
}

/// The optional keys of a cluster: values of `knobs` for the keys `accepted`,
/// and what was left out. `overload` selects the flag names (`--overload-*`)
/// used in errors.
///
/// # Errors
/// [`SoakError::UnsupportedKnob`] for a knob given on the command line that
/// the binary does not accept.
pub fn resolve_knobs(
    knobs: &Knobs,
    overload: bool,
    accepted: &AcceptedKeys,
) -> Result<(BTreeMap<Role, Table>, Vec<KnobOutcome>), SoakError> {
    let pick =
        |plain: &'static str, prefixed: &'static str| if overload { prefixed } else { plain };
    let mut optional = vec![
        bytes_knob(
            Role::Meta,
            "sled_cache_bytes",
            "meta-sled-cache",
            knobs.meta_sled_cache,
        ),
        bytes_knob(
            Role::Datanode,
            "write_budget_bytes",
            pick("datanode-write-budget", "overload-datanode-write-budget"),
            knobs.datanode_write_budget,
        ),
        bytes_knob(
            Role::Gateway,
            "buffer_budget_bytes",
            pick("gateway-buffer-budget", "overload-gateway-buffer-budget"),
            knobs.gateway_buffer_budget,
        ),
        bytes_knob(
            Role::Gateway,
            "read_budget_bytes",
            pick("gateway-read-budget", "overload-gateway-read-budget"),
            knobs.gateway_read_budget,
        ),
    ];
    if let Some(k) = knobs.max_inflight {
        optional.push(bytes_knob(
            Role::Gateway,
            "max_inflight_requests",
            pick("max-inflight", "overload-max-inflight"),
            k,
        ));
    }
    if let Some(k) = knobs.stall_timeout {
        optional.push(Optional {
            role: Role::Gateway,
            key: "stall_timeout",
            flag: pick("stall-timeout", "overload-stall-timeout"),
            value: Value::String(humantime::format_duration(k.value).to_string()),
            explicit: k.explicit,
        });
    }
    let mut tables: BTreeMap<Role, Table> = BTreeMap::new();
    let mut outcomes = Vec::new();
    for o in optional {
        let applied = accepted.accepts(o.role, o.key);
        if !applied && o.explicit {
            return Err(SoakError::UnsupportedKnob {
                flag: o.flag,
                role: o.role.as_str(),
                key: o.key,
            });
        }
        outcomes.push(KnobOutcome {
            role: o.role,
            key: o.key,
            value: o.value.to_string(),
            applied,
        });
        if applied {
            tables
                .entry(o.role)
                .or_default()
                .insert(o.key.to_owned(), o.value);
        } else {
            tracing::warn!(role = o.role.as_str(), key = o.key, value = %o.value, "this sluice binary has no such config key; not applied");
        }
    }
    Ok((tables, outcomes))
}

/// Addresses and directories of one process.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Port of the role's main listener (gRPC or S3), on 127.0.0.1.
    pub port: u16,
    /// Port of `/metrics`, when the binary accepts `metrics_listen`.
    pub metrics_port: Option<u16>,
    /// Data directory (meta and datanodes).
    pub data_dir: PathBuf,
}

/// S3 settings of the gateway.
#[derive(Debug, Clone)]
pub struct GatewayAccess {
    /// Region.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret key.
    pub secret_key: String,
}

fn addr(port: u16) -> Value {
    Value::String(format!("127.0.0.1:{port}"))
}

fn http(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn common(table: &mut Table, at: &Placement) {
    table.insert("listen".into(), addr(at.port));
    if let Some(port) = at.metrics_port {
        table.insert("metrics_listen".into(), addr(port));
    }
}

/// The meta node's config (single voter, node id 1).
pub fn meta_config(at: &Placement, extra: Option<&Table>) -> Table {
    let mut t = Table::new();
    t.insert("node_id".into(), Value::Integer(1));
    common(&mut t, at);
    t.insert("advertise_addr".into(), Value::String(http(at.port)));
    t.insert(
        "data_dir".into(),
        Value::String(at.data_dir.display().to_string()),
    );
    t.extend(extra.cloned().unwrap_or_default());
    t
}

/// Config of datanode `node_id` registering with the meta node on `meta_port`.
pub fn datanode_config(
    node_id: u64,
    at: &Placement,
    meta_port: u16,
    extra: Option<&Table>,
) -> Table {
    let mut t = Table::new();
    t.insert(
        "node_id".into(),
        Value::Integer(i64::try_from(node_id).unwrap_or(i64::MAX)),
    );
    common(&mut t, at);
    t.insert("advertise_addr".into(), Value::String(http(at.port)));
    t.insert(
        "data_dir".into(),
        Value::String(at.data_dir.display().to_string()),
    );
    t.insert(
        "meta_endpoints".into(),
        Value::Array(vec![Value::String(http(meta_port))]),
    );
    t.insert("heartbeat_interval".into(), Value::String("1s".into()));
    t.insert(
        "shutdown_grace".into(),
        Value::String(SHUTDOWN_GRACE.into()),
    );
    t.extend(extra.cloned().unwrap_or_default());
    t
}

/// The gateway's config.
pub fn gateway_config(
    at: &Placement,
    meta_port: u16,
    access: &GatewayAccess,
    extra: Option<&Table>,
) -> Table {
    let mut t = Table::new();
    common(&mut t, at);
    t.insert("region".into(), Value::String(access.region.clone()));
    t.insert(
        "access_key".into(),
        Value::String(access.access_key.clone()),
    );
    t.insert(
        "secret_key".into(),
        Value::String(access.secret_key.clone()),
    );
    t.insert(
        "meta_endpoints".into(),
        Value::Array(vec![Value::String(http(meta_port))]),
    );
    t.insert(
        "datanode_refresh_interval".into(),
        Value::String("1s".into()),
    );
    t.insert(
        "shutdown_grace".into(),
        Value::String(SHUTDOWN_GRACE.into()),
    );
    t.extend(extra.cloned().unwrap_or_default());
    t
}

/// Writes `table` as TOML to `path`.
///
/// # Errors
/// [`SoakError::Toml`], [`SoakError::Filesystem`].
pub fn write_config(role: Role, table: &Table, path: &Path) -> Result<(), SoakError> {
    let text = toml::to_string(table).map_err(|source| SoakError::Toml {
        role: role.as_str(),
        source,
    })?;
    std::fs::write(path, text).map_err(|source| SoakError::Filesystem {
        action: "write",
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::options::Knob;

    #[test]
    fn printed_config_keys_are_its_object_keys() {
        let keys = parse_printed_config(br#"{"listen": "127.0.0.1:9000", "write_quorum": null}"#)
            .expect("keys");
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            ["listen", "write_quorum"]
        );
        assert_eq!(parse_printed_config(b"error: unexpected argument"), None);
        assert_eq!(parse_printed_config(b"{}"), None);
    }

    const SERDE_ERROR: &str = "Error: parsing config /tmp/p.toml\n\nCaused by:\n    TOML parse error at line 1, column 1\n      |\n    1 | zz = 0\n      | ^^\n    unknown field `zz`, expected one of `node_id`, `listen`, `write_budget_bytes`\n";

    #[test]
    fn parses_the_fields_a_role_lists() {
        let keys = parse_expected_fields(SERDE_ERROR).expect("listed");
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            vec!["listen", "node_id", "write_budget_bytes"]
        );
        let single = parse_expected_fields("unknown field `zz`, expected `listen`").expect("one");
        assert_eq!(single.len(), 1);
        assert_eq!(parse_expected_fields("Error: binding 127.0.0.1:1"), None);
    }

    fn knobs(explicit: bool) -> Knobs {
        let k = |value| Knob { value, explicit };
        Knobs {
            meta_sled_cache: Knob {
                value: 64 << 20,
                explicit: false,
            },
            datanode_write_budget: k(8 << 20),
            gateway_buffer_budget: k(16 << 20),
            gateway_read_budget: k(8 << 20),
            max_inflight: Some(k(32)),
            stall_timeout: Some(Knob {
                value: Duration::from_secs(5),
                explicit,
            }),
        }
    }

    fn accepted() -> AcceptedKeys {
        let set = |keys: &[&str]| Some(keys.iter().map(|k| (*k).to_owned()).collect());
        AcceptedKeys(BTreeMap::from([
            (Role::Meta, set(&["listen", "sled_cache_bytes"])),
            (Role::Datanode, set(&["listen", "write_budget_bytes"])),
            (Role::Gateway, set(&["listen", "region"])),
        ]))
    }

    #[test]
    fn defaults_the_binary_lacks_are_left_out() {
        let (tables, outcomes) = resolve_knobs(&knobs(false), true, &accepted()).expect("ok");
        assert_eq!(
            tables[&Role::Datanode]["write_budget_bytes"],
            Value::Integer(8 << 20)
        );
        assert_eq!(
            tables[&Role::Meta]["sled_cache_bytes"],
            Value::Integer(64 << 20)
        );
        assert!(!tables.contains_key(&Role::Gateway));
        let not_applied: Vec<&str> = outcomes
            .iter()
            .filter(|o| !o.applied)
            .map(|o| o.key)
            .collect();
        assert_eq!(
            not_applied,
            vec![
                "buffer_budget_bytes",
                "read_budget_bytes",
                "max_inflight_requests",
                "stall_timeout"
            ]
        );
    }

    #[test]
    fn explicit_knobs_the_binary_lacks_are_errors() {
        match resolve_knobs(&knobs(true), true, &accepted()) {
            Err(SoakError::UnsupportedKnob { flag, key, role }) => {
                assert_eq!(
                    (flag, key, role),
                    (
                        "overload-gateway-buffer-budget",
                        "buffer_budget_bytes",
                        "gateway"
                    )
                );
            }
            other => panic!("expected UnsupportedKnob, got {other:?}"),
        }
        // With unknown key lists, everything is written.
        let (tables, _) = resolve_knobs(&knobs(true), false, &AcceptedKeys::default()).expect("ok");
        assert_eq!(
            tables[&Role::Gateway]["stall_timeout"],
            Value::String("5s".into())
        );
        assert_eq!(
            tables[&Role::Gateway]["max_inflight_requests"],
            Value::Integer(32)
        );
    }

    #[test]
    fn role_configs_round_trip_through_toml() {
        let at = Placement {
            port: 7001,
            metrics_port: Some(7091),
            data_dir: PathBuf::from("/tmp/soak/meta"),
        };
        let mut extra = Table::new();
        extra.insert("write_budget_bytes".into(), Value::Integer(1 << 20));
        let dn = datanode_config(3, &at, 7000, Some(&extra));
        let text = toml::to_string(&dn).expect("serialise");
        let back: Table = toml::from_str(&text).expect("parse");
        assert_eq!(back["node_id"], Value::Integer(3));
        assert_eq!(back["listen"], Value::String("127.0.0.1:7001".into()));
        assert_eq!(
            back["metrics_listen"],
            Value::String("127.0.0.1:7091".into())
        );
        assert_eq!(
            back["meta_endpoints"],
            Value::Array(vec![Value::String("http://127.0.0.1:7000".into())])
        );
        assert_eq!(back["write_budget_bytes"], Value::Integer(1 << 20));
        let gw = gateway_config(
            &at,
            7000,
            &GatewayAccess {
                region: "us-east-1".into(),
                access_key: "ak".into(),
                secret_key: "sk".into(),
            },
            None,
        );
        assert_eq!(gw["access_key"], Value::String("ak".into()));
        assert!(!gw.contains_key("data_dir"));
        let meta = meta_config(&at, None);
        assert_eq!(
            meta["advertise_addr"],
            Value::String("http://127.0.0.1:7001".into())
        );
    }
}
