//! The override set on the watch stream: the coordinator [`split`]s it into
//! parts of at most [`ENTRIES_PER_PART`] entries (each under a megabyte
//! encoded, whatever the keys' length within their bound), and the
//! limiter's [`OverrideAssembly`] hands over the whole set once its last
//! part arrived, so it never enforces half of one.

use super::meridian::v1 as pb;
use std::sync::Arc;

use crate::overrides::{MAX_OVERRIDES, Override, OverrideIndex, Overrides};

/// Entries per watch message: a key is at most a few hundred bytes.
pub const ENTRIES_PER_PART: usize = 2_000;

/// The set at `version` as watch parts (one, empty, for an empty set).
/// Overrides expired at `now` are left out.
pub fn split<'a>(
    version: u64,
    overrides: impl IntoIterator<Item = &'a Override>,
    now_unix_ms: i64,
) -> Vec<pb::OverrideSet> {
    let entries: Vec<pb::OverrideEntry> = overrides
        .into_iter()
        .filter(|o| o.live_at(now_unix_ms))
        .map(|o| pb::OverrideEntry {
            rule: o.rule.clone(),
            key: o.key.clone(),
            limit: o.limit,
            burst: o.burst.unwrap_or(0),
            expires_at_unix_ms: o.expires_at_unix_ms.unwrap_or(0),
        })
        .collect();
    let mut parts: Vec<pb::OverrideSet> = entries
        .chunks(ENTRIES_PER_PART)
        .enumerate()
        .map(|(i, chunk)| pb::OverrideSet {
            version,
            part: i as u32,
            more: true,
            entries: chunk.to_vec(),
        })
        .collect();
    if parts.is_empty() {
        parts.push(pb::OverrideSet {
            version,
            ..pb::OverrideSet::default()
        });
    }
    if let Some(last) = parts.last_mut() {
        last.more = false;
    }
    parts
}

/// The parts of the newest set, computed once per version and shared by
/// every watch stream that sends it.
#[derive(Debug, Default)]
pub struct PartsCache {
    /// `std` mutex: held while the parts are computed, never across an `.await`.
    parts: std::sync::Mutex<Option<(u64, Arc<Vec<pb::OverrideSet>>)>>,
}

impl PartsCache {
    /// The parts of `overrides` (computed at the first call for its version).
    pub fn get(&self, overrides: &Overrides) -> Arc<Vec<pb::OverrideSet>> {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        match parts.as_ref() {
            Some((version, held)) if *version == overrides.version => Arc::clone(held),
            _ => {
                let now = crate::clock::now_unix_ms();
                let fresh = Arc::new(split(overrides.version, overrides.by_id.values(), now));
                *parts = Some((overrides.version, Arc::clone(&fresh)));
                fresh
            }
        }
    }
}

/// The parts of one set as they arrive.
#[derive(Debug, Default)]
pub struct OverrideAssembly {
    version: u64,
    next_part: u32,
    entries: Vec<Override>,
}

/// A part out of order, or a set past the bound: the stream is broken (the
/// limiter reconnects and keeps the set it held).
#[derive(Debug, thiserror::Error)]
#[error("override set {version}: part {part} arrived, {expected}")]
pub struct OutOfOrder {
    version: u64,
    part: u32,
    expected: String,
}

impl OverrideAssembly {
    /// Takes a part; the whole set's index once its last part arrived.
    pub fn add(&mut self, part: pb::OverrideSet) -> Result<Option<OverrideIndex>, OutOfOrder> {
        if part.part == 0 {
            *self = OverrideAssembly {
                version: part.version,
                ..OverrideAssembly::default()
            };
        } else if part.part != self.next_part || part.version != self.version {
            return Err(OutOfOrder {
                version: part.version,
                part: part.part,
                expected: format!(
                    "part {} of set {} was expected",
                    self.next_part, self.version
                ),
            });
        }
        if self.entries.len() + part.entries.len() > MAX_OVERRIDES {
            return Err(OutOfOrder {
                version: part.version,
                part: part.part,
                expected: format!("the set would pass the bound of {MAX_OVERRIDES} overrides"),
            });
        }
        self.next_part = part.part + 1;
        self.entries
            .extend(part.entries.into_iter().map(|e| Override {
                rule: e.rule,
                key: e.key,
                limit: e.limit,
                burst: (e.burst > 0).then_some(e.burst),
                expires_at_unix_ms: (e.expires_at_unix_ms > 0).then_some(e.expires_at_unix_ms),
                domain: String::new(),
                entries: Vec::new(),
                reason: String::new(),
                set_by: String::new(),
                set_at_unix_ms: 0,
                rule_name: None,
            }));
        if part.more {
            return Ok(None);
        }
        let entries = std::mem::take(&mut self.entries);
        Ok(Some(OverrideIndex::new(self.version, &entries)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(i: usize, expires: Option<i64>) -> Override {
        Override {
            domain: "api".into(),
            entries: vec![("customer".into(), i.to_string())],
            rule: "api|customer".into(),
            key: format!("customer={i}"),
            limit: 5_000,
            burst: None,
            expires_at_unix_ms: expires,
            reason: String::new(),
            set_by: String::new(),
            set_at_unix_ms: 0,
            rule_name: None,
        }
    }

    #[test]
    fn a_large_set_travels_in_parts_and_is_whole_only_at_its_last() {
        let set: Vec<Override> = (0..ENTRIES_PER_PART * 2 + 5)
            .map(|i| o(i, (i == 3).then_some(10)))
            .collect();
        let parts = split(7, &set, 100);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.version == 7));
        use prost::Message;
        assert!(parts.iter().all(|p| p.encoded_len() < 1024 * 1024));
        let mut assembly = OverrideAssembly::default();
        let mut whole = None;
        for (i, part) in parts.into_iter().enumerate() {
            let got = assembly.add(part).expect("in order");
            assert_eq!(got.is_some(), i == 2, "whole only after the last part");
            whole = got;
        }
        let index = whole.expect("whole");
        assert_eq!(index.version, 7);
        assert_eq!(index.len(), set.len() - 1, "the expired one is not sent");
        // An empty set is one empty part: the limiter drops what it held.
        let parts = split(8, &[], 100);
        assert_eq!(parts.len(), 1);
        assert!(
            assembly
                .add(parts[0].clone())
                .expect("ok")
                .is_some_and(|i| i.is_empty())
        );
        // A part out of order breaks the stream.
        let mut parts = split(9, &set, 100);
        parts.remove(1);
        let mut assembly = OverrideAssembly::default();
        assert!(assembly.add(parts[0].clone()).expect("first").is_none());
        assert!(assembly.add(parts[1].clone()).is_err());
    }
}
