//! The data plane of cost scenarios (`sim::cost`): each call decided by a
//! pod against its region's counter at the pod's allocation, counted for
//! the demand report as the limiter counts a reservation, and settled when
//! its cost is known — the ideal counter instead admits a call when its
//! tokens fit.

use rand::Rng;

use super::{RULE, SimWorld, abs, abs_us};
use crate::algorithm::{Algorithm, settle};
use crate::allocation::pod::{Decided, ResetTells, Settlement};
use crate::sim::cost::{Calls, Charging, Pending, settle_call};
use crate::sim::traffic::Batch;

impl SimWorld {
    /// Serves one step's calls (`calls[r][i]`: the calls of `batches[r][i]`).
    pub(super) fn serve_calls(&mut self, t: i64, batches: &[Batch], calls: &Calls) {
        let s = self.scenario.clone();
        let Some(cost) = s.cost.as_ref() else {
            return;
        };
        let (now_ms, now_us) = (abs(t), abs_us(t));
        let period = s.rule.period_ms;
        let fixed_window = s.rule.algorithm == Algorithm::FixedWindow;
        let counted_at = now_ms + s.step_ms - 1;
        let window_end = (now_ms.div_euclid(period) + 1) * period;
        let mut asked_top_up = Vec::new();
        for (r, spec) in s.regions.iter().enumerate() {
            let alloc0 = match self.ideal {
                Some(_) => s.rule.limit,
                None if self.failed(r, t) => 0,
                None => self.regions[r].pods[0]
                    .table
                    .limit(RULE, &self.keys[0], now_ms)
                    .unwrap_or(0),
            };
            self.acc.key0_alloc[r] = self.acc.key0_alloc[r].max(alloc0);
            for (i, &(key, _)) in batches[r].iter().enumerate() {
                for call in calls[r].get(i).map_or(&[][..], Vec::as_slice) {
                    let (admitted, charged) = match (self.charging, self.ideal.as_mut()) {
                        (None, Some(ideal)) => {
                            self.acc.rtt_ms += 2 * spec.latency_ms as u128;
                            // All of a call or none: it is not divisible.
                            let ok = self.params.get(s.rule.limit).is_some_and(|params| {
                                let state = ideal.state(key);
                                state.decide(now_us, call.tokens, params).decision.allowed
                            });
                            (ok, if ok { call.tokens } else { 0 })
                        }
                        (Some(charging), _) => {
                            let p = self.rng.random_range(0..spec.pods);
                            let limit = self.regions[r].pods[p]
                                .table
                                .limit(RULE, &self.keys[key as usize], now_ms)
                                .unwrap_or(0);
                            let params = self.params.get(limit).cloned();
                            let state = self.regions[r].counters.state(key);
                            let (allowed, remaining, charged) = match (&params, charging) {
                                (None, _) => (false, 0, 0),
                                // Admitted while the budget is not spent.
                                (Some(params), Charging::After) => {
                                    let d = state.decide(now_us, 0, params).decision;
                                    (d.remaining > 0, d.remaining, 0)
                                }
                                (Some(params), _) => {
                                    let d = state.decide(now_us, cost.estimate, params).decision;
                                    let charged = if d.allowed { cost.estimate } else { 0 };
                                    (d.allowed, d.remaining, charged)
                                }
                            };
                            if allowed && charging != Charging::Estimate {
                                self.seq += 1;
                                let due = t + call.settle_after_ms;
                                let pending = Pending {
                                    region: r,
                                    pod: p,
                                    key,
                                    charged_at_us: now_us,
                                    tokens: call.tokens,
                                };
                                self.pending.insert((due, self.seq), pending);
                            }
                            // Counted as the limiter counts a reservation:
                            // a check of the estimate; "charge after" has
                            // charged nothing yet (its tokens count when
                            // they are charged), a denial is demand asked.
                            let counted = match charging {
                                Charging::After if allowed => 0,
                                _ => cost.estimate,
                            };
                            let decided = Decided {
                                rule: RULE,
                                key: &self.keys[key as usize],
                                period_ms: period as u64,
                                cost: counted,
                                allowed,
                                limit,
                                remaining,
                                reset_after_us: (window_end - counted_at).max(0) as u64 * 1_000,
                                window_use: true,
                                reset_tells: if fixed_window {
                                    ResetTells::WindowEnd
                                } else {
                                    ResetTells::Nothing
                                },
                                counted: fixed_window,
                                windowed: true,
                            };
                            let account = &mut self.regions[r].pods[p].account;
                            if account.record(&decided, counted_at) && s.coordinator.top_up {
                                asked_top_up.push((r, p));
                            }
                            (allowed, charged)
                        }
                        (None, None) => (false, 0),
                    };
                    self.acc.checks += 1;
                    let e = self.acc.keys.entry(key).or_default();
                    e.0 += call.tokens;
                    if admitted {
                        e.1 += call.tokens;
                        self.acc.region_admitted[r] += call.tokens;
                    }
                    *self.acc.charged.entry(key).or_default() += charged as i64;
                }
            }
        }
        self.send_top_ups(t, asked_top_up);
    }

    /// Settles the calls whose cost is known by `t`, each on its region's
    /// counter at its pod's allocation now (a region holding nothing now
    /// settles nothing: the estimate stays charged).
    pub(super) fn settle_due(&mut self, t: i64) {
        let (Some(charging), Some(cost)) = (self.charging, self.scenario.cost.clone()) else {
            return;
        };
        let (now_ms, now_us) = (abs(t), abs_us(t));
        let period = self.scenario.rule.period_ms;
        let fixed_window = self.scenario.rule.algorithm == Algorithm::FixedWindow;
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let call = entry.remove();
            let key = &self.keys[call.key as usize];
            let region = &mut self.regions[call.region];
            let limit = region.pods[call.pod]
                .table
                .limit(RULE, key, now_ms)
                .unwrap_or(0);
            let Some(params) = self.params.get(limit).cloned() else {
                continue;
            };
            let overdraft = settle::overdraft(cost.max_overdraft, &params);
            let state = region.counters.state(call.key);
            let (back, charged) = settle_call(
                charging,
                state,
                &call,
                cost.estimate,
                overdraft,
                now_us,
                &params,
            );
            let after = state.decide(now_us, 0, &params).decision;
            // The window's settled count: a refund lands in it only when the
            // estimate was charged in it (a fixed window's refund of an
            // ended window gives nothing back).
            let period_us = period as u64 * 1_000;
            let into_this = call.charged_at_us / period_us == now_us / period_us;
            let refunded_here = if into_this { back } else { 0 };
            *self.acc.charged.entry(call.key).or_default() += charged as i64 - refunded_here as i64;
            let settlement = Settlement {
                rule: RULE,
                key,
                period_ms: period as u64,
                refunded: back,
                charged,
                charged_age_ms: (now_us - call.charged_at_us) / 1_000,
                used: fixed_window.then(|| after.limit.saturating_sub(after.remaining)),
            };
            region.pods[call.pod].account.settled(&settlement, now_ms);
        }
    }

    /// What the stated bound lets a key's settled tokens go above `L` in a
    /// window: with reservations, each region's overdraft (the rule's
    /// `max_overdraft`, else its allocation: Σ ≤ L); otherwise nothing.
    pub fn charge_allowance(&self) -> u64 {
        let s = &self.scenario;
        match (self.charging, &s.cost) {
            (Some(Charging::Reserve), Some(cost)) => cost
                .max_overdraft
                .map_or(s.rule.limit, |o| o * s.regions.len() as u64),
            _ => 0,
        }
    }
}
