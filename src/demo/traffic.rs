//! The demo's traffic: each region's share of every customer's demand,
//! swinging between the regions, sent as native checks, and what the world
//! admitted per minute for the summary lines.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::DemoArgs;
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1::limiter_client::LimiterClient;
use crate::proto::meridian::v1::{Check, CheckRequest};

#[derive(Default)]
pub(super) struct Stats {
    /// Keyed by Unix minute.
    pub(super) windows: Mutex<BTreeMap<i64, Window>>,
    pub(super) errors: AtomicU64,
}

/// What the demo counted in one printed window, to show the limit holding.
#[derive(Default, Clone)]
pub(super) struct Window {
    /// Per region.
    pub(super) asked: [u64; 2],
    /// Per region.
    pub(super) admitted: [u64; 2],
    /// Per customer, both regions: what the world admitted (≤ the limit).
    pub(super) per_customer: BTreeMap<String, u64>,
}

/// The share of each customer's traffic that mumbai sends, at time `t`:
/// a triangle wave between 80 % and 20 %.
pub(super) fn mumbai_share(elapsed: Duration, shift_every: Duration) -> f64 {
    let phase = elapsed.as_secs_f64() / shift_every.as_secs_f64().max(0.001);
    let up = phase % 2.0;
    let frac = if up < 1.0 { up } else { 2.0 - up };
    0.8 - 0.6 * frac
}

pub(super) async fn drive(
    url: String,
    region: usize,
    args: DemoArgs,
    started: Instant,
    stats: Arc<Stats>,
) {
    let mut client = loop {
        match LimiterClient::connect(url.clone()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut owed = vec![0.0f64; args.customers as usize];
    loop {
        tick.tick().await;
        let share = mumbai_share(started.elapsed(), args.shift_every);
        let mine = if region == 0 { share } else { 1.0 - share };
        let per_tick = args.demand as f64 / 60.0 / 20.0 * mine;
        let mut checks = Vec::new();
        for (c, owe) in owed.iter_mut().enumerate() {
            *owe += per_tick;
            while *owe >= 1.0 {
                *owe -= 1.0;
                checks.push(Check {
                    domain: "demo".into(),
                    rule: "per_customer".into(),
                    key: format!("cust-{}", c + 1),
                    cost: 1,
                    ..Default::default()
                });
            }
        }
        if checks.is_empty() {
            continue;
        }
        let asked = checks.len() as u64;
        let keys: Vec<String> = checks.iter().map(|c| c.key.clone()).collect();
        match client.check(CheckRequest { checks }).await {
            Ok(r) => {
                let decisions = r.into_inner().decisions;
                let window = now_unix_ms() / 60_000;
                let mut w = stats.windows.lock().unwrap_or_else(|p| p.into_inner());
                let entry = w.entry(window).or_default();
                entry.asked[region] += asked;
                for (key, d) in keys.into_iter().zip(&decisions) {
                    if d.allowed {
                        entry.admitted[region] += 1;
                        *entry.per_customer.entry(key).or_default() += 1;
                    }
                }
                while w.len() > 5 {
                    w.pop_first();
                }
            }
            Err(_) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
