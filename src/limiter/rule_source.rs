//! The rule set a limiter enforces, and its reloading: rule files are polled
//! for changes; a valid edit replaces the rules at once, a broken one is
//! rejected (its errors logged) and the last good rules stay in force.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Whether any rules were loaded yet: false only for a limiter waiting
    /// for its coordinator's first rules (gRPC health reports NOT_SERVING).
    loaded: AtomicBool,
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
        let rules = load(&paths)?;
        Ok(RuleSource {
            current: RwLock::new(Arc::new(rules)),
            shadow: RwLock::new(None),
            paths,
            loaded: AtomicBool::new(true),
        })
    }

    /// A rule set set from outside (the coordinator feed, library use, tests).
    pub fn fixed(rules: RuleSet) -> RuleSource {
        RuleSource {
            current: RwLock::new(Arc::new(rules)),
            shadow: RwLock::new(None),
            paths: Vec::new(),
            loaded: AtomicBool::new(true),
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
    }

    /// Polls the files every `interval` and reloads on change, calling
    /// `on_change` after each successful reload. Runs until dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration, on_change: impl Fn()) {
        if self.paths.is_empty() {
            return;
        }
        let mut seen = self.fingerprint();
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            let now = self.fingerprint();
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

    /// Modification time and length of every file: cheap to poll, and any
    /// editor's save changes one of them.
    fn fingerprint(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.paths
            .iter()
            .map(|p| {
                let m = std::fs::metadata(p).ok()?;
                Some((m.modified().ok()?, m.len()))
            })
            .collect()
    }
}
