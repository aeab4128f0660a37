//! The regional limiter: the engine (hot path) and the transports around it.

pub mod batcher;
mod breaker;
mod cache;
pub mod cli;
pub mod engine;
pub mod global;
pub mod grpc;
pub mod http;

pub use engine::{Check, Engine, EngineConfig, Source, Verdict};
pub mod rule_feed;
pub mod rule_source;
pub mod service;
pub mod split;
pub mod workers;

pub use rule_source::RuleSource;
pub use service::Limiter;
