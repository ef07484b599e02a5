//! Envoy's rate-limit service protocol, compiled from the vendored protos
//! (`proto/`) by `build.rs`: the messages, and the tonic server trait.
//! Only the packages `rls.proto` needs; the module tree mirrors them, as the
//! generated code's paths expect.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `envoy.*`.
pub mod envoy {
    /// `envoy.config.*`.
    pub mod config {
        /// `envoy.config.core.*`.
        pub mod core {
            /// `envoy.config.core.v3`: `HeaderValue` and what it imports.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
            }
        }
    }
    /// `envoy.extensions.*`.
    pub mod extensions {
        /// `envoy.extensions.common.*`.
        pub mod common {
            /// `envoy.extensions.common.ratelimit.*`.
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`: `RateLimitDescriptor`.
                pub mod v3 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/envoy.extensions.common.ratelimit.v3.rs"
                    ));
                }
            }
        }
    }
    /// `envoy.type.*`.
    pub mod r#type {
        /// `envoy.type.v3`.
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
    /// `envoy.service.*`.
    pub mod service {
        /// `envoy.service.ratelimit.*`.
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`: the service and its messages.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
            }
        }
    }
}

/// `udpa.*` annotations.
pub mod udpa {
    /// `udpa.annotations`.
    pub mod annotations {
        include!(concat!(env!("OUT_DIR"), "/udpa.annotations.rs"));
    }
}

/// `validate` (protoc-gen-validate's rules).
pub mod validate {
    include!(concat!(env!("OUT_DIR"), "/validate.rs"));
}

/// `xds.*`.
pub mod xds {
    /// `xds.annotations.*`.
    pub mod annotations {
        /// `xds.annotations.v3`.
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/xds.annotations.v3.rs"));
        }
    }
    /// `xds.core.*`.
    pub mod core {
        /// `xds.core.v3`.
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/xds.core.v3.rs"));
        }
    }
}

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::{rate_limit_descriptor, RateLimitDescriptor};
pub use envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit,
};
pub use envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
pub use envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
