use std::time::Duration;

use clap::Parser;

use super::*;
use sluice_harness::fake_s3::FakeS3;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    options: MultipartPutOptions,
}

fn parse(args: &[&str]) -> Result<MultipartPutOptions, clap::Error> {
    let base = [
        "sluice-bench",
        "--endpoint",
        "http://127.0.0.1:1",
        "--access-key",
        "ak",
        "--secret-key",
        "sk",
    ];
    Cli::try_parse_from(base.iter().chain(args)).map(|c| c.options)
}

#[test]
fn flags_parse_like_warp() {
    let o = parse(&[
        "--concurrent",
        "5",
        "--parts",
        "100",
        "--part-size",
        "10MiB",
        "--part-concurrent",
        "1",
        "--duration",
        "30m",
        "--pids",
        "gateway=1,meta=2",
        "--delete-after",
        "--complete",
        "false",
    ])
    .expect("valid flags");
    assert_eq!(o.concurrent, 5);
    assert_eq!(o.parts, 100);
    assert_eq!(o.part_size.as_u64(), 10 * 1024 * 1024);
    assert_eq!(o.duration, Duration::from_secs(1800));
    assert!(o.delete_after);
    assert!(!o.complete);
    assert_eq!(o.region, "us-east-1");
    assert_eq!(o.max_attempts, 3);
    let targets = o.validate().expect("valid");
    assert_eq!(targets.len(), 2);

    let defaults = parse(&[]).expect("defaults");
    assert!(defaults.complete);
    assert!(!defaults.delete_after);
    assert_eq!(defaults.checksum, ChecksumMode::WhenSupported);
}

#[test]
fn validate_rejects_out_of_range_values() {
    for args in [
        &["--concurrent", "0"][..],
        &["--part-concurrent", "0"],
        &["--parts", "0"],
        &["--parts", "10001"],
        &["--part-size", "0"],
        &["--part-size", "6GiB"],
        &["--duration", "0s"],
        &["--max-attempts", "0"],
        &["--pids", "x=notapid"],
    ] {
        let o = parse(args).expect("parses");
        assert!(o.validate().is_err(), "{args:?} should be rejected");
    }
    assert!(parse(&["--duration", "forever"]).is_err());
    assert!(parse(&["--part-size", "lots"]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_against_fake_endpoint_counts_parts_errors_and_writes_outputs() {
    let fake = FakeS3::start(vec![], 7).await;
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse(&[
        "--concurrent",
        "2",
        "--parts",
        "4",
        "--part-size",
        "64KiB",
        "--part-concurrent",
        "2",
        "--duration",
        "2s",
        "--pids",
        "self",
        "--delete-after",
    ])
    .expect("flags");
    o.endpoint = fake.endpoint();
    o.out_dir = out.path().join("run");

    let summary = tokio::time::timeout(Duration::from_secs(60), run(o))
        .await
        .expect("in time")
        .expect("run");

    // Throughput figures are consistent with each other.
    assert!(summary.parts > 0, "{summary:?}");
    assert_eq!(summary.bytes, summary.parts * 64 * 1024);
    assert_eq!(summary.upload_part_latency.count, summary.parts);
    assert!((summary.elapsed_s - 2.0).abs() < 1e-6);
    assert!((summary.mib_per_s - summary.bytes as f64 / crate::stats::MIB / 2.0).abs() < 1e-9);
    // Every 7th UploadPart got SlowDown; each one is counted, and retried.
    let part_requests = fake.state.upload_part_requests.load(Ordering::Relaxed);
    assert!(part_requests >= 7, "only {part_requests} part requests");
    assert!(summary.slowdown >= 1);
    assert!(summary.slowdown <= part_requests / 7);
    assert_eq!(
        summary.errors_by_code.get(SLOW_DOWN).copied(),
        Some(summary.slowdown)
    );
    assert_eq!(
        summary.errors_total, summary.slowdown,
        "setup probes are not counted"
    );
    // Uploads completed and deleted, the rest left as is.
    let u = &summary.uploads;
    assert!(u.completed >= 1, "{u:?}");
    assert_eq!(u.completed, fake.state.completes.load(Ordering::Relaxed));
    assert!(
        u.deleted <= u.completed && u.completed - u.deleted <= 2,
        "{u:?}"
    );
    assert_eq!(
        u.started,
        u.completed + u.failed + u.left_open + u.unfinished
    );
    assert_eq!(u.failed, 0);
    // Payload buffers are reused: never more than concurrent x part_concurrent.
    assert!(
        summary.payload_buffers >= 1 && summary.payload_buffers <= 4,
        "{}",
        summary.payload_buffers
    );

    // Output files.
    let csv = std::fs::read_to_string(out.path().join("run/samples.csv")).expect("samples.csv");
    let (names, rows) = crate::samples::parse(&csv).expect("parse samples");
    assert_eq!(names, vec!["bench".to_owned()]);
    assert_eq!(rows.len(), 2, "one sample per second of a 2 s run:\n{csv}");
    assert!(rows[1].elapsed_s > rows[0].elapsed_s);
    assert!(
        rows.iter()
            .all(|r| r.rss_mib[0].is_some_and(|mib| mib > 1.0))
    );
    assert!(rows[1].ops_done <= summary.parts);
    assert_eq!(summary.processes[0].samples, 2);

    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("run/summary.json")).expect("summary.json"),
    )
    .expect("valid json");
    assert_eq!(json["parts"], summary.parts);
    assert_eq!(json["slowdown"], summary.slowdown);
    let svg = std::fs::read_to_string(out.path().join("run/chart.svg")).expect("chart.svg");
    assert!(svg.contains("bench") && svg.contains("MiB/s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_per_worker_ends_the_run_early_and_logs_completions() {
    let fake = FakeS3::start(vec![], 0).await;
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse(&[
        "--concurrent",
        "3",
        "--parts",
        "2",
        "--part-size",
        "32KiB",
        "--part-concurrent",
        "2",
        "--duration",
        "5m",
        "--uploads-per-worker",
        "2",
    ])
    .expect("flags");
    o.endpoint = fake.endpoint();
    o.out_dir = out.path().join("run");
    let log = Arc::new(CompletedLog::default());
    let hooks = RunHooks {
        completed: Some(Arc::clone(&log)),
        chart_title: Some("custom chart title".to_owned()),
        stop: None,
    };

    let summary = tokio::time::timeout(Duration::from_secs(60), run_with(o, hooks))
        .await
        .expect("ends when the workers are done, long before --duration")
        .expect("run");

    assert!(summary.elapsed_s < 60.0, "{}", summary.elapsed_s);
    assert_eq!(summary.uploads.started, 6);
    assert_eq!(summary.uploads.completed, 6);
    assert_eq!(summary.uploads.unfinished, 0);
    assert_eq!(summary.parts, 12);
    assert_eq!(fake.state.completes.load(Ordering::Relaxed), 6);
    let mut entries = log.entries();
    entries.sort_by_key(|e| (e.worker, e.upload));
    assert_eq!(entries.len(), 6);
    assert_eq!(log.dropped(), 0);
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.worker, e.upload))
            .collect::<Vec<_>>(),
        vec![(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)]
    );
    assert!(
        entries
            .iter()
            .all(|e| e.parts == 2 && e.part_size == 32 * 1024)
    );
    assert!(entries[0].key.ends_with("/w0/u1"), "{}", entries[0].key);
    // The last sample closes the partial second at the end of the run.
    let csv = std::fs::read_to_string(out.path().join("run/samples.csv")).expect("samples.csv");
    let (_, rows) = crate::samples::parse(&csv).expect("parse samples");
    let last = rows.last().expect("at least the closing sample");
    assert!((last.elapsed_s - summary.elapsed_s).abs() < 0.01, "{csv}");
    assert_eq!(last.ops_done, 12);
    let svg = std::fs::read_to_string(out.path().join("run/chart.svg")).expect("chart.svg");
    assert!(svg.contains("custom chart title"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_ends_an_unbounded_run_and_drops_the_workers() {
    let fake = FakeS3::start(vec![], 0).await;
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse(&[
        "--concurrent",
        "2",
        "--parts",
        "1000",
        "--part-size",
        "16KiB",
        "--duration",
        "10m",
        "--delete-after",
    ])
    .expect("flags");
    o.endpoint = fake.endpoint();
    o.out_dir = out.path().join("run");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let hooks = RunHooks {
        stop: Some(stop_rx),
        ..RunHooks::default()
    };
    let run = tokio::spawn(run_with(o, hooks));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_tx.send(true).expect("run still listening");
    let summary = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("ends soon after the stop, long before --duration")
        .expect("task")
        .expect("run");
    assert!(
        summary.elapsed_s >= 1.4 && summary.elapsed_s < 10.0,
        "{}",
        summary.elapsed_s
    );
    assert!(summary.parts > 0, "some parts went in before the stop");
    // The run waited for its workers to be dropped, but a part whose bytes
    // were already in the socket may still be counted by the fake server a
    // moment later: let it settle, then nothing may move.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let parts_at_stop = fake.state.upload_part_requests.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fake.state.upload_part_requests.load(Ordering::Relaxed),
        parts_at_stop,
        "no worker still uploads after the run returned"
    );
}

#[test]
fn uploads_per_worker_must_be_positive() {
    let o = parse(&["--uploads-per-worker", "0"]).expect("parses");
    assert!(o.validate().is_err());
    assert_eq!(
        parse(&["--uploads-per-worker", "3"])
            .expect("parses")
            .uploads_per_worker,
        Some(3)
    );
}
