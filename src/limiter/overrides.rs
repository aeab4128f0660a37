//! The overrides this limiter enforces: the coordinators' set as it last
//! arrived whole on the watch stream (or from the cache file at start),
//! looked up by every check of a matched rule. While none is held a check
//! pays one atomic load; with any number held, two hash lookups.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::algorithm::Params;
use crate::overrides::OverrideIndex;
use crate::rules::Rule;

/// The override set held, swapped whole when a new one arrives.
#[derive(Debug, Default)]
pub struct HeldOverrides {
    index: RwLock<Arc<OverrideIndex>>,
    /// `index.len()`, read without the lock on every check.
    len: AtomicUsize,
    /// Bumped after every `replace`, as `RuleSource`'s: rule handles compare
    /// it on each check and take the new set's overrides of their rule.
    generation: AtomicU64,
}

impl HeldOverrides {
    /// The params an override in force gives `key` of `rule` now.
    pub fn params(&self, rule: &Rule, key: &str) -> Option<Params> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index.params(rule, key, crate::clock::now_unix_ms())
    }

    /// Holds `index` from now on.
    pub fn replace(&self, index: OverrideIndex) {
        let len = index.len();
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(index);
        self.len.store(len, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// How many times the set was replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The set held.
    pub fn current(&self) -> Arc<OverrideIndex> {
        Arc::clone(&self.index.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Overrides held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

/// The cache file beside the rules cache: the set survives a restart
/// without a coordinator, as the rules do.
#[cfg(feature = "server")]
pub mod cache {
    use std::path::{Path, PathBuf};

    use serde::{Deserialize, Serialize};

    use crate::overrides::{Override, OverrideIndex};

    /// Where the override set of the rules cache at `rules_cache` is kept.
    pub fn path_for(rules_cache: &Path) -> PathBuf {
        rules_cache.with_extension("overrides.json")
    }

    #[derive(Serialize, Deserialize)]
    struct Cached {
        version: u64,
        overrides: Vec<Override>,
    }

    /// The set kept by an earlier run, if any (an unreadable file is logged
    /// and ignored: the coordinators send the set again).
    pub fn load(path: &Path) -> Option<OverrideIndex> {
        let bytes = std::fs::read(path).ok()?;
        match serde_json::from_slice::<Cached>(&bytes) {
            Ok(c) => Some(OverrideIndex::new(c.version, &c.overrides)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable overrides cache");
                None
            }
        }
    }

    /// Writes the set atomically (a temporary file renamed over the old),
    /// 0600 like the rules cache.
    pub fn save(path: &Path, index: &OverrideIndex) -> std::io::Result<()> {
        let cached = Cached {
            version: index.version,
            overrides: index.to_overrides(),
        };
        let bytes = serde_json::to_vec(&cached).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("overrides.json.tmp");
        {
            use std::io::Write;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::Override;
    use crate::rules::{RuleFile, RuleSet};

    #[test]
    fn a_replaced_set_is_enforced_and_an_empty_one_clears_it() {
        let set = RuleSet::parse(&[RuleFile {
            name: "r.yaml".into(),
            text: "domain: api\ndescriptors:\n  - key: customer\n    rate_limit: { unit: minute, requests_per_unit: 1000 }\n".into(),
        }])
        .expect("rules");
        let rule = set
            .resolve("api", &[("customer", "42")])
            .and_then(|r| r.rule)
            .expect("rule")
            .clone();
        let held = HeldOverrides::default();
        assert_eq!(held.params(&rule, "customer=42"), None);
        let o = Override {
            domain: "api".into(),
            entries: vec![("customer".into(), "42".into())],
            rule: rule.id.clone(),
            key: "customer=42".into(),
            limit: 5_000,
            burst: None,
            expires_at_unix_ms: None,
            reason: String::new(),
            set_by: String::new(),
            set_at_unix_ms: 0,
            rule_name: None,
        };
        held.replace(OverrideIndex::new(1, [&o]));
        assert_eq!(
            held.params(&rule, "customer=42").map(|p| p.limit()),
            Some(5_000)
        );
        assert_eq!(held.params(&rule, "customer=43"), None);
        held.replace(OverrideIndex::new(2, []));
        assert_eq!(held.params(&rule, "customer=42"), None);
        assert_eq!(held.current().version, 2);
    }

    #[cfg(feature = "server")]
    #[test]
    fn the_cache_keeps_the_set_across_a_restart() {
        let dir = tempfile::tempdir().expect("dir");
        let path = cache::path_for(&dir.path().join("rules-cache-a.json"));
        assert!(path.ends_with("rules-cache-a.overrides.json"), "{path:?}");
        let o = Override {
            domain: String::new(),
            entries: Vec::new(),
            rule: "api|customer".into(),
            key: "customer=42".into(),
            limit: 5_000,
            burst: Some(9),
            expires_at_unix_ms: Some(77),
            reason: String::new(),
            set_by: String::new(),
            set_at_unix_ms: 0,
            rule_name: None,
        };
        let index = OverrideIndex::new(4, [&o]);
        cache::save(&path, &index).expect("save");
        assert_eq!(cache::load(&path), Some(index));
    }
}
