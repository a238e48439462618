//! `placement-sim`: the gateway's placement and heal-target code over
//! simulated clusters (see [`sim`]). No cluster, no I/O:
//!
//! ```text
//! cargo run -p sluice-gateway --release --example placement-sim -- --nodes 1000 --zones 10
//! ```

use clap::Parser;

mod sim;

/// Placement at scale, simulated: the gateway's placement and heal-target code over simulated
/// clusters (--nodes x --zones, uneven --capacities-tb); prints markdown tables of per-node fill
/// deviation, shards moved when a node joins or leaves, and heal fan-out after a node loss with
/// the hours to re-protect it. No cluster, no I/O.
#[derive(Parser)]
#[command(name = "placement-sim")]
struct Cli {
    #[command(flatten)]
    options: sim::PlacementSimOptions,
}

fn main() -> anyhow::Result<()> {
    sluice_harness::init_logging();
    let options = Cli::parse().options;
    let shapes = sim::run(&options, |r| {
        tracing::info!(
            nodes = r.nodes,
            zones = r.zones,
            seconds = format!("{:.1}", r.seconds),
            "placement-sim: shape done"
        )
    })?;
    print!("{}", sim::render(&options, &shapes));
    Ok(())
}
