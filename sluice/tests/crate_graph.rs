//! The crate graph ARCHITECTURE.md draws: dependencies point down only
//! (binary -> roles -> meta-client -> proto/net/util), and no role crate
//! depends on another role's server crate outside its tests.

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
