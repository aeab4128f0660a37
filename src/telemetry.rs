//! Logs and metrics set-up shared by every command: one log subscriber, one
//! Prometheus recorder per process.

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logs to stderr in `format`; `RUST_LOG` (e.g. `meridian=debug`) overrides
/// the `default` filter. Called once, by `main`, for every command. For a
/// `service` (limiter, coordinator) it also exports OTLP traces when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see `traces`); it must then run
/// inside the tokio runtime, and the returned exporter be dropped (flushed)
/// before that runtime stops.
pub fn init_logs(
    format: LogFormat,
    default: &str,
    service: Option<crate::traces::Service>,
) -> Option<crate::traces::Exporter> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        // Escape codes are for terminals: in a file or a log pipeline
        // (systemd, Kubernetes) they are noise around every field. NO_COLOR
        // (no-color.org) turns them off on a terminal too.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .boxed(),
        LogFormat::Json => builder.json().boxed(),
    };
    let (traces, exporter) = match service.and_then(crate::traces::layer) {
        Some((layer, exporter)) => (Some(layer), Some(exporter)),
        None => (None, None),
    };
    let _ = tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .try_init();
    exporter
}

/// Latency of one check or store call, 50 µs to 1 s: the hot path lives at
/// the low end.
const HOT_PATH_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Coordinator work that waits on Raft (a commit is an fsync and a round
/// trip to a quorum, possibly across regions) or relays to the leader,
/// 1 ms to 30 s.
const CONTROL_PLANE_SECONDS: &[f64] = &[
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Payloads up to the 1 MiB a rule set may take, and a little beyond.
const BYTES: &[f64] = &[
    256.0,
    1024.0,
    4096.0,
    16_384.0,
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
];
/// Keys in one batch (the approximate path's flushes).
const KEYS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0];

/// Buckets for every histogram Meridian records; a histogram no matcher
/// covers is rendered as a summary. The matchers are disjoint on purpose:
/// the exporter tries them in its own (sorted) order, not in this one.
fn buckets() -> [(Matcher, &'static [f64]); 5] {
    [
        (
            Matcher::Suffix("_duration_seconds".into()),
            HOT_PATH_SECONDS,
        ),
        (
            Matcher::Full("meridian_coordinator_rebalance_seconds".into()),
            CONTROL_PLANE_SECONDS,
        ),
        (
            Matcher::Full("meridian_coordinator_api_request_seconds".into()),
            CONTROL_PLANE_SECONDS,
        ),
        (Matcher::Suffix("_bytes".into()), BYTES),
        (Matcher::Suffix("_keys".into()), KEYS),
    ]
}

fn builder() -> PrometheusBuilder {
    buckets()
        .into_iter()
        .fold(PrometheusBuilder::new(), |builder, (matcher, buckets)| {
            // Fails only for an empty bucket list, which none of these is.
            match builder.set_buckets_for_metric(matcher, buckets) {
                Ok(b) => b,
                Err(e) => unreachable!("non-empty buckets: {e}"),
            }
        })
}

/// The process-wide Prometheus recorder for `component` (`limiter`,
/// `coordinator`), installed on first use: every series it renders carries
/// `labels` (the limiter's `region`), and `meridian_build_info` is 1 with the
/// version and the component, so a dashboard can tell which build answers.
/// Its histograms need trimming: run [`upkeep`] as one of the service's tasks.
/// A later call returns the same recorder, whatever it asks for: one
/// process, one set of labels.
pub fn metrics_for(component: &str, labels: &[(&str, &str)]) -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = labels
                .iter()
                .fold(builder(), |b, (name, value)| {
                    b.add_global_label(*name, *value)
                })
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            build_info(component);
            handle
        })
        .clone()
}

/// `meridian_build_info{version, component} 1`: the usual Prometheus way to
/// publish a build as labels of a constant series.
fn build_info(component: &str) {
    metrics::gauge!(
        "meridian_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "component" => component.to_owned()
    )
    .set(1.0);
}

/// Drains the histograms' samples into their buckets every 5 s, so memory
/// stays flat between scrapes. Runs until its task is stopped.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every histogram the limiter and the coordinator record.
    const HISTOGRAMS: &[(&str, f64)] = &[
        ("meridian_check_duration_seconds", 0.000_3),
        ("meridian_store_duration_seconds", 0.000_3),
        ("meridian_approx_flush_duration_seconds", 0.002),
        ("meridian_approx_flush_keys", 12.0),
        ("meridian_coordinator_rebalance_seconds", 0.2),
        ("meridian_coordinator_api_request_seconds", 0.02),
        ("meridian_coordinator_epoch_delta_bytes", 900.0),
    ];

    #[test]
    fn every_histogram_gets_buckets_not_a_summary() {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            for (name, value) in HISTOGRAMS {
                metrics::histogram!(*name).record(*value);
            }
        });
        let text = handle.render();
        for (name, _) in HISTOGRAMS {
            assert!(
                text.contains(&format!("{name}_bucket{{le=")),
                "{name} has no buckets:\n{text}"
            );
        }
        assert!(!text.contains("quantile="), "{text}");
    }

    #[test]
    fn global_labels_and_build_info_are_on_every_series() {
        let recorder = builder()
            .add_global_label("region", "mumbai")
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            build_info("limiter");
            metrics::counter!("meridian_checks_total", "rule" => "api|otp").increment(1);
        });
        let text = handle.render();
        assert!(
            text.contains(&format!(
                "meridian_build_info{{region=\"mumbai\",version=\"{}\",component=\"limiter\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(
            text.contains("meridian_checks_total{region=\"mumbai\",rule=\"api|otp\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn coordinator_rounds_get_buckets_up_to_seconds() {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("meridian_coordinator_rebalance_seconds").record(3.0);
        });
        let text = handle.render();
        assert!(
            text.contains("meridian_coordinator_rebalance_seconds_bucket{le=\"5\"} 1"),
            "{text}"
        );
    }
}
