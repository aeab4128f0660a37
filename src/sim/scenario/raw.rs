//! The scenario file's format: TOML as written, every field optional that
//! has a default, unknown fields refused. [`RawScenario::validate`] turns
//! it into a [`Scenario`](super::Scenario).

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    pub(super) name: String,
    #[serde(default)]
    pub(super) description: String,
    pub(super) duration_s: i64,
    pub(super) step_ms: Option<i64>,
    pub(super) rule: RawRule,
    #[serde(default)]
    pub(super) coordinator: RawCoordinator,
    pub(super) region: Vec<RawRegion>,
    pub(super) traffic: RawTraffic,
    pub(super) cost: Option<RawCost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCost {
    pub(super) estimate: i64,
    pub(super) median: f64,
    pub(super) sigma: f64,
    pub(super) max_cost: i64,
    pub(super) settle_min_s: f64,
    pub(super) settle_max_s: f64,
    pub(super) max_overdraft: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) algorithm: String,
    pub(super) limit: i64,
    pub(super) period_s: i64,
    pub(super) burst: Option<i64>,
    pub(super) partition: Option<String>,
    pub(super) fallback: Option<f64>,
    pub(super) fallback_hold_s: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCoordinator {
    pub(super) rebalance_interval_s: Option<i64>,
    pub(super) round_lead_ms: Option<i64>,
    pub(super) report_interval_s: Option<i64>,
    pub(super) report_interval_ms: Option<i64>,
    pub(super) report_jitter: Option<f64>,
    pub(super) report_loss: Option<f64>,
    pub(super) report_late_ms: Option<i64>,
    pub(super) top_n: Option<usize>,
    pub(super) top_up: Option<bool>,
    pub(super) lease_s: Option<i64>,
    pub(super) suspect_after_s: Option<i64>,
    pub(super) skew_margin_ms: Option<i64>,
    pub(super) ewma_alpha: Option<f64>,
    pub(super) headroom: Option<f64>,
    pub(super) floor: Option<f64>,
    pub(super) hysteresis: Option<f64>,
    pub(super) max_shift: Option<f64>,
    pub(super) max_key_entries: Option<usize>,
    #[serde(default)]
    pub(super) outages: Vec<RawSpan>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegion {
    pub(super) name: String,
    pub(super) weight: Option<f64>,
    pub(super) pods: Option<usize>,
    pub(super) latency_ms: Option<i64>,
    #[serde(default)]
    pub(super) partitions: Vec<RawSpan>,
    #[serde(default)]
    pub(super) failures: Vec<RawSpan>,
    pub(super) peak_hour: Option<f64>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSpan {
    pub(super) from_s: i64,
    pub(super) to_s: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTraffic {
    pub(super) customers: usize,
    pub(super) zipf: Option<f64>,
    pub(super) rate: f64,
    pub(super) shape: Option<String>,
    pub(super) mix: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    pub(super) shift: Vec<RawShift>,
    #[serde(default)]
    pub(super) surge: Vec<RawSurge>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShift {
    pub(super) at_s: i64,
    pub(super) mix: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSurge {
    pub(super) from_s: i64,
    pub(super) to_s: i64,
    pub(super) region: Option<String>,
    pub(super) customers: Option<Vec<usize>>,
    pub(super) factor: f64,
}
