//! Envoy's external processing protocol, `envoy.service.ext_proc.v3.ExternalProcessor`,
//! generated from the protos vendored in `proto/` (see `proto/SOURCE`): the messages the
//! batcher's endpoint picker reads and answers, and tonic's server and client.
//!
//! Only the ext_proc service and its import closure are compiled (18 files), not all of
//! Envoy's API; the wasm filter does not depend on this crate.

#[allow(clippy::all, missing_docs, rustdoc::all, dead_code)]
mod generated {
    pub mod envoy {
        pub mod config {
            pub mod core {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
                }
            }
        }
        pub mod extensions {
            pub mod filters {
                pub mod http {
                    pub mod ext_proc {
                        pub mod v3 {
                            include!(concat!(
                                env!("OUT_DIR"),
                                "/envoy.extensions.filters.http.ext_proc.v3.rs"
                            ));
                        }
                    }
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
            }
        }
        pub mod service {
            pub mod ext_proc {
                pub mod v3 {
                    include!(concat!(env!("OUT_DIR"), "/envoy.service.ext_proc.v3.rs"));
                }
            }
        }
    }
    pub mod xds {
        pub mod annotations {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/xds.annotations.v3.rs"));
            }
        }
        pub mod core {
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/xds.core.v3.rs"));
            }
        }
    }
    pub mod udpa {
        pub mod annotations {
            include!(concat!(env!("OUT_DIR"), "/udpa.annotations.rs"));
        }
    }
    pub mod validate {
        include!(concat!(env!("OUT_DIR"), "/validate.rs"));
    }
}

pub use generated::envoy::config::core::v3 as core;
pub use generated::envoy::extensions::filters::http::ext_proc::v3 as mode;
pub use generated::envoy::r#type::v3 as types;
pub use generated::envoy::service::ext_proc::v3 as ext_proc;
pub use prost;
pub use prost_types;

/// The gRPC service name (health checks name it).
pub const SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
