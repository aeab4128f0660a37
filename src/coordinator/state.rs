//! The replicated state and the commands that change it.
//!
//! Pure: [`Registry::apply`] is the only code that mutates replicated state,
//! and it runs inside the Raft state machine on every node with the same
//! commands in the same order. Anything that varies between nodes (the clock,
//! validation of YAML) happens before a command is proposed, and the command
//! carries the result (`at_unix_ms`).
//!
//! These types travel through Raft as bincode, which cannot decode serde's
//! internally tagged enums: keep the default (external) enum tagging.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::drill::{Drills, Event as DrillEvent, StartDrill, Stop};
use super::resets::{RegionAnswer, Resets, StartReset};
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::{Allocations, EpochDelta};
use crate::cluster_id::ClusterId;
use crate::overrides::{Imports, Override, OverrideChange, Overrides, Refused as OverrideRefused};
use crate::rules::{RuleErrors, RuleFile, RuleSet};

/// A rule-set version's place in the staged rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Limiters decide and count with it, but enforce the stable version.
    Shadow,
    /// Enforced only in these regions; the others enforce the stable version.
    Canary { regions: Vec<String> },
    /// Enforced everywhere.
    All,
}

/// How a version came to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Put,
    /// A copy of version `of`'s files, made by a rollback.
    Rollback {
        of: u64,
    },
}

/// One immutable rule-set version; only its stage moves, and only while it is
/// the newest version. Stored one per row in the Raft store (`sm_versions`),
/// so an apply rewrites only the versions it touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSetVersion {
    /// 1, 2, …: the order versions were created in, never reused.
    pub number: u64,
    /// File name → YAML text, as validated when the version was proposed.
    pub files: BTreeMap<String, String>,
    /// Where the version is enforced; see [`Stage`].
    pub stage: Stage,
    /// A put or a rollback copy, for the admin API's history.
    pub origin: Origin,
    /// The proposing leader's clock, carried in the command.
    pub created_at_unix_ms: i64,
}

impl RuleSetVersion {
    /// The version's files, as the parser and validation take them.
    pub fn rule_files(&self) -> Vec<RuleFile> {
        self.files
            .iter()
            .map(|(name, text)| RuleFile {
                name: name.clone(),
                text: text.clone(),
            })
            .collect()
    }
}

/// A region's state in the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionState {
    Active,
    /// Its share is being moved away (drills, maintenance).
    Draining,
    Failed,
}

/// A region as the operator registered it: its weight in static allocations
/// and its state. The rebalancer reads these; only `PutRegion` and
/// `DeleteRegion` change them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// The region's name, as limiters report it (and the registry's key).
    pub name: String,
    /// Relative share of static allocations (> 0).
    pub weight: f64,
    pub state: RegionState,
    /// When an operator last put it (the leader's clock).
    pub updated_at_unix_ms: i64,
}

/// Every change to replicated state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Create version N+1 from already validated files.
    PutRules {
        files: BTreeMap<String, String>,
        stage: Stage,
        at_unix_ms: i64,
    },
    /// Move the newest version to another stage. `version` guards against
    /// rolling out another version than the caller saw; `None`: whichever
    /// version is newest when the command is applied.
    Rollout {
        version: Option<u64>,
        stage: Stage,
    },
    /// Create version N+1 with the files of `to`, or of the previous stable
    /// version when `to` is `None`, at stage `All`.
    Rollback {
        to: Option<u64>,
        at_unix_ms: i64,
    },
    PutRegion {
        name: String,
        weight: f64,
        state: RegionState,
        at_unix_ms: i64,
    },
    DeleteRegion {
        name: String,
    },
    /// The next allocation epoch, as the leader's rebalancer computed it from
    /// the state at `delta.epoch - 1`. Refused unless it is exactly the next
    /// epoch: a delta computed from an older state (a deposed leader, a race
    /// of two rounds) must not be applied on top of a newer one.
    Epoch(EpochDelta),
    /// Names the cluster for good: applied only while it has no id, so the
    /// first leader's proposal wins and a later one (two leaders racing, a
    /// new leader that had not applied the first yet) changes nothing.
    /// Appended last: bincode tags variants by position, and the earlier
    /// variants must keep theirs (storage format 2 reads format 1's log).
    SetClusterId(ClusterId),
    /// Starts a failover drill (storage format 3; the drill commands come
    /// after every earlier variant for the same reason as above).
    StartDrill(StartDrill),
    /// Stops drill `id`: by an operator, or by the leader when its duration ran out.
    StopDrill {
        id: u64,
        stop: Stop,
    },
    /// What the leader observed of drill `id` since its last observation.
    DrillObserved {
        id: u64,
        events: Vec<DrillEvent>,
    },
    /// Sets and removes per-key overrides, all or nothing (storage format
    /// 4, appended after the drill commands).
    SetOverrides(OverrideChange),
    /// Starts a counter reset in every registered region (format 4).
    StartReset(StartReset),
    /// A region's answer to reset `id` (format 4).
    ResetAnswered {
        id: u64,
        region: String,
        answer: RegionAnswer,
    },
    /// Stages chunk `seq` of a bulk override import (format 4): applied by
    /// a later `SetOverrides` naming `import`.
    StageOverrides {
        import: u64,
        seq: u32,
        rows: Vec<Override>,
        at_unix_ms: i64,
    },
}

impl Command {
    /// For a drill command, the drill it touches: `Some(None)` for a start
    /// (its id comes with the outcome), `None` for any other command.
    pub fn drill(&self) -> Option<Option<u64>> {
        match self {
            Command::StartDrill(_) => Some(None),
            Command::StopDrill { id, .. } | Command::DrillObserved { id, .. } => Some(Some(*id)),
            _ => None,
        }
    }

    /// Whether the command touches the staged imports.
    pub fn touches_imports(&self) -> bool {
        matches!(
            self,
            Command::StageOverrides { .. }
                | Command::SetOverrides(OverrideChange {
                    import: Some(_),
                    ..
                })
        )
    }

    /// Whether the command touches the resets.
    pub fn is_reset(&self) -> bool {
        matches!(self, Command::StartReset(_) | Command::ResetAnswered { .. })
    }
}

/// What applying a command did. A rejected command is still in the log (every
/// node rejects it identically); it changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// Applied; `version` is the rule-set version the command created or moved.
    Applied { version: Option<u64> },
    /// Refused against the state it met, e.g. a rollout of a superseded
    /// version or a rollback with nothing to roll back to.
    Rejected { reason: String },
    /// Refused because what it names does not exist (a version, a region).
    NotFound { reason: String },
    /// Membership changes and blank entries carry no command.
    Nothing,
}

/// The replicated state: what every coordinator node holds identically, held
/// by the Raft state machine (`raft::storage`) and changed only by
/// [`Registry::apply`]. Its bincode is the storage format (see
/// `raft::storage`'s format versions): changing a field here changes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Registry {
    /// Every rule-set version ever created, by number. Versions are never
    /// edited or deleted, so any of them can be rolled back to.
    pub versions: BTreeMap<u64, RuleSetVersion>,
    /// Registered regions by name.
    pub regions: BTreeMap<String, Region>,
    /// Global limits divided between regions (see `crate::allocation`).
    pub allocations: Allocations,
    /// Which cluster this is, set once by its first leader
    /// ([`Command::SetClusterId`]) and never changed. Limiters take rules
    /// only from the cluster whose id they hold. `None` in a new cluster
    /// and in data written in storage format 1, until a leader sets it.
    pub cluster_id: Option<ClusterId>,
    /// Failover drills, active and past (from storage format 3; after the
    /// cluster id, so a format-2 payload is this one without it and the
    /// overrides).
    pub drills: Drills,
    /// Per-key overrides (from storage format 4; last). An `Arc`: the state
    /// is cloned for every apply batch and published to readers, and only
    /// an override change copies the set.
    pub overrides: Arc<Overrides>,
    /// Counter resets and each region's answer (from format 4).
    pub resets: Resets,
    /// Bulk override imports staged chunk by chunk (from format 4; last).
    pub override_imports: Arc<Imports>,
}

fn rejected(reason: impl Into<String>) -> Outcome {
    Outcome::Rejected {
        reason: reason.into(),
    }
}

impl Registry {
    /// The newest version, whatever its stage.
    pub fn current(&self) -> Option<&RuleSetVersion> {
        self.versions.values().next_back()
    }

    /// The newest version before `current` that reached stage `All`: what
    /// regions enforce while `current` is in shadow or outside its canary.
    /// `None` when `current` is itself at `All`.
    pub fn stable(&self) -> Option<&RuleSetVersion> {
        let current = self.current()?;
        if current.stage == Stage::All {
            return None;
        }
        self.versions
            .range(..current.number)
            .rev()
            .map(|(_, v)| v)
            .find(|v| v.stage == Stage::All)
    }

    /// The version limiters enforce everywhere: the newest at stage `All`,
    /// else the stable one before it.
    pub fn enforced(&self) -> Option<&RuleSetVersion> {
        match self.current() {
            Some(v) if v.stage == Stage::All => Some(v),
            _ => self.stable(),
        }
    }

    /// [`Registry::enforced`], parsed. Versions are validated before they
    /// are committed, so an error means the parser changed since.
    pub fn enforced_rule_set(&self) -> Option<Result<RuleSet, RuleErrors>> {
        Some(RuleSet::parse(&self.enforced()?.rule_files()))
    }

    /// Regions that serve global rules now: registered, active, and in no
    /// drill.
    pub fn serving_regions(&self) -> Vec<String> {
        self.regions
            .values()
            .filter(|r| r.state == RegionState::Active && self.drills.active_on(&r.name).is_none())
            .map(|r| r.name.clone())
            .collect()
    }

    /// The enforced rule set's global rules (none when it does not parse).
    pub fn global_rules(&self) -> Vec<GlobalRule> {
        match self.enforced_rule_set() {
            Some(Ok(set)) => GlobalRule::of_rule_set(&set),
            _ => Vec::new(),
        }
    }

    fn next_number(&self) -> u64 {
        self.current().map_or(1, |v| v.number + 1)
    }

    /// Canary regions must be registered, so a typo cannot silently canary nowhere.
    fn check_stage(&self, stage: &Stage) -> Result<(), String> {
        if let Stage::Canary { regions } = stage {
            if regions.is_empty() {
                return Err("a canary stage needs at least one region".into());
            }
            if let Some(unknown) = regions.iter().find(|r| !self.regions.contains_key(*r)) {
                return Err(format!("canary region {unknown:?} is not registered"));
            }
        }
        Ok(())
    }

    /// The version a [`Command::Rollback`] with `to` copies: `to` itself, or
    /// the newest version before current that was enforced everywhere. The
    /// admin API resolves it before proposing, to validate its files against
    /// today's rules (parser and floor), and proposes the number it checked.
    pub fn rollback_target(&self, to: Option<u64>) -> Result<&RuleSetVersion, Outcome> {
        let Some(current) = self.current() else {
            return Err(rejected("there is no rule-set version to roll back from"));
        };
        match to {
            Some(n) => self.versions.get(&n).ok_or_else(|| Outcome::NotFound {
                reason: format!("version {n} does not exist"),
            }),
            None => self
                .versions
                .range(..current.number)
                .rev()
                .map(|(_, v)| v)
                .find(|v| v.stage == Stage::All)
                .ok_or_else(|| {
                    rejected(format!(
                        "no version before {} was enforced everywhere",
                        current.number
                    ))
                }),
        }
    }

    pub fn apply(&mut self, command: Command) -> Outcome {
        match command {
            Command::PutRules {
                files,
                stage,
                at_unix_ms,
            } => {
                if let Err(reason) = self.check_stage(&stage) {
                    return rejected(reason);
                }
                let number = self.next_number();
                self.versions.insert(
                    number,
                    RuleSetVersion {
                        number,
                        files,
                        stage,
                        origin: Origin::Put,
                        created_at_unix_ms: at_unix_ms,
                    },
                );
                Outcome::Applied {
                    version: Some(number),
                }
            }
            Command::Rollout { version, stage } => {
                if let Err(reason) = self.check_stage(&stage) {
                    return rejected(reason);
                }
                let Some(current) = self.versions.values_mut().next_back() else {
                    return rejected("there is no rule-set version yet");
                };
                let version = version.unwrap_or(current.number);
                if current.number != version {
                    return rejected(format!(
                        "only the newest version ({}) can be rolled out; version {version} is superseded",
                        current.number
                    ));
                }
                if current.stage == Stage::All && stage != Stage::All {
                    return rejected(format!(
                        "version {version} is already enforced everywhere; use rollback to go back"
                    ));
                }
                current.stage = stage;
                Outcome::Applied {
                    version: Some(version),
                }
            }
            Command::Rollback { to, at_unix_ms } => {
                let target = match self.rollback_target(to) {
                    Ok(v) => v,
                    Err(refused) => return refused,
                };
                let files = target.files.clone();
                let of = target.number;
                let number = self.next_number();
                self.versions.insert(
                    number,
                    RuleSetVersion {
                        number,
                        files,
                        stage: Stage::All,
                        origin: Origin::Rollback { of },
                        created_at_unix_ms: at_unix_ms,
                    },
                );
                Outcome::Applied {
                    version: Some(number),
                }
            }
            Command::PutRegion {
                name,
                weight,
                state,
                at_unix_ms,
            } => {
                self.regions.insert(
                    name.clone(),
                    Region {
                        name,
                        weight,
                        state,
                        updated_at_unix_ms: at_unix_ms,
                    },
                );
                Outcome::Applied { version: None }
            }
            Command::Epoch(delta) => {
                if delta.epoch != self.allocations.epoch + 1 {
                    return rejected(format!(
                        "epoch {} does not follow epoch {}",
                        delta.epoch, self.allocations.epoch
                    ));
                }
                self.allocations.apply(&delta);
                Outcome::Applied { version: None }
            }
            Command::SetClusterId(id) => match self.cluster_id {
                None => {
                    self.cluster_id = Some(id);
                    Outcome::Applied { version: None }
                }
                Some(held) => rejected(format!(
                    "the cluster id is already {held}; it never changes (proposed {id})"
                )),
            },
            Command::StartDrill(start) => {
                let serving = self.serving_regions();
                let registered = self.regions.contains_key(&start.region);
                let rules = self.global_rules();
                if let Err(reason) =
                    self.drills
                        .check_start(&start, registered, &serving, rules.len())
                {
                    return rejected(reason);
                }
                let periods: Vec<(String, u64, bool)> = rules
                    .iter()
                    .map(|r| {
                        (
                            r.policy.rule.clone(),
                            if r.counted { r.period_ms } else { 0 },
                            r.policy.partition == crate::rules::Partition::Strict,
                        )
                    })
                    .collect();
                let id = self.drills.start(start, &self.allocations, &periods);
                Outcome::Applied { version: Some(id) }
            }
            Command::StopDrill { id, stop } => match self.drills.stop(id, stop) {
                Ok(()) => Outcome::Applied { version: Some(id) },
                Err(super::drill::Refused::NotFound(reason)) => Outcome::NotFound { reason },
                Err(super::drill::Refused::Rejected(reason)) => rejected(reason),
            },
            Command::DrillObserved { id, events } => match self.drills.observed(id, events) {
                Ok(()) => Outcome::Applied { version: Some(id) },
                Err(reason) => rejected(reason),
            },
            Command::StageOverrides {
                import,
                seq,
                rows,
                at_unix_ms,
            } => match Arc::make_mut(&mut self.override_imports)
                .stage(import, seq, rows, at_unix_ms)
            {
                Ok(()) => Outcome::Applied { version: None },
                Err(reason) => rejected(reason),
            },
            Command::SetOverrides(mut change) => {
                if let Some(import) = change.import {
                    let Some(rows) = Arc::make_mut(&mut self.override_imports).take(import) else {
                        return rejected(format!(
                            "import {import} is not staged (it expired, or was applied)"
                        ));
                    };
                    change.set.splice(0..0, rows);
                }
                // Refused changes leave the set as it was: `apply` is whole.
                let mut next = Overrides::clone(&self.overrides);
                match next.apply(&change) {
                    Ok(_) => {
                        let version = next.version;
                        self.overrides = Arc::new(next);
                        Outcome::Applied {
                            version: Some(version),
                        }
                    }
                    Err(OverrideRefused::NotFound(reason)) => Outcome::NotFound { reason },
                    Err(OverrideRefused::Rejected(reason)) => rejected(reason),
                }
            }
            Command::StartReset(start) => match self.resets.start(start) {
                Ok(id) => Outcome::Applied { version: Some(id) },
                Err(reason) => rejected(reason),
            },
            Command::ResetAnswered { id, region, answer } => {
                match self.resets.answered(id, &region, answer) {
                    Ok(()) => Outcome::Applied { version: Some(id) },
                    Err(reason) => Outcome::NotFound { reason },
                }
            }
            Command::DeleteRegion { name } => {
                let in_canary = self.current().is_some_and(
                    |v| matches!(&v.stage, Stage::Canary { regions } if regions.contains(&name)),
                );
                if in_canary {
                    return rejected(format!(
                        "region {name:?} is a canary of the current rule-set version"
                    ));
                }
                match self.regions.remove(&name) {
                    Some(_) => Outcome::Applied { version: None },
                    None => Outcome::NotFound {
                        reason: format!("region {name:?} does not exist"),
                    },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(text: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("a.yaml".to_string(), text.to_string())])
    }

    fn put(registry: &mut Registry, text: &str, stage: Stage) -> Outcome {
        registry.apply(Command::PutRules {
            files: files(text),
            stage,
            at_unix_ms: 0,
        })
    }

    #[test]
    fn puts_create_new_versions_and_never_edit() {
        let mut r = Registry::default();
        assert_eq!(
            put(&mut r, "one", Stage::All),
            Outcome::Applied { version: Some(1) }
        );
        assert_eq!(
            put(&mut r, "two", Stage::All),
            Outcome::Applied { version: Some(2) }
        );
        assert_eq!(r.versions[&1].files, files("one"));
        assert_eq!(r.current().map(|v| v.number), Some(2));
        assert_eq!(r.stable(), None);
    }

    #[test]
    fn shadow_then_canary_then_all_keeps_stable_until_all() {
        let mut r = Registry::default();
        r.apply(Command::PutRegion {
            name: "eu".into(),
            weight: 1.0,
            state: RegionState::Active,
            at_unix_ms: 0,
        });
        put(&mut r, "one", Stage::All);
        put(&mut r, "two", Stage::Shadow);
        assert_eq!(r.stable().map(|v| v.number), Some(1));
        let canary = Stage::Canary {
            regions: vec!["eu".into()],
        };
        assert_eq!(
            r.apply(Command::Rollout {
                version: Some(2),
                stage: canary
            }),
            Outcome::Applied { version: Some(2) }
        );
        assert_eq!(r.stable().map(|v| v.number), Some(1));
        r.apply(Command::Rollout {
            version: None,
            stage: Stage::All,
        });
        assert_eq!(r.stable(), None);
        assert!(matches!(
            r.apply(Command::Rollout {
                version: Some(2),
                stage: Stage::Shadow
            }),
            Outcome::Rejected { .. }
        ));
    }

    #[test]
    fn canary_in_unknown_region_is_rejected() {
        let mut r = Registry::default();
        let out = put(
            &mut r,
            "one",
            Stage::Canary {
                regions: vec!["mars".into()],
            },
        );
        assert!(matches!(out, Outcome::Rejected { reason } if reason.contains("mars")));
        assert!(r.versions.is_empty());
    }

    #[test]
    fn rollback_copies_previous_stable_as_new_version() {
        let mut r = Registry::default();
        put(&mut r, "one", Stage::All);
        put(&mut r, "two", Stage::All);
        assert_eq!(
            r.apply(Command::Rollback {
                to: None,
                at_unix_ms: 5
            }),
            Outcome::Applied { version: Some(3) }
        );
        let v3 = &r.versions[&3];
        assert_eq!(v3.files, files("one"));
        assert_eq!(v3.origin, Origin::Rollback { of: 1 });
        assert_eq!(
            r.apply(Command::Rollback {
                to: Some(2),
                at_unix_ms: 6
            }),
            Outcome::Applied { version: Some(4) }
        );
        assert_eq!(r.versions[&4].files, files("two"));
        assert!(matches!(
            r.apply(Command::Rollback {
                to: Some(99),
                at_unix_ms: 7
            }),
            Outcome::NotFound { .. }
        ));
    }

    #[test]
    fn the_first_cluster_id_applied_stays() {
        let mut r = Registry::default();
        let (first, second) = (ClusterId::random(), ClusterId::random());
        assert_eq!(
            r.apply(Command::SetClusterId(first)),
            Outcome::Applied { version: None }
        );
        assert!(matches!(
            r.apply(Command::SetClusterId(second)),
            Outcome::Rejected { reason } if reason.contains(&first.to_string())
        ));
        assert_eq!(r.cluster_id, Some(first));
    }

    #[test]
    fn rollback_without_history_is_rejected() {
        let mut r = Registry::default();
        assert!(matches!(
            r.apply(Command::Rollback {
                to: None,
                at_unix_ms: 0
            }),
            Outcome::Rejected { .. }
        ));
        put(&mut r, "one", Stage::All);
        assert!(matches!(
            r.apply(Command::Rollback {
                to: None,
                at_unix_ms: 0
            }),
            Outcome::Rejected { .. }
        ));
    }
}
