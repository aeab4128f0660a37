//! Counter resets, as the replicated state keeps them: an operator's order
//! to clear one key's counters in every region, and each region's answer.
//!
//! An order is started for the regions registered at the time. Each region's
//! limiters receive the orders their region has not answered on the watch
//! stream, apply them (`limiter::reset`) and report the outcome; the leader
//! commits the first answer of each region. A region cut off applies the
//! order when it comes back, as long as the order is younger than
//! [`RESET_VALID_MS`]; after that it is no longer sent, and the order says
//! so for that region. Applying an order late would clear what the region
//! counted since, so it is not done forever.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::drill::Actor;

/// How long an order waits for a region that has not answered.
pub const RESET_VALID_MS: i64 = 10 * 60 * 1000;

/// Orders kept (the oldest go first): each is a few hundred bytes.
pub const MAX_RESETS: usize = 1_000;

/// Orders started within a minute: resets are operator actions, a script
/// in a loop is refused before it fills the log.
pub const MAX_RESETS_PER_MINUTE: usize = 120;

/// One region's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionAnswer {
    /// When the pod applied it (its clock).
    pub at_unix_ms: i64,
    /// The pod that answered first.
    pub pod: String,
    pub ok: bool,
    /// What was cleared, or why it failed.
    pub detail: String,
}

/// One reset order and its answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetOrder {
    pub id: u64,
    pub domain: String,
    pub entries: Vec<(String, String)>,
    /// The rule the descriptor must resolve to (`None`: whichever); with
    /// `key`, the rule whose counter `key` is cleared.
    pub rule: Option<String>,
    /// The key as checks by rule name count it, instead of `entries`.
    pub key: Option<String>,
    pub by: Actor,
    pub at_unix_ms: i64,
    /// The regions asked: every region registered when it started.
    pub regions: Vec<String>,
    /// Each region's answer, once it came.
    pub answers: BTreeMap<String, RegionAnswer>,
}

impl ResetOrder {
    /// Whether `region` should still apply it at `now`.
    pub fn pending_for(&self, region: &str, now_unix_ms: i64) -> bool {
        self.regions.iter().any(|r| r == region)
            && !self.answers.contains_key(region)
            && now_unix_ms - self.at_unix_ms < RESET_VALID_MS
    }
}

/// The order as an operator starts it (the id comes with the commit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartReset {
    pub domain: String,
    pub entries: Vec<(String, String)>,
    pub rule: Option<String>,
    pub key: Option<String>,
    pub by: Actor,
    pub at_unix_ms: i64,
    pub regions: Vec<String>,
}

/// Every order kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resets {
    pub last_id: u64,
    pub by_id: BTreeMap<u64, ResetOrder>,
}

impl Resets {
    /// Starts an order; its id, or why it is refused.
    pub fn start(&mut self, start: StartReset) -> Result<u64, String> {
        if start.regions.is_empty() {
            return Err("no region is registered: nothing to reset".into());
        }
        let recent = self
            .by_id
            .values()
            .filter(|o| start.at_unix_ms - o.at_unix_ms < 60_000)
            .count();
        if recent >= MAX_RESETS_PER_MINUTE {
            return Err(format!(
                "{recent} resets were started within the last minute, the most allowed \
                 ({MAX_RESETS_PER_MINUTE}); wait and try again"
            ));
        }
        self.last_id += 1;
        let id = self.last_id;
        self.by_id.insert(
            id,
            ResetOrder {
                id,
                domain: start.domain,
                entries: start.entries,
                rule: start.rule,
                key: start.key,
                by: start.by,
                at_unix_ms: start.at_unix_ms,
                regions: start.regions,
                answers: BTreeMap::new(),
            },
        );
        while self.by_id.len() > MAX_RESETS {
            self.by_id.pop_first();
        }
        Ok(id)
    }

    /// Records `region`'s answer to order `id`; the first answer stands.
    pub fn answered(&mut self, id: u64, region: &str, answer: RegionAnswer) -> Result<(), String> {
        let Some(order) = self.by_id.get_mut(&id) else {
            return Err(format!("reset {id} is not kept"));
        };
        if !order.regions.iter().any(|r| r == region) {
            return Err(format!("reset {id} was not asked of region {region:?}"));
        }
        order.answers.entry(region.to_string()).or_insert(answer);
        Ok(())
    }

    /// The orders `region` should apply at `now`.
    pub fn pending_for(&self, region: &str, now_unix_ms: i64) -> Vec<&ResetOrder> {
        // Only orders younger than the validity can be pending.
        self.by_id
            .values()
            .rev()
            .take_while(|o| now_unix_ms - o.at_unix_ms < RESET_VALID_MS)
            .filter(|o| o.pending_for(region, now_unix_ms))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(at: i64) -> StartReset {
        StartReset {
            domain: "api".into(),
            entries: vec![("customer".into(), "42".into())],
            rule: None,
            key: None,
            by: Actor::default(),
            at_unix_ms: at,
            regions: vec!["east".into(), "west".into()],
        }
    }

    fn answer(pod: &str) -> RegionAnswer {
        RegionAnswer {
            at_unix_ms: 5,
            pod: pod.into(),
            ok: true,
            detail: "3 keys".into(),
        }
    }

    #[test]
    fn an_order_is_pending_for_each_region_until_it_answers_or_it_is_too_old() {
        let mut resets = Resets::default();
        let id = resets.start(start(1_000)).expect("started");
        assert_eq!(id, 1);
        assert_eq!(resets.pending_for("east", 2_000).len(), 1);
        assert!(resets.pending_for("north", 2_000).is_empty(), "not asked");
        resets
            .answered(id, "east", answer("east-0"))
            .expect("answered");
        resets
            .answered(id, "east", answer("east-1"))
            .expect("again");
        assert_eq!(
            resets.by_id[&id].answers["east"].pod, "east-0",
            "the first stands"
        );
        assert!(resets.pending_for("east", 2_000).is_empty());
        assert_eq!(resets.pending_for("west", 2_000).len(), 1);
        assert!(
            resets
                .pending_for("west", 1_000 + RESET_VALID_MS)
                .is_empty()
        );
        assert!(resets.answered(id, "north", answer("n")).is_err());
        assert!(resets.answered(9, "east", answer("e")).is_err());
    }

    #[test]
    fn orders_are_bounded_in_number_and_rate() {
        let mut resets = Resets::default();
        for i in 0..MAX_RESETS_PER_MINUTE {
            resets.start(start(i as i64)).expect("under the rate");
        }
        assert!(resets.start(start(59_000)).is_err(), "past the rate");
        let mut t = 60_000;
        for _ in 0..MAX_RESETS + 10 {
            t += 1_000;
            resets.start(start(t)).expect("spread out");
        }
        assert_eq!(resets.by_id.len(), MAX_RESETS);
        let none = StartReset {
            regions: Vec::new(),
            ..start(t)
        };
        assert!(resets.start(none).is_err());
    }
}
