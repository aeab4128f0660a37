//! What the dashboard watches: the history of every global rule
//! ([`History`]) and the live update each dashboard's event stream sends.
//!
//! One task per node ([`Live::run`]) follows the applied state and Raft's
//! metrics. At each new epoch it samples the allocations into the history
//! (with the hits the allocator counted, while this node leads); at each
//! change it renders one update — JSON, once, however many dashboards
//! listen — and publishes it on a watch channel. A dashboard that falls
//! behind gets the newest update, never a queue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metrics::gauge;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::history::{History, HitsSource};
use super::viewers::{Refusal, Seat, Viewers};
use crate::algorithm::Algorithm;
use crate::coordinator::allocator::Allocator;
use crate::coordinator::hits::PerRegion;
use crate::coordinator::node::Node;
use crate::coordinator::raft::storage::Applied;
use crate::coordinator::state::Registry;
use crate::rules::{Accuracy, Partition};

/// Changes closer together than this make one update: Raft's metrics move
/// with every replicated entry, and a dashboard needs no more.
const COALESCE: Duration = Duration::from_millis(100);

/// How a global rule is enforced, from the enforced rule-set version: what
/// the dashboard labels a rule with and draws its bound from.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleMeta {
    pub algorithm: Algorithm,
    pub accuracy: &'static str,
    pub partition: &'static str,
    pub period_ms: u64,
}

/// The rules' history, their descriptions and the latest update.
pub struct Live {
    history: Mutex<History>,
    meta: Mutex<(Option<u64>, BTreeMap<String, RuleMeta>)>,
    updates: watch::Sender<Arc<str>>,
    /// The event streams open, and who may open more.
    viewers: Arc<Viewers>,
    closing: watch::Sender<bool>,
}

/// The allocator's counts, read while this node leads.
struct LeaderHits<'a>(&'a Allocator);

impl HitsSource for LeaderHits<'_> {
    fn rule(&self, rule: &str) -> Option<PerRegion> {
        Some(self.0.hits(rule))
    }
    fn key(&self, rule: &str, key: &str) -> Option<PerRegion> {
        Some(self.0.key_hits(rule, key))
    }
}

impl Live {
    /// Keeps `samples` samples per series.
    pub fn new(samples: usize) -> Arc<Live> {
        Arc::new(Live {
            history: Mutex::new(History::new(samples)),
            meta: Mutex::new((None, BTreeMap::new())),
            updates: watch::channel(Arc::from("{}")).0,
            viewers: Arc::new(Viewers::default()),
            closing: watch::channel(false).0,
        })
    }

    /// The history, locked. Held only to copy out what a request needs.
    pub fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The enforced version's description of `rule`, if it is global there.
    pub fn meta(&self, rule: &str) -> Option<RuleMeta> {
        self.meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .get(rule)
            .cloned()
    }

    /// The latest update and every one after it, for one event stream from
    /// `peer` (anonymous unless `with_token`), with the seat that counts
    /// the stream; refused past the bounds of `viewers`.
    pub fn subscribe(
        &self,
        peer: std::net::IpAddr,
        with_token: bool,
    ) -> Result<(watch::Receiver<Arc<str>>, Seat), Refusal> {
        let seat = self.viewers.admit(peer, with_token)?;
        Ok((self.updates.subscribe(), seat))
    }

    /// Resolves once the node shuts down: event streams end then, so the
    /// HTTP server's graceful shutdown does not wait on them.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|closing| *closing).await;
        }
    }

    /// Ends every event stream (see [`Live::closed`]).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Follows the applied state and Raft's metrics until the node stops.
    pub async fn run(self: Arc<Self>, node: Arc<Node>, allocator: Arc<Allocator>) {
        let mut applied = node.applied.clone();
        let mut metrics = node.raft.metrics();
        loop {
            self.refresh(&node, &allocator, &applied.borrow_and_update().clone());
            metrics.borrow_and_update();
            tokio::select! {
                r = applied.changed() => if r.is_err() { return },
                r = metrics.changed() => if r.is_err() { return },
            }
            tokio::time::sleep(COALESCE).await;
        }
    }

    fn refresh(&self, node: &Node, allocator: &Allocator, state: &Applied) {
        let registry = &state.registry;
        self.refresh_meta(registry);
        let leading = allocator.is_leader();
        {
            let mut history = self.history();
            if leading {
                history.record(&registry.allocations, &LeaderHits(allocator));
            } else {
                history.record(&registry.allocations, &super::history::NoHits);
            }
            gauge!("meridian_coordinator_history_series").set(history.series() as f64);
            gauge!("meridian_coordinator_history_bytes").set(history.bytes() as f64);
        }
        let update = self.render(node, registry, leading);
        self.updates.send_if_modified(|current| {
            if **current == *update {
                return false;
            }
            *current = Arc::from(update.as_str());
            true
        });
    }

    fn refresh_meta(&self, registry: &Registry) {
        let version = registry.enforced().map(|v| v.number);
        let mut meta = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        if meta.0 == version && version.is_some() {
            return;
        }
        let rules = match registry.enforced_rule_set() {
            Some(Ok(set)) => set
                .rules()
                .filter(|r| r.scope == crate::rules::Scope::Global)
                // Each limit of a `limits:` rule is allocated under its own id.
                .flat_map(|r| r.limits().enumerate().map(move |(i, p)| (r, i, p)))
                .map(|(r, i, params)| {
                    (
                        r.limit_id(i).into_owned(),
                        RuleMeta {
                            algorithm: params.algorithm(),
                            accuracy: match r.accuracy {
                                Accuracy::Exact => "exact",
                                Accuracy::Approximate { .. } => "approximate",
                            },
                            partition: match r.partition {
                                Partition::Strict => "strict",
                                Partition::Available => "available",
                            },
                            period_ms: params.period().as_millis() as u64,
                        },
                    )
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        *meta = (version, rules);
    }

    /// The update: the node's Raft view, the enforced rules version, each
    /// global rule's latest sample and the regions' leases. Nothing in it
    /// moves by itself (no "expires in"): it changes only when something
    /// happened, so an idle cluster sends nothing but keep-alives.
    fn render(&self, node: &Node, registry: &Registry, leading: bool) -> String {
        let m = node.raft.metrics().borrow().clone();
        let allocations = &registry.allocations;
        let history = self.history();
        let rules: BTreeMap<&String, Value> = allocations
            .rules
            .keys()
            .filter_map(|id| {
                let series = &history.rule(id)?.split;
                let last = series.samples.back()?;
                let points: BTreeMap<&String, Value> = series
                    .regions
                    .iter()
                    .zip(&last.points)
                    .filter_map(|(region, p)| Some((region, json!(p.as_ref()?))))
                    .collect();
                let meta = self.meta(id);
                Some((
                    id,
                    json!({
                        "limit": last.limit,
                        "epoch": last.epoch,
                        "algorithm": meta.as_ref().map(|m| m.algorithm.name()),
                        "partition": meta.as_ref().map(|m| m.partition),
                        "regions": points,
                    }),
                ))
            })
            .collect();
        drop(history);
        let leases: BTreeMap<&String, Value> = allocations
            .regions
            .iter()
            .map(|(name, l)| {
                (
                    name,
                    json!({
                        "valid_until_unix_ms": l.valid_until_ms,
                        "acked_epoch": l.acked,
                        "last_heard_unix_ms": l.last_heard_ms,
                        "state": registry.regions.get(name).map(|r| r.state),
                    }),
                )
            })
            .collect();
        let current = registry.current();
        json!({
            "node_id": node.id,
            "leader": m.current_leader,
            "term": m.current_term,
            "state": format!("{:?}", m.state),
            "last_log_index": m.last_log_index,
            "applied_index": m.last_applied.map(|l| l.index),
            "hits_counted_here": leading,
            "epoch": allocations.epoch,
            "at_unix_ms": allocations.at_ms,
            "rules_version": current.map(|v| v.number),
            "rules_stage": current.map(|v| &v.stage),
            "rules": rules,
            "leases": leases,
        })
        .to_string()
    }
}
