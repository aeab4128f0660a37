//! The in-process library (`meridian::Limiter` on the embedded store): ns per
//! decision through the service's path (`check_rule`, `check`) and through a
//! rule handle (`Limiter::rule`), on one key, over 1 M keys and on two
//! threads, beside the `governor` crate's keyed limiter in the same run.
//!
//! Run: `cargo bench --bench library`
//!
//! The two-thread benchmarks report wall time per decision over both threads
//! (each thread checks its own half of the 1 M keys): perfect scaling halves
//! the one-thread figure over 1 M keys.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures::FutureExt;
use meridian::store::MemoryStore;
use meridian::{KeyOverride, Limiter};

const MANY_KEYS: usize = 1_000_000;
const THREADS: usize = 2;

/// Limits no benchmark reaches. The fixed window is an hour long so that a
/// key's state outlives the walk through 1 M keys (a window of a second
/// expired each key between two visits, and the store then dropped and
/// re-inserted it: churn, not decisions). A GCRA key's state is empty, and
/// kept its 1 s floor only, a few µs after each admitted hit at any rate
/// this high: its 1 M-key figure includes that churn.
const RULES: &str = r#"
domain: api
descriptors:
  - key: customer
    rate_limit:
      name: per_customer
      unit: hour
      requests_per_unit: 1000000000000
  - key: gcra
    algorithm: leaky_bucket
    rate_limit:
      name: per_customer_gcra
      unit: second
      requests_per_unit: 1000000000
"#;

/// Drives a check that the embedded store decides at its first poll, as an
/// `.await` in a gateway's async handler would: no executor, no parking.
fn ready<F: Future>(check: F) -> F::Output {
    check
        .now_or_never()
        .expect("the embedded store never waits")
}

/// Wall time for `iters` decisions on each of [`THREADS`] threads, per
/// decision: `decide(thread, i)` makes the i-th decision of a thread.
fn on_threads<T>(iters: u64, decide: impl Fn(usize, u64) -> T + Sync) -> Duration {
    let start = Barrier::new(THREADS + 1);
    // The scope ends once every thread has finished: `began` to then is the run.
    let began = std::thread::scope(|s| {
        for t in 0..THREADS {
            let (start, decide) = (&start, &decide);
            s.spawn(move || {
                start.wait();
                for i in 0..iters {
                    black_box(decide(t, i));
                }
            });
        }
        start.wait();
        Instant::now()
    });
    began.elapsed() / THREADS as u32
}

/// The key the i-th decision of thread `t` checks: each thread walks its own
/// half of the keys.
fn key_of(keys: &[String], t: usize, i: u64) -> &str {
    let half = keys.len() / THREADS;
    &keys[t * half + (i as usize % half)]
}

fn library(c: &mut Criterion) {
    let keys: Vec<String> = (0..MANY_KEYS).map(|i| format!("customer-{i}")).collect();
    let mut group = c.benchmark_group("library");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    // The embedded store never awaits, so a trivial executor is enough.
    let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).expect("rules");
    group.bench_function("meridian/check_rule/one_key", |b| {
        b.iter(|| {
            black_box(ready(limiter.check_rule(
                "api",
                "per_customer",
                "customer-1",
                1,
            )))
        })
    });
    group.bench_function("meridian/check_descriptor/one_key", |b| {
        b.iter(|| {
            black_box(ready(limiter.check(
                "api",
                &[("customer", "customer-1")],
                1,
            )))
        })
    });
    let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).expect("rules");
    let mut i = 0;
    group.bench_function("meridian/check_rule/1M_keys", |b| {
        b.iter(|| {
            i = (i + 1) % MANY_KEYS;
            black_box(ready(limiter.check_rule(
                "api",
                "per_customer",
                &keys[i],
                1,
            )))
        })
    });

    // Rule handles: resolved once, then no matching, no allocation.
    for (label, rule) in [
        ("fixed_window", "per_customer"),
        ("leaky_bucket", "per_customer_gcra"),
    ] {
        let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).expect("rules");
        let handle = limiter.rule("api", rule).expect("rule");
        group.bench_function(format!("meridian/handle/{label}/one_key"), |b| {
            b.iter(|| black_box(ready(handle.check("customer-1", 1))))
        });
        // `try_check`: the same decision with no future, as governor's
        // `check_key` is called.
        group.bench_function(format!("meridian/handle/{label}/one_key_sync"), |b| {
            b.iter(|| black_box(handle.try_check("customer-1", 1)))
        });
        let mut i = 0;
        group.bench_function(format!("meridian/handle/{label}/1M_keys"), |b| {
            b.iter(|| {
                i = (i + 1) % MANY_KEYS;
                black_box(ready(handle.check(&keys[i], 1)))
            })
        });
        let mut i = 0;
        group.bench_function(format!("meridian/handle/{label}/1M_keys_sync"), |b| {
            b.iter(|| {
                i = (i + 1) % MANY_KEYS;
                black_box(handle.try_check(&keys[i], 1))
            })
        });
        group.bench_function(
            format!("meridian/handle/{label}/1M_keys_{THREADS}_threads"),
            |b| {
                b.iter_custom(|iters| {
                    on_threads(iters, |t, i| ready(handle.check(key_of(&keys, t, i), 1)))
                })
            },
        );
    }

    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"));
    let keyed = governor::RateLimiter::keyed(quota);
    group.bench_function("governor/keyed/one_key", |b| {
        b.iter(|| black_box(keyed.check_key(&"customer-1")))
    });
    let keyed = governor::RateLimiter::keyed(quota);
    let mut i = 0;
    group.bench_function("governor/keyed/1M_keys", |b| {
        b.iter(|| {
            i = (i + 1) % MANY_KEYS;
            black_box(keyed.check_key(&keys[i].as_str()))
        })
    });
    // Keys a gateway draws from requests do not outlive them, so a limiter
    // embedded there owns a copy of each: governor keyed on `String`s (its
    // map's entry 32 bytes, the key's bytes in an allocation of their own)
    // is the like-for-like figure; the `&str` rows above borrow the bench's
    // own keys for the limiter's whole life.
    let owned = governor::RateLimiter::<String, _, _>::keyed(quota);
    let mut i = 0;
    group.bench_function("governor/keyed_owned_keys/1M_keys", |b| {
        b.iter(|| {
            i = (i + 1) % MANY_KEYS;
            black_box(owned.check_key(&keys[i]))
        })
    });
    drop(owned);
    let keyed = governor::RateLimiter::keyed(quota);
    group.bench_function(format!("governor/keyed/1M_keys_{THREADS}_threads"), |b| {
        b.iter_custom(|iters| on_threads(iters, |t, i| keyed.check_key(&key_of(&keys, t, i))))
    });
    group.finish();
}

/// The cost of per-key overrides on the hot path: the same checks with
/// none held and with 100,000 held (each key overridden or not), in one run.
/// It must not grow with their number (two hash lookups).
fn overrides(c: &mut Criterion) {
    const HELD: usize = 100_000;
    let mut group = c.benchmark_group("overrides");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let names: Vec<String> = (0..HELD).map(|i| format!("customer-{i}")).collect();
    for held in [0, HELD] {
        let limiter = Limiter::from_yaml(RULES, MemoryStore::new()).expect("rules");
        let list: Vec<KeyOverride<'_>> = names[..held]
            .iter()
            .map(|key| KeyOverride {
                domain: "api",
                descriptor: &[],
                rule: Some("per_customer"),
                key: Some(key),
                limit: 2_000_000_000,
                burst: None,
            })
            .collect();
        limiter.set_overrides(&list).expect("overrides");
        for (label, key) in [
            ("plain_key", "someone-else"),
            ("overridden_key", "customer-7"),
        ] {
            group.bench_function(format!("{held}_held/{label}"), |b| {
                b.iter(|| black_box(ready(limiter.check_rule("api", "per_customer", key, 1))))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, library, overrides);
criterion_main!(benches);
