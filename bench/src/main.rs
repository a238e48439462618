//! `sluice-bench`: load generator for S3 endpoints. See the library docs
//! (`sluice_bench`) for what each subcommand does; this file only parses
//! the command line, starts tracing and prints the report.

use clap::{Parser, Subcommand};
use sluice_bench::heal::{self, HealOptions};
use sluice_bench::meta_load::{self, MetaLoadOptions};
use sluice_bench::multipart::{self, MultipartPutOptions};
use sluice_bench::objects::{self, GetOptions, ObjectOptions};
use sluice_bench::soak::{self, SoakOptions};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "Load generator for S3 endpoints (warp-style benchmarks)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// warp-style multipart-put: parallel multipart uploads of fresh random parts for a duration,
    /// with UploadPart latency, errors by S3 code, per-second server RSS samples and server CPU
    /// per part and per GiB.
    MultipartPut(Box<MultipartPutOptions>),
    /// warp-style put: --concurrent workers loop PutObject of fresh random --obj-size objects
    /// for --duration, with PutObject latency, errors by S3 code, server RSS per second and
    /// server CPU per op and per GiB; then deletes the objects (unless --keep).
    Put(Box<ObjectOptions>),
    /// warp-style get: writes --objects objects of --obj-size (untimed), then --concurrent
    /// workers loop GetObject of a random one, reading the whole body (a wrong length or ETag
    /// counts as an error), for --duration; reports like put, then deletes the objects
    /// (unless --keep).
    Get(Box<GetOptions>),
    /// Soak: start a multi-process Sluice cluster (meta, 6 datanodes, gateway), run the seed,
    /// SDK-default and overload shapes, print a PASS/FAIL verdict per shape, write verdict.json.
    /// Exits with status 1 when a shape fails.
    Soak(Box<SoakOptions>),
    /// Heal: start the soak cluster, write a seeded data set, kill and wipe a datanode, start
    /// it again and follow the gateway's heal (throughput, RSS, optional client load) until the
    /// node holds its share again; read everything back with two other nodes down; write
    /// heal/summary.json. Exits with status 1 on FAIL.
    Heal(Box<HealOptions>),
    /// Meta load: start three meta voters (separate processes), load --objects records through
    /// the metadata API and Raft, time PutObject, listings at the start, middle and end (with
    /// and without a delimiter), many-part pages and heads, then replace a follower (new id) and
    /// time its snapshot catch-up with the peak RSS of leader and new node; writes summary.json.
    MetaLoad(Box<MetaLoadOptions>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_harness::init_logging();
    match Cli::parse().command {
        Command::MultipartPut(options) => {
            let out_dir = options.out_dir.clone();
            let summary = multipart::run(*options).await?;
            print!("{}", summary.render_text());
            print_files(&out_dir);
        }
        Command::Put(options) => {
            let out_dir = options.out_dir.clone();
            let summary = objects::run_put(*options).await?;
            print!("{}", summary.render_text());
            print_files(&out_dir);
        }
        Command::Get(options) => {
            let out_dir = options.object.out_dir.clone();
            let summary = objects::run_get(*options).await?;
            print!("{}", summary.render_text());
            print_files(&out_dir);
        }
        Command::Soak(options) => {
            let verdict = options.out_dir.join("verdict.json");
            let report = soak::run(*options).await?;
            print!("{}", report.render());
            println!("  verdict:     {}", verdict.display());
            if !report.pass {
                anyhow::bail!("soak failed");
            }
        }
        Command::Heal(options) => {
            let summary = options.out_dir.join("heal").join("summary.json");
            let report = heal::run(*options).await?;
            print!("{}", report.render());
            println!("  summary:     {}", summary.display());
            if !report.pass {
                anyhow::bail!("heal benchmark failed");
            }
        }
        Command::MetaLoad(options) => {
            let summary = options.out_dir.join("summary.json");
            let report = meta_load::run(*options).await?;
            print!("{}", meta_load::render(&report));
            println!("  summary: {}", summary.display());
        }
    }
    Ok(())
}

/// The files line of the `multipart-put`, `put` and `get` reports.
fn print_files(out_dir: &std::path::Path) {
    println!(
        "  files:       {}, {}, {}",
        out_dir.join("samples.csv").display(),
        out_dir.join("summary.json").display(),
        out_dir.join("chart.svg").display()
    );
}
