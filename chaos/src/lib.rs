//! `sluice-chaos`: a Jepsen-style fault-injection harness for a real,
//! multi-process Sluice cluster (3 meta, 6 datanodes on 3 hosts, 2
//! gateways), each host in its own network namespace, mTLS on.
//!
//! A run ([`run`]) starts the cluster ([`cluster`]), drives concurrent S3
//! clients that record a history ([`workload`], [`history`]), injects
//! faults on a seeded schedule ([`schedule`], [`faults`], [`proxy`]),
//! samples every process's RSS ([`monitor`]), heals, waits for the cluster
//! to settle, reads everything back and checks the history ([`checker`]).

pub mod checker;
pub mod cluster;
pub mod faults;
pub mod history;
pub mod monitor;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod workload;
