//! Envoy's way of settling a cost quota (issue 31, part 2): a rule with
//! `settle: on_stream_done` answers two requests per call. Envoy's rate
//! limit filter sends the first before the call with the route's ordinary
//! actions, and the second when the stream ends with the actions marked
//! `apply_on_stream_done`, carrying the call's real cost (an LLM call's
//! tokens) as `hits_addend`. Both carry the same descriptors, so the cost
//! tells them apart:
//!
//! - **cost 0** — an explicit `hits_addend: 0`, or none at all: the
//!   request-time check. Admitted while at least one hit of budget remains,
//!   and charges nothing. (On other rules an unset `hits_addend` means 1;
//!   here it means 0, so a route that forgot `hits_addend: {number: 0}`
//!   still charges nothing before the call.)
//! - **cost n > 0** — the stream-done settlement: `n` charged now, never
//!   denied (Envoy ignores the answer: the call already happened), taking
//!   the key at most the rule's `max_overdraft` past each limit; the rest,
//!   and anything above `max_cost`, is dropped and counted in
//!   `meridian_stream_done_hits_total`. The charge is
//!   `algorithm::settle::charge`, a reservation commit's excess.
//!
//! Nothing is charged up front: the stream-done request names no admission
//! (Envoy sends it after a 429 too, and after a request-time call that
//! failed open), so an estimate charged before could not be told apart and
//! subtracted. A gateway that can hold an estimate uses reservations
//! (`limiter::reserve`). The bound this leaves — every call admitted while
//! budget remained may charge its whole cost — is in docs/cost-quotas.md.

use std::sync::Arc;

use metrics::counter;

use super::engine::Check;
use super::service::Service;
use super::verdict::{Source, Verdict, fail_decision};
use crate::algorithm::{Decision, DenyReason, InvalidInput, MAX_LIMIT};
use crate::rules::Rule;
use crate::store::reservation::{LimitSettled, ReservationError};

impl Service {
    /// One descriptor of a `settle: on_stream_done` rule at `cost` (see the
    /// module doc): 0 is the request-time check, more is the settlement.
    /// An Envoy per-descriptor `limit` is not used: both requests of a call
    /// must meet the same limit (an operator's override still applies).
    pub(super) async fn stream_done_step(
        &self,
        rule: &Arc<Rule>,
        counter_key: &str,
        metric_key: Option<&str>,
        cost: u64,
    ) -> Result<Verdict, InvalidInput> {
        if cost == 0 {
            self.admit_while_budget_remains(rule, counter_key, metric_key)
                .await
        } else {
            self.charge_stream_done(rule, counter_key, cost).await
        }
    }

    /// A check-only peek, denied when nothing remains: a peek alone admits
    /// a key exactly at its limit, where no hit fits.
    async fn admit_while_budget_remains(
        &self,
        rule: &Rule,
        counter_key: &str,
        metric_key: Option<&str>,
    ) -> Result<Verdict, InvalidInput> {
        let overridden = self.overrides.params(rule, counter_key);
        let mut verdict = self
            .decide(Check {
                rule,
                counter_key,
                cost: 0,
                limit: overridden.as_ref(),
                metric_key,
            })
            .await?;
        let d = &mut verdict.decision;
        // Only the store's count says "nothing remains"; a fail mode's
        // decision knows no count and stands as it is.
        if verdict.source == Source::Store && d.allowed && d.remaining == 0 {
            if rule.shadow_mode {
                verdict.shadow_denied = true;
            } else {
                d.allowed = false;
                d.reason = Some(DenyReason::OverLimit);
                // When the window or bucket has room again at the latest.
                d.retry_after_us = d.reset_after_us;
            }
        }
        Ok(verdict)
    }

    /// Charges the call's cost on every limit of the rule (this region's
    /// allocation of a global one), up to `max_overdraft` past each.
    async fn charge_stream_done(
        &self,
        rule: &Rule,
        counter_key: &str,
        cost: u64,
    ) -> Result<Verdict, InvalidInput> {
        if cost > MAX_LIMIT {
            return Err(InvalidInput::new(
                "hits_addend",
                cost,
                "must be at most 10^15 (the cost a stream-done request charges)",
            ));
        }
        let dropped = |outcome: &'static str, hits: u64| {
            counter!("meridian_stream_done_hits_total", "rule" => rule.id.clone(), "outcome" => outcome)
                .increment(hits);
        };
        let amount = match rule.max_cost {
            Some(max) if cost > max => {
                dropped("over_max_cost", cost - max);
                max
            }
            _ => cost,
        };
        let Some(limits) = self.reservable_limits(rule, counter_key)? else {
            // A ban, or a global rule this region holds nothing of.
            dropped("no_allocation", amount);
            return Ok(self.engine.unallocated(rule));
        };
        let overdrafts: Vec<u64> = limits.iter().map(|l| rule.overdraft(&l.params)).collect();
        let settled = match self
            .engine
            .charge(&limits, counter_key, amount, &overdrafts)
            .await
        {
            Ok(settled) => settled,
            Err(ReservationError::Invalid(e)) => return Err(e),
            Err(e) => {
                tracing::warn!(rule = %rule.id, error = %e, hits = amount, "stream-done charge lost: the store failed");
                dropped("store_failed", amount);
                let params = &limits[0].params;
                return Ok(Verdict {
                    decision: fail_decision(params, true),
                    source: Source::FailOpen,
                    shadow_denied: false,
                    limit_index: 0,
                });
            }
        };
        let charged = settled.iter().map(|l| l.charged).min().unwrap_or(0);
        dropped("charged", charged);
        if amount > charged {
            dropped("over_overdraft", amount - charged);
        }
        #[cfg(feature = "server")]
        self.count_demand(rule, counter_key, &settled);
        Ok(charged_verdict(&settled))
    }

    /// The charge as a global rule's demand: hits admitted (a request-time
    /// check counts none), so the coordinator sees what calls cost.
    #[cfg(feature = "server")]
    fn count_demand(&self, rule: &Rule, counter_key: &str, settled: &[LimitSettled]) {
        let window_use = self.overrides.params(rule, counter_key).is_none();
        for (index, l) in settled.iter().enumerate() {
            self.global.record_limit(
                rule,
                index,
                counter_key,
                super::global::Counted {
                    cost: l.charged,
                    allowed: true,
                    limit: l.limit,
                    remaining: l.remaining,
                    reset_after_us: 0,
                    window_use,
                },
            );
        }
    }
}

/// An admission (the settlement is never denied) with the tightest limit's
/// count after the charge.
fn charged_verdict(settled: &[LimitSettled]) -> Verdict {
    let (index, tightest) = settled
        .iter()
        .enumerate()
        .min_by_key(|(_, l)| l.remaining)
        .map_or((0, LimitSettled::default()), |(i, l)| (i, *l));
    Verdict {
        decision: Decision {
            allowed: true,
            limit: tightest.limit,
            remaining: tightest.remaining,
            reset_after_us: 0,
            retry_after_us: 0,
            delay_us: 0,
            reason: None,
        },
        source: Source::Store,
        shadow_denied: false,
        limit_index: index,
    }
}
