//! The rule set a limiter enforces, and its reloading: rule files are polled
//! for changes; a valid edit replaces the rules at once, a broken one is
//! rejected (its errors logged) and the last good rules stay in force.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use metrics::counter;

use crate::rules::{RuleErrors, RuleFile, RuleSet};

/// The rules a limiter process enforces, swapped whole on reload or when the
/// coordinator pushes a version; every check reads the current `Arc`.
pub struct RuleSource {
    /// Swapped whole on reload; readers clone the `Arc` and never hold the lock
    /// across an `.await`.
    current: RwLock<Arc<RuleSet>>,
    /// A rule-set version in its shadow rollout stage: decided and counted
    /// beside `current` (its rules already in shadow mode), never enforced.
    shadow: RwLock<Option<Arc<RuleSet>>>,
    /// The rule files polled for changes; empty when the rules come from the
    /// coordinator (or are fixed, as in the library).
    paths: Vec<PathBuf>,
    /// The files' fingerprint taken just before they were loaded: the
    /// watcher starts from it, so an edit saved between the load and the
    /// watcher's first poll is not taken for the loaded version.
    loaded_from: Fingerprint,
    /// Whether any rules were loaded yet: false only for a limiter waiting
    /// for its coordinator's first rules (gRPC health reports NOT_SERVING).
    loaded: AtomicBool,
    /// Bumped after every replacement of `current`: the library's rule
    /// handles (`embedded::RuleHandle`) resolve their rule once and compare
    /// this on each check, so a replaced rule is never enforced stale.
    generation: AtomicU64,
}

/// Modification time and length of every rule file (`None` where it cannot
/// be read): cheap to poll, and any editor's save changes one of them.
type Fingerprint = Vec<Option<(SystemTime, u64)>>;

fn fingerprint(paths: &[PathBuf]) -> Fingerprint {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// Why rule files could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid rules:\n{0}")]
    Invalid(RuleErrors),
}

/// Reads and validates rule files.
pub fn load(paths: &[PathBuf]) -> Result<RuleSet, LoadError> {
    let files = paths
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .map(|text| RuleFile {
                    name: p.display().to_string(),
                    text,
                })
                .map_err(|source| LoadError::Read {
                    path: p.display().to_string(),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    RuleSet::parse(&files).map_err(LoadError::Invalid)
}

impl RuleSource {
    /// Loads the files once; start-up fails if they are invalid.
    pub fn from_files(paths: Vec<PathBuf>) -> Result<RuleSource, LoadError> {
        // Taken before reading: an edit racing the read is seen as a change.
        let loaded_from = fingerprint(&paths);
        let rules = load(&paths)?;
        Ok(RuleSource {
            current: RwLock::new(Arc::new(rules)),
            shadow: RwLock::new(None),
            paths,
            loaded_from,
            loaded: AtomicBool::new(true),
            generation: AtomicU64::new(0),
        })
    }

    /// A rule set set from outside (the coordinator feed, library use, tests).
    pub fn fixed(rules: RuleSet) -> RuleSource {
        RuleSource {
            current: RwLock::new(Arc::new(rules)),
            shadow: RwLock::new(None),
            paths: Vec::new(),
            loaded_from: Vec::new(),
            loaded: AtomicBool::new(true),
            generation: AtomicU64::new(0),
        }
    }

    /// No rules yet: a limiter following a coordinator before the first
    /// version (or its cache) arrives. Checks match nothing meanwhile.
    pub fn awaiting() -> RuleSource {
        let source = RuleSource::fixed(RuleSet::default());
        source.loaded.store(false, Ordering::Release);
        source
    }

    /// Whether rules were loaded (from files, a cache or the coordinator).
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    pub fn shadow(&self) -> Option<Arc<RuleSet>> {
        self.shadow
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the enforced rules and the shadow set together.
    pub fn set(&self, enforced: RuleSet, shadow: Option<RuleSet>) {
        self.replace(enforced);
        *self.shadow.write().unwrap_or_else(|e| e.into_inner()) = shadow.map(Arc::new);
    }

    pub fn current(&self) -> Arc<RuleSet> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn replace(&self, rules: RuleSet) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
        self.loaded.store(true, Ordering::Release);
        // After the swap: whoever sees the new generation reads the new rules.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// How many times the rules were replaced (see the field).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Polls the files every `interval` and reloads on change, calling
    /// `on_change` after each successful reload. Runs until dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration, on_change: impl Fn()) {
        if self.paths.is_empty() {
            return;
        }
        let mut seen = self.loaded_from.clone();
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            let now = fingerprint(&self.paths);
            if now == seen {
                continue;
            }
            seen = now;
            match load(&self.paths) {
                Ok(rules) => {
                    self.replace(rules);
                    counter!("meridian_rule_reloads_total", "result" => "ok").increment(1);
                    tracing::info!(files = ?self.paths, "rules reloaded");
                    on_change();
                }
                Err(e) => {
                    counter!("meridian_rule_reloads_total", "result" => "rejected").increment(1);
                    tracing::warn!(error = %e, "rule edit rejected; the previous rules stay in force");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_PER_HOUR: &str = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

    /// An edit saved after the files were loaded but before the watcher's
    /// first poll is still picked up: the watcher starts from what was loaded,
    /// not from what is on disk when it happens to start.
    #[tokio::test]
    async fn an_edit_between_load_and_the_first_poll_is_reloaded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, TWO_PER_HOUR).expect("write rules");
        let source = Arc::new(RuleSource::from_files(vec![path.clone()]).expect("valid rules"));
        let edited = TWO_PER_HOUR.replace("requests_per_unit: 2", "requests_per_unit: 7");
        std::fs::write(&path, edited).expect("edit rules");

        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let watcher = tokio::spawn(Arc::clone(&source).watch(
            Duration::from_millis(10),
            move || {
                let _ = tx.send(());
            },
        ));
        let reloaded = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
        watcher.abort();
        assert!(
            reloaded.is_ok(),
            "the edit made before the first poll was never reloaded"
        );
        let limits: Vec<u64> = source
            .current()
            .rules()
            .map(|r| r.requests_per_unit)
            .collect();
        assert_eq!(limits, [7], "the reloaded rules");
    }
}
