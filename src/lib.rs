//! Meridian: a multi-region rate limiter. The architecture is described in
//! `docs/architecture.md`.
//!
//! The pure core (`algorithm`) decides; `store` keeps the state, embedded or in
//! Redis.
//!
//! Embedding the limiter in a Rust process: [`Limiter`] (see [`library`]).
//! With `default-features = false` the crate is that library alone — the
//! limiter, the stores (`redis` adds the Redis store), the algorithms and the
//! rules; the `server` feature (on by default) adds the binary's services.

pub mod algorithm;
#[cfg(feature = "server")]
pub mod allocation;
#[cfg(feature = "server")]
pub mod bench;
pub mod clock;
#[cfg(feature = "server")]
pub mod coordinator;
#[cfg(feature = "server")]
pub mod demo;
pub mod library;
pub mod limiter;
#[cfg(feature = "server")]
pub mod proto;
pub mod rules;
#[cfg(feature = "server")]
pub mod shutdown;
#[cfg(feature = "server")]
pub mod sim;
pub mod store;
#[cfg(feature = "server")]
pub mod tasks;
#[cfg(feature = "server")]
pub mod telemetry;

pub use library::Limiter;
