//! `meridian simulate`: a deterministic discrete-event simulation of global
//! limits over the *real* rebalancer and enforcement code (docs/architecture.md).
//!
//! Virtual time only — no clock reads, no threads, no async. Traffic is
//! drawn from a seeded stream once per step and fed to every strategy
//! ([`Strategy`]) side by side, so their figures compare the same
//! requests; the ideal global counter is the reference for false rejections.
//! Everything written out is ordered (sorted maps, integer sums), so the same
//! scenario and seed give byte-identical files.
//!
//! - [`scenario`]: the TOML scenario format and its validation;
//! - `traffic`: per-customer, per-region demand;
//! - `enforce`: a region's counters (the simulated Redis), decided by the
//!   algorithm state machines with the allocation as the limit;
//! - `world`: pods, network, coordinator, events;
//! - [`output`]: the files a run writes: CSV, SVG and markdown;
//! - `cli`: the subcommand.

pub(crate) mod cli;
pub mod cost;
pub(crate) mod enforce;
pub mod output;
pub mod scenario;
pub(crate) mod traffic;
pub(crate) mod world;

use std::rc::Rc;

pub use scenario::{Scenario, ScenarioError};
pub use world::Strategy;

use world::{SimWorld, T0_MS};

/// A strategy keeps up after a shift once it admits this fraction of what
/// the ideal counter admits, for [`CATCH_UP_WINDOWS`] windows in a row.
pub(crate) const CATCH_UP_FRACTION: f64 = 0.95;
/// How many windows in a row a strategy must keep up for (see `CATCH_UP_FRACTION`).
pub(crate) const CATCH_UP_WINDOWS: usize = 3;

/// One clock-aligned window of one strategy, world-wide.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRow {
    /// From the simulation start.
    pub start_ms: i64,
    /// Hits requested in the window, all keys and regions.
    pub asked: u64,
    /// Hits this strategy admitted of them.
    pub admitted: u64,
    /// What the ideal counter admitted of the same requests.
    pub ideal: u64,
    /// Σ over keys of max(0, ideal − admitted).
    pub false_rejected: u64,
    /// The most one key admitted world-wide in this window.
    pub max_key_admitted: u64,
    /// Most admitted above the stated bound by one key (≤ 0: held).
    /// Token bucket: the excess over `B + R·T`, rounded up.
    pub bound_excess: i64,
    /// Hits admitted per region, in scenario region order.
    pub region_admitted: Vec<u64>,
    /// Hits key 0 (the heaviest customer) requested, all regions.
    pub key0_asked: u64,
    /// Hits key 0 was admitted.
    pub key0_admitted: u64,
    /// The largest allocation key 0 had per region during the window.
    pub key0_alloc: Vec<u64>,
}

/// One strategy's totals over the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Key-windows whose demand reached `L`.
    pub contended: u64,
    /// Σ admitted over contended key-windows (the mean overshoot's numerator).
    pub contended_admitted: u128,
    /// Σ min(admitted, L) over contended key-windows.
    pub contended_used: u128,
    /// Key-windows admitting more than `L`.
    pub over: u64,
    /// The most one key admitted in one window over the run.
    pub max_key_admitted: u64,
    /// Σ over windows of what the ideal counter admitted.
    pub ideal_admitted: u128,
    /// Σ over windows of `WindowRow::false_rejected`.
    pub false_rejected: u128,
    /// Hits admitted over the run.
    pub admitted: u128,
    /// Hits requested over the run.
    pub asked: u128,
    /// The largest `WindowRow::bound_excess` of the run (≤ 0: the bound held throughout).
    pub max_bound_excess: i64,
    /// Round trips paid to a global counter (ideal only), ms × checks.
    pub rtt_ms: u128,
    /// Checks made (the mean round trip's denominator).
    pub checks: u64,
}

/// What one strategy did with the run's traffic.
pub struct StrategyRun {
    /// The strategy simulated.
    pub strategy: Strategy,
    /// Cost scenarios: how calls were charged (over `meridian`'s
    /// allocations); `None` for the ideal counter and hit scenarios.
    pub charging: Option<cost::Charging>,
    /// One row per clock-aligned window of the rule's period, in time order.
    pub windows: Vec<WindowRow>,
    /// Totals over every window.
    pub summary: Summary,
}

/// The result of [`simulate`]: every strategy's figures over the same traffic.
pub struct Run {
    /// The scenario run (shared with the output writers).
    pub scenario: Rc<Scenario>,
    /// The seed the traffic was drawn with; same scenario and seed, same run.
    pub seed: u64,
    /// One per strategy, in [`Strategy::ALL`] order.
    pub runs: Vec<StrategyRun>,
}

impl Summary {
    fn pct(num: u128, den: u128) -> Option<f64> {
        (den > 0).then(|| num as f64 * 100.0 / den as f64)
    }

    pub fn max_overshoot_pct(&self, limit: u64) -> f64 {
        self.max_key_admitted as f64 * 100.0 / limit as f64
    }

    pub(crate) fn mean_overshoot_pct(&self, limit: u64) -> Option<f64> {
        Self::pct(
            self.contended_admitted,
            u128::from(self.contended) * u128::from(limit),
        )
    }

    pub(crate) fn windows_over_pct(&self) -> Option<f64> {
        Self::pct(u128::from(self.over), u128::from(self.contended))
    }

    pub fn false_rejections_pct(&self) -> Option<f64> {
        Self::pct(self.false_rejected, self.ideal_admitted)
    }

    pub(crate) fn capacity_used_pct(&self, limit: u64) -> Option<f64> {
        Self::pct(
            self.contended_used,
            u128::from(self.contended) * u128::from(limit),
        )
    }

    pub(crate) fn latency_ms(&self) -> f64 {
        if self.checks == 0 {
            0.0
        } else {
            self.rtt_ms as f64 / self.checks as f64
        }
    }
}

impl StrategyRun {
    /// The name reports and plots give the run.
    pub fn name(&self) -> &'static str {
        self.charging
            .map_or(self.strategy.name(), cost::Charging::name)
    }

    /// The run's place in the plots' palette: a hit scenario's strategies,
    /// or the ideal and then each way of charging.
    pub(crate) fn color_index(&self) -> usize {
        self.charging
            .map_or(self.strategy as usize, |c| 1 + c as usize)
    }

    /// Per demand shift: how long until the strategy keeps up with the ideal
    /// counter (`None`: it never does before the run ends).
    pub fn catch_up_ms(&self, shifts: &[i64]) -> Vec<Option<i64>> {
        let w = &self.windows;
        shifts
            .iter()
            .map(|&s| {
                let first = w.iter().rposition(|row| row.start_ms <= s)?;
                (first..w.len())
                    .find(|&i| {
                        w[i..(i + CATCH_UP_WINDOWS).min(w.len())]
                            .iter()
                            .all(|row| row.admitted as f64 >= CATCH_UP_FRACTION * row.ideal as f64)
                    })
                    .map(|i| (w[i].start_ms - s).max(0))
            })
            .collect()
    }
}

/// Runs every strategy on the scenario. `progress` is called with the
/// fraction done, a few hundred times per run at most.
pub fn simulate(scenario: Scenario, seed: u64, progress: &mut dyn FnMut(f64)) -> Run {
    let scenario = Rc::new(scenario);
    let s = &scenario;
    let keys: Rc<[String]> = (0..s.traffic.customers).map(|c| format!("c{c}")).collect();
    // A cost scenario compares ways of charging calls over Meridian's
    // allocations; otherwise, ways of dividing the limit.
    let plan: Vec<(Strategy, Option<cost::Charging>)> = match s.cost {
        Some(_) => std::iter::once((Strategy::Ideal, None))
            .chain(
                cost::Charging::ALL
                    .iter()
                    .map(|&c| (Strategy::Meridian, Some(c))),
            )
            .collect(),
        None => Strategy::ALL.iter().map(|&st| (st, None)).collect(),
    };
    let mut worlds: Vec<SimWorld> = plan
        .iter()
        .map(|&(strategy, charging)| {
            let world = SimWorld::new(scenario.clone(), strategy, seed, keys.clone());
            match charging {
                Some(c) => world.charging(c),
                None => world,
            }
        })
        .collect();
    let mut traffic = traffic::Traffic::new(s, seed);
    let mut costs = s.cost.as_ref().map(|c| cost::Costs::new(c, seed));
    let mut calls = cost::Calls::new();
    let mut batches = vec![Vec::new(); s.regions.len()];
    let mut runs: Vec<StrategyRun> = plan
        .iter()
        .map(|&(strategy, charging)| StrategyRun {
            strategy,
            charging,
            windows: Vec::new(),
            summary: Summary::default(),
        })
        .collect();
    let period = s.rule.period_ms;
    let mut window_start = 0;
    let report_every = (s.duration_ms / s.step_ms / 200).max(1) * s.step_ms;
    let mut t = 0;
    while t < s.duration_ms {
        if t > 0 && (T0_MS + t) % period == 0 {
            close_window(s, &mut worlds, &mut runs, window_start, t);
            window_start = t;
        }
        traffic.step(s, t, &mut batches);
        if let Some(costs) = costs.as_mut() {
            costs.draw(&batches, &mut calls);
        }
        for world in &mut worlds {
            world.step(t, &batches, costs.as_ref().map(|_| &calls));
        }
        t += s.step_ms;
        if t % report_every == 0 {
            progress(t as f64 / s.duration_ms as f64);
        }
    }
    close_window(s, &mut worlds, &mut runs, window_start, s.duration_ms);
    progress(1.0);
    Run {
        scenario: scenario.clone(),
        seed,
        runs,
    }
}

fn close_window(
    s: &Scenario,
    worlds: &mut [SimWorld],
    runs: &mut [StrategyRun],
    from: i64,
    to: i64,
) {
    let limit = s.rule.limit;
    let (ideal, others) = worlds.split_at_mut(1);
    let ideal = &ideal[0];
    for (i, run) in runs.iter_mut().enumerate() {
        let world = if i == 0 { ideal } else { &others[i - 1] };
        let mut row = WindowRow {
            start_ms: from,
            asked: 0,
            admitted: 0,
            ideal: 0,
            false_rejected: 0,
            max_key_admitted: 0,
            bound_excess: i64::MIN,
            region_admitted: world.acc.region_admitted.clone(),
            key0_asked: 0,
            key0_admitted: 0,
            key0_alloc: world.acc.key0_alloc.clone(),
        };
        let sum = &mut run.summary;
        // Every strategy saw the same requests, so the ideal's keys are all keys.
        for (key, &(asked, ideal_admitted)) in &ideal.acc.keys {
            let admitted = world.acc.keys.get(key).map_or(0, |e| e.1);
            row.asked += asked;
            row.admitted += admitted;
            row.ideal += ideal_admitted;
            row.false_rejected += ideal_admitted.saturating_sub(admitted);
            row.max_key_admitted = row.max_key_admitted.max(admitted);
            if s.rule.windowed() {
                let bound = limit + world.allowance(*key, from, to);
                row.bound_excess = row.bound_excess.max(admitted as i64 - bound as i64);
            }
            if asked >= limit {
                sum.contended += 1;
                sum.contended_admitted += u128::from(admitted);
                sum.contended_used += u128::from(admitted.min(limit));
            }
            sum.over += u64::from(admitted > limit);
            if *key == 0 {
                row.key0_asked = asked;
                row.key0_admitted = admitted;
            }
        }
        if !s.rule.windowed() {
            row.bound_excess = world.acc.bucket_excess.ceil() as i64;
        }
        if s.cost.is_some() {
            // Cost scenarios: the bound is on the tokens charged (settled),
            // not on the tokens calls consumed (which `admitted` counts).
            let bound = (limit + world.charge_allowance()) as i64;
            row.bound_excess = (world.acc.charged.values())
                .map(|&charged| charged - bound)
                .max()
                .unwrap_or(0);
        }
        if row.bound_excess == i64::MIN {
            row.bound_excess = 0;
        }
        sum.max_key_admitted = sum.max_key_admitted.max(row.max_key_admitted);
        sum.ideal_admitted += u128::from(row.ideal);
        sum.false_rejected += u128::from(row.false_rejected);
        sum.admitted += u128::from(row.admitted);
        sum.asked += u128::from(row.asked);
        sum.max_bound_excess = sum.max_bound_excess.max(row.bound_excess);
        sum.rtt_ms += world.acc.rtt_ms;
        sum.checks += world.acc.checks;
        run.windows.push(row);
    }
    for world in worlds.iter_mut() {
        let acc = &mut world.acc;
        acc.keys.clear();
        acc.region_admitted.iter_mut().for_each(|x| *x = 0);
        acc.key0_alloc.iter_mut().for_each(|x| *x = 0);
        acc.rtt_ms = 0;
        acc.checks = 0;
        acc.bucket_excess = 0.0;
        acc.charged.clear();
    }
}
