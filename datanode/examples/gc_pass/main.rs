//! `gc-pass`: one datanode GC pass over a real store of many shard files
//! (see [`gc`]):
//!
//! ```text
//! cargo run -p sluice-datanode --release --example gc-pass -- --work-dir /mnt/x --out-dir out
//! ```

use clap::Parser;

mod gc;

/// One datanode GC pass: write --shards (default 1 M) 21-byte shard files into a real DiskStore
/// (untimed), time one pass of the datanode's GC code with an in-memory twin of meta's
/// Collectable answering --unreferenced-percent of them collectable, at --gc-max-ops-per-sec;
/// report time, shards listed and deleted, peak RSS; check that exactly the unreferenced shards
/// are gone (exit status 1 otherwise); write summary.json.
#[derive(Parser)]
#[command(name = "gc-pass")]
struct Cli {
    #[command(flatten)]
    options: gc::GcPassOptions,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_harness::init_logging();
    let options = Cli::parse().options;
    let summary = options.out_dir.join("summary.json");
    let report = gc::run(options).await?;
    print!("{}", gc::render(&report));
    println!("  summary: {}", summary.display());
    Ok(())
}
