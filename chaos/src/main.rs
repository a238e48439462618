//! `sluice-chaos`: see the crate docs and chaos/README.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_chaos::{checker, history, proxy, run, schedule, workload};

#[derive(Parser, Debug)]
#[command(
    name = "sluice-chaos",
    version,
    about = "Seeded fault injection against a real multi-process Sluice cluster, with a history checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a cluster in network namespaces, run the workload under the
    /// seeded faults, settle, read back and check (needs root).
    Run(run::RunArgs),
    /// Check a recorded history (history.jsonl of a run directory).
    Check {
        /// The history.
        history: PathBuf,
        /// Where the read-back phase started (CLOCK_MONOTONIC µs; printed
        /// by `read-back`).
        #[arg(long)]
        final_phase_start_us: Option<u64>,
    },
    /// Print the fault schedule `run` would use for `--seed` (same
    /// options), without running it.
    Schedule(run::RunArgs),
    /// List the fault kinds.
    Faults,
    /// (internal) The workload: concurrent S3 clients recording a history.
    Workload(workload::WorkloadArgs),
    /// (internal) The final phase: read every key written, list the bucket.
    ReadBack(workload::ReadBackArgs),
    /// (internal) A fault proxy (latency, jitter, bandwidth, down) in front
    /// of one datanode.
    Proxy(proxy::ProxyArgs),
}

fn main() -> ExitCode {
    // The SDK's futures are large, and unoptimised builds keep every one
    // of them on the stack while polling: the default 2 MiB overflows.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(32 << 20)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice-chaos: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async_main())
}

async fn async_main() -> ExitCode {
    sluice_harness::init_logging();
    match real_main(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            let results = run::run(args).await?;
            Ok(if results.iter().all(|r| r.passed()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Check {
            history: path,
            final_phase_start_us,
        } => {
            let h = history::read_jsonl(&path)?;
            let report = checker::check(
                &h,
                &checker::CheckOptions {
                    final_phase_start_us,
                    ..Default::default()
                },
            );
            println!("{}", report.render());
            Ok(if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Schedule(args) => {
            let seed = args.seed.ok_or_else(|| anyhow::anyhow!("give --seed"))?;
            let kinds = schedule::parse_kinds(&args.faults).map_err(anyhow::Error::msg)?;
            for f in schedule::schedule(seed, &run::schedule_options(&args, &kinds)) {
                println!("{}", f.describe());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Faults => {
            for k in schedule::ALL {
                println!("{k}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Workload(args) => {
            workload::run_workload(args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ReadBack(args) => {
            workload::read_back(args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Proxy(args) => {
            proxy::run(args).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
