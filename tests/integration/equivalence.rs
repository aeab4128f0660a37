//! The embedded store and the Redis scripts are two implementations of each
//! algorithm; random traffic must get the same decisions from both.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::RedisServer;
use meridian::algorithm::{Algorithm, Params};
use meridian::store::{Limit, MemoryStore, RedisConfig, RedisStore, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[derive(Debug, Clone)]
struct Op {
    key: u8,
    cost: u64,
    /// Decided under the case's second limit (a global allocation moved).
    other: bool,
    /// µs since the previous op; timestamps never go backwards.
    /// (A cost of 0 means a check-only peek.)
    advance: u64,
}

fn op(period_us: u64) -> impl Strategy<Value = Op> {
    let advance = prop_oneof![
        3 => Just(0u64),
        3 => 0..2_000u64,
        4 => 0..period_us,
        1 => period_us..3 * period_us,
    ];
    // Mostly small costs, sometimes more than any limit here allows; 0 is a peek.
    let cost = prop_oneof![8 => 1..4u64, 1 => 4..13u64, 1 => Just(40u64), 1 => Just(0u64)];
    (0..3u8, cost, advance, prop::bool::weighted(0.2)).prop_map(|(key, cost, advance, other)| Op {
        key,
        cost,
        other,
        advance,
    })
}

/// Params, a second limit of the same algorithm (used only by the
/// rescaling tests), the start time and the ops.
fn case(algorithm: Algorithm) -> impl Strategy<Value = (Params, Params, u64, Vec<Op>)> {
    let periods = prop_oneof![Just(1_000u64), Just(1_500), Just(10_000), Just(86_400_000)];
    (
        1..13i64,
        1..13i64,
        1..40i64,
        1..40i64,
        periods,
        0..100_000_000u64,
    )
        .prop_map(move |(limit, burst, limit2, burst2, ms, start)| {
            let params = |limit, burst| {
                let burst = algorithm.has_burst().then_some(burst);
                Params::new(algorithm, limit, Duration::from_millis(ms), burst)
                    .expect("generated params are valid")
            };
            (
                params(limit, burst),
                params(limit2, burst2),
                1_700_000_000_000_000 + start,
                ms * 1_000,
            )
        })
        .prop_flat_map(|(params, other, start, period_us)| {
            (
                Just(params),
                Just(other),
                Just(start),
                prop::collection::vec(op(period_us), 1..60),
            )
        })
}

fn run(algorithm: Algorithm) {
    run_with(algorithm, false);
}

/// `rescaling`: ops switch between the case's two limits, as a bucket's
/// does when its global allocation moves.
fn run_with(algorithm: Algorithm, rescaling: bool) {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let redis = rt
        .block_on(RedisStore::connect(&RedisConfig::new(server.url())))
        .expect("connect");
    let memory = MemoryStore::new();
    let cases = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    runner
        .run(&case(algorithm), |(params, other, start, ops)| {
            // A fresh rule per case, so earlier cases' state cannot leak in.
            let rule = format!("eq{}", cases.fetch_add(1, Ordering::Relaxed));
            let limits = [
                Limit {
                    rule: rule.clone(),
                    params,
                },
                Limit {
                    rule,
                    params: other,
                },
            ];
            let mut now = start;
            // Redis expires keys in real time, the memory store in the
            // ops' time: compared only while neither may drop the state
            // (one key, each step shorter than the least a state is kept,
            // every check reaching the state — a cost above a burst is
            // denied before it), since a converted bucket drains at the
            // lower of two rates and outlives the expiry its old limit set.
            let floor = limits[0].params.ttl_floor_us();
            let most = limits[0].params.capacity().min(limits[1].params.capacity());
            for (i, op) in ops.iter().enumerate() {
                let (key, advance, cost) = if rescaling {
                    (0, op.advance % floor, op.cost.min(most))
                } else {
                    (op.key, op.advance, op.cost)
                };
                now += advance;
                let limit = &limits[usize::from(rescaling && op.other)];
                let key = format!("k{key}");
                let (from_memory, from_redis) = rt.block_on(async {
                    if cost == 0 {
                        (
                            memory.peek(limit, &key, Some(now)).await,
                            redis.peek(limit, &key, Some(now)).await,
                        )
                    } else {
                        (
                            memory.check(limit, &key, cost, Some(now)).await,
                            redis.check(limit, &key, cost, Some(now)).await,
                        )
                    }
                });
                let (m, r) = (from_memory.expect("memory"), from_redis.expect("redis"));
                prop_assert_eq!(&m, &r, "op {} {:?} at {}", i, op, now);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{algorithm}: memory and redis disagree: {e}"));
}

#[test]
fn fixed_window_matches() {
    run(Algorithm::FixedWindow);
}

#[test]
fn sliding_window_log_matches() {
    run(Algorithm::SlidingWindowLog);
}

#[test]
fn sliding_window_counter_matches() {
    run(Algorithm::SlidingWindowCounter);
}

#[test]
fn token_bucket_matches() {
    run(Algorithm::TokenBucket);
}

#[test]
fn leaky_bucket_matches() {
    run(Algorithm::LeakyBucket);
}

/// A bucket whose limit changes (its global allocation moved) is rescaled
/// the same way by the memory store and the Redis scripts (issue 29: the
/// memory store read the old scale's level in the new one).
#[test]
fn token_bucket_matches_when_its_limit_changes() {
    run_with(Algorithm::TokenBucket, true);
}

#[test]
fn leaky_bucket_matches_when_its_limit_changes() {
    run_with(Algorithm::LeakyBucket, true);
}
