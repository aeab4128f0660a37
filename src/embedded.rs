//! Meridian in process: a Rust gateway embeds the limiter with no extra hop.
//!
//! [`Limiter`] is the `meridian limiter` service's own check path (same rule
//! files, same matching, same engine with its over-limit cache,
//! approximate path, hot-key split, fail modes and shadow mode) behind a small
//! API. Counters live in the store you give it: a [`MemoryStore`] for one
//! process, or a [`RedisStore`] shared with other pods and with `meridian
//! limiter` services on the same Redis (they use the same keys).
//!
//! ```
//! use meridian::Limiter;
//! use meridian::store::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::from_yaml(
//!     r#"
//! domain: api
//! descriptors:
//!   - key: customer
//!     rate_limit:
//!       name: per_customer
//!       unit: minute
//!       requests_per_unit: 2
//! "#,
//!     MemoryStore::new(),
//! )?;
//!
//! // Envoy-style: a descriptor of (key, value) entries and a cost.
//! let first = limiter.check("api", &[("customer", "42")], 1).await?.unwrap();
//! assert!(first.decision.allowed);
//! assert_eq!(first.decision.remaining, 1);
//!
//! // By rule name and key (a named check counts under the key given).
//! assert!(limiter.check_rule("api", "per_customer", "7", 2).await?.unwrap().decision.allowed);
//! let denied = limiter.check_rule("api", "per_customer", "7", 1).await?.unwrap();
//! assert!(!denied.decision.allowed);
//! assert!(denied.decision.retry_after_us > 0);
//!
//! // No rule matches: not limited.
//! assert!(limiter.check("api", &[("path", "/health")], 1).await?.is_none());
//! # Ok(())
//! # }
//! ```

mod handle;

use std::sync::Arc;

pub use handle::RuleHandle;

use crate::algorithm::InvalidInput;
use crate::limiter::reserve::{ReserveAnswer, ReserveRequest, SettleAnswer};
use crate::limiter::reset::{ResetError, ResetOutcome};
use crate::limiter::service::{self, Descriptor, NativeCheck};
use crate::limiter::{Engine, EngineConfig, RuleSource, Verdict};
use crate::rules::{RuleErrors, RuleFile, RuleSet};
#[cfg(feature = "redis")]
use crate::store::RedisStore;
use crate::store::reservation::ReservationError;
use crate::store::{AnyStore, MemoryStore, StoreError};

/// One key's own limit for [`Limiter::set_overrides`]: a descriptor (or a
/// rule name and a key, as [`Limiter::check_rule`] addresses it) and the
/// limit per the rule's period.
#[derive(Debug, Clone, Copy)]
pub struct KeyOverride<'a> {
    /// The descriptor's domain.
    pub domain: &'a str,
    /// The descriptor's entries; empty with `rule` + `key`.
    pub descriptor: &'a [(&'a str, &'a str)],
    /// The rule the descriptor must resolve to, or with `key` the rule's name.
    pub rule: Option<&'a str>,
    /// The key as checks by rule name give it.
    pub key: Option<&'a str>,
    /// Requests per the rule's period.
    pub limit: u64,
    /// A token or leaky bucket's burst (default: the limit).
    pub burst: Option<u64>,
}

/// An in-process rate limiter built from rules and a store.
pub struct Limiter {
    /// Shared with the [`RuleHandle`]s made from it.
    inner: Arc<service::Service>,
}

/// Builds a [`Limiter`]: rules (YAML text, one domain per file), a store,
/// and engine settings (defaults as in `meridian limiter`).
#[derive(Default)]
pub struct Builder {
    files: Vec<RuleFile>,
    store: Option<AnyStore>,
    config: EngineConfig,
}

/// Why a [`Limiter`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A rule file did not parse or validate; every problem is listed, each as
    /// `file:line: field: reason`.
    #[error("invalid rules:\n{0}")]
    Rules(#[from] RuleErrors),
    /// [`Builder::build`] was called before [`Builder::store`].
    #[error("no store: call Builder::store")]
    NoStore,
}

impl Limiter {
    /// A builder with no rules, no store and the default engine settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// One rule file's YAML and a store.
    pub fn from_yaml(yaml: &str, store: impl Into<AnyStore>) -> Result<Limiter, BuildError> {
        Limiter::builder()
            .rules_yaml("rules", yaml)
            .store(store)
            .build()
    }

    /// Decides one descriptor (domain + (key, value) entries), consuming
    /// `cost` hits (0 = check only). `None` when no rule applies: not limited.
    pub async fn check(
        &self,
        domain: &str,
        descriptor: &[(&str, &str)],
        cost: u64,
    ) -> Result<Option<Verdict>, InvalidInput> {
        let descriptor = Descriptor {
            entries: descriptor
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            limit: None,
            hits: Some(cost),
        };
        let mut outcomes = self.inner.rate_limit(domain, &[descriptor], 1).await?;
        match outcomes.pop() {
            Some(outcome) => Ok(outcome?.map(|o| o.verdict)),
            None => Ok(None),
        }
    }

    /// Decides `key` under the rule named `rule` (its `rate_limit.name`) in
    /// `domain`, consuming `cost` hits (0 = check only). `None` when the
    /// domain has no such rule.
    pub async fn check_rule(
        &self,
        domain: &str,
        rule: &str,
        key: &str,
        cost: u64,
    ) -> Result<Option<Verdict>, InvalidInput> {
        let check = NativeCheck {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            key: key.to_owned(),
            descriptor: Vec::new(),
            cost,
            check_only: cost == 0,
        };
        let mut results = self.inner.check_batch(std::slice::from_ref(&check)).await?;
        match results.pop() {
            Some(result) => Ok(result?.map(|o| o.verdict)),
            None => Ok(None),
        }
    }

    /// Holds `estimate` hits against every limit the descriptor (domain +
    /// (key, value) entries) hits, for at most `ttl` (see
    /// docs/cost-quotas.md). Admitted: the answer's `id` commits or
    /// releases it; not admitted: nothing is held, `retry_after_us()` says
    /// when it could be. No rule matching: `matched` false, nothing held.
    pub async fn reserve(
        &self,
        domain: &str,
        descriptor: &[(&str, &str)],
        estimate: u64,
        ttl: std::time::Duration,
    ) -> Result<ReserveAnswer, ReservationError> {
        self.inner
            .reserve(&ReserveRequest {
                domain: domain.to_owned(),
                descriptor: descriptor
                    .iter()
                    .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                estimate,
                ttl,
                ..ReserveRequest::default()
            })
            .await
    }

    /// [`Limiter::reserve`] by rule name and key, as [`Limiter::check_rule`]
    /// addresses a limit.
    pub async fn reserve_rule(
        &self,
        domain: &str,
        rule: &str,
        key: &str,
        estimate: u64,
        ttl: std::time::Duration,
    ) -> Result<ReserveAnswer, ReservationError> {
        self.inner
            .reserve(&ReserveRequest {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
                key: key.to_owned(),
                estimate,
                ttl,
                ..ReserveRequest::default()
            })
            .await
    }

    /// Settles reservation `id` at its `actual` cost: refunds the unused
    /// part of the estimate, or charges the excess (at most the rule's
    /// `max_overdraft` past each limit). Retrying the same commit changes
    /// nothing and answers the same (`replayed`).
    pub async fn commit(&self, id: &str, actual: u64) -> Result<SettleAnswer, ReservationError> {
        self.inner.commit(id, actual).await
    }

    /// Releases reservation `id`: its whole estimate back.
    pub async fn release(&self, id: &str) -> Result<SettleAnswer, ReservationError> {
        self.inner.release(id).await
    }

    /// The estimates of the open reservations on `key` under the rule
    /// named `rule` in `domain`, summed (0 when there is no such rule).
    pub async fn outstanding(
        &self,
        domain: &str,
        rule: &str,
        key: &str,
    ) -> Result<u64, ReservationError> {
        let rules = self.inner.rules.current();
        let found = rules
            .by_name(domain, rule)
            .map_err(|e| InvalidInput::new("rule", rule, e.to_string()))?;
        match found {
            Some(r) => self.inner.outstanding(&r.id, key).await,
            None => Ok(0),
        }
    }

    /// Swaps the rules (one YAML text per domain); the old ones stay on error.
    pub fn replace_rules(&self, yamls: &[&str]) -> Result<(), RuleErrors> {
        self.inner.rules.replace(parse(yamls.iter().copied())?);
        self.inner.engine.rules_changed();
        Ok(())
    }

    /// Clears every counter the descriptor (domain + (key, value) entries)
    /// has under the rule it matches (with `rule`, a rule of that name,
    /// which the descriptor must match): each limit, each split
    /// sub-counter, in the store and in this process (unflushed hits,
    /// cached denials). Its next check starts from nothing. What was
    /// cleared, one entry per matched rule (none when no rule matches).
    pub async fn reset(
        &self,
        domain: &str,
        descriptor: &[(&str, &str)],
        rule: Option<&str>,
    ) -> Result<ResetOutcome, ResetError> {
        let entries: Vec<(String, String)> = descriptor
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        self.inner.reset(domain, &entries, rule).await
    }

    /// Gives keys their own limits under their rules, replacing the ones
    /// given before (what `meridian ctl overrides` does for the service):
    /// each [`KeyOverride`]'s descriptor resolves to its rule and key as a
    /// check's would, and checks of that key are held to the override's
    /// limit (and burst) with the rule's algorithm and period. A check by
    /// rule name counts the key as given, a descriptor check its entries:
    /// give the form the checks use. Refused whole, naming the override and
    /// field, when one does not resolve or its numbers do not fit the rule.
    pub fn set_overrides(&self, overrides: &[KeyOverride<'_>]) -> Result<(), InvalidInput> {
        let rules = self.inner.rules.current();
        let now = crate::clock::now_unix_ms();
        let mut held = Vec::with_capacity(overrides.len());
        for o in overrides {
            let proposed = crate::overrides::Proposed {
                domain: o.domain.to_owned(),
                entries: o
                    .descriptor
                    .iter()
                    .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                rule: o.rule.map(str::to_owned),
                key: o.key.map(str::to_owned),
                limit: o.limit,
                burst: o.burst,
                expires_at_unix_ms: None,
                reason: String::new(),
            };
            held.push(crate::overrides::resolve(
                &rules, &proposed, 0.0, "library", now,
            )?);
        }
        let version = self.inner.overrides.current().version + 1;
        self.inner
            .overrides
            .replace(crate::overrides::OverrideIndex::new(version, &held));
        self.inner.engine.rules_changed();
        Ok(())
    }

    /// Sends the approximate path's unflushed hits to Redis now.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.inner.engine.flush_approximate().await
    }
}

impl Builder {
    /// Adds one rule file's YAML; `name` appears in error messages.
    pub fn rules_yaml(mut self, name: &str, yaml: &str) -> Builder {
        self.files.push(RuleFile {
            name: name.to_owned(),
            text: yaml.to_owned(),
        });
        self
    }

    /// The store counters live in (required): a [`MemoryStore`] for one process,
    /// a `RedisStore` shared by the region's pods.
    pub fn store(mut self, store: impl Into<AnyStore>) -> Builder {
        self.store = Some(store.into());
        self
    }

    /// Pods sharing the store in this region (`fail_mode: local` enforces limit ÷ pods).
    pub fn pods_in_region(mut self, pods: u64) -> Builder {
        self.config.pods_in_region = pods;
        self
    }

    /// Replaces every engine setting at once (pods, cache, breaker, in-flight
    /// cap), `pods_in_region` included: call it before [`Builder::pods_in_region`].
    pub fn engine_config(mut self, config: EngineConfig) -> Builder {
        self.config = config;
        self
    }

    /// Parses and validates the rules and starts the limiter over the store.
    pub fn build(self) -> Result<Limiter, BuildError> {
        let store = self.store.ok_or(BuildError::NoStore)?;
        let rules = RuleSet::parse(&self.files)?;
        Ok(Limiter {
            inner: Arc::new(service::Service::uncoordinated(
                Engine::new(store, &self.config),
                Arc::new(RuleSource::fixed(rules)),
            )),
        })
    }
}

fn parse<'a>(yamls: impl Iterator<Item = &'a str>) -> Result<RuleSet, RuleErrors> {
    let files: Vec<RuleFile> = yamls
        .enumerate()
        .map(|(i, text)| RuleFile {
            name: format!("rules[{i}]"),
            text: text.to_owned(),
        })
        .collect();
    RuleSet::parse(&files)
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> AnyStore {
        AnyStore::Memory(store)
    }
}

#[cfg(feature = "redis")]
impl From<RedisStore> for AnyStore {
    fn from(store: RedisStore) -> AnyStore {
        AnyStore::Redis(Box::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
domain: api
descriptors:
  - key: customer
    algorithm: sliding_window_counter
    rate_limit:
      name: per_customer
      unit: hour
      requests_per_unit: 5
  - key: hot
    split: 4
    rate_limit:
      name: hot
      unit: hour
      requests_per_unit: 40
"#;

    #[tokio::test]
    async fn library_checks_match_the_service_semantics() {
        let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).unwrap();
        for left in (0..5).rev() {
            let v = limiter
                .check("api", &[("customer", "1")], 1)
                .await
                .unwrap()
                .unwrap();
            assert!(v.decision.allowed);
            assert_eq!(v.decision.remaining, left);
        }
        let v = limiter
            .check("api", &[("customer", "1")], 1)
            .await
            .unwrap()
            .unwrap();
        assert!(!v.decision.allowed);
        assert_eq!(v.reason(), "over_limit");
        // Check-only does not consume; another key has its own counter.
        let peek = limiter
            .check("api", &[("customer", "2")], 0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(peek.decision.remaining, 5);
        assert!(
            limiter
                .check("api", &[("customer", "2")], 5)
                .await
                .unwrap()
                .unwrap()
                .decision
                .allowed
        );
        // Unknown domain or rule: not limited; bad input: an error naming the field.
        assert!(
            limiter
                .check("other", &[("customer", "1")], 1)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            limiter
                .check_rule("api", "nope", "k", 1)
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            limiter
                .check("", &[("customer", "1")], 1)
                .await
                .unwrap_err()
                .field,
            "domain"
        );
    }

    #[tokio::test]
    async fn split_key_admits_exactly_its_limit_in_memory() {
        let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).unwrap();
        let mut admitted = 0;
        for _ in 0..200 {
            let v = limiter
                .check_rule("api", "hot", "k", 1)
                .await
                .unwrap()
                .unwrap();
            admitted += u64::from(v.decision.allowed);
            assert_eq!(v.decision.limit, 40);
        }
        assert_eq!(admitted, 40);
    }

    #[tokio::test]
    async fn invalid_rules_are_refused_and_replacing_keeps_the_old() {
        assert!(matches!(
            Limiter::from_yaml("domain: [", MemoryStore::new()),
            Err(BuildError::Rules(_))
        ));
        assert!(matches!(
            Limiter::builder().build(),
            Err(BuildError::NoStore)
        ));
        let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).unwrap();
        assert!(limiter.replace_rules(&["domain: ["]).is_err());
        assert!(
            limiter
                .check_rule("api", "hot", "k", 1)
                .await
                .unwrap()
                .is_some()
        );
    }
}
