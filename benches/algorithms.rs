//! ns per decision of each algorithm in the embedded store, on one key and
//! spread over 1 M keys, beside the `governor` crate's GCRA on one key.
//!
//! Run: `cargo bench --bench algorithms`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use meridian::algorithm::{Algorithm, Params, leaky_bucket};
use meridian::store::{Limit, MemoryStore};

const MANY_KEYS: usize = 1_000_000;

fn limit(algorithm: Algorithm) -> Limit {
    // High enough that most checks are admitted at one check per simulated µs.
    let n = match algorithm {
        Algorithm::SlidingWindowLog => 100_000,
        _ => 1_000_000,
    };
    Limit {
        rule: "bench".into(),
        params: Params::new(algorithm, n, Duration::from_secs(1), None).expect("params"),
    }
}

fn algorithms(c: &mut Criterion) {
    let keys: Vec<String> = (0..MANY_KEYS).map(|i| format!("customer-{i}")).collect();
    let mut group = c.benchmark_group("memory_store");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for algorithm in Algorithm::ALL {
        let l = limit(algorithm);
        let store = MemoryStore::new();
        let mut now = 1_700_000_000_000_000u64;
        group.bench_function(format!("{algorithm}/one_key"), |b| {
            b.iter(|| {
                now += 1;
                black_box(store.check_at(&l, "customer-1", 1, now))
            })
        });
        let store = MemoryStore::new();
        let mut i = 0;
        group.bench_function(format!("{algorithm}/1M_keys"), |b| {
            b.iter(|| {
                i = (i + 1) % MANY_KEYS;
                now += 1;
                black_box(store.check_at(&l, &keys[i], 1, now))
            })
        });
    }
    // The bare state machine, without key building, hashing or locking.
    let params = limit(Algorithm::LeakyBucket).params;
    let mut state = leaky_bucket::State::default();
    let mut now = 1_700_000_000_000_000u64;
    group.bench_function("leaky_bucket/decide_only", |b| {
        b.iter(|| {
            now += 1;
            black_box(leaky_bucket::decide(&mut state, now, 1, &params))
        })
    });
    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000).expect("non-zero"));
    let governor = governor::RateLimiter::direct(quota);
    group.bench_function("governor_gcra/direct", |b| {
        b.iter(|| black_box(governor.check()))
    });
    // governor's keyed limiter is the like-for-like comparison: a map of keys.
    let keyed = governor::RateLimiter::keyed(quota);
    group.bench_function("governor_gcra/one_key", |b| {
        b.iter(|| black_box(keyed.check_key(&keys[1])))
    });
    let keyed = governor::RateLimiter::keyed(quota);
    let mut i = 0;
    group.bench_function("governor_gcra/1M_keys", |b| {
        b.iter(|| {
            i = (i + 1) % MANY_KEYS;
            black_box(keyed.check_key(&keys[i]))
        })
    });
    group.finish();
}

criterion_group!(benches, algorithms);
criterion_main!(benches);
