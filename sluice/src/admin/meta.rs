//! `sluice admin meta list|add|remove|replace|digest`: the meta cluster's
//! voters, changed through openraft's membership API on the leader (see
//! `sluice_meta`'s `admin/members.rs`), and each voter's state digest.
//!
//! `add` blocks until the new node has caught up and is a voter (or the
//! catch-up timeout passed, and the learner was removed again); `replace`
//! adds the new node, then removes the old one. Every subcommand prints a
//! table of the members afterwards, or JSON with `--json`.

use std::time::Duration;

use clap::{Args, Subcommand};
use sluice_meta_client::MetaClient;
use sluice_proto::admin as apb;
use sluice_proto::admin::admin_client::AdminClient;

use super::{AdminConn, connect};

/// `sluice admin meta ...`.
#[derive(Subcommand, Debug)]
pub enum MetaCommand {
    /// List voters and learners with the leader, term, commit and applied
    /// index and each member's replication progress.
    List(Output),
    /// Add a meta node as a voter: it joins as a learner, catches up, and is
    /// promoted. Start the node first, with `join = true` in its config.
    Add {
        /// The new node's `node_id`.
        #[arg(long)]
        id: u64,
        /// The new node's `advertise_addr`, e.g. `http://10.0.0.14:7001`.
        #[arg(long)]
        addr: String,
        /// How long the leader waits for it to catch up (humantime).
        #[arg(long, value_parser = humantime_arg, default_value = "60s")]
        catch_up_timeout: Duration,
        #[command(flatten)]
        output: Output,
    },
    /// Remove a meta node (voter or learner). Refused for the last voter and
    /// when the remaining voters would have no live quorum.
    Remove {
        /// The node id to remove.
        id: u64,
        #[command(flatten)]
        output: Output,
    },
    /// Each voter's digest of its applied state and the applied index it is
    /// of (asked of every voter, or of the `--node` ids). Voters at the same
    /// applied index must show the same digest.
    Digest {
        /// Only these node ids (repeatable); default: every voter.
        #[arg(long = "node")]
        nodes: Vec<u64>,
        #[command(flatten)]
        output: Output,
    },
    /// Replace voter OLD by a new node: add the new one, then remove OLD.
    Replace {
        /// The node id to replace.
        old: u64,
        /// The new node's `node_id`.
        #[arg(long)]
        id: u64,
        /// The new node's `advertise_addr`.
        #[arg(long)]
        addr: String,
        #[arg(long, value_parser = humantime_arg, default_value = "60s")]
        catch_up_timeout: Duration,
        #[command(flatten)]
        output: Output,
    },
}

/// Output format flags.
#[derive(Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn humantime_arg(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs one `sluice admin meta` subcommand.
pub async fn run(conn: &AdminConn, command: MetaCommand) -> anyhow::Result<()> {
    let client = connect(conn)?;
    match command {
        MetaCommand::List(output) => {
            let members = list(&client).await?;
            print_members(&members, None, output);
        }
        MetaCommand::Add {
            id,
            addr,
            catch_up_timeout,
            output,
        } => {
            let resp = add(&client, id, addr, catch_up_timeout).await?;
            print_response(&resp, output);
        }
        MetaCommand::Remove { id, output } => {
            let resp = remove(&client, id).await?;
            print_response(&resp, output);
        }
        MetaCommand::Replace {
            old,
            id,
            addr,
            catch_up_timeout,
            output,
        } => {
            let resp = replace(&client, old, id, addr, catch_up_timeout).await?;
            print_response(&resp, output);
        }
        MetaCommand::Digest { nodes, output } => {
            let digests = digests(conn, &client, &nodes).await?;
            if output.json {
                println!("{}", digests_json(&digests));
            } else {
                print!("{}", digests_table(&digests));
            }
        }
    }
    Ok(())
}

/// How long `meta digest` waits for one voter's answer (the digest reads
/// the whole state).
const DIGEST_TIMEOUT: Duration = Duration::from_secs(120);

/// One voter's answer to StateDigest.
#[derive(Debug, Clone)]
pub struct VoterDigest {
    pub id: u64,
    pub addr: String,
    pub result: Result<apb::StateDigestResponse, String>,
}

/// StateDigest of every voter (or of the ids in `only`), each asked
/// directly at its address, concurrently.
pub async fn digests(
    conn: &AdminConn,
    client: &MetaClient,
    only: &[u64],
) -> anyhow::Result<Vec<VoterDigest>> {
    let members = list(client).await?;
    let targets: Vec<(u64, String)> = members
        .members
        .iter()
        .filter(|m| {
            if only.is_empty() {
                m.voter
            } else {
                only.contains(&m.id)
            }
        })
        .map(|m| (m.id, m.addr.clone()))
        .collect();
    for id in only {
        anyhow::ensure!(
            targets.iter().any(|(t, _)| t == id),
            "node {id} is not a member of the meta cluster"
        );
    }
    let transport = super::transport(conn)?;
    let asks = targets.into_iter().map(|(id, addr)| {
        let node = MetaClient::with_timeouts(vec![addr.clone()], DIGEST_TIMEOUT, DIGEST_TIMEOUT)
            .with_transport(transport.clone());
        async move {
            let result = node
                .call_on("StateDigest", |channel| async move {
                    AdminClient::new(channel)
                        .state_digest(apb::StateDigestRequest {})
                        .await
                })
                .await
                .map_err(|e| e.to_string());
            VoterDigest { id, addr, result }
        }
    });
    Ok(futures::future::join_all(asks).await)
}

/// The digests as JSON (the `--json` output): `voters`, each with `id`,
/// `addr` and either `applied_index`, `digest`, `records` or `error`.
pub fn digests_json(d: &[VoterDigest]) -> serde_json::Value {
    let voters: Vec<serde_json::Value> = d
        .iter()
        .map(|v| match &v.result {
            Ok(r) => serde_json::json!({
                "id": v.id,
                "addr": v.addr,
                "applied_index": r.applied_index,
                "digest": r.digest_hex,
                "records": r.records,
            }),
            Err(e) => serde_json::json!({ "id": v.id, "addr": v.addr, "error": e }),
        })
        .collect();
    serde_json::json!({ "voters": voters })
}

/// The digests as a human table.
pub fn digests_table(d: &[VoterDigest]) -> String {
    let mut out = format!(
        "{:>4}  {:>10}  {:>10}  DIGEST\n",
        "ID", "APPLIED", "RECORDS"
    );
    for v in d {
        match &v.result {
            Ok(r) => out.push_str(&format!(
                "{:>4}  {:>10}  {:>10}  {}\n",
                v.id, r.applied_index, r.records, r.digest_hex
            )),
            Err(e) => out.push_str(&format!("{:>4}  error: {e}\n", v.id)),
        }
    }
    out
}

/// ListMembers on the leader.
pub async fn list(client: &MetaClient) -> anyhow::Result<apb::ListMembersResponse> {
    Ok(client
        .call_on("ListMembers", |channel| async move {
            AdminClient::new(channel)
                .list_members(apb::ListMembersRequest {})
                .await
        })
        .await?)
}

/// AddVoter on the leader.
pub async fn add(
    client: &MetaClient,
    id: u64,
    addr: String,
    catch_up_timeout: Duration,
) -> anyhow::Result<apb::MembershipResponse> {
    let req = apb::AddVoterRequest {
        id,
        addr,
        catch_up_timeout_ms: Some(ms(catch_up_timeout)),
    };
    Ok(client
        .call_on("AddVoter", |channel| {
            let req = req.clone();
            async move { AdminClient::new(channel).add_voter(req).await }
        })
        .await?)
}

/// RemoveVoter on the leader.
pub async fn remove(client: &MetaClient, id: u64) -> anyhow::Result<apb::MembershipResponse> {
    Ok(client
        .call_on("RemoveVoter", |channel| async move {
            AdminClient::new(channel)
                .remove_voter(apb::RemoveVoterRequest { id })
                .await
        })
        .await?)
}

/// ReplaceVoter on the leader.
pub async fn replace(
    client: &MetaClient,
    old_id: u64,
    new_id: u64,
    new_addr: String,
    catch_up_timeout: Duration,
) -> anyhow::Result<apb::MembershipResponse> {
    let req = apb::ReplaceVoterRequest {
        old_id,
        new_id,
        new_addr,
        catch_up_timeout_ms: Some(ms(catch_up_timeout)),
    };
    Ok(client
        .call_on("ReplaceVoter", |channel| {
            let req = req.clone();
            async move { AdminClient::new(channel).replace_voter(req).await }
        })
        .await?)
}

fn print_response(resp: &apb::MembershipResponse, output: Output) {
    let members = resp.members.clone().unwrap_or_default();
    print_members(&members, Some(&resp.message), output);
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The members as JSON (the `--json` output).
pub fn members_json(m: &apb::ListMembersResponse, message: Option<&str>) -> serde_json::Value {
    let members: Vec<serde_json::Value> = m
        .members
        .iter()
        .map(|x| {
            serde_json::json!({
                "id": x.id,
                "addr": x.addr,
                "role": if x.voter { "voter" } else { "learner" },
                "leader": x.leader,
                "matched_index": x.matched_index,
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "leader_id": if m.leader_id == 0 { None } else { Some(m.leader_id) },
        "term": m.term,
        "commit_index": m.commit_index,
        "applied_index": m.applied_index,
        "last_log_index": m.last_log_index,
        "change_in_progress": m.change_in_progress,
        "members": members,
    });
    if let Some(message) = message {
        v["message"] = serde_json::Value::String(message.to_string());
    }
    v
}

/// The members as a human table.
pub fn members_table(m: &apb::ListMembersResponse) -> String {
    let mut out = format!(
        "leader {}  term {}  commit {}  applied {}  last log {}{}\n",
        if m.leader_id == 0 {
            "-".to_string()
        } else {
            m.leader_id.to_string()
        },
        m.term,
        opt(m.commit_index),
        opt(m.applied_index),
        opt(m.last_log_index),
        if m.change_in_progress {
            "  (membership change in progress)"
        } else {
            ""
        }
    );
    let addr_w = m
        .members
        .iter()
        .map(|x| x.addr.len())
        .max()
        .unwrap_or(0)
        .max("ADDR".len());
    out.push_str(&format!(
        "{:>4}  {:<addr_w$}  {:<8}  {:>8}\n",
        "ID", "ADDR", "ROLE", "MATCHED"
    ));
    for x in &m.members {
        let role = match (x.voter, x.leader) {
            (true, true) => "leader",
            (true, false) => "voter",
            (false, _) => "learner",
        };
        out.push_str(&format!(
            "{:>4}  {:<addr_w$}  {:<8}  {:>8}\n",
            x.id,
            x.addr,
            role,
            opt(x.matched_index)
        ));
    }
    out
}

fn print_members(m: &apb::ListMembersResponse, message: Option<&str>, output: Output) {
    if output.json {
        println!("{}", members_json(m, message));
    } else {
        if let Some(message) = message {
            println!("{message}");
        }
        print!("{}", members_table(m));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> apb::ListMembersResponse {
        apb::ListMembersResponse {
            members: vec![
                apb::MetaMember {
                    id: 1,
                    addr: "http://10.0.0.11:7001".into(),
                    voter: true,
                    leader: true,
                    matched_index: Some(42),
                },
                apb::MetaMember {
                    id: 4,
                    addr: "http://10.0.0.14:7001".into(),
                    voter: false,
                    leader: false,
                    matched_index: None,
                },
            ],
            leader_id: 1,
            term: 3,
            commit_index: Some(42),
            applied_index: Some(41),
            last_log_index: Some(42),
            change_in_progress: false,
        }
    }

    #[test]
    fn table_and_json_name_every_member() {
        let t = members_table(&sample());
        assert!(t.starts_with("leader 1  term 3  commit 42  applied 41  last log 42\n"));
        assert!(t.contains("   1  http://10.0.0.11:7001  leader          42"));
        assert!(t.contains("   4  http://10.0.0.14:7001  learner          -"));
        let j = members_json(&sample(), Some("added"));
        assert_eq!(j["leader_id"], 1);
        assert_eq!(j["members"][1]["role"], "learner");
        assert_eq!(j["members"][1]["matched_index"], serde_json::Value::Null);
        assert_eq!(j["message"], "added");
    }
}
