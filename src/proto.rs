//! Generated protobuf and gRPC code (see build.rs and proto/).

#![allow(clippy::all)]

// Generated from Envoy's protos: their docs are the .proto comments, and many
// fields have none.
#[allow(missing_docs)]
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

/// The largest request a limiter sends a coordinator (a report: real ones
/// are kilobytes; the bounds a coordinator checks keep them far below).
pub const MAX_REPORT_BYTES: usize = 16 * 1024 * 1024;
/// The largest message a coordinator streams to a limiter: a region's
/// snapshot with every rule's key entries fits many times over. Both ends
/// set it, so neither falls back to tonic's 4 MiB default.
pub const MAX_UPDATE_BYTES: usize = 64 * 1024 * 1024;

/// Meridian's own APIs: the limiter (`Limiter`) and, with the coordinator, its services.
pub mod meridian {
    // Generated: the .proto comments become the docs, where they exist.
    #[allow(missing_docs)]
    pub mod v1 {
        tonic::include_proto!("meridian.v1");
    }
}

/// The per-message budget of a coordinator's watch stream (`--watch-message-bytes`):
/// an allocation update larger than this is sent in parts. Far below
/// [`MAX_UPDATE_BYTES`], so a limiter of an older build, whose limit was
/// tonic's 4 MiB default, still decodes every message.
pub const WATCH_MESSAGE_BUDGET: usize = 4 * 1024 * 1024 - 64 * 1024;

/// The most a limiter assembles from the parts of one allocation update:
/// a region's snapshot of 1,000 global rules with 1,000 key entries each is
/// well under it, a coordinator sending parts without end is not.
pub const MAX_ASSEMBLED_UPDATE_BYTES: usize = 512 * 1024 * 1024;

pub mod allocation_parts;
pub mod codec;
pub mod override_parts;

/// The per-region allocation update travels as `meridian.v1.AllocationUpdate`;
/// the coordinator builds it, the limiter reads it.
mod allocation_wire {
    use super::meridian::v1 as pb;
    use crate::allocation::table::{Now, RegionUpdate, RuleUpdate};

    impl From<&RegionUpdate> for pb::AllocationUpdate {
        fn from(u: &RegionUpdate) -> Self {
            pb::AllocationUpdate {
                epoch: u.epoch,
                valid_until_unix_ms: u.valid_until_ms,
                full: u.full,
                rules: u
                    .rules
                    .iter()
                    .map(|r| {
                        let key_now = r.key_now();
                        pb::RuleAllocation {
                            rule: r.rule.clone(),
                            limit: r.limit,
                            fallback: r.fallback,
                            split: r.split,
                            split_immediate: r.split_now.immediate,
                            split_shrink_now: r.split_now.shrink_now,
                            split_now_until_unix_ms: r.split_now.until_ms,
                            split_before: r.split_now.starting.map(|(v, _)| v),
                            split_before_until_unix_ms: r.split_now.starting.map_or(0, |(_, t)| t),
                            keys: r
                                .keys
                                .iter()
                                .map(|(key, value)| {
                                    let now = key_now(key);
                                    pb::KeyAllocation {
                                        key: key.clone(),
                                        value: *value,
                                        immediate: now.immediate,
                                        shrink_now: now.shrink_now,
                                        now_until_unix_ms: now.until_ms,
                                        before: now.starting.map(|(v, _)| v),
                                        before_until_unix_ms: now.starting.map_or(0, |(_, t)| t),
                                    }
                                })
                                .collect(),
                        }
                    })
                    .collect(),
                removed_rules: u.removed_rules.clone(),
                // Whole; the watch stream splits it if it must.
                part: 0,
                more: false,
            }
        }
    }

    fn starting(before: Option<u64>, until: i64) -> Option<(u64, i64)> {
        before.filter(|_| until > 0).map(|v| (v, until))
    }

    impl From<&pb::AllocationUpdate> for RegionUpdate {
        fn from(u: &pb::AllocationUpdate) -> Self {
            RegionUpdate {
                epoch: u.epoch,
                valid_until_ms: u.valid_until_unix_ms,
                full: u.full,
                rules: u
                    .rules
                    .iter()
                    .map(|r| RuleUpdate {
                        rule: r.rule.clone(),
                        limit: r.limit,
                        fallback: r.fallback,
                        split: r.split,
                        split_now: Now {
                            immediate: r.split_immediate,
                            shrink_now: r.split_shrink_now,
                            until_ms: r.split_now_until_unix_ms,
                            starting: starting(r.split_before, r.split_before_until_unix_ms),
                        },
                        keys: r.keys.iter().map(|k| (k.key.clone(), k.value)).collect(),
                        keys_now: r
                            .keys
                            .iter()
                            .filter(|k| k.immediate || k.shrink_now || k.before.is_some())
                            .map(|k| {
                                let now = Now {
                                    immediate: k.immediate,
                                    shrink_now: k.shrink_now,
                                    until_ms: k.now_until_unix_ms,
                                    starting: starting(k.before, k.before_until_unix_ms),
                                };
                                (k.key.clone(), now)
                            })
                            .collect(),
                    })
                    .collect(),
                removed_rules: u.removed_rules.clone(),
            }
        }
    }
}
