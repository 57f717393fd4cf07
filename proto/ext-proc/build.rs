//! Generates Envoy's `envoy.service.ext_proc.v3` (and the packages it imports) from the
//! vendored protos in `proto/` with protoc (Debian `protobuf-compiler`; `PROTOC` overrides
//! its path). `google.protobuf` types map to prost-types (prost-build's default).
//!
//! The generated code carries no comments: Envoy's proto comments hold indented blocks
//! and RST that rustdoc would run as Rust doc-tests. The vendored `.proto` files are the
//! documentation.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut config = prost_build::Config::new();
    config.disable_comments(["."]);
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .disable_comments(".")
        .compile_protos_with_config(
            config,
            &["proto/envoy/service/ext_proc/v3/external_processor.proto"],
            &["proto"],
        )?;
    Ok(())
}
