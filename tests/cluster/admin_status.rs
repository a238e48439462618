//! `sluice.admin.Admin/Status` (what `sluice admin status` prints) against
//! an in-process cluster of three meta voters, six datanodes and a
//! gateway: every voter and datanode is listed with the right state, a
//! stopped datanode shows down, loads and memory are reported.

use anyhow::{Result, ensure};
use sluice_meta_client::MetaClient;
use sluice_proto::admin::admin_client::AdminClient;
use sluice_proto::admin::{StatusRequest, StatusResponse};

use crate::fixtures::{CONVERGE_TIMEOUT, TestCluster, wait_until};

async fn status(meta: &MetaClient) -> std::result::Result<StatusResponse, String> {
    meta.call_on("Status", |channel| async move {
        AdminClient::new(channel).status(StatusRequest {}).await
    })
    .await
    .map_err(|e| e.to_string())
}

fn states(s: &StatusResponse) -> Vec<(u64, String)> {
    s.datanodes
        .iter()
        .map(|d| (d.id, d.state.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_lists_voters_datanodes_and_gateways() -> Result<()> {
    let mut c = TestCluster::start(3, 6).await?;
    let leader = c.wait_leader().await?;
    // Asked through a follower: the client follows the leader hint.
    let follower = c
        .metas
        .iter()
        .enumerate()
        .find(|(i, _)| *i as u64 + 1 != leader)
        .map(|(_, m)| format!("http://{}", m.addr()))
        .expect("a follower");
    let meta = MetaClient::new(vec![follower]).with_transport(crate::fixtures::admin_transport());
    c.s3().create_bucket().bucket("status").send().await?;
    crate::put(&c.s3(), "status", "a", &crate::random_bytes(1, 1 << 20)).await?;

    // Every datanode up with its load reported, the gateway with its epoch
    // and memory.
    let s = wait_until("a complete status", CONVERGE_TIMEOUT, || {
        let meta = meta.clone();
        async move {
            let s = status(&meta).await?;
            let loaded = s.datanodes.iter().all(|d| {
                d.memory.as_ref().is_some_and(|m| m.rss_bytes > 0) && d.write_budget_bytes > 0
            });
            let gateway_memory = s.gateways.iter().any(|g| {
                g.memory
                    .as_ref()
                    .is_some_and(|m| m.rss_bytes > 0 && m.budget_bytes > 0)
            });
            if loaded && gateway_memory && s.voters.iter().all(|v| v.reachable) {
                Ok(s)
            } else {
                Err(format!("{s:?}"))
            }
        }
    })
    .await?;
    ensure!(
        s.leader_id == leader,
        "answered by {} not the leader {leader}",
        s.leader_id
    );
    ensure!(
        s.term > 0 && s.commit_index > 0 && s.applied_index > 0,
        "{s:?}"
    );
    let mut voters: Vec<(u64, bool)> = s.voters.iter().map(|v| (v.id, v.leader)).collect();
    voters.sort_unstable();
    ensure!(
        voters == vec![(1, leader == 1), (2, leader == 2), (3, leader == 3)],
        "voters {voters:?}"
    );
    for v in &s.voters {
        ensure!(
            v.term == s.term,
            "voter {} in term {} not {}",
            v.id,
            v.term,
            s.term
        );
        ensure!(
            v.applied_index > 0 && v.matched_index.is_some(),
            "voter {v:?}"
        );
    }
    let want: Vec<(u64, String)> = (1..=6).map(|id| (id, "up".to_string())).collect();
    ensure!(states(&s) == want, "datanodes {:?}", states(&s));
    ensure!(
        s.gateways.len() == 1 && !s.gateways[0].open_epochs.is_empty(),
        "gateways {:?}",
        s.gateways
    );
    ensure!(
        s.leader_memory
            .as_ref()
            .is_some_and(|m| m.rss_bytes > 0 && m.budget_bytes > 0),
        "{s:?}"
    );
    ensure!(s.degraded_blobs == 0 && !s.degraded_capped, "{s:?}");
    // Every role's background workers, by name: the leader's own, and
    // those each datanode and the gateway reported with their load.
    let named = |workers: &[sluice_proto::meta::WorkerStatus], wanted: &[&str]| {
        wanted
            .iter()
            .all(|w| workers.iter().any(|x| x.name == *w && x.state != "stopped"))
    };
    ensure!(
        named(
            &s.leader_workers,
            &[
                "snapshot-schedule",
                "leadership-watch",
                "upload-sweeper",
                "lifecycle-sweeper",
                "lease-sweeper",
                "reclaimer",
            ]
        ),
        "leader workers {:?}",
        s.leader_workers
    );
    for d in &s.datanodes {
        ensure!(
            named(&d.workers, &["gc", "scrubber", "membership"]),
            "datanode {} workers {:?}",
            d.id,
            d.workers
        );
    }
    ensure!(
        named(
            &s.gateways[0].workers,
            &["epoch-renewal", "datanode-refresh"]
        ),
        "gateway workers {:?}",
        s.gateways[0].workers
    );

    // One datanode stopped: it shows down, with its last heartbeat.
    c.datanodes[5].stop().await?;
    let s = wait_until("datanode 6 down in status", CONVERGE_TIMEOUT, || {
        let meta = meta.clone();
        async move {
            let s = status(&meta).await?;
            if s.datanodes.iter().any(|d| d.id == 6 && d.state == "down") {
                Ok(s)
            } else {
                Err(format!("{:?}", states(&s)))
            }
        }
    })
    .await?;
    let mut want: Vec<(u64, String)> = (1..=5).map(|id| (id, "up".to_string())).collect();
    want.push((6, "down".into()));
    ensure!(states(&s) == want, "datanodes {:?}", states(&s));
    let down = s.datanodes.iter().find(|d| d.id == 6).expect("datanode 6");
    ensure!(!down.live && down.last_heartbeat_ms > 0, "{down:?}");
    Ok(())
}
