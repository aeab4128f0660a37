//! The `meridian` binary's commands: the options and entry point of each,
//! for `src/main.rs` to dispatch to. The services behind them stay inside
//! the crate; this is their one public door.

pub use crate::bench::{BenchArgs, run as bench};
pub use crate::coordinator::{CoordinatorArgs, run as coordinator};
pub use crate::ctl::{CtlArgs, run as ctl};
pub use crate::demo::{DemoArgs, run as demo};
pub use crate::limiter::cli::{LimiterArgs, run as limiter};
pub use crate::rules::cli::{RulesArgs, run as rules};
pub use crate::sim::cli::{SimulateArgs, run as simulate};
pub use crate::telemetry::{LogFormat, init_logs};
pub use crate::tls::certs::{CertsArgs, run as certs};
pub use crate::tls::install_crypto_provider;
pub use crate::traces::{DEFAULT_CHECK_RATIO, Exporter, Service};
