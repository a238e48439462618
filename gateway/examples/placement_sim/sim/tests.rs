//! Unit tests of [`super`]: flag checks, the fill arithmetic on a hand-made
//! cluster, and small seeded runs of the whole simulation.

use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    options: PlacementSimOptions,
}

fn options(args: &[&str]) -> PlacementSimOptions {
    let mut argv = vec!["placement-sim"];
    argv.extend_from_slice(args);
    Cli::parse_from(argv).options
}

fn small() -> PlacementSimOptions {
    options(&[
        "--nodes",
        "12",
        "--zones",
        "3",
        "--blobs",
        "3000",
        "--move-blobs",
        "3000",
        "--refresh-blobs",
        "100",
        "--threads",
        "2",
    ])
}

#[test]
fn shapes_skip_zones_above_the_node_count() {
    let o = options(&["--nodes", "12,100", "--zones", "3,50"]);
    assert_eq!(shapes(&o), Ok(vec![(12, 3), (100, 3), (100, 50)]));
}

#[test]
fn shapes_refuse_bad_flags() {
    let too_few = options(&["--nodes", "5"]);
    assert_eq!(
        shapes(&too_few),
        Err(SimError::TooFewNodes {
            nodes: 5,
            shards: 6
        })
    );
    for args in [
        &["--fill", "0.5,0.25"][..],
        &["--fill", "1.0"],
        &["--capacities-tb", "0"],
        &["--zones", "0"],
        &["--blobs", "0"],
    ] {
        assert!(
            matches!(shapes(&options(args)), Err(SimError::Invalid { .. })),
            "{args:?}"
        );
    }
}

#[test]
fn fill_stats_are_relative_to_the_cluster_fill() {
    let node = |id, zone: &str, tb: f64| SimNode {
        id,
        zone: zone.into(),
        capacity: (tb * TB) as u64,
    };
    let nodes = [node(1, "a", 10.0), node(2, "b", 20.0)];
    // Cluster fill 15/30 = 0.5; node 1 at 0.6 (+20 %), node 2 at 0.45 (−10 %).
    let used = [(6.0 * TB) as u64, (9.0 * TB) as u64];
    let f = fill_stats("live", &nodes, &used, (TB / 1000.0) as u64, 0);
    assert!((f.cluster_fill - 0.5).abs() < 1e-9);
    assert!((f.max_dev - 0.2).abs() < 1e-9, "{f:?}");
    assert!((f.sd_dev - (0.025f64).sqrt()).abs() < 1e-9, "{f:?}");
    assert_eq!(f.by_capacity.len(), 2);
    assert!((f.by_capacity[0].0 - 10.0).abs() < 1e-9);
    assert!((f.by_capacity[1].1 + 0.1).abs() < 1e-9);
    assert_eq!(f.worst_zone.0, "a");
    // 6000 and 9000 shards: noise sqrt((1/6000 + 1/9000) / 2).
    let noise = ((1.0 / 6000.0 + 1.0 / 9000.0) / 2.0f64).sqrt();
    assert!((f.noise_sd - noise).abs() < 1e-9, "{f:?}");
}

#[test]
fn a_small_run_places_moves_and_heals() {
    let o = small();
    let r = run_shape(&o, 12, 3).expect("12 nodes hold 6 shards");
    // One row per --fill level, then the frozen placement and the
    // rebalance target.
    assert_eq!(r.fill.len(), o.fill.len() + 2);
    assert_eq!(r.fill[o.fill.len()].weights, "frozen");
    let live_last = &r.fill[o.fill.len() - 1];
    assert_eq!(live_last.blobs, 3000);
    assert!(
        (live_last.cluster_fill - 0.75).abs() < 0.01,
        "{live_last:?}"
    );
    // Rendezvous: what moves is at least what the new node takes, and
    // with these caps not much more.
    let mv = &r.moves;
    assert!(
        mv.add_optimum > 0.0 && mv.add_moved >= mv.add_optimum,
        "{mv:?}"
    );
    assert!(mv.add_moved <= 2.0 * mv.add_optimum, "{mv:?}");
    assert!(mv.remove_moved >= mv.remove_optimum && mv.remove_optimum > 0.0);
    assert!(mv.remove_moved <= 2.0 * mv.remove_optimum, "{mv:?}");
    // Heal: every lost shard found a target, read from k others each.
    let h = &r.heal;
    assert!(h.lost_shards > 0);
    assert_eq!(h.unplaced, 0);
    assert!(h.readers >= o.data_shards && h.readers <= 11, "{h:?}");
    assert!(h.writers >= 1 && h.writers <= 11, "{h:?}");
    assert!(h.hours_nodes >= h.hours_ideal, "{h:?}");
}

#[test]
fn runs_are_deterministic_per_seed() {
    let o = small();
    let a = run_shape(&o, 12, 3).expect("runs");
    let b = run_shape(&o, 12, 3).expect("runs");
    assert_eq!(a.fill, b.fill);
    assert_eq!(a.moves, b.moves);
    assert_eq!(a.heal, b.heal);
    let text = render(&o, &[a]);
    assert!(text.contains("| 12 | 3 | live | 3000 |"), "{text}");
}

#[test]
fn even_zones_give_every_zone_the_same_mix() {
    let o = options(&["--even-zones"]);
    let cl = cluster(&o, 24, 3);
    for z in 0..3 {
        let mut caps: Vec<u64> = cl
            .iter()
            .filter(|c| c.zone == zone_name(z))
            .map(|c| c.capacity)
            .collect();
        caps.sort_unstable();
        let tb: Vec<u64> = caps.iter().map(|c| c / 1_000_000_000_000).collect();
        assert_eq!(tb, [4, 4, 8, 8, 16, 16, 20, 20], "zone {z}");
    }
}
