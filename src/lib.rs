//! Meridian: a multi-region rate limiter. The architecture is described in
//! `docs/architecture.md`.
//!
//! Embedding the limiter in a Rust process: [`Limiter`] (see [`embedded`]),
//! over a store from [`store`], with rules from [`rules`]; the algorithms
//! themselves are the pure state machines of [`algorithm`]. With
//! `default-features = false` the crate is that library alone (`redis` adds
//! the Redis store); the `server` feature (on by default) adds the binary's
//! services and the gRPC types ([`proto`]) a gateway or a test uses to call
//! the limiter and the coordinator.
//!
//! The binary's entry points (`commands`), the pure global-limit logic
//! (`allocation`) and the simulator (`sim`) are public only so that the
//! binary, the tests and the benchmarks reach them: they are hidden from
//! these docs and are no API to embed.

// Without the services, the engine's operational surface (gauges, lanes,
// the breaker's state, rule-file paths) has no caller in the crate: it is not
// dead in the build that ships the binary, where it is checked.
#![cfg_attr(not(feature = "server"), allow(dead_code))]
#![warn(missing_docs)]

pub mod algorithm;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod allocation;
#[cfg(feature = "server")]
mod bench;
mod clock;
#[cfg(feature = "server")]
mod cluster_id;
#[cfg(feature = "server")]
mod cockpit;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod commands;
#[cfg(feature = "server")]
mod coordinator;
#[cfg(feature = "server")]
mod ctl;
#[cfg(feature = "server")]
mod demo;
pub mod embedded;
mod limiter;
#[doc(hidden)]
pub mod overrides;
#[cfg(feature = "server")]
pub mod proto;
pub mod rules;
#[cfg(feature = "server")]
mod secret;
#[cfg(feature = "server")]
mod serve;
#[cfg(feature = "server")]
mod shutdown;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod sim;
#[cfg(feature = "server")]
mod slots;
pub mod store;
#[cfg(feature = "server")]
mod tasks;
#[cfg(feature = "server")]
mod telemetry;
#[cfg(feature = "server")]
mod tls;
#[cfg(feature = "server")]
mod traces;

pub use embedded::{BuildError, Builder, KeyOverride, Limiter, RuleHandle};
pub use limiter::reserve::{ReserveAnswer, SettleAnswer};
pub use limiter::reset::{Cleared, ResetError, ResetOutcome, ResetRule};
pub use limiter::{EngineConfig, Source, Verdict};
pub use store::reservation::{LimitSettled, ReservationError, Settle, Settled};
