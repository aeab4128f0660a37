//! Clearing counters (an operator's reset): every state key of some counter
//! keys under one rule, deleted by name in `scripts/clear.lua`.
//!
//! All of one counter's keys share its hash tag (`mr:{<rule>:<key>}`, a
//! `limits:` rule's other limits included), so one script call on the node
//! that owns the slot reaches them all. A split rule's sub-counters have tags
//! of their own: on a Cluster they are grouped by slot, one call a group.
//! The names are computed in the script, not sent: a windowed counter is
//! named by its window on the Redis clock, which only the script reads.

use std::collections::HashMap;

use futures::future::try_join_all;
use redis::{Cmd, Script};

use super::{Connection, RedisStore, slot};
use crate::algorithm::Micros;
use crate::store::{Counters, StoreError};

/// Prefixes one script call clears at most. Each names 4 + 6 × periods keys
/// (about 60 for a rule and the seven Envoy units), so a call deletes a few
/// thousand names at most and holds Redis for about a millisecond.
const PREFIXES_PER_CALL: usize = 64;

/// Calls on the wire at once on a Cluster (a split key's groups go to many
/// slots); on a standalone server one at a time, as every prefix fits one
/// node.
const CLUSTER_CALLS_AT_ONCE: usize = 16;

pub(super) fn clear_script() -> Script {
    Script::new(include_str!("scripts/clear.lua"))
}

impl RedisStore {
    /// [`crate::store::Store::clear`]: one script call per group of at most
    /// [`PREFIXES_PER_CALL`] prefixes of one slot, each within the deadline.
    /// A failure fails the whole clear; deleting is idempotent, so the caller
    /// may simply clear again.
    pub(super) async fn clear_counters(
        &self,
        counters: &Counters<'_>,
        now: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let prefixes = counters.prefixes()?;
        let groups = self.slot_groups(prefixes);
        let calls: Vec<Cmd> = groups
            .iter()
            .flat_map(|group| group.chunks(PREFIXES_PER_CALL))
            .map(|chunk| self.clear_call(chunk, counters.periods, now))
            .collect();
        let at_once = if self.is_cluster() {
            CLUSTER_CALLS_AT_ONCE
        } else {
            1
        };
        let mut deleted = 0;
        for wave in calls.chunks(at_once) {
            let replies =
                try_join_all(wave.iter().map(|cmd| self.invoke(&self.clear, cmd))).await?;
            for reply in replies {
                deleted += match reply.as_slice() {
                    &[n] => u64::try_from(n).unwrap_or(0),
                    other => {
                        return Err(StoreError::Reply(format!(
                            "clear answered {other:?}, expected one count"
                        )));
                    }
                };
            }
        }
        Ok(deleted)
    }

    /// Every prefix for a standalone server or Sentinel's master; one group
    /// per hash slot on a Cluster (a script may only touch its own slot).
    fn slot_groups(&self, prefixes: Vec<String>) -> Vec<Vec<String>> {
        match self.connection {
            Connection::Standalone(_) | Connection::Sentinel(_) => vec![prefixes],
            Connection::Cluster(_) => {
                let mut by_slot: HashMap<u16, Vec<String>> = HashMap::new();
                for prefix in prefixes {
                    by_slot.entry(slot(&prefix)).or_default().push(prefix);
                }
                by_slot.into_values().collect()
            }
        }
    }

    fn clear_call(&self, prefixes: &[String], periods: &[u64], now: Option<Micros>) -> Cmd {
        let mut cmd = Cmd::with_capacity(4 + prefixes.len() + periods.len(), 64 * prefixes.len());
        cmd.arg("EVALSHA")
            .arg(self.clear.get_hash())
            .arg(prefixes.len());
        for prefix in prefixes {
            cmd.arg(prefix.as_str());
        }
        match now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        // A zero period would divide by zero in the script; Params never has one.
        for &period in periods.iter().filter(|&&p| p > 0) {
            cmd.arg(period);
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_of_every_key_is_named_in_its_keys_slot() {
        let keys = ["42".to_owned(), "42#0".to_owned()];
        let counters = Counters {
            rule: "api|customer",
            keys: &keys,
            limits: 3,
            periods: &[],
        };
        let names = counters.prefixes().unwrap();
        assert_eq!(
            names,
            [
                "mr:{api|customer:42}:1",
                "mr:{api|customer:42}:2",
                "mr:{api|customer:42}",
                "mr:{api|customer:42#0}:1",
                "mr:{api|customer:42#0}:2",
                "mr:{api|customer:42#0}",
            ]
        );
        assert_eq!(slot(&names[0]), slot(&names[2]));
        assert_eq!(slot(&names[3]), slot(&names[5]));
    }
}
