//! Compiles Envoy's rate-limit service protos (vendored in `proto/`) into
//! Rust with prost and tonic. `protox` parses them in Rust, so the build
//! needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "envoy/service/ratelimit/v3/rls.proto";
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile([root], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .compile_fds(descriptors)?;
    Ok(())
}
