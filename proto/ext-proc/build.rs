//! Generates Envoy's `envoy.service.ext_proc.v3` (and the packages it imports) from the
//! vendored protos in `proto/` with protoc (Debian `protobuf-compiler`; `PROTOC` overrides
//! its path). `google.protobuf` types map to prost-types (prost-build's default).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(
            &["proto/envoy/service/ext_proc/v3/external_processor.proto"],
            &["proto"],
        )?;
    Ok(())
}
