//! The data plane in virtual time: each step's requests served by the
//! pods against their region's counters, what they admitted counted for the
//! window, and the stated bounds' allowance checked against it.

use rand::Rng;

use super::{Event, RULE, SimWorld, Strategy, abs, abs_us};
use crate::algorithm::Algorithm;
use crate::allocation::pod::{Decided, ResetTells};
use crate::sim::traffic::Batch;

impl SimWorld {
    pub(super) fn serve(&mut self, t: i64, batches: &[Batch]) {
        let now_ms = abs(t);
        let now_us = abs_us(t);
        let s = self.scenario.clone();
        let period = s.rule.period_ms;
        let fixed_window = s.rule.algorithm == Algorithm::FixedWindow;
        // A step's checks are spread over it: the pods count them at its
        // last millisecond (still the same window and period, as steps
        // divide the period), so a top-up's pace since a report covers the
        // step's own span too.
        let counted_at = now_ms + s.step_ms - 1;
        let window_end = (now_ms.div_euclid(period) + 1) * period;
        // Pods that asked for a top-up: they report once the step's checks
        // are counted, as a limiter's reporter wakes for them.
        let mut asked_top_up = Vec::new();
        for (r, spec) in s.regions.iter().enumerate() {
            let pods = spec.pods;
            // Key 0's allocation here, for the plots.
            let alloc0 = match self.strategy {
                Strategy::Ideal => s.rule.limit,
                Strategy::Static => self.regions[r].static_share,
                _ if self.failed(r, t) => 0,
                _ => self.regions[r].pods[0]
                    .table
                    .limit(RULE, &self.keys[0], now_ms)
                    .unwrap_or(0),
            };
            self.acc.key0_alloc[r] = self.acc.key0_alloc[r].max(alloc0);
            for &(key, n) in &batches[r] {
                let n = u64::from(n);
                let mut admitted = 0;
                if let Some(ideal) = self.ideal.as_mut() {
                    let params = self.params.get(s.rule.limit);
                    admitted = ideal.admit(key, n, params, now_us).0;
                    self.acc.rtt_ms += u128::from(n) * 2 * spec.latency_ms as u128;
                } else {
                    let mut split = [0u64; 64];
                    if n >= pods as u64 {
                        let base = n / pods as u64;
                        let first = self.rng.random_range(0..pods);
                        for (p, slot) in split.iter_mut().take(pods).enumerate() {
                            let extra = ((p + pods - first) % pods) < (n % pods as u64) as usize;
                            *slot = base + u64::from(extra);
                        }
                    } else {
                        for _ in 0..n {
                            split[self.rng.random_range(0..pods)] += 1;
                        }
                    }
                    for (p, &k) in split.iter().take(pods).enumerate() {
                        if k == 0 {
                            continue;
                        }
                        let region = &mut self.regions[r];
                        let limit = match self.strategy {
                            Strategy::Static => region.static_share,
                            _ => region.pods[p]
                                .table
                                .limit(RULE, &self.keys[key as usize], now_ms)
                                .unwrap_or(0),
                        };
                        let (got, remaining) =
                            region
                                .counters
                                .admit(key, k, self.params.get(limit), now_us);
                        admitted += got;
                        if self.coordinator.is_none() {
                            continue;
                        }
                        let mut decided = Decided {
                            rule: RULE,
                            key: &self.keys[key as usize],
                            period_ms: period as u64,
                            cost: got,
                            allowed: true,
                            limit,
                            remaining,
                            reset_after_us: (window_end - counted_at).max(0) as u64 * 1_000,
                            window_use: true,
                            // Counted when decided: only a fixed window's
                            // reset (its end, given here) places it.
                            reset_tells: if fixed_window {
                                ResetTells::WindowEnd
                            } else {
                                ResetTells::Nothing
                            },
                            counted: fixed_window,
                            windowed: s.rule.windowed(),
                        };
                        let account = &mut region.pods[p].account;
                        let mut topped = got > 0 && account.record(&decided, counted_at);
                        if k > got {
                            (decided.cost, decided.allowed) = (k - got, false);
                            topped |= account.record(&decided, counted_at);
                        }
                        if topped && self.strategy == Strategy::Meridian && s.coordinator.top_up {
                            asked_top_up.push((r, p));
                        }
                    }
                }
                if !s.rule.windowed() {
                    *self.step_hits.entry(key).or_default() += admitted;
                }
                self.acc.checks += n;
                self.acc.region_admitted[r] += admitted;
                let e = self.acc.keys.entry(key).or_default();
                e.0 += n;
                e.1 += admitted;
            }
        }
        self.send_top_ups(t, asked_top_up);
        if !s.rule.windowed() {
            self.check_bucket(t);
        }
    }

    /// Pods `(region, pod)` that asked for a top-up report once the step's
    /// checks are counted, as a limiter's reporter wakes for them.
    pub(super) fn send_top_ups(&mut self, t: i64, mut asked: Vec<(usize, usize)>) {
        asked.sort_unstable();
        asked.dedup();
        for (r, p) in asked {
            let report = self.pod_report(r, p, t, false);
            if self.link(r, t) {
                let at = t + self.latency(r);
                self.schedule(at, Event::Report { region: r, report });
            }
        }
    }

    /// What the stated bounds (docs/architecture.md) let the world admit
    /// above `L` for `key` in the window `[from, to)`: with `partition: available`, the allocation a cut-off
    /// region held when it went silent, for at most one lease after.
    pub fn allowance(&self, key: u32, from: i64, to: i64) -> u64 {
        let c = &self.scenario.coordinator.config;
        self.cuts
            .iter()
            .filter(|cut| from < cut.from_ms + c.lease_ms + c.skew_margin_ms && to > cut.from_ms)
            .map(|cut| {
                cut.tables
                    .iter()
                    .filter_map(|t| t.limit(RULE, &self.keys[key as usize], abs(cut.from_ms)))
                    .max()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Token bucket bound: world-wide admitted over any interval T is at most
    /// `B + R·T`. Admissions happen at step instants, so for steps i < j the
    /// hits admitted in steps i+1..=j span T = t_j − t_{i+1}.
    pub(super) fn check_bucket(&mut self, t: i64) {
        let s = &self.scenario;
        let rate = s.rule.limit as f64 / s.rule.period_ms as f64;
        let burst = s.rule.burst.unwrap_or(s.rule.limit) as f64;
        let step = s.step_ms as f64;
        for (&key, &this) in &self.step_hits {
            let (total, low) = self.bucket.entry(key).or_insert((0, f64::INFINITY));
            // Every step the key was idle lowers total − R·t; the lowest of
            // those is the one just before this step.
            let before = *total as f64 - rate * (t as f64 - step);
            *low = low.min(before);
            *total += this;
            let excess = (*total as f64 - rate * t as f64) - *low - (burst - rate * step);
            if excess > 1e-6 && excess > self.acc.bucket_excess {
                self.acc.bucket_excess = excess;
            }
        }
        self.step_hits.clear();
    }
}
