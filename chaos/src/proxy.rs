//! (stub until the proxy lands)
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Toxics { pub latency_ms: u64, pub jitter_ms: u64, pub bandwidth_bytes_per_sec: Option<u64>, pub down: bool }
pub fn write_control(path: &Path, toxics: &Toxics) -> anyhow::Result<()> { std::fs::write(path, serde_json::to_string(toxics)?)?; Ok(()) }
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs { #[arg(long)] pub listen: SocketAddr, #[arg(long)] pub upstream: SocketAddr, #[arg(long)] pub control: PathBuf, #[arg(long, default_value_t = 1024)] pub max_connections: usize }
pub async fn run(_args: ProxyArgs) -> anyhow::Result<()> { unimplemented!() }
