//! The demand reporter: how often this pod reports (the coordinators' interval,
//! or a shorter `--report-interval`), what a report holds, and where it goes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::counter;
use tokio::sync::Notify;

use super::Global;
use crate::allocation::cadence::DEFAULT_REPORT_INTERVAL_MS;
use crate::allocation::leader::PodReport;
use crate::allocation::pod::{CountedRule, Holding};
use crate::clock::now_unix_ms;
use crate::proto::meridian::v1 as pb;
use crate::proto::meridian::v1::coordinator_client::CoordinatorClient;
use crate::tasks::Stop;
use crate::tls::Expect;

/// What the table held when a report began.
struct Held {
    epoch: u64,
    caps: HashMap<String, u64>,
}

impl Global {
    /// The same pod with `--report-interval` (`None`: follow the
    /// coordinators).
    pub fn with_report_interval(mut self, flag: Option<Duration>) -> Global {
        self.report_interval.flag_ms = flag.map_or(0, |d| d.as_millis().max(1) as u64);
        self
    }

    /// How often demand is reported now, and who said so.
    pub fn report_interval(&self) -> (Duration, IntervalSource) {
        self.report_interval.effective()
    }

    /// The coordinator's report interval, from a Watch message (0: the
    /// coordinator did not say). The reporter follows a change at once.
    pub fn set_coordinator_report_interval(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let before = self
            .report_interval
            .coordinator_ms
            .swap(ms, Ordering::Relaxed);
        if before == ms {
            return;
        }
        let (effective, source) = self.report_interval();
        let flag = self.report_interval.flag_ms;
        if flag > ms {
            // The flag may only shorten the interval: an old setting would
            // leave the coordinator's rounds without news of this pod.
            tracing::warn!(
                flag_ms = flag,
                coordinator_ms = ms,
                "--report-interval is longer than the coordinators' report interval; \
                 following the coordinators"
            );
        }
        tracing::info!(interval = ?effective, source = source.as_str(), "report interval");
        self.report_interval.changed.notify_one();
    }

    /// The report to send now: demand since the last one (bounded per rule),
    /// pending top-ups, and the epoch held.
    #[cfg(test)]
    pub(super) fn take_report(&self, with_demand: bool) -> pb::DemandReport {
        self.take_report_held(with_demand, self.held())
    }

    /// The epoch held and each counted rule's largest value, read together.
    fn held(&self) -> Held {
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let counted = self.counted.read().unwrap_or_else(|p| p.into_inner());
        Held {
            epoch: table.epoch(),
            caps: counted
                .keys()
                .filter_map(|rule| Some((rule.clone(), table.window_cap(rule, now)?)))
                .collect(),
        }
    }

    /// The report for `held`, the epoch read before in-flight checks were
    /// drained: only checks that may have read an older table were waited
    /// for, so the report acknowledges no newer epoch, and a rule's cap is
    /// the larger of its value then and now.
    fn take_report_held(&self, with_demand: bool, held: Held) -> pb::DemandReport {
        let now = now_unix_ms();
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        let counted = self.counted.read().unwrap_or_else(|p| p.into_inner());
        let holding = Holding {
            epoch: held.epoch,
            counted: counted
                .iter()
                .filter_map(|(rule, period)| {
                    let cap = table.window_cap(rule, now)?;
                    Some(CountedRule {
                        rule: rule.clone(),
                        period_ms: *period,
                        cap: cap.max(held.caps.get(rule).copied().unwrap_or(0)),
                    })
                })
                .collect(),
        };
        drop((table, counted));
        let mut report = to_proto(self.account().report(&holding, with_demand, now));
        report.resets_applied = self.resets_to_report();
        report
    }

    /// Sends demand every report interval ([`Global::report_interval`],
    /// read again after each report), and an acknowledgement (with any
    /// top-ups) as soon as an epoch is applied or a top-up is due, until
    /// `stop`; then one last demand report, so the hits counted since the
    /// previous one reach the centre instead of dying with the pod. A report
    /// that cannot be delivered is dropped: demand is a rate, the next one
    /// carries on.
    pub async fn report_until(
        self: Arc<Self>,
        coordinators: Vec<String>,
        transport: crate::tls::Transport,
        mut stop: Stop,
    ) {
        let mut nodes = CoordinatorNodes {
            coordinators,
            transport,
            next: 0,
            client: None,
        };
        // The first demand report goes out at once.
        let mut last_demand = tokio::time::Instant::now();
        let mut next = last_demand;
        loop {
            let (with_demand, last) = tokio::select! {
                () = tokio::time::sleep_until(next) => (true, false),
                () = self.wake.notified() => (false, false),
                () = self.report_interval.changed.notified() => {
                    // A shorter interval counts from the last report, not
                    // from the next one.
                    next = last_demand + self.report_interval().0;
                    continue;
                }
                () = stop.stopped() => (true, true),
            };
            if with_demand {
                last_demand = tokio::time::Instant::now();
                next = last_demand + self.report_interval().0;
            }
            // Checks that read the table before it changed are counted
            // first; if some take too long, the window use is left out (the
            // centre then grants nothing within the window).
            let mut held = self.held();
            let drained = self.flight.drain(Duration::from_millis(200)).await;
            // An epoch is acknowledged only once the region's Redis keeps
            // it (or a newer one): a pod restarted without a coordinator
            // then never restores a table older than the region acknowledged.
            held.epoch = self.save_through(held.epoch).await;
            let mut report = self.take_report_held(with_demand, held);
            if !drained {
                report.used.clear();
            }
            let kind = match (with_demand, last) {
                (_, true) => "last",
                (true, false) => "demand",
                (false, false) => "ack",
            };
            nodes.send(&report, kind).await;
            if last {
                return;
            }
        }
    }
}

/// Where this pod's report interval comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalSource {
    /// No Watch message said yet: [`DEFAULT_REPORT_INTERVAL_MS`].
    Default,
    /// The coordinators' (`WatchUpdate.report_interval_ms`).
    Coordinator,
    /// `--report-interval`, shorter than the coordinators'.
    Flag,
}

impl IntervalSource {
    /// As `/readyz` and the logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            IntervalSource::Default => "default, until a coordinator says",
            IntervalSource::Coordinator => "coordinator",
            IntervalSource::Flag => "--report-interval",
        }
    }
}

/// How often this pod reports demand: the coordinators give the interval on
/// the Watch stream (they know their rounds); `--report-interval` may only
/// shorten it. Read by the reporter after every report.
#[derive(Default)]
pub struct ReportInterval {
    /// `--report-interval` in ms; 0 when not given. Set before the
    /// reporter starts.
    flag_ms: u64,
    /// The coordinators' interval in ms; 0 until a Watch message gave one.
    /// Written by the coordinator stream, read by the reporter and /readyz.
    coordinator_ms: AtomicU64,
    /// Tells the reporter the interval changed.
    changed: Notify,
}

impl ReportInterval {
    /// The interval in force and who set it.
    pub fn effective(&self) -> (Duration, IntervalSource) {
        let (given, source) = match self.coordinator_ms.load(Ordering::Relaxed) {
            0 => (DEFAULT_REPORT_INTERVAL_MS, IntervalSource::Default),
            ms => (ms, IntervalSource::Coordinator),
        };
        match self.flag_ms {
            flag if flag > 0 && flag < given => (Duration::from_millis(flag), IntervalSource::Flag),
            _ => (Duration::from_millis(given), source),
        }
    }
}

/// A report as it travels.
fn to_proto(report: PodReport) -> pb::DemandReport {
    pb::DemandReport {
        region: report.region,
        pod: report.pod,
        epoch: report.epoch,
        interval_ms: report.interval_ms,
        rules: report
            .rules
            .into_iter()
            .map(|rd| pb::RuleDemand {
                rule: rd.rule,
                keys: rd
                    .keys
                    .into_iter()
                    .map(|k| pb::KeyDemand {
                        key: k.key,
                        asked: k.asked,
                        allowed: k.allowed,
                    })
                    .collect(),
                remainder_asked: rd.remainder_asked,
                remainder_allowed: rd.remainder_allowed,
            })
            .collect(),
        used: report
            .used
            .into_iter()
            .map(|u| pb::WindowUse {
                rule: u.rule,
                window_start_unix_ms: u.window_start_ms,
                count: u.used.count,
                cap: u.used.cap,
            })
            .collect(),
        top_ups: report
            .top_ups
            .into_iter()
            .map(|t| pb::TopUp {
                rule: t.rule,
                key: t.key,
                per_period: t.per_period,
                interval_ms: t.interval_ms,
            })
            .collect(),
        admitted: report
            .admitted
            .into_iter()
            .map(|a| pb::PeriodAdmitted {
                rule: a.rule,
                key: a.key.unwrap_or_default(),
                period_start_unix_ms: a.period_start_ms,
                admitted: a.admitted,
            })
            .collect(),
        resets_applied: Vec::new(),
        reserved: report
            .reserved
            .into_iter()
            .map(|r| pb::KeyReserved {
                rule: r.rule,
                key: r.key,
                outstanding: r.outstanding,
            })
            .collect(),
    }
}

/// The coordinator nodes a pod's reports go to: any of them takes one (a
/// follower relays to the leader), the one that answered last first.
struct CoordinatorNodes {
    /// The nodes' gRPC URLs (`--coordinator`), tried in turn.
    coordinators: Vec<String>,
    /// TLS with this region's certificate, or plaintext (`--insecure`).
    transport: crate::tls::Transport,
    /// Index (modulo the count) of the node to dial when none is connected.
    next: usize,
    /// The channel to the node that answered last; `None` after a failure,
    /// so the next report dials the next node.
    client: Option<CoordinatorClient<tonic::transport::Channel>>,
}

impl CoordinatorNodes {
    /// Delivers `report` to the first node that takes it, trying each once.
    async fn send(&mut self, report: &pb::DemandReport, kind: &'static str) {
        for _ in 0..self.coordinators.len() {
            let mut client = match &self.client {
                Some(c) => c.clone(),
                None => {
                    let url = &self.coordinators[self.next % self.coordinators.len()];
                    let channel = self.transport.channel(url, Expect::AnyNode, |e| {
                        e.connect_timeout(Duration::from_secs(1))
                            .timeout(Duration::from_secs(3))
                    });
                    match channel {
                        Ok(channel) => {
                            let c = CoordinatorClient::new(channel)
                                .max_encoding_message_size(crate::proto::MAX_REPORT_BYTES);
                            self.client = Some(c.clone());
                            c
                        }
                        Err(e) => {
                            tracing::error!(%url, error = %e, "bad coordinator URL");
                            self.next += 1;
                            continue;
                        }
                    }
                }
            };
            match client.report(report.clone()).await {
                Ok(_) => {
                    counter!("meridian_allocation_reports_total", "kind" => kind).increment(1);
                    return;
                }
                Err(status) => {
                    counter!("meridian_allocation_report_failures_total").increment(1);
                    tracing::debug!(error = %status, "report failed; trying the next coordinator");
                    self.client = None;
                    self.next += 1;
                }
            }
        }
        if kind == "last" {
            tracing::warn!("no coordinator took the last demand report; its hits are lost");
        }
    }
}
