//! The `meridian.v1.Coordinator` gRPC service limiters use, served by every
//! node from its own applied state.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::raft::storage::Applied;
use super::state::{RuleSetVersion, Stage};
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_server;

/// Serves `WatchRules` from the node's applied state.
pub struct CoordinatorService {
    applied: watch::Receiver<Arc<Applied>>,
}

impl CoordinatorService {
    pub fn server(
        applied: watch::Receiver<Arc<Applied>>,
    ) -> coordinator_server::CoordinatorServer<CoordinatorService> {
        coordinator_server::CoordinatorServer::new(CoordinatorService { applied })
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

#[tonic::async_trait]
impl coordinator_server::Coordinator for CoordinatorService {
    type WatchRulesStream = UpdateStream;

    async fn watch_rules(
        &self,
        request: Request<pb::WatchRulesRequest>,
    ) -> Result<Response<Self::WatchRulesStream>, Status> {
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
}
