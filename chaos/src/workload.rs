//! (stub until the workload lands)
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs { #[arg(long)] pub seed: u64 }
#[derive(Debug, Clone, clap::Args)]
pub struct ReadBackArgs { #[arg(long)] pub history: std::path::PathBuf }
pub async fn run_workload(_a: WorkloadArgs) -> anyhow::Result<()> { unimplemented!() }
pub async fn read_back(_a: ReadBackArgs) -> anyhow::Result<()> { unimplemented!() }
