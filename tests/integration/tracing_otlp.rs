//! OTLP traces: a limiter with `OTEL_EXPORTER_OTLP_ENDPOINT` set exports a
//! span for an Envoy RLS check that continues the trace its `traceparent`
//! metadata names, to a real OTLP/gRPC receiver (in this test process); a
//! check whose parent was not sampled is not exported. A coordinator exports
//! its rebalance rounds.

use crate::common;

use std::time::{Duration, Instant};

use common::limiter::LimiterProcess;
use meridian::proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use meridian::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio::sync::mpsc;

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";
const SAMPLED_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const GATEWAY_SPAN: &str = "00f067aa0ba902b7";

/// One exported span: trace id, parent span id, name, service name.
#[derive(Debug, Clone)]
struct Received {
    trace_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    name: String,
    service: String,
}

/// The OTLP/gRPC trace collector, reduced to handing every span to the test.
struct Receiver(mpsc::UnboundedSender<Received>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                let _ = self.0.send(Received {
                    trace_id: span.trace_id,
                    parent_span_id: span.parent_span_id,
                    name: span.name,
                    service: service.clone(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

async fn check(limiter: &LimiterProcess, traceparent: &str) {
    let mut client = RateLimitServiceClient::connect(limiter.grpc_url())
        .await
        .expect("connect to the limiter");
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "traced".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ASCII metadata"));
    client
        .should_rate_limit(request)
        .await
        .expect("the check is answered");
}

/// An OTLP/gRPC receiver on a free loopback port: its endpoint URL and the
/// spans it receives.
async fn start_receiver() -> (String, mpsc::UnboundedReceiver<Received>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the OTLP receiver");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let (spans, received) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(spans)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (endpoint, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_rounds_are_exported() {
    let (endpoint, mut received) = start_receiver().await;
    let options = common::coordinator::Options {
        extra_args: vec!["--rebalance-interval".into(), "200ms".into()],
        env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        ],
        ..Default::default()
    };
    let _cluster = common::coordinator::Cluster::start(1, options).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let round = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, received.recv()).await {
            Ok(Some(span)) if span.name == "coordinator.round" => break span,
            Ok(Some(other)) => seen.push(other),
            _ => panic!("no coordinator.round span within 20 s; received {seen:?}"),
        }
    };
    assert!(round.service.contains("meridian-coordinator"), "{round:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checks_span_continues_the_gateways_trace_and_reaches_the_collector() {
    let (endpoint, mut received) = start_receiver().await;
    let limiter = LimiterProcess::start_with_env(
        RULES,
        &["--store", "memory"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            // Export every 100 ms instead of every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );

    check(&limiter, &format!("00-{UNSAMPLED_TRACE}-{GATEWAY_SPAN}-00")).await;
    check(&limiter, &format!("00-{SAMPLED_TRACE}-{GATEWAY_SPAN}-01")).await;

    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    let span = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, received.recv()).await {
            Ok(Some(span)) if span.trace_id == hex(SAMPLED_TRACE) => break span,
            Ok(Some(other)) => seen.push(other),
            _ => panic!("no span of trace {SAMPLED_TRACE} within 15 s; received {seen:?}"),
        }
    };
    assert_eq!(span.parent_span_id, hex(GATEWAY_SPAN), "{span:?}");
    assert_eq!(span.name, "ratelimit.ShouldRateLimit");
    assert!(span.service.contains("meridian-limiter"), "{span:?}");
    // The unsampled check was sent first; the batch that carried the sampled
    // one would have carried it too. Give a straggler one more export.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(other) = received.try_recv() {
        seen.push(other);
    }
    assert!(
        seen.iter().all(|s| s.trace_id != hex(UNSAMPLED_TRACE)),
        "a check whose parent was not sampled was exported: {seen:?}"
    );
}
