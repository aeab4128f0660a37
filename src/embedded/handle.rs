//! The library's fast path: a rule resolved once ([`Limiter::rule`]) into a
//! [`RuleHandle`] whose [`RuleHandle::check`] answers what
//! [`Limiter::check_rule`] answers, without matching, allocating or
//! formatting anything on the way to the store.
//!
//! Staleness: a handle keeps what it resolved (the rule, its limit built
//! once, its metric handles, whether the override set holds any key of it)
//! stamped with the generations of the rules and of the overrides it was
//! resolved from. Every check compares both stamps with the limiter's (two
//! atomic loads); after [`Limiter::replace_rules`] or
//! [`Limiter::set_overrides`] the first check through the handle resolves
//! again, by domain and name, and every check after it uses the new rule: a
//! handle never enforces a replaced limit. A rule that is gone answers
//! `None` (not limited), as `check_rule` does, until a rule of that name
//! comes back.

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::future::{self, Either};

use super::Limiter;
use crate::algorithm::InvalidInput;
use crate::limiter::Verdict;
use crate::limiter::check_metrics::RuleMetrics;
use crate::limiter::engine::Check;
use crate::limiter::service::Service;
use crate::overrides::OverrideIndex;
use crate::rules::Rule;
use crate::store::{Limit, key};

/// One rule of a [`Limiter`], resolved once by domain and name: check keys
/// under it with [`RuleHandle::check`]. Cheap to clone, `Send` and `Sync`;
/// it keeps the limiter's state alive, and follows its rule and override
/// changes (see the module doc).
pub struct RuleHandle {
    /// The limiter's shared state (engine, rules, overrides).
    service: Arc<Service>,
    domain: Box<str>,
    name: Box<str>,
    /// What the rule resolved to, swapped whole when the rules or the
    /// overrides change. `ArcSwap`, not a lock: every check reads it, from
    /// any number of threads, and a lock's shared counter would make those
    /// threads contend on one cache line.
    resolved: ArcSwap<Resolved>,
}

/// The rule as of one generation of the rules and of the overrides.
struct Resolved {
    rules_generation: u64,
    overrides_generation: u64,
    /// `Ok(None)`: the domain has no rule of that name (now); `Err`: several
    /// rules carry it (as `check_rule` answers both).
    target: Result<Option<Target>, InvalidInput>,
}

struct Target {
    rule: Arc<Rule>,
    /// The rule's one limit as the store is given it, built once; `None`
    /// when the rule takes the general path (unlimited, `requests_per_unit:
    /// 0`, several `limits:`, a split key).
    limit: Option<Limit>,
    /// The rule's metric handles, so a check looks nothing up to count itself.
    metrics: Arc<RuleMetrics>,
    /// The override set, only when it holds a key of this rule: a check of
    /// any other rule pays no override lookup at all.
    overrides: Option<Arc<OverrideIndex>>,
}

impl Limiter {
    /// A handle on the rule named `rule` (its `rate_limit.name`) in
    /// `domain`, for checks that skip matching (see [`RuleHandle`]). An
    /// error names the field when the domain is empty, has no rule of that
    /// name, or has several.
    ///
    /// ```
    /// use meridian::Limiter;
    /// use meridian::store::MemoryStore;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::from_yaml(
    ///     "domain: api\ndescriptors:\n  - key: customer\n    rate_limit: {name: per_customer, unit: minute, requests_per_unit: 2}\n",
    ///     MemoryStore::new(),
    /// )?;
    /// let per_customer = limiter.rule("api", "per_customer")?;
    /// # futures::executor::block_on(async {
    /// let first = per_customer.check("42", 1).await?.expect("the rule is there");
    /// assert_eq!((first.decision.allowed, first.decision.remaining), (true, 1));
    /// assert!(per_customer.check("42", 2).await?.is_some_and(|v| !v.decision.allowed));
    /// # Ok::<_, meridian::algorithm::InvalidInput>(())
    /// # })?;
    /// assert!(limiter.rule("api", "per_path").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn rule(&self, domain: &str, rule: &str) -> Result<RuleHandle, InvalidInput> {
        let handle = RuleHandle {
            service: Arc::clone(&self.inner),
            domain: domain.into(),
            name: rule.into(),
            resolved: ArcSwap::from_pointee(Resolved {
                rules_generation: u64::MAX,
                overrides_generation: u64::MAX,
                target: Ok(None),
            }),
        };
        match &handle.current().target {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(InvalidInput::new(
                    "rule",
                    rule,
                    format!("domain {domain:?} has no rule of that name"),
                ));
            }
            Err(e) => return Err(e.clone()),
        }
        Ok(handle)
    }
}

impl RuleHandle {
    /// Decides `key` under the handle's rule, consuming `cost` hits (0 =
    /// check only): the same verdict as [`Limiter::check_rule`] with this
    /// domain and rule name. `None` when the rule is no longer in the rules.
    ///
    /// On the embedded store a one-limit rule is decided when this is
    /// called, and the future it returns is a ready answer of a few words:
    /// awaiting it costs nothing. Anything else (another store, an
    /// overridden key, a rule of another shape) is decided when the future
    /// is polled, on the engine's general path.
    pub fn check<'a>(
        &'a self,
        key: &'a str,
        cost: u64,
    ) -> impl Future<Output = Result<Option<Verdict>, InvalidInput>> + Send + 'a {
        // A small future for the common case: the general path's state
        // machine is hundreds of bytes, moved on every call if inlined.
        match self.try_check(key, cost) {
            Some(decided) => Either::Left(future::ready(decided)),
            None => Either::Right(Box::pin(self.check_general(key, cost))),
        }
    }

    /// The engine's general path, through the service as `check_rule` goes.
    async fn check_general(&self, key: &str, cost: u64) -> Result<Option<Verdict>, InvalidInput> {
        let resolved = self.current_owned();
        let target = match &resolved.target {
            Ok(Some(target)) => target,
            Ok(None) => return Ok(None),
            Err(e) => return Err(e.clone()),
        };
        let overridden = target
            .overrides
            .as_ref()
            .and_then(|index| index.params(&target.rule, key, crate::clock::now_unix_ms()));
        let check = Check {
            rule: &target.rule,
            counter_key: key,
            cost,
            limit: overridden.as_ref(),
            metric_key: target.rule.counts_values().then_some(key),
        };
        self.service.decide(check).await.map(Some)
    }

    /// The domain and the rule name the handle was made for.
    pub fn name(&self) -> (&str, &str) {
        (&self.domain, &self.name)
    }

    /// [`RuleHandle::check`] with no future, when the embedded store decides
    /// the check at once: the same verdict, or `None` when the check must
    /// take the general path — another store, a key with an override, a
    /// rule with several limits, a split key, a ban or no limit — and
    /// `check` must be awaited instead. The cheapest call of the library,
    /// for synchronous callers; `check` is this plus a ready future.
    pub fn try_check(&self, key: &str, cost: u64) -> Option<Result<Option<Verdict>, InvalidInput>> {
        let resolved = self.current();
        let Ok(Some(target)) = &resolved.target else {
            return None;
        };
        let limit = target.limit.as_ref()?;
        // As `Service::decide` checks it first, before the store's own checks.
        if let Err(e) = key::check(&target.rule.id, key) {
            return Some(Err(e));
        }
        if let Some(index) = &target.overrides
            && index
                .params(&target.rule, key, crate::clock::now_unix_ms())
                .is_some()
        {
            return None;
        }
        let metric_key = target.rule.counts_values().then_some(key);
        let decided = self.service.engine.check_in_process(
            &target.rule,
            limit,
            key,
            cost,
            metric_key,
            &target.metrics,
        )?;
        Some(decided.map(Some))
    }

    /// What the rule resolves to now: the kept resolution while both
    /// generations match, else a fresh one (kept for the next checks).
    fn current(&self) -> arc_swap::Guard<Arc<Resolved>> {
        let (rules, overrides) = self.generations();
        let kept = self.resolved.load();
        if kept.rules_generation == rules && kept.overrides_generation == overrides {
            return kept;
        }
        drop(kept);
        self.resolved
            .store(Arc::new(self.resolve(rules, overrides)));
        self.resolved.load()
    }

    /// [`RuleHandle::current`], held across an `.await`.
    fn current_owned(&self) -> Arc<Resolved> {
        arc_swap::Guard::into_inner(self.current())
    }

    fn generations(&self) -> (u64, u64) {
        (
            self.service.rules.generation(),
            self.service.overrides.generation(),
        )
    }

    /// Resolves the rule by domain and name, as `check_rule` matches it.
    /// The generations were read before: a change racing this resolution
    /// makes the next check resolve once more, never keeps a stale rule.
    fn resolve(&self, rules_generation: u64, overrides_generation: u64) -> Resolved {
        let target = if self.domain.is_empty() {
            Err(InvalidInput::new("domain", "\"\"", "must not be empty"))
        } else {
            let rules = self.service.rules.current();
            match rules.by_name(&self.domain, &self.name) {
                Ok(found) => Ok(found.map(|rule| self.target(rule))),
                Err(e) => Err(InvalidInput::new("rule", &self.name, e.to_string())),
            }
        };
        Resolved {
            rules_generation,
            overrides_generation,
            target,
        }
    }

    fn target(&self, rule: &Arc<Rule>) -> Target {
        // The engine's own order: a ban or no limit, then several limits,
        // take the general path; so does a split key.
        let one_limit = !rule.denies_all() && rule.also.is_empty() && rule.split <= 1;
        let limit = rule
            .params
            .as_ref()
            .filter(|_| one_limit)
            .map(|params| Limit {
                rule: rule.id.clone(),
                params: params.clone(),
            });
        let overrides = self.service.overrides.current();
        Target {
            rule: Arc::clone(rule),
            limit,
            metrics: self.service.engine.rule_metrics(rule),
            overrides: overrides.has_rule(&rule.id).then_some(overrides),
        }
    }
}

impl Clone for RuleHandle {
    fn clone(&self) -> RuleHandle {
        RuleHandle {
            service: Arc::clone(&self.service),
            domain: self.domain.clone(),
            name: self.name.clone(),
            resolved: ArcSwap::new(self.resolved.load_full()),
        }
    }
}

impl std::fmt::Debug for RuleHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleHandle")
            .field("domain", &self.domain)
            .field("rule", &self.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::executor::block_on;
    use proptest::prelude::*;

    use super::*;
    use crate::KeyOverride;
    use crate::algorithm::Algorithm;
    use crate::store::MemoryStore;

    const START: Duration = Duration::from_secs(1_700_000_000);

    fn rules(algorithm: Algorithm, limit: u64, shadow: bool) -> String {
        format!(
            "domain: api\ndescriptors:\n  - key: customer\n    algorithm: {algorithm}\n    shadow_mode: {shadow}\n    rate_limit:\n      name: per_customer\n      unit: minute\n      requests_per_unit: {limit}\n"
        )
    }

    fn limiter(yaml: &str) -> Limiter {
        Limiter::from_yaml(yaml, MemoryStore::new()).expect("valid rules")
    }

    /// What a caller can see of a verdict, compared whole.
    fn seen(v: Result<Option<Verdict>, InvalidInput>) -> String {
        format!(
            "{:?}",
            v.map(|v| v.map(|v| (v.decision, v.source, v.shadow_denied, v.limit_index)))
        )
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Moves the clock on by `advance_ms`, then checks `key` at `cost`.
        Check { key: u8, cost: u64, advance_ms: u64 },
        /// Both limiters take new rules with this limit.
        Replace { limit: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            12 => (0u8..4, 0u64..8, prop_oneof![3 => Just(0u64), 1 => 0u64..40_000])
                .prop_map(|(key, cost, advance_ms)| Step::Check { key, cost, advance_ms }),
            1 => (1u64..12).prop_map(|limit| Step::Replace { limit }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The handle answers exactly what `check_rule` answers: two limiters
        /// on the embedded store, one checked by name and one through a handle,
        /// fed the same random traffic at the same (stopped) instants, with an
        /// override on one key and rules replaced midway, give the same verdict
        /// every time: decision (allowed, limit, remaining, reset, retry-after,
        /// delay, reason), source and shadow flag.
        #[test]
        fn a_handle_answers_as_check_rule(
            algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
            limit in 1u64..12,
            shadow in any::<bool>(),
            steps in prop::collection::vec(step(), 1..120),
        ) {
            let by_name = limiter(&rules(algorithm, limit, shadow));
            let handled = limiter(&rules(algorithm, limit, shadow));
            let overrides = [KeyOverride {
                domain: "api",
                descriptor: &[],
                rule: Some("per_customer"),
                key: Some("k1"),
                limit: limit + 3,
                burst: None,
            }];
            by_name.set_overrides(&overrides).expect("override");
            handled.set_overrides(&overrides).expect("override");
            let handle = handled.rule("api", "per_customer").expect("handle");
            let mut now = START;
            for step in steps {
                match step {
                    Step::Check { key, cost, advance_ms } => {
                        now += Duration::from_millis(advance_ms);
                        crate::clock::freeze(Some(now));
                        let key = format!("k{key}");
                        let expected = block_on(by_name.check_rule("api", "per_customer", &key, cost));
                        let got = block_on(handle.check(&key, cost));
                        crate::clock::freeze(None);
                        prop_assert_eq!(seen(got), seen(expected), "{} at {:?}", key, now);
                    }
                    Step::Replace { limit } => {
                        let yaml = rules(algorithm, limit, shadow);
                        by_name.replace_rules(&[&yaml]).expect("rules");
                        handled.replace_rules(&[&yaml]).expect("rules");
                    }
                }
            }
        }
    }

    #[test]
    fn a_handle_follows_replaced_rules_and_overrides() {
        let limiter = limiter(&rules(Algorithm::FixedWindow, 5, false));
        let handle = limiter.rule("api", "per_customer").expect("handle");
        let check = |key: &str| {
            block_on(handle.check(key, 1))
                .expect("valid")
                .map(|v| v.decision)
        };
        assert_eq!(check("a").map(|d| (d.limit, d.remaining)), Some((5, 4)));

        limiter
            .replace_rules(&[&rules(Algorithm::FixedWindow, 2, false)])
            .expect("rules");
        assert_eq!(check("a").map(|d| (d.limit, d.remaining)), Some((2, 0)));

        limiter
            .set_overrides(&[KeyOverride {
                domain: "api",
                descriptor: &[],
                rule: Some("per_customer"),
                key: Some("vip"),
                limit: 100,
                burst: None,
            }])
            .expect("override");
        assert_eq!(check("vip").map(|d| d.limit), Some(100));
        assert_eq!(check("b").map(|d| d.limit), Some(2));

        // The rule gone: not limited, as by name; back: enforced again.
        limiter
            .replace_rules(&["domain: api\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"])
            .expect("rules");
        assert!(check("a").is_none());
        limiter
            .replace_rules(&[&rules(Algorithm::FixedWindow, 2, false)])
            .expect("rules");
        assert_eq!(check("c").map(|d| d.limit), Some(2));
    }

    #[test]
    fn a_handle_on_no_rule_or_a_bad_key_is_refused_naming_the_field() {
        let limiter = limiter(&rules(Algorithm::FixedWindow, 5, false));
        assert_eq!(limiter.rule("api", "nope").unwrap_err().field, "rule");
        assert_eq!(
            limiter.rule("", "per_customer").unwrap_err().field,
            "domain"
        );
        let handle = limiter.rule("api", "per_customer").expect("handle");
        let long = "k".repeat(600);
        assert_eq!(block_on(handle.check(&long, 1)).unwrap_err().field, "key");
    }

    /// Two threads through one handle on one key admit exactly the limit,
    /// under every algorithm.
    #[test]
    fn threads_sharing_a_handle_admit_exactly_the_limit() {
        for algorithm in Algorithm::ALL {
            let limiter = limiter(&rules(algorithm, 1_000, false));
            let handle = limiter.rule("api", "per_customer").expect("handle");
            let admitted: u64 = std::thread::scope(|s| {
                let threads: Vec<_> = (0..2)
                    .map(|_| {
                        let handle = handle.clone();
                        s.spawn(move || {
                            crate::clock::freeze(Some(START));
                            (0..1_500)
                                .filter(|_| {
                                    block_on(handle.check("k", 1))
                                        .expect("valid")
                                        .is_some_and(|v| v.decision.allowed)
                                })
                                .count() as u64
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().expect("thread")).sum()
            });
            // The clock stopped on both threads: no window rolls, no bucket refills.
            assert_eq!(admitted, 1_000, "{algorithm}");
        }
    }
}
