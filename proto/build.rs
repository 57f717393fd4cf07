//! Generates the cohort.v1 code from `cohort.proto` with protoc (Debian `protobuf-compiler`,
//! installed by `scripts/setup`; `PROTOC` overrides its path).
//!
//! Without the `grpc` feature only prost messages are generated, which build for wasm32;
//! with it, tonic's client and server as well.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=cohort.proto");
    if std::env::var_os("CARGO_FEATURE_GRPC").is_some() {
        #[cfg(feature = "grpc")]
        tonic_build::configure()
            .build_server(true)
            .build_client(true)
            .compile_protos(&["cohort.proto"], &["."])?;
    } else {
        prost_build::compile_protos(&["cohort.proto"], &["."])?;
    }
    Ok(())
}
