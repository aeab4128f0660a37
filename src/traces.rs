//! OTLP traces: exported only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//!
//! A limiter traces checks (the Envoy RLS call continues the W3C trace
//! context its `traceparent` metadata carries) and a coordinator traces its
//! rebalance rounds. Spans go out over OTLP/gRPC (tonic, the same one the
//! services use) in batches from the SDK's own thread.
//!
//! Sampling is the standard `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`
//! when set; otherwise parent-based with a ratio for new traces
//! ([`DEFAULT_CHECK_RATIO`] for a limiter, every round for a coordinator): a
//! check that arrives inside a sampled trace is always traced, so a gateway
//! that samples decides for its checks.
//!
//! With the variable unset nothing is set up: no exporter, no span on the
//! hot path ([`enabled`] is false).

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The endpoint variable (OpenTelemetry's standard name).
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Share of new traces (no sampled parent) a limiter samples by default:
/// one check in a hundred keeps the exporter's cost off the hot path.
pub const DEFAULT_CHECK_RATIO: f64 = 0.01;
/// The tracing target of every span meant for OTLP; only these are exported.
pub const TARGET: &str = "meridian::trace";

/// Whether spans are exported (set once, at start-up).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported: callers skip building spans otherwise.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Which process is tracing: its service name and default ratio.
#[derive(Debug, Clone, Copy)]
pub struct Service {
    /// `service.name` of its spans.
    pub name: &'static str,
    /// Share of new traces sampled when `OTEL_TRACES_SAMPLER` is unset.
    pub ratio: f64,
}

/// Shuts the exporter down (flushing what is queued) when dropped.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "OTLP exporter shutdown");
        }
    }
}

/// The endpoint to export to, if the operator set one.
pub fn endpoint(value: Option<&str>) -> Option<String> {
    value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The OTLP layer and its exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
/// Must run inside a tokio runtime (tonic's channel spawns its worker there).
pub fn layer<S>(service: Service) -> Option<(impl Layer<S>, Exporter)>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let endpoint = endpoint(std::env::var(ENDPOINT_ENV).ok().as_deref())?;
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
    {
        Ok(exporter) => exporter,
        Err(e) => {
            // Logs are not up yet: stderr is all there is.
            eprintln!("{ENDPOINT_ENV}={endpoint}: cannot export traces there: {e}");
            return None;
        }
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.name)
        .build();
    let mut builder = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource);
    if std::env::var_os("OTEL_TRACES_SAMPLER").is_none() {
        builder = builder.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            service.ratio,
        ))));
    }
    let provider = builder.build();
    let tracer = provider.tracer("meridian");
    ENABLED.store(true, Ordering::Relaxed);
    let only_ours =
        tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(only_ours);
    Some((layer, Exporter { provider }))
}

/// Makes `span` a child of the W3C trace context in `metadata`
/// (`traceparent`, `tracestate`), if it carries a valid one.
pub fn continue_trace(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let parent = TraceContextPropagator::new().extract(&Metadata(metadata));
    // An invalid or missing traceparent leaves an empty context: the span
    // then starts a trace of its own.
    let _ = span.set_parent(parent);
}

/// tonic's metadata as an OpenTelemetry carrier.
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_non_empty_endpoint_turns_export_on() {
        assert_eq!(endpoint(None), None);
        assert_eq!(endpoint(Some("")), None);
        assert_eq!(endpoint(Some("  ")), None);
        assert_eq!(
            endpoint(Some("http://collector:4317")).as_deref(),
            Some("http://collector:4317")
        );
    }
}
