//! An allocation update too large for one watch message, as parts.
//!
//! The coordinator [`split`]s an update so that each part, framed in its
//! `WatchUpdate`, encodes to at most the stream's per-message budget; the
//! limiter's [`Assembly`] joins the parts of one update and hands it over
//! only when the last one arrived, so the table never holds half a snapshot.
//! Splitting never drops or reorders anything: joining the parts gives the
//! update back (see the tests).

use prost::Message;
use prost::encoding::encoded_len_varint;

use super::meridian::v1 as pb;

/// What a length-delimited field of `len` bytes costs in its parent: its tag
/// (field numbers below 16 take one byte), its length and its bytes.
fn field(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// The frame a part travels in: `WatchUpdate.allocations` (field 2), with no
/// `rules` beside it.
pub fn framed_len(part: &pb::AllocationUpdate) -> usize {
    field(part.encoded_len())
}

/// Splits `update` into parts whose `WatchUpdate` frames each encode to at
/// most `budget` bytes. An update that fits is returned whole (part 0, no
/// more). Only a single key entry larger than the budget could make a part
/// exceed it; key names are bounded far below any sane budget.
pub fn split(update: pb::AllocationUpdate, budget: usize) -> Vec<pb::AllocationUpdate> {
    if framed_len(&update) <= budget {
        return vec![update];
    }
    let pb::AllocationUpdate {
        epoch,
        valid_until_unix_ms,
        full,
        rules,
        removed_rules,
        ..
    } = update;
    let header = pb::AllocationUpdate {
        epoch,
        valid_until_unix_ms,
        full,
        ..Default::default()
    };
    // The frame and the header with the largest part number and `more`:
    // an upper bound for every part's own fields.
    let bound = pb::AllocationUpdate {
        part: u32::MAX,
        more: true,
        ..header.clone()
    };
    let base = 1 + encoded_len_varint(budget as u64) + bound.encoded_len();
    let mut parts = Vec::new();
    let mut current = header.clone();
    let mut used = base;
    for mut rule in rules {
        let keys = std::mem::take(&mut rule.keys);
        let head_len = rule.encoded_len();
        let mut chunk = rule.clone();
        let mut chunk_len = head_len;
        for key in keys {
            let cost = field(key.encoded_len());
            let placed = !chunk.keys.is_empty() || !current.rules.is_empty();
            if used + field(chunk_len + cost) > budget && placed {
                if !chunk.keys.is_empty() {
                    current.rules.push(chunk);
                }
                parts.push(std::mem::replace(&mut current, header.clone()));
                used = base;
                chunk = rule.clone();
                chunk_len = head_len;
            }
            chunk.keys.push(key);
            chunk_len += cost;
        }
        if used + field(chunk_len) > budget && !current.rules.is_empty() {
            parts.push(std::mem::replace(&mut current, header.clone()));
            used = base;
        }
        used += field(chunk_len);
        current.rules.push(chunk);
    }
    for removed in removed_rules {
        let cost = field(removed.len());
        let placed = !current.rules.is_empty() || !current.removed_rules.is_empty();
        if used + cost > budget && placed {
            parts.push(std::mem::replace(&mut current, header.clone()));
            used = base;
        }
        used += cost;
        current.removed_rules.push(removed);
    }
    parts.push(current);
    let last = parts.len() - 1;
    for (i, part) in parts.iter_mut().enumerate() {
        part.part = i as u32;
        part.more = i < last;
    }
    parts
}

/// Why parts could not be joined: the stream is not one a coordinator of
/// this build sends, so the limiter leaves it for another node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    /// A part other than the one expected next.
    #[error("allocation update part {got} arrived where part {expected} was due")]
    OutOfOrder {
        /// The part number that was due.
        expected: u32,
        /// The one that came.
        got: u32,
    },
    /// A part of another update (epoch or kind) than the parts before it.
    #[error(
        "allocation update part {part} is of epoch {got} (full: {full}), the parts before it of epoch {expected}"
    )]
    Mixed {
        /// The part's number.
        part: u32,
        /// The epoch of the parts before it.
        expected: u64,
        /// The part's epoch.
        got: u64,
        /// The part's `full` flag.
        full: bool,
    },
    /// The parts add up to more than [`super::MAX_ASSEMBLED_UPDATE_BYTES`].
    #[error("allocation update parts exceed {max} bytes")]
    TooLarge {
        /// The bound.
        max: usize,
    },
}

/// The parts of one update received so far on one stream.
#[derive(Debug, Default)]
pub struct Assembly {
    /// The update joined from its parts so far; `None` between updates.
    pending: Option<pb::AllocationUpdate>,
    /// Encoded bytes of the parts joined, against the bound.
    bytes: usize,
}

impl Assembly {
    /// Takes the next part; the whole update once `part` was its last.
    pub fn add(
        &mut self,
        part: pb::AllocationUpdate,
    ) -> Result<Option<pb::AllocationUpdate>, PartError> {
        let expected = self.pending.as_ref().map_or(0, |p| p.part + 1);
        if part.part != expected {
            self.pending = None;
            return Err(PartError::OutOfOrder {
                expected,
                got: part.part,
            });
        }
        self.bytes = if expected == 0 { 0 } else { self.bytes } + part.encoded_len();
        if self.bytes > super::MAX_ASSEMBLED_UPDATE_BYTES {
            self.pending = None;
            return Err(PartError::TooLarge {
                max: super::MAX_ASSEMBLED_UPDATE_BYTES,
            });
        }
        let more = part.more;
        let joined = match self.pending.take() {
            None => part,
            Some(mut joined) => {
                if (joined.epoch, joined.full) != (part.epoch, part.full) {
                    return Err(PartError::Mixed {
                        part: part.part,
                        expected: joined.epoch,
                        got: part.epoch,
                        full: part.full,
                    });
                }
                let mut rules = part.rules.into_iter();
                // A rule cut between parts continues with its next keys.
                if let Some(first) = rules.next() {
                    match joined.rules.last_mut() {
                        Some(last) if last.rule == first.rule => last.keys.extend(first.keys),
                        _ => joined.rules.push(first),
                    }
                }
                joined.rules.extend(rules);
                joined.removed_rules.extend(part.removed_rules);
                joined.part = part.part;
                joined.valid_until_unix_ms = part.valid_until_unix_ms;
                joined
            }
        };
        if more {
            self.pending = Some(joined);
            return Ok(None);
        }
        self.bytes = 0;
        Ok(Some(pb::AllocationUpdate {
            part: 0,
            more: false,
            ..joined
        }))
    }

    /// Whether parts of an update are waiting for the rest.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(rules: usize, keys: usize) -> pb::AllocationUpdate {
        pb::AllocationUpdate {
            epoch: 7,
            valid_until_unix_ms: 1_700_000_000_000,
            full: true,
            rules: (0..rules)
                .map(|r| pb::RuleAllocation {
                    rule: format!("api|rule-{r}"),
                    limit: 1_000,
                    fallback: 100,
                    split: Some(500),
                    keys: (0..keys)
                        .map(|k| pb::KeyAllocation {
                            key: format!("customer-{k:06}"),
                            value: Some(k as u64),
                            immediate: k % 3 == 0,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            removed_rules: (0..50).map(|i| format!("api|gone-{i}")).collect(),
            ..Default::default()
        }
    }

    fn join(parts: Vec<pb::AllocationUpdate>) -> pb::AllocationUpdate {
        let mut assembly = Assembly::default();
        let mut whole = None;
        let n = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let out = assembly.add(part).expect("a part in order");
            assert_eq!(out.is_some(), i + 1 == n, "whole only after the last part");
            whole = out.or(whole);
        }
        whole.expect("the last part completes the update")
    }

    #[test]
    fn every_part_fits_the_budget_and_joining_gives_the_update_back() {
        for (rules, keys, budget) in [(3, 2_000, 8_192), (40, 30, 2_048), (1, 0, 256)] {
            let original = update(rules, keys);
            let parts = split(original.clone(), budget);
            if framed_len(&original) > budget {
                assert!(parts.len() > 1, "{rules}×{keys} in {budget}: not split");
            }
            for part in &parts {
                assert!(
                    framed_len(part) <= budget,
                    "a part of {} bytes over {budget}",
                    framed_len(part)
                );
            }
            assert_eq!(join(parts), original, "{rules}×{keys} in {budget}");
        }
    }

    #[test]
    fn an_update_that_fits_is_one_message_as_before() {
        let small = update(2, 3);
        assert_eq!(split(small.clone(), 1 << 20), vec![small]);
    }

    #[test]
    fn parts_out_of_order_or_of_another_epoch_are_refused() {
        let mut parts = split(update(3, 2_000), 8_192);
        assert!(parts.len() >= 3);
        let mut assembly = Assembly::default();
        assert_eq!(assembly.add(parts[0].clone()), Ok(None));
        assert_eq!(
            assembly.add(parts[2].clone()),
            Err(PartError::OutOfOrder {
                expected: 1,
                got: 2
            })
        );
        assert!(!assembly.is_pending(), "a broken update is dropped");
        parts[1].epoch = 8;
        assert_eq!(assembly.add(parts[0].clone()), Ok(None));
        assert!(matches!(
            assembly.add(parts[1].clone()),
            Err(PartError::Mixed { .. })
        ));
    }
}
