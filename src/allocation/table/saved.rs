//! A region's table as its pods keep it between processes: what a pod
//! enforces for one epoch, so that a pod that starts while no coordinator
//! answers enforces the same — the same values, the same window boundaries
//! pending, the same lease — and lapses on the same schedule.
//!
//! Only whole values travel: the lapse is applied when a limit is read (as
//! for every table), on the reading pod's clock, so a table saved during
//! its lease and read after it enforces the fallback, then nothing.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{RuleView, Table, Value};
use crate::allocation::{Epoch, Millis};

/// The format of [`SavedTable`]; a pod refuses a table of another version
/// (a newer build's) instead of guessing at it.
pub const SAVED_TABLE_VERSION: u32 = 1;

/// One region's table for one epoch, as kept in the region's store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTable {
    /// [`SAVED_TABLE_VERSION`].
    pub version: u32,
    /// The epoch the table holds.
    pub epoch: Epoch,
    /// The region's lease (Unix ms): past it, the fallbacks.
    pub valid_until_ms: Millis,
    /// Each rule's `fallback_hold` (ms) as the saving pod enforced it.
    pub holds: Vec<(String, i64)>,
    /// Every rule the table holds, by id.
    pub rules: Vec<SavedRule>,
}

/// One rule of a [`SavedTable`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedRule {
    /// The rule's (or limit's) id.
    pub rule: String,
    /// The world-wide limit.
    pub limit: u64,
    /// What the region enforces once its lease lapses.
    pub fallback: u64,
    /// The value of keys without an entry.
    pub split: SavedValue,
    /// Keys with their own value.
    pub keys: Vec<(String, SavedValue)>,
    /// Entries removed whose old value holds until the window boundary
    /// (the second field).
    pub retiring: Vec<(String, SavedValue, Millis)>,
}

/// A value in force and the one waiting for a window boundary: (value,
/// boundary in Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SavedValue(pub u64, pub Option<(u64, Millis)>);

impl From<&Value> for SavedValue {
    fn from(v: &Value) -> SavedValue {
        SavedValue(v.active, v.next)
    }
}

impl From<SavedValue> for Value {
    fn from(v: SavedValue) -> Value {
        Value {
            active: v.0,
            next: v.1,
        }
    }
}

impl Table {
    /// The table as it is kept, rules and keys sorted (the same table
    /// always gives the same bytes).
    pub fn saved(&self) -> SavedTable {
        let mut rules: Vec<SavedRule> = self
            .rules
            .iter()
            .map(|(id, view)| {
                let mut keys: Vec<(String, SavedValue)> = view
                    .keys
                    .iter()
                    .map(|(k, v)| (k.clone(), v.into()))
                    .collect();
                keys.sort_by(|a, b| a.0.cmp(&b.0));
                let mut retiring: Vec<(String, SavedValue, Millis)> = view
                    .retiring
                    .iter()
                    .map(|(k, (v, until))| (k.clone(), v.into(), *until))
                    .collect();
                retiring.sort_by(|a, b| a.0.cmp(&b.0));
                SavedRule {
                    rule: id.clone(),
                    limit: view.limit,
                    fallback: view.fallback,
                    split: (&view.split).into(),
                    keys,
                    retiring,
                }
            })
            .collect();
        rules.sort_by(|a, b| a.rule.cmp(&b.rule));
        let mut holds: Vec<(String, i64)> =
            self.holds.iter().map(|(r, h)| (r.clone(), *h)).collect();
        holds.sort();
        SavedTable {
            version: SAVED_TABLE_VERSION,
            epoch: self.epoch,
            valid_until_ms: self.valid_until_ms,
            holds,
            rules,
        }
    }

    /// The table `saved` describes, holding its epoch (so an older update is
    /// refused, a newer one applies as a change) and its holds.
    pub fn restored(saved: &SavedTable) -> Table {
        Table {
            epoch: saved.epoch,
            valid_until_ms: saved.valid_until_ms,
            rules: saved
                .rules
                .iter()
                .map(|r| {
                    let view = RuleView {
                        limit: r.limit,
                        fallback: r.fallback,
                        split: r.split.into(),
                        keys: r
                            .keys
                            .iter()
                            .map(|(k, v)| (k.clone(), (*v).into()))
                            .collect(),
                        retiring: r
                            .retiring
                            .iter()
                            .map(|(k, v, until)| (k.clone(), ((*v).into(), *until)))
                            .collect(),
                        fresh: false,
                    };
                    (r.rule.clone(), view)
                })
                .collect(),
            holds: saved.holds.iter().cloned().collect::<HashMap<_, _>>(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{RegionUpdate, RuleUpdate};
    use super::*;
    use crate::allocation::lapsed_value;

    const MINUTE: u64 = 60_000;

    fn update(
        epoch: Epoch,
        valid_until_ms: Millis,
        split: u64,
        keys: &[(&str, u64)],
    ) -> RegionUpdate {
        RegionUpdate {
            epoch,
            valid_until_ms,
            full: true,
            rules: vec![RuleUpdate {
                rule: "r".into(),
                limit: 1_000,
                fallback: 100,
                split: Some(split),
                keys: keys
                    .iter()
                    .map(|(k, v)| (k.to_string(), Some(*v)))
                    .collect(),
                ..Default::default()
            }],
            removed_rules: vec![],
        }
    }

    #[test]
    fn a_restored_table_enforces_what_the_saved_one_did_and_lapses_on_the_same_schedule() {
        let window = |_: &str| Some(MINUTE);
        let mut table = Table::default();
        let lease = 10 * MINUTE as i64 + 30_000;
        table
            .apply(
                &update(7, lease, 400, &[("hot", 600), ("cold", 50)]),
                0,
                window,
            )
            .expect("applies");
        table.set_fallback_holds(HashMap::from([("r".to_string(), 20_000)]));
        // A shrink of the split pending at the next boundary, an entry
        // retiring until then.
        let mut shrink = update(8, lease, 300, &[("hot", 600)]);
        shrink.full = true;
        table.apply(&shrink, 5_000, window).expect("applies");

        let saved = table.saved();
        let restored = Table::restored(&saved);
        assert_eq!(restored.epoch(), 8);
        assert_eq!(restored.valid_until_ms(), lease);
        assert_eq!(restored.saved(), saved, "the same table, the same bytes");
        for now in [
            5_000,
            59_999,
            60_000,
            lease,
            lease + 1,
            lease + 20_000,
            lease + 20_001,
        ] {
            for key in ["hot", "cold", "other"] {
                assert_eq!(
                    restored.limit("r", key, now),
                    table.limit("r", key, now),
                    "{key} at {now}"
                );
            }
        }
        // The schedule itself: the split's 400 until the boundary, 300 after,
        // min(300, fallback) past the lease, nothing past the hold.
        let split_at = |now| restored.limit("r", "other", now);
        assert_eq!(split_at(59_999), Some(400));
        assert_eq!(split_at(60_000), Some(300));
        assert_eq!(
            split_at(lease + 1),
            Some(lapsed_value(300, 100, lease, 20_000, lease + 1))
        );
        assert_eq!(split_at(lease + 1), Some(100));
        assert_eq!(split_at(lease + 20_001), Some(0));
        assert_eq!(restored.limit("r", "cold", 59_999), Some(50), "retiring");

        // Fenced like the table it came from.
        let mut restored = restored;
        assert!(
            restored
                .apply(&update(7, lease, 999, &[]), 70_000, window)
                .is_err()
        );
        restored
            .apply(&update(8, lease + MINUTE as i64, 500, &[]), 70_000, window)
            .expect("a snapshot of the same epoch replaces it");
        assert_eq!(restored.limit("r", "other", 120_000), Some(500));
    }
}
