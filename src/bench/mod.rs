//! `meridian bench`: a load generator for the limiter's three APIs (Envoy RLS
//! v3, native gRPC, HTTP JSON) — or any Envoy RLS v3 server.
//!
//! Open loop (`--rate`) sends on a fixed schedule and measures latency from
//! each request's *scheduled* time, so a stalled server shows up in the tail
//! instead of silently slowing the generator (coordinated omission). Closed
//! loop (`--concurrency`) keeps N requests in flight and measures from the
//! actual send. Around the measured window it samples Redis (`--redis`) and the
//! server process (`--server-pid`) to report the cost of one check.

mod api;
mod keys;
mod probe;
mod recorder;
mod schedule;
mod summary;
mod template;
mod threads;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use crate::rules::parse_duration;

pub use api::Api;
use api::{Addressing, CheckShape, Connection};
pub use keys::KeyDist;
use keys::KeySampler;
use probe::{ProbeError, RedisProbe, RedisSample, process_cpu};
use recorder::{Recorder, Sample};
use schedule::Schedule;
pub use summary::Summary;
use summary::{LatencySummary, ProcessCost, RedisCost};
use template::DescriptorTemplate;
pub use template::EntryTemplate;
use threads::ClientThreads;

/// Closed-loop streams when neither `--rate` nor `--concurrency` is given.
pub const DEFAULT_CONCURRENCY: usize = 16;

#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Load-test a limiter (Envoy RLS v3, native gRPC or HTTP) and report throughput, \
             latency percentiles and the cost of one check",
    after_help = "Examples:\n  \
      meridian bench --api rls --domain bench --descriptor 'customer={key}' --concurrency 16\n  \
      meridian bench --api grpc --domain bench --rule per-customer --batch 100 --connections 2\n  \
      meridian bench --api http --target http://127.0.0.1:8080 --domain bench \
      --descriptor 'customer={key}' --rate 5000 --dist zipf:1.1\n  \
      meridian bench ... --redis redis://REDIS_HOST:PORT --server-pid $(pidof meridian) --json"
)]
/// `meridian bench` options: the API and limiter to drive, the keys and
/// traffic shape, how long, and where the report goes.
pub struct BenchArgs {
    /// API to drive: rls = envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (any Envoy
    /// RLS v3 server), grpc = meridian.v1.Limiter/Check, http = POST /v1/check
    #[arg(long, value_enum, default_value = "grpc")]
    pub api: Api,

    /// Server address: host:port for rls and grpc; for http a URL (a URL without a path gets
    /// /v1/check) [default: 127.0.0.1:8081 for rls and grpc, http://127.0.0.1:8080 for http]
    #[arg(long, value_name = "ADDR")]
    pub target: Option<String>,

    /// Open loop: send this many checks per second on a fixed schedule, whatever the server
    /// does; latency counts from each request's scheduled send time [default: closed loop]
    #[arg(long, value_name = "CHECKS_PER_S", conflicts_with = "concurrency")]
    pub rate: Option<u64>,

    /// Closed loop: this many streams, each sending its next request as soon as the previous
    /// one is answered [default: 16 unless --rate is given]
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,

    /// gRPC channels (one HTTP/2 connection each) or HTTP clients (each with its own
    /// connection pool); streams / requests are spread over them round-robin
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub connections: usize,

    /// How long to measure, after the warm-up (e.g. 500ms, 10s, 2m, 1m30s)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,

    /// Load sent before measuring starts, not counted (0s for none)
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_warmup)]
    pub warmup: Duration,

    /// Number of distinct keys (0 … N-1, in decimal)
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub keys: u64,

    /// Key distribution: uniform; zipf[:S] (rank r drawn ∝ 1/r^S, S defaults to 1); hot[:F]
    /// (key 0 gets the fraction F of checks, default 0.5, the rest uniform)
    #[arg(long, value_name = "DIST", default_value = "uniform")]
    pub dist: KeyDist,

    /// Checks per request for grpc and http (throughput counts checks; rls sends one
    /// descriptor per request)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batch: usize,

    /// Rate limit domain of every check
    #[arg(long)]
    pub domain: String,

    /// grpc / http: address checks by this rule name plus the drawn key [default: none; give
    /// --rule or --descriptor]
    #[arg(long, value_name = "NAME", conflicts_with = "descriptor")]
    pub rule: Option<String>,

    /// Descriptor entry KEY=VALUE, `{key}` replaced by the drawn key; repeat for several
    /// entries of one descriptor (required for rls, e.g. --descriptor 'customer={key}')
    /// [default: none]
    #[arg(long, value_name = "KEY=VALUE")]
    pub descriptor: Vec<EntryTemplate>,

    /// Hits each check consumes (RLS: hits_addend)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub cost: u64,

    /// Deadline of each request; a request that misses it counts as an error
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Open loop: most requests in flight; beyond it sending waits (and the wait shows in
    /// the latency, which still counts from the scheduled time). Over HTTP each request in
    /// flight holds a connection of its own: keep N under the server's connection cap (a
    /// limiter's --http-max-connections, 1024 by default) or a slow server resets some
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub max_in_flight: usize,

    /// Redis the server uses: report Redis commands and CPU µs per check (INFO commandstats
    /// and INFO cpu before and after the measured window) [default: off]
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,

    /// Server process id: report its CPU µs per check (/proc/PID/stat before and after)
    /// [default: off]
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,

    /// Seed of the key draws, so runs against different servers send the same keys
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Print the summary as one JSON object on stdout (progress still goes to stderr)
    /// [default: a text summary]
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--{flag}: {reason}")]
    InvalidArg { flag: &'static str, reason: String },
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("load task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("client thread: {0}")]
    Thread(String),
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> BenchError {
    BenchError::InvalidArg {
        flag,
        reason: reason.into(),
    }
}

/// Like the rule files' durations, but zero (`0`, `0s`, …) is allowed: no warm-up.
fn parse_warmup(text: &str) -> Result<Duration, String> {
    let digits = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !digits.is_empty() && digits.bytes().all(|b| b == b'0') {
        return Ok(Duration::ZERO);
    }
    parse_duration(text)
}

/// Open or closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Load {
    Open { rate: u64, schedule: Schedule },
    Closed { concurrency: usize },
}

/// The validated run, before any I/O.
#[derive(Debug, Clone)]
struct Plan {
    api: Api,
    target: String,
    shape: CheckShape,
    load: Load,
    batch: usize,
    sampler: KeySampler,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Plan, BenchError> {
        if args.domain.is_empty() {
            return Err(invalid("domain", "must not be empty"));
        }
        let addressing = match (&args.rule, DescriptorTemplate::new(args.descriptor.clone())) {
            (Some(_), _) if args.api == Api::Rls => {
                return Err(invalid(
                    "rule",
                    "rls addresses limits by descriptor: use --descriptor",
                ));
            }
            (Some(rule), _) => Addressing::Rule(rule.clone()),
            (None, Some(template)) => Addressing::Descriptor(template),
            (None, None) => {
                return Err(invalid(
                    "descriptor",
                    "give --descriptor KEY=VALUE (or, for grpc and http, --rule NAME)",
                ));
            }
        };
        if args.batch == 0 {
            return Err(invalid("batch", "must be at least 1"));
        }
        if args.api == Api::Rls && args.batch > 1 {
            return Err(invalid(
                "batch",
                "rls sends one descriptor per request; use grpc or http",
            ));
        }
        if args.api == Api::Rls && u32::try_from(args.cost).is_err() {
            return Err(invalid("cost", "rls hits_addend is a uint32"));
        }
        if args.connections == 0 {
            return Err(invalid("connections", "must be at least 1"));
        }
        if args.max_in_flight == 0
            || args.max_in_flight > Semaphore::MAX_PERMITS.min(u32::MAX as usize)
        {
            return Err(invalid("max-in-flight", "must be between 1 and 4294967295"));
        }
        let load = match (args.rate, args.concurrency) {
            (Some(rate), _) => Load::Open {
                rate,
                schedule: Schedule::new(rate, args.batch as u64)
                    .ok_or_else(|| invalid("rate", "must be at least 1"))?,
            },
            (None, Some(0)) => return Err(invalid("concurrency", "must be at least 1")),
            (None, concurrency) => Load::Closed {
                concurrency: concurrency.unwrap_or(DEFAULT_CONCURRENCY),
            },
        };
        Ok(Plan {
            api: args.api,
            target: args
                .target
                .clone()
                .unwrap_or_else(|| args.api.default_target().to_owned()),
            shape: CheckShape {
                domain: args.domain.clone(),
                addressing,
                cost: args.cost,
            },
            load,
            batch: args.batch,
            sampler: KeySampler::new(args.dist, args.keys).map_err(|e| invalid("keys", e))?,
        })
    }

    fn draw_keys(&self, rng: &mut StdRng) -> Vec<String> {
        (0..self.batch)
            .map(|_| self.sampler.sample(rng).to_string())
            .collect()
    }
}

/// Aborts a background task when dropped, so no exit path leaves it running.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Instants of one run.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

/// Counters sampled at the edges of the measured window.
struct Probes {
    redis: Option<RedisProbe>,
    server_pid: Option<String>,
}

/// CPU counters read before and after the measured part of a run.
#[derive(Default)]
struct ProbeSample {
    /// Redis's command calls and CPU, when `--redis` is given.
    redis: Option<RedisSample>,
    /// The server's CPU time, when `--server-pid` is given.
    server: Option<Duration>,
    /// This process's CPU time.
    client: Option<Duration>,
}

impl Probes {
    async fn sample(&mut self) -> Result<ProbeSample, ProbeError> {
        Ok(ProbeSample {
            redis: match &mut self.redis {
                Some(probe) => Some(probe.sample().await?),
                None => None,
            },
            server: self.server_pid.as_deref().map(process_cpu).transpose()?,
            client: Some(process_cpu("self")?),
        })
    }
}

/// Runs the bench, printing progress to stderr and the summary to stdout.
pub async fn run(args: BenchArgs) -> Result<Summary, BenchError> {
    let plan = Arc::new(Plan::new(&args)?);
    let mut probes = Probes {
        redis: match &args.redis {
            Some(url) => Some(RedisProbe::connect(url).await?),
            None => None,
        },
        server_pid: args.server_pid.map(|pid| pid.to_string()),
    };
    probes.sample().await?; // fail before the load if a probe cannot work

    let load = match plan.load {
        Load::Open { schedule, .. } => {
            let mut connections = Vec::with_capacity(args.connections);
            for _ in 0..args.connections {
                let connection = Connection::open(plan.api, &plan.target, args.timeout)
                    .await
                    .map_err(|reason| BenchError::Connect {
                        target: plan.target.clone(),
                        reason,
                    })?;
                connections.push(connection);
            }
            Ready::Open(connections, schedule)
        }
        Load::Closed { concurrency } => {
            Ready::Closed(ClientThreads::open(&plan, concurrency, &args).await?)
        }
    };

    let start = Instant::now();
    let window = Window {
        start,
        measure_from: start + args.warmup,
        end: start + args.warmup + args.duration,
    };
    let recorder = Arc::new(Recorder::new(start));
    let _progress = AbortOnDrop(tokio::spawn(report_progress(recorder.clone(), window)));
    let before = tokio::spawn(async move {
        tokio::time::sleep_until(window.measure_from.into()).await;
        let sample = probes.sample().await;
        (probes, sample)
    });

    match load {
        Ready::Open(connections, schedule) => {
            open_loop(&plan, schedule, connections, &recorder, window, &args).await?
        }
        Ready::Closed(threads) => threads.run(window, &recorder).await?,
    }

    let (mut probes, before) = before.await?;
    let before = before?;
    let after = probes.sample().await?;
    let summary = summarise(&plan, &args, &recorder, window, &before, &after);
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&summary).expect("a summary serialises")
        );
    } else {
        print!("{summary}");
    }
    Ok(summary)
}

fn summarise(
    plan: &Plan,
    args: &BenchArgs,
    recorder: &Recorder,
    window: Window,
    before: &ProbeSample,
    after: &ProbeSample,
) -> Summary {
    let totals = recorder.measured();
    let last = recorder.last_done().unwrap_or(window.end);
    let elapsed = last
        .saturating_duration_since(window.measure_from)
        .max(args.duration);
    let (latency, lag) = recorder.histograms();
    let cpu_us = |b: Option<Duration>, a: Option<Duration>| -> Option<u64> {
        Some(u64::try_from(a?.saturating_sub(b?).as_micros()).unwrap_or(u64::MAX))
    };
    let (rate, concurrency) = match plan.load {
        Load::Open { rate, .. } => (Some(rate), None),
        Load::Closed { concurrency } => (None, Some(concurrency)),
    };
    Summary {
        api: plan.api.name().to_owned(),
        target: plan.target.clone(),
        mode: if rate.is_some() { "open" } else { "closed" },
        rate,
        concurrency,
        connections: args.connections,
        batch: plan.batch,
        keys: args.keys,
        dist: args.dist.to_string(),
        elapsed_s: elapsed.as_secs_f64(),
        requests: totals.requests,
        checks: totals.checks,
        throughput_checks_per_s: totals.checks as f64 / elapsed.as_secs_f64(),
        allowed: totals.allowed,
        denied: totals.denied,
        errors: totals.errors,
        unmatched: totals.unmatched,
        reasons: recorder.reasons(),
        latency: LatencySummary::from_histogram(&latency),
        send_lag: rate.map(|_| LatencySummary::from_histogram(&lag)),
        first_error: recorder.first_error(),
        redis: match (&before.redis, &after.redis) {
            (Some(b), Some(a)) => Some(RedisCost::new(
                &a.calls_since(b),
                a.cpu_us.saturating_sub(b.cpu_us),
                totals.checks,
            )),
            _ => None,
        },
        server: cpu_us(before.server, after.server).map(|us| ProcessCost::new(us, totals.checks)),
        client: ProcessCost::new(
            cpu_us(before.client, after.client).unwrap_or(0),
            totals.checks,
        ),
    }
}

/// Sends on the schedule from a blocking-pool thread: `std::thread::sleep`
/// wakes within tens of µs, where tokio's timer wheel rounds up to whole
/// milliseconds, which would add up to 1 ms of our own lateness to every
/// latency. Each request then runs as its own task.
async fn open_loop(
    plan: &Arc<Plan>,
    schedule: Schedule,
    connections: Vec<Connection>,
    recorder: &Arc<Recorder>,
    window: Window,
    args: &BenchArgs,
) -> Result<(), BenchError> {
    let total = schedule.due_before(args.warmup + args.duration);
    let warm = schedule.due_before(args.warmup);
    let in_flight = Arc::new(Semaphore::new(args.max_in_flight));
    let runtime = tokio::runtime::Handle::current();
    let (plan, recorder, permits, seed) =
        (plan.clone(), recorder.clone(), in_flight.clone(), args.seed);
    tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        for i in 0..total {
            let due = window.start + schedule.due(i);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let permit = match permits.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => match runtime.block_on(permits.clone().acquire_owned()) {
                    Ok(permit) => permit,
                    Err(_) => return, // closed: nobody waits for the rest
                },
            };
            let keys = plan.draw_keys(&mut rng);
            let mut connection = connections[i as usize % connections.len()].clone();
            let (plan, recorder) = (plan.clone(), recorder.clone());
            runtime.spawn(async move {
                let sent = Instant::now();
                let result = connection.send(&plan.shape, &keys).await;
                let done = Instant::now();
                recorder.record(Sample {
                    shard: i as usize,
                    measured: i >= warm,
                    checks: keys.len(),
                    latency: done - due,
                    lag: Some(sent.saturating_duration_since(due)),
                    done,
                    result,
                });
                drop(permit);
            });
        }
    })
    .await?;
    // Every permit back means every request has been answered or timed out.
    let all = u32::try_from(args.max_in_flight).expect("validated in Plan::new");
    let _drained = in_flight.acquire_many(all).await;
    Ok(())
}

/// How long a closed-loop stream pauses after a failed request, so a refused
/// connection does not turn the bench into a busy loop on a shared machine.
const ERROR_PAUSE: Duration = Duration::from_millis(1);

/// Connections made ready for the load.
enum Ready {
    Open(Vec<Connection>, Schedule),
    Closed(ClientThreads),
}

/// Runs `streams` (stream number, its connection) on the calling runtime, each
/// sending its next request when the previous one is answered, until the
/// window ends.
async fn closed_loop(
    plan: &Arc<Plan>,
    streams: Vec<(usize, Connection)>,
    recorder: &Arc<Recorder>,
    window: Window,
    seed: u64,
) -> Result<(), BenchError> {
    let mut running = JoinSet::new();
    for (stream, mut connection) in streams {
        let (plan, recorder) = (plan.clone(), recorder.clone());
        running.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(stream as u64));
            loop {
                let sent = Instant::now();
                if sent >= window.end {
                    break;
                }
                let keys = plan.draw_keys(&mut rng);
                let result = connection.send(&plan.shape, &keys).await;
                let failed = result.is_err();
                let done = Instant::now();
                recorder.record(Sample {
                    shard: stream,
                    measured: sent >= window.measure_from,
                    checks: keys.len(),
                    latency: done - sent,
                    lag: None,
                    done,
                    result,
                });
                if failed {
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        });
    }
    while let Some(stream) = running.join_next().await {
        stream?;
    }
    Ok(())
}

/// One line a second on stderr: phase, checks/s and mean latency over the
/// last second, and the running outcome counts.
async fn report_progress(recorder: Arc<Recorder>, window: Window) {
    let mut tick = tokio::time::interval_at(
        (window.start + Duration::from_secs(1)).into(),
        Duration::from_secs(1),
    );
    let mut last = (recorder::Totals::default(), 0u64, window.start);
    loop {
        let now = tick.tick().await.into_std();
        let (totals, latency_us) = recorder.progress();
        let seconds = now.duration_since(last.2).as_secs_f64();
        let requests = totals.requests - last.0.requests;
        let mean_ms = if requests == 0 {
            0.0
        } else {
            (latency_us - last.1) as f64 / requests as f64 / 1000.0
        };
        // The phase the second began in: the line describes that second.
        let phase = if last.2 < window.measure_from {
            "warmup"
        } else if last.2 < window.end {
            "measure"
        } else {
            "drain"
        };
        eprintln!(
            "[{:>5.1}s] {phase:<7} {:>9.0} checks/s  mean {mean_ms:.3} ms  allowed {}  denied {}  errors {}",
            now.duration_since(window.start).as_secs_f64(),
            (totals.checks - last.0.checks) as f64 / seconds,
            totals.allowed,
            totals.denied,
            totals.errors,
        );
        last = (totals, latency_us, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(line: &str) -> BenchArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
            .unwrap_or_else(|e| panic!("{line}: {e}"))
            .bench
    }

    fn plan(line: &str) -> Result<Plan, BenchError> {
        Plan::new(&args(line))
    }

    #[test]
    fn warm_up_may_be_zero_and_takes_the_rule_files_units() {
        assert_eq!(parse_warmup("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_warmup("0"), Ok(Duration::ZERO));
        assert_eq!(parse_warmup("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_warmup("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_warmup("soon").is_err());
        assert!(parse_warmup("").is_err());
    }

    #[test]
    fn defaults_are_a_closed_loop_of_16_on_grpc() {
        let p = plan("--domain bench --rule per-customer").unwrap();
        assert_eq!(p.api, Api::Grpc);
        assert_eq!(p.target, "127.0.0.1:8081");
        assert_eq!(p.load, Load::Closed { concurrency: 16 });
        assert_eq!(p.batch, 1);
        let a = args("--domain bench --rule r");
        assert_eq!(
            (a.duration, a.warmup, a.keys),
            (Duration::from_secs(10), Duration::from_secs(1), 10_000)
        );
        assert_eq!(a.dist, KeyDist::Uniform);
    }

    #[test]
    fn rate_selects_the_open_loop_in_checks_per_second() {
        let p = plan("--api http --domain d --descriptor customer={key} --rate 1000 --batch 10")
            .unwrap();
        assert_eq!(p.target, "http://127.0.0.1:8080");
        let Load::Open { rate, schedule } = p.load else {
            panic!("open loop expected")
        };
        assert_eq!(rate, 1000);
        assert_eq!(schedule.due(1), Duration::from_millis(10));
        assert!(
            Cli::try_parse_from([
                "bench",
                "--domain",
                "d",
                "--rule",
                "r",
                "--rate",
                "5",
                "--concurrency",
                "2"
            ])
            .is_err()
        );
    }

    #[test]
    fn rls_needs_a_descriptor_and_single_checks() {
        assert!(
            plan("--api rls --domain d --descriptor customer={key} --descriptor plan=free").is_ok()
        );
        assert!(matches!(
            plan("--api rls --domain d --rule r"),
            Err(BenchError::InvalidArg { flag: "rule", .. })
        ));
        assert!(matches!(
            plan("--api rls --domain d"),
            Err(BenchError::InvalidArg {
                flag: "descriptor",
                ..
            })
        ));
        assert!(matches!(
            plan("--api rls --domain d --descriptor k={key} --batch 2"),
            Err(BenchError::InvalidArg { flag: "batch", .. })
        ));
        assert!(matches!(
            plan("--api rls --domain d --descriptor k={key} --cost 4294967296"),
            Err(BenchError::InvalidArg { flag: "cost", .. })
        ));
    }

    #[test]
    fn rule_and_descriptor_exclude_each_other_and_bad_values_fail() {
        assert!(
            Cli::try_parse_from([
                "bench",
                "--domain",
                "d",
                "--rule",
                "r",
                "--descriptor",
                "k={key}"
            ])
            .is_err()
        );
        assert!(
            Cli::try_parse_from(["bench", "--domain", "d", "--rule", "r", "--dist", "zipf:-2"])
                .is_err()
        );
        assert!(
            Cli::try_parse_from(["bench", "--rule", "r"]).is_err(),
            "domain is required"
        );
        for (line, flag) in [
            ("--domain d --rule r --batch 0", "batch"),
            ("--domain d --rule r --connections 0", "connections"),
            ("--domain d --rule r --rate 0", "rate"),
            ("--domain d --rule r --concurrency 0", "concurrency"),
            ("--domain d --rule r --keys 0", "keys"),
            ("--domain d --rule r --max-in-flight 0", "max-in-flight"),
        ] {
            match plan(line) {
                Err(BenchError::InvalidArg { flag: f, .. }) => assert_eq!(f, flag, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    #[test]
    fn keys_are_drawn_per_check_of_a_batch() {
        let p = plan("--domain d --rule r --keys 5 --batch 4").unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let keys = p.draw_keys(&mut rng);
        assert_eq!(keys.len(), 4);
        assert!(keys.iter().all(|k| k.parse::<u64>().unwrap() < 5));
    }
}
