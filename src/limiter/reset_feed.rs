//! Counter resets arriving on the watch stream: each pod applies each order
//! pending for its region once (its Redis keys, and its own caches and
//! pending batches, which only it holds), and repeats its answer in its
//! reports until the order is no longer pending (see
//! `coordinator::resets`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use metrics::counter;

use super::global::Global;
use super::reset::{ResetError, ResetOutcome, ResetRule};
use super::service::Service;
use crate::algorithm::InvalidInput;
use crate::proto::meridian::v1 as pb;

/// The orders this pod applied, among those still pending.
pub struct ResetFeed {
    pub service: Arc<Service>,
    pub global: Arc<Global>,
    /// Ids applied (or being applied) by this pod: bounded by the pending
    /// list, which the coordinators bound.
    applied: Mutex<BTreeSet<u64>>,
}

impl ResetFeed {
    pub fn new(service: Arc<Service>, global: Arc<Global>) -> ResetFeed {
        ResetFeed {
            service,
            global,
            applied: Mutex::default(),
        }
    }

    /// Takes the region's pending orders: applies the ones this pod has
    /// not, and forgets answers to orders no longer pending.
    pub fn pending(self: &Arc<Self>, orders: Vec<pb::ResetOrder>) {
        let ids: BTreeSet<u64> = orders.iter().map(|o| o.id).collect();
        self.global.resets_pending(&ids);
        let fresh: Vec<pb::ResetOrder> = {
            let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
            applied.retain(|id| ids.contains(id));
            orders
                .into_iter()
                .filter(|o| applied.insert(o.id))
                .collect()
        };
        for order in fresh {
            let feed = Arc::clone(self);
            tokio::spawn(async move { feed.apply(order).await });
        }
    }

    /// Clears `key` of the rule named `name`, as checks by rule name count
    /// it (the enforced set's rule, and the shadow set's if it differs).
    async fn reset_named(
        &self,
        domain: &str,
        name: &str,
        key: &str,
    ) -> Result<ResetOutcome, ResetError> {
        let sets = std::iter::once(self.service.rules.current()).chain(self.service.rules.shadow());
        let mut rules = Vec::new();
        for set in sets {
            let rule = match set.by_name(domain, name) {
                Ok(Some(rule)) => rule.clone(),
                Ok(None) => continue,
                Err(e) => {
                    return Err(ResetError::Invalid(InvalidInput::new(
                        "rule",
                        name,
                        e.to_string(),
                    )));
                }
            };
            if rules.iter().any(|r: &ResetRule| r.rule.id == rule.id) {
                continue;
            }
            let cleared = self.service.reset_counter(&rule, key).await?;
            rules.push(ResetRule {
                rule,
                counter_key: key.to_owned(),
                cleared,
            });
        }
        Ok(ResetOutcome { rules })
    }

    async fn apply(&self, order: pb::ResetOrder) {
        let entries: Vec<(String, String)> = order
            .entries
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect();
        let rule = (!order.rule.is_empty()).then_some(order.rule.as_str());
        let outcome = if order.key.is_empty() {
            self.service.reset(&order.domain, &entries, rule).await
        } else {
            self.reset_named(&order.domain, rule.unwrap_or_default(), &order.key)
                .await
        };
        let (ok, detail) = match &outcome {
            Ok(done) if done.rules.is_empty() => (
                true,
                "the descriptor matches no rule here: nothing to clear".to_string(),
            ),
            Ok(done) => {
                let parts: Vec<String> = done
                    .rules
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {}: {} store keys, {} pending hits dropped",
                            r.rule.id, r.counter_key, r.cleared.store_keys, r.cleared.pending_hits
                        )
                    })
                    .collect();
                (true, parts.join("; "))
            }
            Err(e) => (false, e.to_string()),
        };
        let detail: String = detail.chars().take(400).collect();
        counter!("meridian_resets_applied_total", "outcome" => if ok { "ok" } else { "failed" })
            .increment(1);
        tracing::info!(id = order.id, ok, %detail, "counter reset applied");
        self.global.reset_applied(pb::ResetApplied {
            id: order.id,
            ok,
            detail,
            at_unix_ms: crate::clock::now_unix_ms(),
        });
        if !ok {
            // Tried again when the next pending list names it.
            self.applied
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&order.id);
        }
    }
}
