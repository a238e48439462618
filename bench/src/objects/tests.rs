use std::time::Duration;

use clap::Parser;

use super::*;
use sluice_harness::fake_s3::FakeS3;

#[derive(Debug, Parser)]
struct PutCli {
    #[command(flatten)]
    options: ObjectOptions,
}

#[derive(Debug, Parser)]
struct GetCli {
    #[command(flatten)]
    options: GetOptions,
}

const BASE: [&str; 7] = [
    "sluice-bench",
    "--endpoint",
    "http://127.0.0.1:1",
    "--access-key",
    "ak",
    "--secret-key",
    "sk",
];

fn parse_put(args: &[&str]) -> Result<ObjectOptions, clap::Error> {
    PutCli::try_parse_from(BASE.iter().chain(args)).map(|c| c.options)
}

fn parse_get(args: &[&str]) -> Result<GetOptions, clap::Error> {
    GetCli::try_parse_from(BASE.iter().chain(args)).map(|c| c.options)
}

#[test]
fn flags_parse_like_warp() {
    let o = parse_put(&[
        "--obj-size",
        "4KiB",
        "--concurrent",
        "32",
        "--duration",
        "60s",
        "--pids",
        "meta=1,gw=2",
        "--keep",
        "--max-attempts",
        "1",
    ])
    .expect("valid flags");
    assert_eq!(o.obj_size.as_u64(), 4096);
    assert_eq!(o.concurrent, 32);
    assert_eq!(o.duration, Duration::from_secs(60));
    assert!(o.keep);
    assert_eq!(o.max_attempts, 1);
    assert_eq!(o.validate().expect("valid").len(), 2);

    let defaults = parse_put(&[]).expect("defaults");
    assert_eq!(defaults.obj_size.as_u64(), 10 * 1024 * 1024);
    assert_eq!(defaults.concurrent, 20);
    assert_eq!(defaults.duration, Duration::from_secs(300));
    assert!(!defaults.keep);
    assert_eq!(defaults.prefix, None);
    assert_eq!(defaults.max_attempts, 3);

    let g = parse_get(&["--obj-size", "1MiB", "--concurrent", "16"]).expect("get flags");
    let (targets, objects) = g.validate().expect("valid");
    assert!(targets.is_empty());
    assert_eq!(objects, 32, "default: 2 x --concurrent");
    let g = parse_get(&["--concurrent", "16", "--objects", "1"]).expect("get flags");
    assert_eq!(g.validate().expect("valid").1, 1);
    let g = parse_get(&["--obj-size", "100MiB", "--part-size", "10MiB"]).expect("get flags");
    assert!(g.validate().is_ok());
    assert_eq!(g.part_size.map(|p| p.as_u64()), Some(10 * 1024 * 1024));
    for (obj, part) in [("100MiB", "4MiB"), ("10MiB", "10MiB"), ("10MiB", "20MiB")] {
        let g = parse_get(&["--obj-size", obj, "--part-size", part]).expect("get flags");
        assert!(g.validate().is_err(), "--obj-size {obj} --part-size {part}");
    }
}

#[test]
fn validate_rejects_out_of_range_values() {
    for args in [
        &["--concurrent", "0"][..],
        &["--obj-size", "0"],
        &["--obj-size", "6GiB"],
        &["--duration", "0s"],
        &["--max-attempts", "0"],
        &["--pids", "gw=notapid"],
        &["--pids", "a=1,a=2"],
    ] {
        let o = parse_put(args).expect("parses");
        assert!(o.validate().is_err(), "put {args:?} should be rejected");
        let g = parse_get(args).expect("parses");
        assert!(g.validate().is_err(), "get {args:?} should be rejected");
    }
    for objects in ["0", "1000001"] {
        let g = parse_get(&["--objects", objects]).expect("parses");
        assert!(g.validate().is_err(), "--objects {objects}");
    }
    assert!(parse_put(&["--obj-size", "big"]).is_err());
    assert!(parse_put(&["--duration", "soon"]).is_err());
    assert!(parse_get(&["--objects", "-1"]).is_err());
    assert!(
        parse_put(&["--objects", "3"]).is_err(),
        "put has no --objects"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_against_fake_endpoint_reports_and_cleans_up() {
    let fake = FakeS3::start(vec![], 0).await;
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse_put(&[
        "--obj-size",
        "16KiB",
        "--concurrent",
        "2",
        "--duration",
        "2s",
        "--pids",
        "self",
    ])
    .expect("flags");
    o.endpoint = fake.endpoint();
    o.out_dir = out.path().join("run");

    let summary = tokio::time::timeout(Duration::from_secs(60), run_put(o))
        .await
        .expect("in time")
        .expect("run");

    assert_eq!(summary.benchmark, "put");
    assert_eq!(summary.operation, "PutObject");
    assert!(summary.ops > 0, "{summary:?}");
    assert_eq!(summary.bytes, summary.ops * 16 * 1024);
    assert_eq!(summary.latency.count, summary.ops);
    assert!(summary.first_byte_latency.is_none());
    assert!((summary.elapsed_s - 2.0).abs() < 1e-6);
    assert_eq!(summary.errors_total, 0, "setup probes are not counted");
    assert!(summary.key_prefix.starts_with("put/"));
    let puts = fake.state.put_object_requests.load(Ordering::Relaxed);
    assert!(puts >= summary.ops);
    // One buffer per worker, reused.
    assert!(
        (1..=4).contains(&summary.payload_buffers),
        "{}",
        summary.payload_buffers
    );
    // Every key a PutObject was started on is deleted; the fake holds none.
    let c = &summary.cleanup;
    assert!(!c.kept);
    // At most one PutObject per worker ended late or was dropped.
    assert!(
        c.keys >= summary.ops && c.keys <= summary.ops + 2,
        "{c:?} {}",
        summary.ops
    );
    assert_eq!((c.deleted, c.failed), (c.keys, 0));
    assert_eq!(fake.stored_objects(), 0);
    // CPU of the sampled process (this test binary).
    let cpu = &summary.server_cpu;
    assert_eq!(cpu.processes.len(), 1);
    assert_eq!(cpu.processes[0].name, "bench");
    assert!(cpu.processes[0].cpu_s.is_some());
    assert!(cpu.per_op_s.is_some() && cpu.per_gib_s.is_some());

    let csv = std::fs::read_to_string(out.path().join("run/samples.csv")).expect("samples.csv");
    assert!(csv.starts_with("elapsed_s,mib_per_s,ops_done,errors,rss_mib_bench\n"));
    let (names, rows) = crate::samples::parse(&csv).expect("parse samples");
    assert_eq!(names, vec!["bench".to_owned()]);
    assert_eq!(rows.len(), 2, "one sample per second of a 2 s run:\n{csv}");
    assert!(rows[1].ops_done <= summary.ops);
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("run/summary.json")).expect("summary.json"),
    )
    .expect("valid json");
    assert_eq!(json["benchmark"], "put");
    assert_eq!(json["ops"], summary.ops);
    assert_eq!(json["cleanup"]["deleted"], c.deleted);
    assert!(json["server_cpu"]["total_s"].is_number());
    let svg = std::fs::read_to_string(out.path().join("run/chart.svg")).expect("chart.svg");
    assert!(svg.contains("PutObject throughput"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_keep_leaves_the_objects() {
    let fake = FakeS3::start(vec![], 0).await;
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse_put(&[
        "--obj-size",
        "1KiB",
        "--concurrent",
        "2",
        "--duration",
        "1s",
        "--keep",
        "--prefix",
        "mine",
    ])
    .expect("flags");
    o.endpoint = fake.endpoint();
    o.out_dir = out.path().to_owned();
    let summary = tokio::time::timeout(Duration::from_secs(60), run_put(o))
        .await
        .expect("in time")
        .expect("run");
    assert!(summary.cleanup.kept);
    assert_eq!(summary.cleanup.deleted, 0);
    assert!(summary.key_prefix.starts_with("mine/"));
    let stored = fake.stored_objects() as u64;
    assert!(
        stored >= summary.ops && stored <= summary.cleanup.keys,
        "{stored} {:?}",
        summary.cleanup
    );
    assert_eq!(fake.state.deletes.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_seeded_objects_and_counts_short_bodies() {
    let fake = FakeS3::start(vec![], 0).await;
    // Every 4th GetObject answers one byte short.
    fake.state.short_every_nth_get.store(4, Ordering::Relaxed);
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse_get(&[
        "--obj-size",
        "8KiB",
        "--concurrent",
        "2",
        "--objects",
        "3",
        "--duration",
        "2s",
    ])
    .expect("flags");
    o.object.endpoint = fake.endpoint();
    o.object.out_dir = out.path().join("run");

    let summary = tokio::time::timeout(Duration::from_secs(60), run_get(o))
        .await
        .expect("in time")
        .expect("run");

    assert_eq!(summary.benchmark, "get");
    assert_eq!(summary.shape.objects, Some(3));
    // Seeding wrote the 3 objects and is not counted.
    assert_eq!(fake.state.put_object_requests.load(Ordering::Relaxed), 3);
    assert!(summary.ops > 0, "{summary:?}");
    assert_eq!(summary.bytes, summary.ops * 8 * 1024);
    assert_eq!(summary.latency.count, summary.ops);
    let first = summary.first_byte_latency.expect("get reports first byte");
    assert_eq!(first.count, summary.ops);
    assert!(first.p50_ms <= summary.latency.p50_ms);
    // The short bodies are errors, never successes.
    let short = summary
        .errors_by_code
        .get(BODY_LENGTH_MISMATCH)
        .copied()
        .unwrap_or(0);
    assert!(short >= 1, "{:?}", summary.errors_by_code);
    assert_eq!(summary.errors_total, short);
    let failed = summary
        .failed_requests
        .get("GetObject")
        .copied()
        .unwrap_or(0);
    assert!(failed >= 1 && failed <= short, "{failed} {short}");
    let gets = fake.state.get_object_requests.load(Ordering::Relaxed);
    assert!(gets >= summary.ops + short, "{gets}");
    // The seeded objects are deleted.
    assert_eq!(
        (summary.cleanup.keys, summary.cleanup.deleted),
        (3, 3),
        "{:?}",
        summary.cleanup
    );
    assert_eq!(fake.stored_objects(), 0);

    let text = summary.render_text();
    assert!(
        text.contains("GetObject:") && text.contains("first byte:"),
        "{text}"
    );
    let svg = std::fs::read_to_string(out.path().join("run/chart.svg")).expect("chart.svg");
    assert!(svg.contains("GetObject throughput"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_fails_when_it_cannot_write_its_objects() {
    let fake = FakeS3::start(vec![], 0).await;
    fake.state.fail_put_objects.store(true, Ordering::Relaxed);
    let out = tempfile::tempdir().expect("tempdir");
    let mut o = parse_get(&[
        "--objects",
        "2",
        "--concurrent",
        "1",
        "--max-attempts",
        "1",
        "--duration",
        "10m",
    ])
    .expect("flags");
    o.object.endpoint = fake.endpoint();
    o.object.out_dir = out.path().to_owned();
    let result = tokio::time::timeout(Duration::from_secs(60), run_get(o))
        .await
        .expect("fails at once, without a load phase");
    assert!(
        matches!(&result, Err(BenchError::Seed { key, .. }) if key.ends_with("/o0")),
        "{result:?}"
    );
    assert_eq!(fake.state.put_object_requests.load(Ordering::Relaxed), 1);
    assert_eq!(fake.state.get_object_requests.load(Ordering::Relaxed), 0);
    // The key it tried is deleted again.
    assert_eq!(fake.state.deletes.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_keys_batches_a_thousand_keys_a_request() {
    let fake = FakeS3::start(vec![], 0).await;
    {
        let mut objects = fake
            .state
            .objects
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for i in 0..2500 {
            objects.insert(format!("/b/k/{i}"), 1);
        }
    }
    let tally = Arc::new(ErrorTally::default());
    let client = crate::s3::build_client(
        &ClientOptions {
            endpoint: fake.endpoint(),
            ca_bundle: None,
            region: "us-east-1".into(),
            access_key: "ak".into(),
            secret_key: "sk".into(),
            max_attempts: 1,
            initial_backoff: Duration::from_millis(5),
            attempt_timeout: Duration::from_secs(10),
            checksum: ChecksumMode::WhenSupported,
        },
        tally,
    );
    let before = fake.state.requests.load(Ordering::Relaxed);
    let cleanup = delete_keys(&client, "b", (0..2500).map(|i| format!("k/{i}")), 2500).await;
    assert_eq!(
        cleanup,
        Cleanup {
            kept: false,
            keys: 2500,
            deleted: 2500,
            failed: 0
        }
    );
    assert_eq!(fake.state.requests.load(Ordering::Relaxed) - before, 3);
    assert_eq!(fake.stored_objects(), 0);
}
