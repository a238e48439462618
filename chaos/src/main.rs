//! `sluice-chaos`: see the crate docs and chaos/README.md.

use clap::{Parser, Subcommand};
use sluice_chaos::workload::{self, ReadBackArgs, WorkloadArgs};

#[derive(Debug, Parser)]
#[command(
    name = "sluice-chaos",
    about = "Jepsen-style fault injection for a Sluice cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs S3 clients against the cluster, recording a history, until
    /// SIGTERM/SIGINT or --duration; prints the stats as a JSON line.
    Workload(WorkloadArgs),
    /// Reads back every key the history's writes name, and lists the
    /// bucket, appending to the history; prints
    /// {"final_phase_start_us": N} as it starts.
    ReadBack(ReadBackArgs),
}

fn main() -> anyhow::Result<()> {
    // The SDK's futures are large, and unoptimised builds keep every one
    // of them on the stack while polling: the default 2 MiB overflows.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(32 << 20)
        .build()?
        .block_on(async_main())
}

async fn async_main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().command {
        Command::Workload(args) => workload::run_workload(args).await.map(drop),
        Command::ReadBack(args) => workload::read_back(args).await,
    }
}
