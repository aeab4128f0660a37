//! The `meridian.v1.Coordinator` gRPC service limiters use, served by every
//! node from its own applied state.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::allocator::{Allocator, FORWARDED};
use super::freshness::Freshness;
use super::raft::storage::Applied;
use super::state::{RuleSetVersion, Stage};
use crate::allocation::Epoch;
use crate::allocation::table::region_update;
use crate::proto::allocation_parts;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_server;
use crate::proto::override_parts::PartsCache;

/// Serves the watch streams from the node's applied state; hands reports to
/// the allocator (which relays them to the leader).
pub struct CoordinatorService {
    applied: watch::Receiver<Arc<Applied>>,
    allocator: Arc<Allocator>,
    /// Whether this node is in a cluster, hears a leader and is caught up
    /// with its commit: a node that is not serves no watch (and ends open
    /// ones), so a limiter never follows an empty or lagging node.
    freshness: Freshness,
    /// Open watch streams, capped in all and per client address.
    streams: Arc<Streams>,
    /// The allocation updates of the latest epochs, computed once per
    /// (from, to, region) and shared by every stream that sends them.
    updates: Arc<UpdateCache>,
    /// The override set's parts, computed once per version.
    override_parts: Arc<PartsCache>,
    /// How often limiters should report demand (ms), from this node's
    /// --rebalance-interval (`allocation::cadence::report_interval_for`):
    /// sent in the first message of every watch.
    report_interval_ms: u64,
}

impl CoordinatorService {
    pub fn server(
        applied: watch::Receiver<Arc<Applied>>,
        allocator: Arc<Allocator>,
        freshness: Freshness,
        limits: StreamLimits,
        report_interval_ms: u64,
    ) -> coordinator_server::CoordinatorServer<CoordinatorService> {
        coordinator_server::CoordinatorServer::new(CoordinatorService {
            applied,
            allocator,
            freshness,
            streams: Arc::new(Streams::new(limits)),
            updates: Arc::new(UpdateCache::new(limits.message_bytes)),
            override_parts: Arc::new(PartsCache::default()),
            report_interval_ms,
        })
        .max_decoding_message_size(crate::proto::MAX_REPORT_BYTES)
        .max_encoding_message_size(crate::proto::MAX_UPDATE_BYTES)
    }

    /// `Ok` when this node may serve a watch: it is fresh
    /// ([`Freshness::serving`]: a member, hearing the leader, caught up) and
    /// has applied the cluster's id, which every update carries.
    fn serving(&self) -> Result<(), Status> {
        self.freshness.serving()?;
        if self.applied.borrow().registry.cluster_id.is_none() {
            // Limiters pin the id of the first cluster they follow: without
            // one they could not tell this cluster's rules from another's.
            return Err(Status::unavailable(
                "this node's cluster has no id yet (its leader sets one); watch another",
            ));
        }
        Ok(())
    }
}

fn version_proto(v: &RuleSetVersion) -> pb::RuleSetVersion {
    let (stage, canary_regions) = match &v.stage {
        Stage::Shadow => (pb::RolloutStage::Shadow, Vec::new()),
        Stage::Canary { regions } => (pb::RolloutStage::Canary, regions.clone()),
        Stage::All => (pb::RolloutStage::All, Vec::new()),
    };
    pb::RuleSetVersion {
        number: v.number,
        stage: stage.into(),
        canary_regions,
        files: v
            .files
            .iter()
            .map(|(name, text)| pb::RuleSetFile {
                name: name.clone(),
                text: text.clone(),
            })
            .collect(),
        created_at_unix_ms: v.created_at_unix_ms,
    }
}

/// What a limiter must know; `current` is absent before the first version.
fn update(applied: &Applied) -> pb::RuleSetUpdate {
    pb::RuleSetUpdate {
        current: applied.registry.current().map(version_proto),
        stable: applied.registry.stable().map(version_proto),
        applied_index: applied.last_applied.map_or(0, |l| l.index),
        cluster_id: applied
            .registry
            .cluster_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
    }
}

/// Identifies an update without its applied index, which moves on every
/// unrelated write (regions, later allocations).
type RulesKey = (Option<(u64, i32, Vec<String>)>, Option<u64>);

fn rules_key(u: &pb::RuleSetUpdate) -> RulesKey {
    (
        u.current
            .as_ref()
            .map(|c| (c.number, c.stage, c.canary_regions.clone())),
        u.stable.as_ref().map(|s| s.number),
    )
}

/// How often an open stream checks that its node is still caught up.
const FRESHNESS_CHECK: Duration = Duration::from_millis(500);

/// Waits until the applied state changes: true then. False when the stream
/// should end: the state is gone, the client left, or this node fell behind
/// the leader (the client is told why, and moves to another node).
async fn next_change<T>(
    applied: &mut watch::Receiver<Arc<Applied>>,
    tx: &mpsc::Sender<Result<T, Status>>,
    freshness: &Freshness,
) -> bool {
    let mut check = tokio::time::interval_at(
        tokio::time::Instant::now() + FRESHNESS_CHECK,
        FRESHNESS_CHECK,
    );
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            changed = applied.changed() => break changed.is_ok() && still_serving(tx, freshness).await,
            _ = check.tick() => if !still_serving(tx, freshness).await { break false },
            () = tx.closed() => break false,
        }
    }
}

/// Whether this node still serves; if not, ends the stream with the reason.
async fn still_serving<T>(tx: &mpsc::Sender<Result<T, Status>>, freshness: &Freshness) -> bool {
    match freshness.still_serving() {
        Ok(()) => true,
        Err(status) => {
            tracing::info!(
                reason = status.message(),
                "ending a watch: this node is not caught up"
            );
            let _ = tx.send(Err(status)).await;
            false
        }
    }
}

/// Sends `rules` and an allocation update's parts as watch messages: the
/// rules ride with the first part when both fit the budget, and the report
/// interval (0: unchanged) with the first message. False once the stream is
/// gone.
async fn send_update(
    tx: &mpsc::Sender<Result<pb::WatchUpdate, Status>>,
    rules: Option<pb::RuleSetUpdate>,
    parts: &[pb::AllocationUpdate],
    message_bytes: usize,
    report_interval_ms: u64,
) -> bool {
    let mut parts = parts.iter();
    let mut first = pb::WatchUpdate {
        rules,
        allocations: parts.next().cloned(),
        report_interval_ms,
        ..pb::WatchUpdate::default()
    };
    if first.rules.is_some() && first.allocations.is_some() && first.encoded_len() > message_bytes {
        let alone = pb::WatchUpdate {
            rules: first.rules.take(),
            allocations: None,
            report_interval_ms: std::mem::take(&mut first.report_interval_ms),
            ..pb::WatchUpdate::default()
        };
        if tx.send(Ok(alone)).await.is_err() {
            return false;
        }
    }
    if tx.send(Ok(first)).await.is_err() {
        return false;
    }
    for part in parts {
        let message = pb::WatchUpdate {
            rules: None,
            allocations: Some(part.clone()),
            report_interval_ms: 0,
            ..pb::WatchUpdate::default()
        };
        if tx.send(Ok(message)).await.is_err() {
            return false;
        }
    }
    true
}

/// A reset order as the watch stream carries it.
fn reset_order(o: &crate::coordinator::resets::ResetOrder) -> pb::ResetOrder {
    pb::ResetOrder {
        id: o.id,
        domain: o.domain.clone(),
        entries: o
            .entries
            .iter()
            .map(|(key, value)| pb::ResetEntry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        rule: o.rule.clone().unwrap_or_default(),
        key: o.key.clone().unwrap_or_default(),
    }
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::RuleSetUpdate, Status>> + Send>>;
type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchUpdate, Status>> + Send>>;

#[tonic::async_trait]
impl coordinator_server::Coordinator for CoordinatorService {
    type WatchRulesStream = UpdateStream;

    async fn watch_rules(
        &self,
        request: Request<pb::WatchRulesRequest>,
    ) -> Result<Response<Self::WatchRulesStream>, Status> {
        self.serving()?;
        let region = &request.get_ref().region;
        speaks_for(&request, region, "watch rules for", false)?;
        not_cut_off(&self.applied.borrow(), region)?;
        let slot = self.streams.open(client_of(&request))?;
        let region = request.into_inner().region;
        tracing::info!(%region, "limiter watching rules");
        let mut applied = self.applied.clone();
        let freshness = self.freshness.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let _slot = slot;
            let mut last_sent = None;
            loop {
                let state = applied.borrow_and_update().clone();
                if let Err(status) = not_cut_off(&state, &region) {
                    let _ = tx.send(Err(status)).await;
                    break;
                }
                let next = update(&state);
                let key = rules_key(&next);
                if last_sent.as_ref() != Some(&key) {
                    if tx.send(Ok(next)).await.is_err() {
                        break;
                    }
                    last_sent = Some(key);
                }
                if !next_change(&mut applied, &tx, &freshness).await {
                    break;
                }
            }
            tracing::debug!(%region, "rules watch ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.serving()?;
        speaks_for(&request, &request.get_ref().region, "watch", false)?;
        not_cut_off(&self.applied.borrow(), &request.get_ref().region)?;
        let slot = self.streams.open(client_of(&request))?;
        let pb::WatchRequest { region, pod } = request.into_inner();
        if !crate::allocation::valid_region_name(&region)
            || pod.len() > super::report_bounds::MAX_POD_NAME
        {
            return Err(Status::invalid_argument(
                "region must be a region name (1–64 characters of a-z, 0-9, '-' or '_') and pod at most 253 bytes",
            ));
        }
        let updates = Arc::clone(&self.updates);
        let override_parts = Arc::clone(&self.override_parts);
        let message_bytes = self.updates.message_bytes;
        let report_interval_ms = self.report_interval_ms;
        tracing::info!(%region, %pod, "limiter watching rules and allocations");
        let mut applied = self.applied.clone();
        let freshness = self.freshness.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let _slot = slot;
            let mut rules_sent = None;
            // Fixed for the node's life, so said once per stream; a limiter
            // that moves to a node with another setting hears it there.
            let mut interval_sent = false;
            // The applied state this stream last sent allocations from, to
            // send only what changed since (several epochs may pass between
            // wakes). An `Arc` of the node's own state, not a copy: every
            // stream that sent one epoch shares it.
            let mut allocations_sent: Option<Arc<Applied>> = None;
            // The override set's version this stream last sent.
            let mut overrides_sent: Option<u64> = None;
            // The ids of the resets this stream last said were pending.
            let mut resets_sent: Option<Vec<u64>> = None;
            loop {
                let state = applied.borrow_and_update().clone();
                if let Err(status) = not_cut_off(&state, &region) {
                    let _ = tx.send(Err(status)).await;
                    break;
                }
                let rules = update(&state);
                let key = rules_key(&rules);
                let rules = (rules_sent.as_ref() != Some(&key)).then_some(rules);
                let current = &state.registry.allocations;
                let allocations = match &allocations_sent {
                    None => updates.get(None, &state, &region),
                    Some(sent) if sent.registry.allocations.epoch < current.epoch => {
                        updates.get(Some(sent), &state, &region)
                    }
                    Some(_) => None,
                };
                if rules.is_some() || allocations.is_some() {
                    let parts = allocations.as_deref().map_or(&[][..], Vec::as_slice);
                    let interval = if interval_sent { 0 } else { report_interval_ms };
                    if !send_update(&tx, rules, parts, message_bytes, interval).await {
                        break;
                    }
                    rules_sent = Some(key);
                    interval_sent = true;
                }
                // Overrides after the rules they name: on a new stream, and
                // whenever the set's version moved.
                let overrides = &state.registry.overrides;
                if overrides_sent != Some(overrides.version) {
                    let mut gone = false;
                    for part in override_parts.get(overrides).iter() {
                        let message = pb::WatchUpdate {
                            overrides: Some(part.clone()),
                            ..pb::WatchUpdate::default()
                        };
                        if tx.send(Ok(message)).await.is_err() {
                            gone = true;
                            break;
                        }
                    }
                    if gone {
                        break;
                    }
                    overrides_sent = Some(overrides.version);
                }
                // The resets this region has to apply, whenever the list moved.
                let pending = state
                    .registry
                    .resets
                    .pending_for(&region, crate::clock::now_unix_ms());
                let ids: Vec<u64> = pending.iter().map(|o| o.id).collect();
                if resets_sent.as_ref() != Some(&ids) {
                    let message = pb::WatchUpdate {
                        resets: pending.iter().map(|o| reset_order(o)).collect(),
                        resets_sent: true,
                        ..pb::WatchUpdate::default()
                    };
                    if tx.send(Ok(message)).await.is_err() {
                        break;
                    }
                    resets_sent = Some(ids);
                }
                if allocations_sent
                    .as_ref()
                    .is_none_or(|s| s.registry.allocations.epoch < current.epoch)
                {
                    allocations_sent = Some(state.clone());
                }
                if !next_change(&mut applied, &tx, &freshness).await {
                    break;
                }
            }
            tracing::debug!(%region, %pod, "watch ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report(
        &self,
        request: Request<pb::DemandReport>,
    ) -> Result<Response<pb::ReportReply>, Status> {
        let forwarded = request.metadata().contains_key(FORWARDED);
        speaks_for(&request, &request.get_ref().region, "report for", forwarded)?;
        let epoch = self
            .allocator
            .report(request.into_inner(), forwarded)
            .await?;
        Ok(Response::new(pb::ReportReply { epoch }))
    }
}

/// Refuses a region that a partition drill cuts off: its limiters must run
/// on what they hold, as if the network were cut.
fn not_cut_off(applied: &Applied, region: &str) -> Result<(), Status> {
    match applied.registry.drills.active_on(region) {
        Some(d) if d.mode == crate::coordinator::drill::Mode::Partition => {
            metrics::counter!("meridian_coordinator_drill_refusals_total").increment(1);
            Err(Status::unavailable(format!(
                "region {region:?} is cut off from the coordinators by drill {} (partition)",
                d.id
            )))
        }
        _ => Ok(()),
    }
}

/// Refuses a caller whose certificate does not name `region`: a region's
/// limiters watch and report for their own region only, whatever the
/// message says. A node's certificate may only relay a report another node
/// accepted (`relayed`). Over plaintext (`--insecure`) nothing is proven
/// and the message is taken as it is.
fn speaks_for<T>(
    request: &Request<T>,
    region: &str,
    what: &str,
    relayed: bool,
) -> Result<(), Status> {
    use crate::tls::Identity;
    let Some(identity) = crate::tls::peer(request).and_then(|p| p.identity.as_ref()) else {
        return Ok(());
    };
    let refusal = match identity {
        Identity::Region(own) if own == region => return Ok(()),
        Identity::Node(_) if relayed => return Ok(()),
        Identity::Region(own) => {
            format!("this certificate is region {own:?}'s; it cannot {what} region {region:?}")
        }
        Identity::Node(id) => format!(
            "node {id}'s certificate cannot {what} a region: limiters use their region's certificate"
        ),
    };
    metrics::counter!("meridian_coordinator_identity_refusals_total", "caller" => identity.kind())
        .increment(1);
    tracing::warn!(caller = %identity, %region, %refusal, "request refused");
    Err(Status::permission_denied(refusal))
}

/// How many watch streams a node serves, and how large their messages are.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// In all (`--max-watch-streams`).
    pub total: usize,
    /// From one client (`--max-watch-streams-per-client`): see [`Streams`].
    pub per_client: usize,
    /// The most bytes one watch message encodes to (`--watch-message-bytes`).
    pub message_bytes: usize,
}

/// The open watch streams, by client: the identity its certificate names
/// over TLS (a region, so a region's pods share one cap wherever they
/// connect from), its IP address over plaintext.
pub struct Streams {
    limits: StreamLimits,
    /// `std` mutex: held to bump a count, never across an `.await`.
    open: std::sync::Mutex<(usize, HashMap<String, usize>)>,
}

/// One open stream's place; dropping it (the stream ends) frees it.
pub struct StreamSlot {
    streams: Arc<Streams>,
    client: Option<String>,
}

/// Who a stream counts against: see [`Streams`].
fn client_of<T>(request: &Request<T>) -> Option<String> {
    let peer = crate::tls::peer(request)?;
    Some(match &peer.identity {
        Some(identity) => identity.to_string(),
        None => peer.addr.ip().to_string(),
    })
}

impl Streams {
    fn new(limits: StreamLimits) -> Streams {
        Streams {
            limits,
            open: std::sync::Mutex::new((0, HashMap::new())),
        }
    }

    /// A slot for a new stream from `client`, or `RESOURCE_EXHAUSTED` naming
    /// the cap it would break.
    fn open(self: &Arc<Self>, client: Option<String>) -> Result<StreamSlot, Status> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.0 >= self.limits.total {
            metrics::counter!("meridian_coordinator_watch_refused_total", "cap" => "total")
                .increment(1);
            return Err(Status::resource_exhausted(format!(
                "this node serves at most {} watch streams; watch another node",
                self.limits.total
            )));
        }
        if let Some(who) = &client {
            let mine = open.1.entry(who.clone()).or_insert(0);
            if *mine >= self.limits.per_client {
                metrics::counter!("meridian_coordinator_watch_refused_total", "cap" => "per_client")
                    .increment(1);
                return Err(Status::resource_exhausted(format!(
                    "{who} holds {} watch streams, the most one client may",
                    self.limits.per_client
                )));
            }
            *mine += 1;
        }
        open.0 += 1;
        metrics::gauge!("meridian_coordinator_watch_streams").set(open.0 as f64);
        Ok(StreamSlot {
            streams: Arc::clone(self),
            client,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(who) = &self.client
            && let Some(n) = open.1.get_mut(who)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.1.remove(who);
            }
        }
        metrics::gauge!("meridian_coordinator_watch_streams").set(open.0 as f64);
    }
}

/// The epoch a stream last sent (`None`: none yet) and its region.
type UpdateKey = (Option<Epoch>, String);
/// What such a stream sends, as the parts that fit the per-message budget
/// (`None`: nothing for its region).
type SharedUpdate = Option<Arc<Vec<pb::AllocationUpdate>>>;

/// Allocation updates for the newest epoch, keyed by the epoch a stream
/// last sent (`None`: it needs a snapshot) and its region. Cleared when the
/// epoch moves, so it holds one epoch's worth: a few entries per region.
pub struct UpdateCache {
    /// `std` mutex: held while one update is computed, never across an `.await`.
    entries: std::sync::Mutex<(Epoch, HashMap<UpdateKey, SharedUpdate>)>,
    /// The most bytes one watch message may encode to: larger updates are
    /// split into parts.
    message_bytes: usize,
}

impl UpdateCache {
    fn new(message_bytes: usize) -> UpdateCache {
        UpdateCache {
            entries: std::sync::Mutex::new((0, HashMap::new())),
            message_bytes,
        }
    }

    /// What a stream for `region` that last sent `sent` sends now that
    /// `state` is applied.
    fn get(&self, sent: Option<&Arc<Applied>>, state: &Applied, region: &str) -> SharedUpdate {
        let current = &state.registry.allocations;
        let from = sent.map(|s| s.registry.allocations.epoch);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.0 != current.epoch {
            *entries = (current.epoch, HashMap::new());
        }
        if let Some(update) = entries.1.get(&(from, region.to_string())) {
            return update.clone();
        }
        let update = match sent {
            None => region_update(current, region, None),
            Some(s) => region_update(current, region, Some(&s.registry.allocations.diff(current))),
        }
        .map(|u| {
            let parts = allocation_parts::split(pb::AllocationUpdate::from(&u), self.message_bytes);
            if parts.len() > 1 {
                tracing::debug!(
                    region,
                    epoch = u.epoch,
                    parts = parts.len(),
                    "allocation update sent in parts"
                );
            }
            Arc::new(parts)
        });
        entries.1.insert((from, region.to_string()), update.clone());
        update
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_capped_in_all_and_per_client_and_slots_free_on_drop() {
        let streams = Arc::new(Streams::new(StreamLimits {
            total: 3,
            per_client: 2,
            message_bytes: crate::proto::WATCH_MESSAGE_BUDGET,
        }));
        let a = "meridian://region/mumbai";
        let b = "10.0.0.2";
        let first = streams.open(Some(a.to_string())).expect("a 1");
        let _second = streams.open(Some(a.to_string())).expect("a 2");
        let refused = streams.open(Some(a.to_string())).err().map(|s| s.code());
        assert_eq!(
            refused,
            Some(tonic::Code::ResourceExhausted),
            "a third from one client"
        );
        let _third = streams.open(Some(b.to_string())).expect("b 1");
        let refused = streams.open(Some(b.to_string())).err().map(|s| s.code());
        assert_eq!(
            refused,
            Some(tonic::Code::ResourceExhausted),
            "a fourth in all"
        );
        drop(first);
        assert!(
            streams.open(Some(b.to_string())).is_ok(),
            "a closed stream's slot was not freed"
        );
    }
}
