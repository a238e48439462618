//! `sluice admin key ...`: S3 access keys stored in meta (Garage's model:
//! a key has read / write / owner grants per bucket).
//!
//! `create` prints the secret once; nothing else shows it again. Every
//! subcommand prints a human table, or JSON with `--json`.

use clap::{Args, Subcommand};
use sluice_meta_client::new_op_id;
use sluice_proto::admin::{self as apb, admin_client::AdminClient};

use super::{AdminConn, connect};

/// `sluice admin key <command>`.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Create an access key named NAME; prints its id and secret (once).
    Create {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List access keys and their grants (no secrets).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete access key KEY (its id).
    Delete {
        key: String,
        #[arg(long)]
        json: bool,
    },
    /// Grant KEY permissions on a bucket.
    Allow(GrantArgs),
    /// Revoke permissions of KEY on a bucket (all three when none is named).
    Deny(GrantArgs),
}

/// KEY, the bucket and the permissions of `allow` / `deny`.
#[derive(Args, Debug)]
pub struct GrantArgs {
    /// The access key id.
    key: String,
    #[arg(long)]
    bucket: String,
    #[arg(long)]
    read: bool,
    #[arg(long)]
    write: bool,
    #[arg(long)]
    owner: bool,
    #[arg(long)]
    json: bool,
}

/// Runs one `sluice admin key` subcommand against the meta cluster.
pub async fn run(conn: &AdminConn, command: KeyCommand) -> anyhow::Result<()> {
    let meta = connect(conn)?;
    match command {
        KeyCommand::Create { name, json } => {
            let req = apb::CreateKeyRequest {
                name,
                op_id: new_op_id(),
            };
            let resp = meta
                .call_on("CreateKey", |ch| {
                    let req = req.clone();
                    async move { AdminClient::new(ch).create_key(req).await }
                })
                .await?;
            let key = resp.key.unwrap_or_default();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "id": key.id,
                        "name": key.name,
                        "created_ms": key.created_ms,
                        "secret": resp.secret,
                    })
                );
            } else {
                println!("Key ID:     {}", key.id);
                println!("Key name:   {}", key.name);
                println!("Secret key: {}", resp.secret);
                println!("(the secret is not shown again)");
            }
        }
        KeyCommand::List { json } => {
            let resp = meta
                .call_on("ListKeys", |ch| async move {
                    AdminClient::new(ch)
                        .list_keys(apb::ListKeysRequest {})
                        .await
                })
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&resp.keys)?);
            } else {
                print!("{}", table(&resp.keys));
            }
        }
        KeyCommand::Delete { key, json } => {
            let req = apb::DeleteKeyRequest {
                id: key.clone(),
                op_id: new_op_id(),
            };
            meta.call_on("DeleteKey", |ch| {
                let req = req.clone();
                async move { AdminClient::new(ch).delete_key(req).await }
            })
            .await?;
            if json {
                println!("{}", serde_json::json!({ "deleted": key }));
            } else {
                println!("deleted key {key}");
            }
        }
        KeyCommand::Allow(g) => grant(&meta, g, true).await?,
        KeyCommand::Deny(g) => grant(&meta, g, false).await?,
    }
    Ok(())
}

async fn grant(
    meta: &sluice_meta_client::MetaClient,
    g: GrantArgs,
    allow: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !allow || g.read || g.write || g.owner,
        "name at least one of --read, --write, --owner"
    );
    let req = apb::KeyGrantRequest {
        id: g.key,
        bucket: g.bucket,
        read: g.read,
        write: g.write,
        owner: g.owner,
        op_id: new_op_id(),
    };
    let resp = if allow {
        meta.call_on("AllowKey", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).allow_key(req).await }
        })
        .await?
    } else {
        meta.call_on("DenyKey", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).deny_key(req).await }
        })
        .await?
    };
    let keys: Vec<apb::KeyInfo> = resp.key.into_iter().collect();
    if g.json {
        println!(
            "{}",
            serde_json::to_string_pretty(keys.first().unwrap_or(&apb::KeyInfo::default()))?
        );
    } else {
        print!("{}", table(&keys));
    }
    Ok(())
}

/// `r`, `w`, `o` for the permissions a grant holds, `-` for the others.
fn perms(g: &sluice_proto::meta::BucketGrant) -> String {
    [(g.read, 'r'), (g.write, 'w'), (g.owner, 'o')]
        .iter()
        .map(|&(on, c)| if on { c } else { '-' })
        .collect()
}

/// One row per key: id, name, creation time, and its grants as
/// `bucket:rwo` (comma-separated).
fn table(keys: &[apb::KeyInfo]) -> String {
    let rows: Vec<[String; 4]> = keys
        .iter()
        .map(|k| {
            let grants: Vec<String> = k
                .grants
                .iter()
                .map(|g| format!("{}:{}", g.bucket, perms(g)))
                .collect();
            [
                k.id.clone(),
                k.name.clone(),
                created(k.created_ms),
                if grants.is_empty() {
                    "-".into()
                } else {
                    grants.join(",")
                },
            ]
        })
        .collect();
    let header = [
        "KEY ID",
        "NAME",
        "CREATED",
        "BUCKETS (r=read w=write o=owner)",
    ];
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 4]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3]]);
    }
    out
}

/// A creation time as seconds since the Unix epoch, `-` when unknown.
fn created(ms: i64) -> String {
    if ms <= 0 {
        "-".into()
    } else {
        format!("{}s", ms / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_keys_and_grants() {
        let keys = vec![apb::KeyInfo {
            id: "SKABC".into(),
            name: "alice".into(),
            created_ms: 5_000,
            grants: vec![
                sluice_proto::meta::BucketGrant {
                    bucket: "photos".into(),
                    read: true,
                    write: false,
                    owner: true,
                },
                sluice_proto::meta::BucketGrant {
                    bucket: "logs".into(),
                    read: true,
                    write: true,
                    owner: false,
                },
            ],
        }];
        let t = table(&keys);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("KEY ID"));
        assert!(lines[1].starts_with("SKABC   alice"), "{t}");
        assert!(lines[1].ends_with("photos:r-o,logs:rw-"), "{t}");
    }
}
