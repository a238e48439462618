//! Compiles the `.proto` files with the vendored `protoc` (no system protoc needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/meta.proto",
        "proto/datanode.proto",
        "proto/raft.proto",
        "proto/admin.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // Shard blocks decode as slices of the receive buffer, not copies: a
    // datanode's blocks are then exactly the bytes its credits count.
    config.bytes([".sluice.datanode.ShardBlock.data"]);
    // Messages holding a secret get a hand-written, redacting Debug
    // (proto/src/redact.rs), so a secret never reaches a log line.
    config.skip_debug([
        ".sluice.meta.AccessKey",
        ".sluice.raft.CreateAccessKey",
        ".sluice.admin.CreateKeyResponse",
    ]);
    tonic_prost_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
