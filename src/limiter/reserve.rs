//! Cost quotas that settle later (issue 31): `reserve` holds an estimate
//! against every limit a request hits, `commit(id, actual)` settles it at
//! its real cost, `release(id)` gives it all back, and a reservation left
//! open settles at its estimate when its ttl passes (nothing to do: the
//! estimate stays charged). Every transport (HTTP, native gRPC, the
//! library) calls these; the arithmetic is `algorithm::settle`'s, the
//! records the store's (`store::reservation`).
//!
//! Exact path only: an `accuracy: approximate` rule refuses reservations
//! (its counts live in each pod until a flush, where no record could sit
//! beside them). `scope: global` rules reserve against this region's
//! allocation, as a check would; a reservation is demand at its estimate
//! when admitted and its settlement corrects it, and the pod reports what
//! it holds open per key (`Global::settled`, `Global::open_reservation`;
//! docs/cost-quotas.md, "Across regions").

use std::time::Duration;

use metrics::counter;

use super::reservation_id::{self, ReservationId};
use super::service::{NativeCheck, NativeMatch, Service, match_native};
use crate::algorithm::{Decision, InvalidInput, MAX_LIMIT, Params, settle};
use crate::rules::{Accuracy, Rule};
use crate::store::Limit;
use crate::store::reservation::{Hold, LimitSettled, MAX_TTL, ReservationError, Settle, Settled};

/// A reservation asked for: a rule name and key, or a descriptor, as a
/// native check addresses a limit.
#[derive(Debug, Clone, Default)]
pub struct ReserveRequest {
    /// The rules' domain.
    pub domain: String,
    /// A rule's `name`, with `key`; or empty with `descriptor`.
    pub rule: String,
    /// The counter key, with `rule`.
    pub key: String,
    /// Entries matched as Envoy matches a descriptor.
    pub descriptor: Vec<(String, String)>,
    /// Hits held against every limit until settled (at least 1).
    pub estimate: u64,
    /// How long the reservation stays open; then it settles at `estimate`.
    pub ttl: Duration,
}

/// What a reserve answers.
#[derive(Debug, Clone)]
pub struct ReserveAnswer {
    /// Whether a rule matched; when none does, nothing is limited and
    /// nothing is held (`admitted`, no id).
    pub matched: bool,
    /// The estimate is held against every limit.
    pub admitted: bool,
    /// The id to commit or release (empty when not admitted).
    pub id: String,
    /// The rule's name (or id when unnamed).
    pub rule: String,
    /// One decision per limit (a single one when a limit could never hold
    /// the estimate): remaining after the hold, retry-after when denied.
    pub limits: Vec<Decision>,
}

impl ReserveAnswer {
    /// Until the same reservation could be admitted (the longest of the
    /// denials); 0 when admitted, or when it never can be.
    pub fn retry_after_us(&self) -> u64 {
        self.limits
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after_us)
            .max()
            .unwrap_or(0)
    }

    /// Why it was denied (`over_limit`, `cost_exceeds_capacity`, …), empty
    /// when admitted.
    pub fn reason(&self) -> &'static str {
        match self
            .limits
            .iter()
            .find(|d| !d.allowed)
            .and_then(|d| d.reason)
        {
            None => "",
            Some(crate::algorithm::DenyReason::OverLimit) => "over_limit",
            Some(crate::algorithm::DenyReason::CostExceedsCapacity { .. }) => {
                "cost_exceeds_capacity"
            }
            Some(crate::algorithm::DenyReason::StoreFull) => "store_full",
        }
    }
}

/// What a commit or release answers: [`Settled`] plus the totals of the
/// rule's first limit.
#[derive(Debug, Clone)]
pub struct SettleAnswer {
    /// Everything the store answered.
    pub settled: Settled,
}

impl SettleAnswer {
    /// The first limit's settlement (the rule's own; `limits:` rules have
    /// one per limit in `settled.limits`).
    pub fn first(&self) -> LimitSettled {
        self.settled.limits.first().copied().unwrap_or_default()
    }

    /// The actual cost settled at (0 for a release).
    pub fn actual(&self) -> u64 {
        self.settled.settled.actual()
    }

    /// Excess the first limit's `max_overdraft` left uncharged.
    pub fn uncharged(&self) -> u64 {
        self.actual()
            .saturating_sub(self.settled.estimate)
            .saturating_sub(self.first().charged)
    }
}

impl Service {
    /// Reserves `request.estimate` against every limit the request hits.
    pub async fn reserve(
        &self,
        request: &ReserveRequest,
    ) -> Result<ReserveAnswer, ReservationError> {
        if request.estimate == 0 || request.estimate > MAX_LIMIT {
            return Err(InvalidInput::new(
                "estimate",
                request.estimate,
                "must be 1 to 10^15 (the hits held until commit)",
            )
            .into());
        }
        if request.ttl.is_zero() || request.ttl > MAX_TTL {
            return Err(InvalidInput::new(
                "ttl_ms",
                request.ttl.as_millis(),
                format!("must be 1 to {} ms", MAX_TTL.as_millis()),
            )
            .into());
        }
        let rules = self.rules.current();
        let check = NativeCheck {
            domain: request.domain.clone(),
            rule: request.rule.clone(),
            key: request.key.clone(),
            descriptor: request.descriptor.clone(),
            cost: request.estimate,
            check_only: false,
        };
        let Some(NativeMatch {
            rule, counter_key, ..
        }) = match_native(&rules, &check)?
        else {
            return Ok(unmatched(true));
        };
        if rule.unlimited {
            return Ok(unmatched(true));
        }
        let name = rule.name.clone().unwrap_or_else(|| rule.id.clone());
        if let Some(max) = rule.max_cost.filter(|max| request.estimate > *max) {
            return Err(InvalidInput::new(
                "estimate",
                request.estimate,
                format!("above the rule's max_cost of {max}"),
            )
            .into());
        }
        let Some(limits) = self.reservable_limits(&rule, &counter_key)? else {
            // A ban (`requests_per_unit: 0`), or a global rule this region
            // holds nothing of: denied, as a check would be.
            counter!("meridian_reservations_total", "rule" => rule.id.clone(), "outcome" => "denied").increment(1);
            let verdict = self.engine.unallocated(&rule);
            let denied = std::slice::from_ref(&verdict.decision);
            self.count_reserved(&rule, &counter_key, request.estimate, denied);
            return Ok(ReserveAnswer {
                matched: true,
                admitted: false,
                id: String::new(),
                rule: name,
                limits: vec![verdict.decision],
            });
        };
        let nonce = reservation_id::nonce();
        let hold = Hold {
            limits: &limits,
            key: &counter_key,
            nonce: &nonce,
        };
        #[cfg(feature = "server")]
        let _in_flight = self.global.flight(&rule);
        let reserved = self
            .engine
            .reserve(hold, request.estimate, request.ttl.as_micros() as u64)
            .await?;
        self.count_reserved(&rule, &counter_key, request.estimate, &reserved.decisions);
        #[cfg(feature = "server")]
        if reserved.admitted {
            let ttl_ms = request.ttl.as_millis() as u64;
            let estimate = request.estimate as i64;
            self.global
                .open_reservation(&rule, &counter_key, estimate, ttl_ms);
        }
        let outcome = if reserved.admitted {
            "opened"
        } else {
            "denied"
        };
        counter!("meridian_reservations_total", "rule" => rule.id.clone(), "outcome" => outcome)
            .increment(1);
        if reserved.expired > 0 {
            counter!("meridian_reservations_total", "rule" => rule.id.clone(), "outcome" => "expired")
                .increment(reserved.expired);
        }
        let id = match reserved.admitted {
            true => ReservationId {
                region: self.region.clone(),
                rule: rule.id.clone(),
                key: counter_key,
                nonce,
            }
            .encode(),
            false => String::new(),
        };
        Ok(ReserveAnswer {
            matched: true,
            admitted: reserved.admitted,
            id,
            rule: name,
            limits: reserved.decisions,
        })
    }

    /// Settles reservation `id` at `actual`: refunds `estimate − actual`, or
    /// charges the excess (at most the rule's `max_overdraft` past each
    /// limit). A retried commit at the same actual answers the same and
    /// changes nothing.
    pub async fn commit(&self, id: &str, actual: u64) -> Result<SettleAnswer, ReservationError> {
        if actual > MAX_LIMIT {
            return Err(InvalidInput::new("actual", actual, "must be at most 10^15").into());
        }
        self.settle(id, Settle::Commit(actual)).await
    }

    /// Releases reservation `id`: the whole estimate back.
    pub async fn release(&self, id: &str) -> Result<SettleAnswer, ReservationError> {
        self.settle(id, Settle::Release).await
    }

    /// The estimates of the open reservations this region holds on
    /// `counter_key` under the rule with id `rule_id`, summed (0 for no
    /// such rule), read from the store (`Limiter::outstanding`). The
    /// demand reports keep their own count instead (`allocation::reserved`):
    /// a store read per key and report would cost a Redis call each.
    pub async fn outstanding(
        &self,
        rule_id: &str,
        counter_key: &str,
    ) -> Result<u64, ReservationError> {
        Ok(self.engine.outstanding(rule_id, counter_key).await?)
    }

    async fn settle(&self, id: &str, how: Settle) -> Result<SettleAnswer, ReservationError> {
        let id = ReservationId::decode(id)?;
        if id.region != self.region {
            return Err(ReservationError::OtherRegion {
                made_in: id.region,
                here: self.region.clone(),
            });
        }
        let rules = self.rules.current();
        // A rule removed since: its counters are no longer checked, and
        // its reservations settle at their estimate.
        let Some(rule) = rules.rule(&id.rule).cloned() else {
            return Err(ReservationError::Unknown);
        };
        if let (Settle::Commit(actual), Some(max)) = (how, rule.max_cost)
            && actual > max
        {
            return Err(InvalidInput::new(
                "actual",
                actual,
                format!("above the rule's max_cost of {max}; the reservation stays open"),
            )
            .into());
        }
        let Some(limits) = self.reservable_limits(&rule, &id.key)? else {
            return Err(ReservationError::Unknown);
        };
        let overdrafts: Vec<u64> = limits.iter().map(|l| rule.overdraft(&l.params)).collect();
        let hold = Hold {
            limits: &limits,
            key: &id.key,
            nonce: &id.nonce,
        };
        let result = self.engine.settle(hold, how, &overdrafts).await;
        #[cfg(feature = "server")]
        if let Ok(settled) = &result
            && !settled.replayed
        {
            let left_ms = settled.expires_in_us / 1_000;
            let estimate = settled.estimate as i64;
            self.global
                .open_reservation(&rule, &id.key, -estimate, left_ms);
            let window_use = self.overrides.params(&rule, &id.key).is_none();
            for (index, limit) in settled.limits.iter().enumerate() {
                let age = settled.charged_age_us;
                self.global
                    .settled(&rule, index, &id.key, limit, age, window_use);
            }
        }
        let outcome = match (&result, how) {
            (Ok(s), _) if s.replayed => "replayed",
            (Ok(_), Settle::Commit(_)) => "committed",
            (Ok(_), Settle::Release) => "released",
            (Err(ReservationError::Expired { .. }), _) => "expired_on_settle",
            (Err(_), _) => "settle_refused",
        };
        counter!("meridian_reservations_total", "rule" => rule.id.clone(), "outcome" => outcome)
            .increment(1);
        Ok(SettleAnswer { settled: result? })
    }

    /// The limits a reservation of `rule` on `key` holds: an override's,
    /// the rule's (all of a `limits:` rule), or for a global rule this
    /// region's allocation of each. `None` when nothing can be held (a
    /// ban, or no allocation). Refuses what cannot take reservations. Also
    /// the limits a stream-done charge lands on (`limiter::stream_done`).
    pub(super) fn reservable_limits(
        &self,
        rule: &Rule,
        key: &str,
    ) -> Result<Option<Vec<Limit>>, InvalidInput> {
        if rule.denies_all() {
            return Ok(None);
        }
        if matches!(rule.accuracy, Accuracy::Approximate { .. }) {
            return Err(InvalidInput::new(
                "rule",
                &rule.id,
                "accuracy: approximate rules take no reservations (their counts sit in each \
                 pod until a flush); use an exact rule for cost quotas",
            ));
        }
        if rule.split > 1 {
            return Err(InvalidInput::new(
                "rule",
                &rule.id,
                "split rules take no reservations (a hold must land on every limit's one counter)",
            ));
        }
        let overridden = self.overrides.params(rule, key);
        let Some(params) = self.global_limits(rule, key, overridden)? else {
            return Ok(None);
        };
        if let Some(p) = params.iter().find(|p| !settle::reservable(p.algorithm())) {
            return Err(InvalidInput::new(
                "rule",
                &rule.id,
                format!(
                    "{} takes no reservations (one log entry per hit, at most 100,000); use \
                     sliding_window_counter, fixed_window or token_bucket for cost quotas",
                    p.algorithm()
                ),
            ));
        }
        Ok(Some(
            params
                .into_iter()
                .map(|params| Limit {
                    rule: rule.id.clone(),
                    params,
                })
                .collect(),
        ))
    }

    /// The rule's limits as this region enforces them: its allocation of
    /// each for a coordinated global rule (`None`: nothing allocated). A
    /// key's override (`overridden`) is its limit world-wide on a global
    /// rule, of which this region holds its share, as a check does.
    fn global_limits(
        &self,
        rule: &Rule,
        key: &str,
        overridden: Option<Params>,
    ) -> Result<Option<Vec<Params>>, InvalidInput> {
        #[cfg(feature = "server")]
        {
            use super::global::{GlobalLimit, GlobalLimits};
            if let Some(p) = overridden {
                return Ok(match self.global.limit(rule, key, Some(&p))? {
                    GlobalLimit::Rule => Some(vec![p]),
                    GlobalLimit::Allocated(share) => Some(vec![share]),
                    GlobalLimit::Nothing => None,
                });
            }
            match self.global.limits(rule, key)? {
                GlobalLimits::Rule => {}
                GlobalLimits::Allocated(limits) => return Ok(Some(limits)),
                GlobalLimits::Nothing => return Ok(None),
            }
        }
        #[cfg(not(feature = "server"))]
        {
            let _ = key;
            if let Some(p) = overridden {
                return Ok(Some(vec![p]));
            }
        }
        Ok(Some(rule.limits().cloned().collect()))
    }

    /// Counts a reservation of a global rule as the demand report counts a
    /// check of cost `estimate` (each limit under its own id, with its own
    /// decision's window use); its settlement corrects it later
    /// ([`super::global::Global::settled`]). `decisions` has one per limit,
    /// or one denial standing for all.
    fn count_reserved(&self, rule: &Rule, key: &str, estimate: u64, decisions: &[Decision]) {
        #[cfg(feature = "server")]
        {
            use super::global::Counted;
            let admitted =
                decisions.len() == rule.also.len() + 1 && decisions.iter().all(|d| d.allowed);
            let overridden = self.overrides.params(rule, key).is_some();
            for index in 0..=rule.also.len() {
                let Some(d) = decisions.get(index).or(decisions.first()) else {
                    return;
                };
                self.global.record_limit(
                    rule,
                    index,
                    key,
                    Counted {
                        cost: estimate,
                        allowed: admitted,
                        limit: d.limit,
                        remaining: d.remaining,
                        reset_after_us: d.reset_after_us,
                        window_use: !overridden && decisions.len() > index,
                    },
                );
            }
        }
        #[cfg(not(feature = "server"))]
        let _ = (rule, key, estimate, decisions);
    }
}

fn unmatched(admitted: bool) -> ReserveAnswer {
    ReserveAnswer {
        matched: false,
        admitted,
        id: String::new(),
        rule: String::new(),
        limits: Vec::new(),
    }
}
