//! Generates the protobuf messages from `proto/` with prost. The `.proto` files are parsed by
//! protox (pure Rust), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/logservice.proto",
        "proto/lock.proto",
        "proto/query.proto",
        "proto/moerr.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    for dependency in ["proto/metadata.proto", "proto/status.proto"] {
        println!("cargo:rerun-if-changed={dependency}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new()
        // Deterministic map order on the wire and in tests.
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
