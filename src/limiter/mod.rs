//! The regional limiter: the engine (hot path) and the transports around it.

#[cfg(feature = "redis")]
pub mod batcher;
mod breaker;
mod cache;
pub(crate) mod check_metrics;
#[cfg(feature = "server")]
pub mod cli;
pub mod counters;
pub mod engine;
#[cfg(feature = "redis")]
mod flush_plan;
#[cfg(feature = "server")]
pub mod global;
#[cfg(feature = "server")]
pub mod grpc;
#[cfg(feature = "server")]
pub mod health;
#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "server")]
mod http_reserve;

pub use engine::{Engine, EngineConfig};
pub mod overrides;
pub mod reservation_id;
pub mod reserve;
pub mod reset;
#[cfg(feature = "server")]
pub mod reset_feed;
#[cfg(feature = "server")]
pub mod rls_json;
#[cfg(feature = "server")]
pub mod rule_feed;
pub mod rule_source;
pub mod service;
pub mod split;
mod stream_done;
pub mod value_metrics;
mod verdict;
#[cfg(feature = "server")]
pub mod workers;

pub use rule_source::RuleSource;
pub use verdict::{Source, Verdict};
