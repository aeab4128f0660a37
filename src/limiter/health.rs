//! `grpc.health.v1.Health` on the gRPC port, the probe gateways and
//! Kubernetes speak: SERVING once rules are loaded and the store answers,
//! NOT_SERVING while either is not so, and NOT_SERVING for good from the
//! first moment of a SIGTERM drain (so a gateway that watches the status
//! moves its traffic before the connections close).
//!
//! One [`Health`] per process; each worker serves a clone of its
//! [`Health::server`], and every clone reads the same statuses.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use super::rule_source::RuleSource;
use super::service::Service;

/// The services whose status is reported: the whole server (`""`, what a
/// probe without a service name asks) and each gRPC API on the port.
pub const SERVICES: [&str; 3] = [
    "",
    "envoy.service.ratelimit.v3.RateLimitService",
    "meridian.v1.Limiter",
];

/// How often the store is pinged to keep the status current. A probe reads
/// the last result, so a dead Redis shows as NOT_SERVING within this.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The process's health statuses.
#[derive(Clone)]
pub struct Health {
    /// Writes the statuses every served clone reads (tonic-health keeps them
    /// behind its own lock and a watch channel per service).
    reporter: HealthReporter,
    /// `true` from the start of a drain; afterwards nothing reports SERVING
    /// again. A tokio mutex held across the status write, so a probe that
    /// pinged before the drain began cannot write SERVING after it.
    draining: Arc<Mutex<bool>>,
}

impl Health {
    /// Every service starts NOT_SERVING: nothing has been checked yet.
    pub async fn new() -> Health {
        let reporter = HealthReporter::new();
        for name in SERVICES {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        Health {
            reporter,
            draining: Arc::new(Mutex::new(false)),
        }
    }

    /// A server for one worker's gRPC router.
    pub fn server(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// Marks every service NOT_SERVING for the rest of the process's life.
    pub async fn drain(&self) {
        let mut draining = self.draining.lock().await;
        *draining = true;
        self.set_all(ServingStatus::NotServing).await;
        drop(draining);
    }

    /// Pings the store every [`PROBE_INTERVAL`] and reports SERVING while the
    /// rules are loaded and the store answers. Runs until dropped.
    pub async fn probe(self, limiter: Arc<Service>, rules: Arc<RuleSource>) {
        let mut ticker = tokio::time::interval(PROBE_INTERVAL);
        let mut last = None;
        loop {
            ticker.tick().await;
            let status = if rules.loaded() && limiter.engine.store().ping().await.is_ok() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            // Checked after the ping: a drain that began during it wins.
            let draining = self.draining.lock().await;
            if *draining {
                return;
            }
            if last != Some(status) {
                tracing::info!(%status, "gRPC health");
                self.set_all(status).await;
                last = Some(status);
            }
            drop(draining);
        }
    }

    async fn set_all(&self, status: ServingStatus) {
        for name in SERVICES {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
