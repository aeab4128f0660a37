//! Generated protobuf and gRPC code (see build.rs and proto/).

#![allow(clippy::all, missing_docs)]

pub mod envoy {
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
}

/// Meridian's own APIs: the limiter (`Limiter`) and, with the coordinator, its services.
pub mod meridian {
    pub mod v1 {
        tonic::include_proto!("meridian.v1");
    }
}
