//! The crate graph ARCHITECTURE.md draws: dependencies point down only
//! (binary -> roles -> meta-client -> proto/net/util), and no role crate
//! depends on another role's server crate outside its tests. The tools
//! drive Sluice from outside: the harness and chaos link no Sluice crate
//! at all, and bench only what its black-box benchmarks need.

use std::path::Path;

/// The Sluice crates a crate's `[dependencies]` name.
fn sluice_dependencies(krate: &str) -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("read {}: {e}", manifest.display()));
    let doc: toml::Table = text.parse().expect("Cargo.toml parses");
    let mut deps: Vec<String> = doc
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|t| {
            t.keys()
                .filter(|k| k.starts_with("sluice-"))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    deps.sort();
    deps
}

#[test]
fn roles_depend_on_the_contract_and_the_meta_client_only() {
    let contract = [
        "sluice-meta-client",
        "sluice-net",
        "sluice-proto",
        "sluice-util",
    ];
    for role in ["gateway", "datanode", "meta"] {
        assert_eq!(sluice_dependencies(role), contract, "{role}");
    }
    assert_eq!(
        sluice_dependencies("meta-client"),
        ["sluice-net", "sluice-proto", "sluice-util"]
    );
    assert!(sluice_dependencies("proto").is_empty());
    assert!(sluice_dependencies("net").is_empty());
    assert!(sluice_dependencies("util").is_empty());
}

#[test]
fn the_harness_and_chaos_link_no_sluice_crate() {
    assert!(
        sluice_dependencies("harness").is_empty(),
        "{:?}",
        sluice_dependencies("harness")
    );
    assert_eq!(sluice_dependencies("chaos"), ["sluice-harness"]);
}

#[test]
fn bench_links_no_role_crate() {
    // meta-client and proto: `meta-load` drives meta's API as a client.
    // The white-box simulations live beside their roles (`cargo run -p
    // sluice-gateway --example placement-sim`, `-p sluice-datanode
    // --example gc-pass`); the soak's copies of gateway constants are
    // checked against the gateway by a test (a dev-dependency).
    assert_eq!(
        sluice_dependencies("bench"),
        ["sluice-harness", "sluice-meta-client", "sluice-proto"]
    );
}
