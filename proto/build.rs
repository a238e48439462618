//! Compiles the `.proto` files with the vendored `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let protos = ["proto/meta.proto", "proto/datanode.proto", "proto/raft.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .protoc_executable(protoc)
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
