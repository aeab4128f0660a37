//! Rules and allocations from the coordinator: a limiter started with
//! `--coordinator` follows the `Watch` stream of any coordinator node,
//! enforces what its region should at the version's rollout stage and hands
//! allocation updates to `global`; it keeps the last rules it received while
//! no coordinator answers, and caches them on disk so that a restart without
//! a coordinator still enforces. It follows one cluster only: the first
//! whose id it accepted (kept in the cache) or `--cluster-id`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};
use serde::{Deserialize, Serialize};
use tokio_stream::StreamExt;

use super::global::Global;
use super::overrides::HeldOverrides;
use super::reset_feed::ResetFeed;
use super::rule_source::RuleSource;
use crate::cluster_id::ClusterId;
use crate::proto::allocation_parts::Assembly;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::proto::meridian::v1::{RolloutStage, RuleSetUpdate, RuleSetVersion, WatchRequest};
use crate::proto::override_parts::OverrideAssembly;
use crate::rules::{RuleFile, RuleSet};

/// What one region runs from one update: the version it enforces and the
/// version it decides in shadow only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    pub enforce: Option<CachedVersion>,
    pub shadow: Option<CachedVersion>,
    /// The coordinator's Raft log index the update was read at: a limiter
    /// takes no update read at an older one (a lagging or empty node). 0 in
    /// caches written before it was recorded.
    #[serde(default)]
    pub applied_index: u64,
    /// The cluster the update came from (`None`: a coordinator that sends
    /// no id). Once set in what a limiter holds, it is the only cluster the
    /// limiter takes updates from. `None` in caches written before it was
    /// recorded: the next cluster followed is pinned.
    #[serde(default)]
    pub cluster_id: Option<ClusterId>,
}

/// Why a rule update is not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The node has no rule set, while this limiter enforces one: an empty
    /// node (new, or not joined) — never "drop all rules".
    NoVersion { held: u64 },
    /// The node is behind what this limiter already applied.
    Behind { index: u64, held: u64 },
    /// The node belongs to another cluster (or names none) than the one
    /// this limiter follows: its version numbers say nothing about ours.
    OtherCluster {
        sent: Option<ClusterId>,
        held: ClusterId,
    },
}

impl std::error::Error for Refusal {}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoVersion { held } => write!(
                f,
                "the coordinator has no rule set (an empty node?) while this limiter enforces version {held}"
            ),
            Refusal::Behind { index, held } => write!(
                f,
                "the coordinator is behind: its rules are from log index {index}, this limiter applied {held}"
            ),
            Refusal::OtherCluster { sent, held } => {
                let sent =
                    sent.map_or_else(|| "no cluster id".to_string(), |id| format!("cluster {id}"));
                write!(
                    f,
                    "the coordinator sent rules of {sent}, but this limiter follows cluster {held} \
                     (its rules cache or --cluster-id); keeping its rules"
                )
            }
        }
    }
}

/// Whether `next` may replace `held` (what the limiter enforces now): never
/// an update of another cluster than the one held, never "no version" over a
/// version, never an update read at an older log index.
pub fn admit(held: &Selection, next: &Selection) -> Result<(), Refusal> {
    if let Some(pinned) = held.cluster_id
        && next.cluster_id != Some(pinned)
    {
        return Err(Refusal::OtherCluster {
            sent: next.cluster_id,
            held: pinned,
        });
    }
    if let Some(v) = &held.enforce
        && next.enforce.is_none()
        && next.shadow.is_none()
    {
        return Err(Refusal::NoVersion { held: v.number });
    }
    if next.applied_index < held.applied_index {
        return Err(Refusal::Behind {
            index: next.applied_index,
            held: held.applied_index,
        });
    }
    Ok(())
}

/// A rule-set version as the limiter keeps it (and writes it to its cache).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedVersion {
    pub number: u64,
    /// (file name, YAML text)
    pub files: Vec<(String, String)>,
}

impl CachedVersion {
    fn from_proto(v: &RuleSetVersion) -> CachedVersion {
        CachedVersion {
            number: v.number,
            files: v
                .files
                .iter()
                .map(|f| (f.name.clone(), f.text.clone()))
                .collect(),
        }
    }

    fn parse(&self) -> Result<RuleSet, crate::rules::RuleErrors> {
        let files: Vec<RuleFile> = self
            .files
            .iter()
            .map(|(name, text)| RuleFile {
                name: name.clone(),
                text: text.clone(),
            })
            .collect();
        RuleSet::parse(&files)
    }
}

/// The rollout rules, for one region: `all` → the current version; `canary`
/// → the current version in canary regions, the stable one elsewhere;
/// `shadow` → the stable version, with the current one in shadow beside it.
pub fn select(update: &RuleSetUpdate, region: &str) -> Selection {
    let applied_index = update.applied_index;
    // Malformed counts as none: `admit` refuses it wherever an id is held.
    let cluster_id = update.cluster_id.parse().ok();
    let Some(current) = &update.current else {
        return Selection {
            enforce: None,
            shadow: None,
            applied_index,
            cluster_id,
        };
    };
    let stable = update.stable.as_ref().map(CachedVersion::from_proto);
    let current_version = CachedVersion::from_proto(current);
    match RolloutStage::try_from(current.stage).unwrap_or(RolloutStage::All) {
        RolloutStage::All | RolloutStage::Unspecified => Selection {
            enforce: Some(current_version),
            shadow: None,
            applied_index,
            cluster_id,
        },
        RolloutStage::Canary if current.canary_regions.iter().any(|r| r == region) => Selection {
            enforce: Some(current_version),
            shadow: None,
            applied_index,
            cluster_id,
        },
        RolloutStage::Canary => Selection {
            enforce: stable,
            shadow: None,
            applied_index,
            cluster_id,
        },
        RolloutStage::Shadow => Selection {
            enforce: stable,
            shadow: Some(current_version),
            applied_index,
            cluster_id,
        },
    }
}

/// Applies a selection to the running rules. An absent enforced version means
/// no rules yet (nothing is limited).
pub fn apply(source: &RuleSource, selection: &Selection) -> Result<(), crate::rules::RuleErrors> {
    let enforced = match &selection.enforce {
        Some(v) => v.parse()?,
        None => RuleSet::default(),
    };
    let shadow = match &selection.shadow {
        Some(v) => Some(v.parse()?.shadowed()),
        None => None,
    };
    source.set(enforced, shadow);
    gauge!("meridian_rules_version")
        .set(selection.enforce.as_ref().map_or(0.0, |v| v.number as f64));
    Ok(())
}

/// Loads the cached selection written by an earlier run, if any.
pub fn load_cache(path: &Path) -> Option<Selection> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(selection) => Some(selection),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable rules cache");
            None
        }
    }
}

/// Writes the selection atomically (temp file, fsync, rename): a crash leaves
/// the old cache or the new one, never half of one. The file is 0600.
pub fn save_cache(path: &Path, selection: &Selection) -> std::io::Result<()> {
    use std::io::Write;
    // Per process: two limiters pointed at one file never write one temp
    // file at once (the rename keeps whichever finished last, whole).
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    // Rules name customers and their limits: readable by this user only.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&tmp)?;
    // A temp file left by an older build keeps its mode through `open`.
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(&serde_json::to_vec_pretty(selection).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The limiter's subscription to the coordinators' rule and allocation stream
/// (`--coordinator`): who it follows, as which pod, and where it keeps the last
/// rules it was sent, so a restart without a coordinator still has them.
pub struct Feed {
    /// Coordinator gRPC URLs, tried in turn whenever a stream fails.
    pub coordinators: Vec<String>,
    /// This pod's region: selects the allocations it is sent.
    pub region: String,
    /// This pod's name, as the coordinator counts its acknowledgements.
    pub pod: String,
    /// The rules cache file (`--rules-cache`), rewritten on every new version.
    pub cache: PathBuf,
    /// Where the allocations that arrive on the stream are applied.
    pub global: Arc<Global>,
    /// What this limiter enforces now (from its cache at start, then from
    /// every update it took) and the cluster it follows: the fence
    /// [`admit`] holds updates against.
    /// `std` mutex: read and replaced between awaits, never held across one.
    pub held: std::sync::Mutex<Selection>,
    /// TLS with this region's certificate, or plaintext (`--insecure`).
    pub transport: crate::tls::Transport,
    /// Where the override sets that arrive whole are applied.
    pub overrides: Arc<HeldOverrides>,
    /// The overrides cache file, rewritten on every new set.
    pub overrides_cache: PathBuf,
    /// Where counter resets pending for the region are applied.
    pub resets: Arc<ResetFeed>,
}

/// A stream that lasted this long resets the reconnect backoff.
const HEALTHY_STREAM: Duration = Duration::from_secs(10);

/// The wait before the next coordinator: doubling from 100 ms to 5 s over
/// failures in a row, back to 100 ms after a stream that ran for
/// [`HEALTHY_STREAM`] (its end is a new fault, not the next step of an old
/// backoff).
#[derive(Debug)]
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    /// The wait after a stream that ran for `ran`.
    fn after(&mut self, ran: Duration) -> Duration {
        if ran >= HEALTHY_STREAM {
            self.0 = Self::FIRST;
        }
        let wait = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        wait
    }
}

impl Feed {
    /// Follows the coordinators forever, moving to the next node whenever a
    /// stream fails; `on_change` runs after every applied update.
    pub async fn run(self, source: Arc<RuleSource>, on_change: impl Fn()) {
        let mut backoff = Backoff(Backoff::FIRST);
        for url in self.coordinators.iter().cycle() {
            let started = std::time::Instant::now();
            let outcome = self.follow(url, &source, &on_change).await;
            let ran = started.elapsed();
            match outcome {
                Ok(()) => tracing::warn!(%url, "coordinator closed the rule stream"),
                Err(e) => match e.downcast_ref::<Refusal>() {
                    // Not a passing fault: a limiter wired to the wrong
                    // cluster needs an operator.
                    Some(Refusal::OtherCluster { sent, held }) => tracing::error!(
                        %url,
                        following = %held,
                        sent = %sent.map_or_else(|| "none".to_string(), |id| id.to_string()),
                        error = %e,
                        cache = %self.cache.display(),
                        "not following this coordinator: it is of another cluster; if that \
                         cluster replaced the old one on purpose, stop this limiter, remove its \
                         rules cache (or pass --cluster-id with the new id) and start it again"
                    ),
                    _ => {
                        tracing::warn!(%url, error = %e, "not following this coordinator; keeping the last rules")
                    }
                },
            }
            counter!("meridian_coordinator_stream_failures_total").increment(1);
            tokio::time::sleep(backoff.after(ran)).await;
        }
    }

    async fn follow(
        &self,
        url: &str,
        source: &RuleSource,
        on_change: &impl Fn(),
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let channel = self
            .transport
            .channel(url, crate::tls::Expect::AnyNode, |e| {
                e.connect_timeout(Duration::from_secs(2))
            })?;
        let mut stream = CoordinatorClient::new(channel)
            .max_decoding_message_size(crate::proto::MAX_UPDATE_BYTES)
            .watch(WatchRequest {
                region: self.region.clone(),
                pod: self.pod.clone(),
            })
            .await?
            .into_inner();
        tracing::info!(%url, "following the coordinator's rules and allocations");
        // Allocations are taken only on a stream whose rules were admitted
        // (the first message carries both), so never from another cluster.
        let mut admitted = false;
        // An update sent in parts is applied whole or not at all.
        let mut parts = Assembly::default();
        let mut override_parts = OverrideAssembly::default();
        while let Some(update) = stream.next().await {
            let update = update?;
            if let Some(rules) = &update.rules {
                let selection = select(rules, &self.region);
                let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Err(refusal) = admit(&held, &selection) {
                    // Neither its rules nor its allocations: try another node.
                    counter!("meridian_rule_updates_refused_total").increment(1);
                    return Err(refusal.into());
                }
                admitted = true;
                self.global.follow_cluster(selection.cluster_id);
                let changed =
                    (&held.enforce, &held.shadow) != (&selection.enforce, &selection.shadow);
                if changed {
                    if let Err(e) = apply(source, &selection) {
                        tracing::error!(error = %e, "coordinator sent rules this limiter rejects");
                        continue;
                    }
                    on_change();
                    tracing::info!(
                        version = selection.enforce.as_ref().map(|v| v.number),
                        shadow = selection.shadow.as_ref().map(|v| v.number),
                        "rules from the coordinator applied"
                    );
                }
                if changed
                    || selection.applied_index > held.applied_index
                    || selection.cluster_id != held.cluster_id
                {
                    if let Err(e) = save_cache(&self.cache, &selection) {
                        tracing::warn!(path = %self.cache.display(), error = %e, "cannot write the rules cache");
                    }
                    *self.held.lock().unwrap_or_else(|p| p.into_inner()) = selection;
                }
            }
            // Like allocations, only from a cluster this limiter follows.
            if admitted {
                self.global
                    .set_coordinator_report_interval(update.report_interval_ms);
            }
            // Like allocations, only from a cluster this limiter follows.
            if let Some(part) = update.overrides
                && admitted
                && let Some(index) = override_parts.add(part)?
            {
                self.take_overrides(index);
                on_change();
            }
            if update.resets_sent && admitted {
                self.resets.pending(update.resets);
            }
            // After the rules: a new global rule's window must be known.
            if let Some(part) = update.allocations
                && admitted
                && let Some(allocations) = parts.add(part)?
                && self.global.apply(&allocations, &source.current())
            {
                on_change();
            }
        }
        Ok(())
    }
}

impl Feed {
    /// Enforces a whole override set from now on and keeps it in the cache.
    fn take_overrides(&self, index: crate::overrides::OverrideIndex) {
        let held = self.overrides.current();
        if *held == index {
            return;
        }
        tracing::info!(
            version = index.version,
            overrides = index.len(),
            "overrides from the coordinator applied"
        );
        if let Err(e) = crate::limiter::overrides::cache::save(&self.overrides_cache, &index) {
            tracing::warn!(path = %self.overrides_cache.display(), error = %e, "cannot write the overrides cache");
        }
        self.overrides.replace(index);
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_reconnect_backoff_starts_over_after_a_healthy_stream() {
        let quick = Duration::from_millis(5);
        let mut b = Backoff(Backoff::FIRST);
        let waits: Vec<u128> = (0..8).map(|_| b.after(quick).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // A stream that ran a minute, then failed: retried at once again.
        assert_eq!(b.after(Duration::from_secs(60)), Backoff::FIRST);
        assert_eq!(b.after(quick), Duration::from_millis(200));
    }

    use super::*;
    use crate::proto::meridian::v1::RuleSetFile;

    fn version(number: u64, stage: RolloutStage, canary: &[&str]) -> RuleSetVersion {
        RuleSetVersion {
            number,
            stage: stage as i32,
            canary_regions: canary.iter().map(|s| s.to_string()).collect(),
            files: vec![RuleSetFile {
                name: "r.yaml".into(),
                text: format!("# v{number}"),
            }],
            created_at_unix_ms: 0,
        }
    }

    fn numbers(s: &Selection) -> (Option<u64>, Option<u64>) {
        (
            s.enforce.as_ref().map(|v| v.number),
            s.shadow.as_ref().map(|v| v.number),
        )
    }

    #[test]
    fn each_stage_selects_what_the_region_enforces() {
        let update = |stage, canary: &[&str]| RuleSetUpdate {
            current: Some(version(3, stage, canary)),
            stable: Some(version(2, RolloutStage::All, &[])),
            applied_index: 9,
            cluster_id: String::new(),
        };
        let all = update(RolloutStage::All, &[]);
        assert_eq!(numbers(&select(&all, "mumbai")), (Some(3), None));
        let canary = update(RolloutStage::Canary, &["mumbai"]);
        assert_eq!(numbers(&select(&canary, "mumbai")), (Some(3), None));
        assert_eq!(numbers(&select(&canary, "hyderabad")), (Some(2), None));
        let shadow = update(RolloutStage::Shadow, &[]);
        assert_eq!(numbers(&select(&shadow, "mumbai")), (Some(2), Some(3)));
        let empty = RuleSetUpdate::default();
        assert_eq!(numbers(&select(&empty, "mumbai")), (None, None));
    }

    #[test]
    fn no_version_and_older_updates_never_replace_what_is_enforced() {
        let held = select(
            &RuleSetUpdate {
                current: Some(version(4, RolloutStage::All, &[])),
                stable: None,
                applied_index: 20,
                cluster_id: String::new(),
            },
            "mumbai",
        );
        let empty = select(&RuleSetUpdate::default(), "mumbai");
        assert_eq!(admit(&held, &empty), Err(Refusal::NoVersion { held: 4 }));
        let behind = select(
            &RuleSetUpdate {
                current: Some(version(3, RolloutStage::All, &[])),
                stable: None,
                applied_index: 12,
                cluster_id: String::new(),
            },
            "mumbai",
        );
        assert_eq!(
            admit(&held, &behind),
            Err(Refusal::Behind {
                index: 12,
                held: 20
            })
        );
        let newer = select(
            &RuleSetUpdate {
                current: Some(version(5, RolloutStage::Shadow, &[])),
                stable: Some(version(4, RolloutStage::All, &[])),
                applied_index: 25,
                cluster_id: String::new(),
            },
            "mumbai",
        );
        assert_eq!(admit(&held, &newer), Ok(()));
        // A limiter that never had rules takes a node's "no version".
        assert_eq!(admit(&empty, &empty), Ok(()));
    }

    #[test]
    fn updates_of_another_cluster_are_refused_once_one_is_held() {
        let (ours, theirs) = (ClusterId::random(), ClusterId::random());
        let update = |id: Option<ClusterId>, number, index| {
            select(
                &RuleSetUpdate {
                    current: Some(version(number, RolloutStage::All, &[])),
                    stable: None,
                    applied_index: index,
                    cluster_id: id.map(|id| id.to_string()).unwrap_or_default(),
                },
                "mumbai",
            )
        };
        let held = update(Some(ours), 4, 20);
        assert_eq!(held.cluster_id, Some(ours));
        let higher_elsewhere = update(Some(theirs), 9, 90);
        assert_eq!(
            admit(&held, &higher_elsewhere),
            Err(Refusal::OtherCluster {
                sent: Some(theirs),
                held: ours
            })
        );
        let text = admit(&held, &higher_elsewhere)
            .expect_err("refused")
            .to_string();
        assert!(
            text.contains(&ours.to_string()) && text.contains(&theirs.to_string()),
            "the refusal names both ids: {text}"
        );
        assert_eq!(
            admit(&held, &update(None, 9, 90)),
            Err(Refusal::OtherCluster {
                sent: None,
                held: ours
            })
        );
        let mut malformed = update(Some(theirs), 9, 90);
        malformed.cluster_id = "not-an-id".parse().ok();
        assert!(admit(&held, &malformed).is_err());
        assert_eq!(admit(&held, &update(Some(ours), 5, 25)), Ok(()));
        // A limiter that holds no id yet follows the first cluster it meets.
        let unpinned = Selection {
            cluster_id: None,
            ..held.clone()
        };
        assert_eq!(admit(&unpinned, &update(Some(theirs), 5, 25)), Ok(()));
    }

    #[test]
    fn a_cache_without_a_cluster_id_loads_unpinned() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules-cache.json");
        std::fs::write(
            &path,
            r#"{"enforce": {"number": 2, "files": [["a.yaml", "domain: a\n"]]}, "shadow": null, "applied_index": 5}"#,
        )
        .expect("write");
        let loaded = load_cache(&path).expect("an older cache loads");
        assert_eq!(loaded.cluster_id, None);
        assert_eq!(loaded.applied_index, 5);
    }

    #[test]
    fn cache_round_trips_atomically() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules-cache.json");
        let s = Selection {
            enforce: Some(CachedVersion {
                number: 4,
                files: vec![("a.yaml".into(), "domain: a\n".into())],
            }),
            shadow: None,
            applied_index: 7,
            cluster_id: Some(ClusterId::random()),
        };
        save_cache(&path, &s).expect("save");
        assert_eq!(load_cache(&path), Some(s));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "the rules cache is readable by others");
        }
        std::fs::write(&path, "{broken").expect("write");
        assert_eq!(load_cache(&path), None);
    }
}
