//! The `meridian.v1.Coordinator` gRPC service limiters use, served by every
//! node from its own applied state.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::allocator::{Allocator, FORWARDED};
use super::raft::Raft;
use super::raft::storage::Applied;
use super::state::{RuleSetVersion, Stage};
use crate::allocation::Allocations;
use crate::allocation::table::region_update;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_server;

/// Serves the watch streams from the node's applied state; hands reports to
/// the allocator (which relays them to the leader).
pub struct CoordinatorService {
    applied: watch::Receiver<Arc<Applied>>,
    allocator: Arc<Allocator>,
    /// Whether this node is in a cluster and hears a leader: a node that is
    /// not serves no watch, so a limiter never follows an empty node.
    raft: Raft,
}

impl CoordinatorService {
    pub fn server(
        applied: watch::Receiver<Arc<Applied>>,
        allocator: Arc<Allocator>,
        raft: Raft,
    ) -> coordinator_server::CoordinatorServer<CoordinatorService> {
        coordinator_server::CoordinatorServer::new(CoordinatorService {
            applied,
            allocator,
            raft,
        })
    }

    /// `Ok` when this node may serve a watch: it is a member of a cluster and
    /// knows the leader, so what it applied is the cluster's, not an empty
    /// node's "no version" or a cut-off node's stale state.
    fn serving(&self) -> Result<(), Status> {
        let metrics = self.raft.metrics().borrow().clone();
        if metrics
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_none()
        {
            return Err(Status::unavailable(
                "this node is in no cluster yet (not initialised or joined); watch another",
            ));
        }
        if metrics.current_leader.is_none() {
            return Err(Status::unavailable(
                "this node knows no leader (an election, or it is cut off); watch another",
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
        let region = request.into_inner().region;
        tracing::info!(%region, "limiter watching rules");
        let mut applied = self.applied.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last_sent = None;
            loop {
                let next = update(&applied.borrow_and_update());
                let key = rules_key(&next);
                if last_sent.as_ref() != Some(&key) {
                    if tx.send(Ok(next)).await.is_err() {
                        break;
                    }
                    last_sent = Some(key);
                }
                tokio::select! {
                    changed = applied.changed() => if changed.is_err() { break },
                    () = tx.closed() => break,
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
        let pb::WatchRequest { region, pod } = request.into_inner();
        if region.is_empty() {
            return Err(Status::invalid_argument("region must not be empty"));
        }
        tracing::info!(%region, %pod, "limiter watching rules and allocations");
        let mut applied = self.applied.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut rules_sent = None;
            // What this stream last sent of the allocations, to send only
            // what changed since (several epochs may pass between wakes).
            let mut allocations_sent: Option<Allocations> = None;
            loop {
                let state = applied.borrow_and_update().clone();
                let rules = update(&state);
                let key = rules_key(&rules);
                let rules = (rules_sent.as_ref() != Some(&key)).then_some(rules);
                let current = &state.registry.allocations;
                let allocations = match &allocations_sent {
                    None => region_update(current, &region, None),
                    Some(sent) if sent.epoch < current.epoch => {
                        region_update(current, &region, Some(&sent.diff(current)))
                    }
                    Some(_) => None,
                };
                if rules.is_some() || allocations.is_some() {
                    let message = pb::WatchUpdate {
                        rules,
                        allocations: allocations.as_ref().map(pb::AllocationUpdate::from),
                    };
                    if tx.send(Ok(message)).await.is_err() {
                        break;
                    }
                    rules_sent = Some(key);
                }
                if allocations_sent
                    .as_ref()
                    .is_none_or(|s| s.epoch < current.epoch)
                {
                    allocations_sent = Some(current.clone());
                }
                tokio::select! {
                    changed = applied.changed() => if changed.is_err() { break },
                    () = tx.closed() => break,
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
        let epoch = self
            .allocator
            .report(request.into_inner(), forwarded)
            .await?;
        Ok(Response::new(pb::ReportReply { epoch }))
    }
}
