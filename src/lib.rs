//! Meridian: a multi-region rate limiter. See DESIGN.md for the architecture.
//!
//! The pure core (`algorithm`) decides; `store` keeps the state, embedded or in
//! Redis.
//!
//! Embedding the limiter in a Rust process: [`Limiter`] (see [`library`]).

pub mod algorithm;
pub mod allocation;
pub mod bench;
pub mod clock;
pub mod coordinator;
pub mod demo;
pub mod library;
pub mod limiter;
pub mod proto;
pub mod rules;
pub mod shutdown;
pub mod sim;
pub mod store;
pub mod tasks;
pub mod telemetry;

pub use library::Limiter;
