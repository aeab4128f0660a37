//! The leader's side of failover drills: it watches every drill that is
//! not finished, commits what it observes ([`observe`]) through Raft, stops
//! a drill whose duration ran out, and runs a round at once when a drill
//! begins or ends. Runs on every node and acts only on the leader, so a
//! drill goes on through a leader change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use metrics::counter;

use super::observe::{Memory, Seen, observe};
use super::{Actor, Stop, StopReason};
use crate::clock::now_unix_ms;
use crate::coordinator::allocator::Allocator;
use crate::coordinator::node::{Node, Write};
use crate::coordinator::state::Command;

/// How often the leader looks at its drills when nothing is applied.
pub const OBSERVE_EVERY: Duration = Duration::from_millis(250);

/// Watches drills on this node; see the module docs.
pub struct DrillRunner {
    node: Arc<Node>,
    allocator: Arc<Allocator>,
}

impl DrillRunner {
    pub fn new(node: Arc<Node>, allocator: Arc<Allocator>) -> Arc<DrillRunner> {
        Arc::new(DrillRunner { node, allocator })
    }

    /// The loop; runs until the process stops.
    pub async fn run(self: Arc<Self>) {
        let mut memory: BTreeMap<u64, Memory> = BTreeMap::new();
        // Drills known active at the last look, to run a round when one
        // begins or ends.
        let mut active: BTreeSet<u64> = BTreeSet::new();
        let mut tick = tokio::time::interval(OBSERVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Every applied change is looked at too, so no epoch of a drill is
        // missed between two ticks.
        let mut changes = self.node.applied.clone();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = changes.changed() => if changed.is_err() { return },
            }
            if !self.allocator.is_leader() {
                // A later term starts afresh: its hits are counted anew.
                memory.clear();
                active.clear();
                continue;
            }
            let applied = self.node.applied.borrow().clone();
            let drills = &applied.registry.drills;
            let now_active: BTreeSet<u64> = drills
                .by_id
                .values()
                .filter(|d| d.active())
                .map(|d| d.id)
                .collect();
            if now_active != active {
                self.allocator.nudge();
                active = now_active;
            }
            let now = now_unix_ms();
            if drills.unfinished().next().is_none() {
                memory.clear();
                continue;
            }
            let rules = drills
                .unfinished()
                .flat_map(|d| d.baseline.iter().map(|b| b.rule.clone()))
                .collect::<BTreeSet<_>>();
            let hits = self.allocator.hit_counts(rules.into_iter());
            let windows = self.allocator.drill_windows();
            // Rules not counted in fixed windows take their periods from
            // the ledger, from the earliest unfinished drill's start on.
            let mut from: BTreeMap<String, i64> = BTreeMap::new();
            for d in drills.unfinished() {
                for b in d.baseline.iter().filter(|b| b.period_ms == 0) {
                    let at = from.entry(b.rule.clone()).or_insert(d.started_at_unix_ms);
                    *at = (*at).min(d.started_at_unix_ms);
                }
            }
            let ledger = self
                .allocator
                .with_ledger(|l, _| crate::coordinator::ledger::drill_figures(l, &from))
                .unwrap_or_default();
            let seen = Seen {
                now,
                node: self.node.id,
                allocations: &applied.registry.allocations,
                hits: &hits,
                windows: &windows,
                ledger: &ledger,
            };
            let mut writes = Vec::new();
            for drill in drills.unfinished() {
                let events = observe(drill, &seen, memory.entry(drill.id).or_default());
                if !events.is_empty() {
                    writes.push(Command::DrillObserved {
                        id: drill.id,
                        events,
                    });
                }
                if drill.active() && drill.ends_at().is_some_and(|t| now >= t) {
                    writes.push(Command::StopDrill {
                        id: drill.id,
                        stop: Stop {
                            at_unix_ms: now,
                            by: Actor {
                                credential: "coordinator (the drill's duration ran out)".into(),
                                from: format!("node {}", self.node.id),
                                operator: None,
                            },
                            reason: StopReason::DurationElapsed,
                        },
                    });
                }
            }
            memory.retain(|id, _| drills.by_id.get(id).is_some_and(|d| !d.finished));
            for command in writes {
                if let Err(e) = self.node.write(Write::Command(command), false).await {
                    counter!("meridian_coordinator_drill_write_failures_total").increment(1);
                    tracing::warn!(error = %e, "cannot commit a drill observation");
                    break;
                }
            }
        }
    }
}
