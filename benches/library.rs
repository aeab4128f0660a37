//! The in-process library (`meridian::Limiter` on the embedded store): decisions
//! per second on one core, for one key and over 1 M keys, beside the `governor`
//! crate's keyed limiter in the same run.
//!
//! Run: `cargo bench --bench library`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::executor::block_on;
use meridian::store::MemoryStore;
use meridian::{KeyOverride, Limiter};

const MANY_KEYS: usize = 1_000_000;

const RULES: &str = r#"
domain: api
descriptors:
  - key: customer
    rate_limit:
      name: per_customer
      unit: second
      requests_per_unit: 1000000000
"#;

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
            black_box(block_on(limiter.check_rule(
                "api",
                "per_customer",
                "customer-1",
                1,
            )))
        })
    });
    group.bench_function("meridian/check_descriptor/one_key", |b| {
        b.iter(|| {
            black_box(block_on(limiter.check(
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
            black_box(block_on(limiter.check_rule(
                "api",
                "per_customer",
                &keys[i],
                1,
            )))
        })
    });

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
                b.iter(|| black_box(block_on(limiter.check_rule("api", "per_customer", key, 1))))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, library, overrides);
criterion_main!(benches);
