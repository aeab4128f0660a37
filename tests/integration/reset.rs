//! Resetting a key (`Limiter::reset`, what `meridian ctl reset` runs in each
//! region): for every algorithm, on a real Redis, a real 3-master Cluster
//! and the embedded store, a key at its limit is admitted a full limit's
//! worth again afterwards, another key keeps its count, and the store holds
//! nothing of the reset key. Also split sub-counters, the approximate path's
//! unflushed hits, every limit of a `limits:` rule, the store's own clear
//! (every window it names), and a reset naming the wrong rule.

use crate::common;

use std::time::Duration;

use common::{RedisCluster, RedisServer};
use meridian::algorithm::{Algorithm, Params};
use meridian::store::{Counters, Limit, MemoryStore, RedisConfig, RedisStore, Store};
use meridian::{Cleared, Limiter, ResetError};

const HOUR: Duration = Duration::from_secs(3600);
const HOUR_US: u64 = 3_600_000_000;
/// One second into an hour window (1.8e15 µs is a whole number of hours).
const NOW: u64 = 1_800_000_000_000_000 + 1_000_000;

/// Domain `domain`, one rule `per_customer` on `customer`: `limit` an hour,
/// with `options` (indented rule fields) added.
fn one_rule(domain: &str, options: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: customer\n{options}    rate_limit:\n      \
         name: per_customer\n      unit: hour\n      requests_per_unit: {limit}\n"
    )
}

async fn redis_limiter(url: &str, yaml: &str) -> Limiter {
    let mut config = RedisConfig::new(url);
    // The test box's cores are shared with builds: no check should miss a
    // deadline and fall to its fail mode here.
    config.deadline = Duration::from_secs(2);
    let store = RedisStore::connect(&config).await.expect("connect");
    Limiter::from_yaml(yaml, store).expect("rules")
}

/// How many of `checks` single-hit checks of customer `customer` are admitted.
async fn admitted(limiter: &Limiter, domain: &str, customer: &str, checks: u32) -> u32 {
    let mut n = 0;
    for _ in 0..checks {
        let verdict = limiter
            .check(domain, &[("customer", customer)], 1)
            .await
            .expect("a valid check")
            .expect("a rule matches");
        n += u32::from(verdict.decision.allowed);
    }
    n
}

/// Resets customer `customer` of `domain` and answers what was cleared of
/// the one rule it matches.
async fn reset(limiter: &Limiter, domain: &str, customer: &str) -> Cleared {
    let outcome = limiter
        .reset(domain, &[("customer", customer)], None)
        .await
        .expect("reset");
    assert_eq!(outcome.rules.len(), 1, "{domain}: {outcome:?}");
    let reset = &outcome.rules[0];
    assert_eq!(reset.rule.name.as_deref(), Some("per_customer"));
    assert_eq!(reset.counter_key, format!("customer={customer}"));
    reset.cleared.clone()
}

/// The counter keys (flush ids left out) of `customer` under `domain`'s
/// rule, on every node given.
fn stored_keys(nodes: &[String], domain: &str, customer: &str) -> Vec<String> {
    let pattern = format!("mr:{{{domain}|*customer={customer}[}}#]*");
    let mut keys = Vec::new();
    for url in nodes {
        let mut conn = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .expect("connect to a test redis");
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query(&mut conn)
            .expect("KEYS");
        keys.extend(found.into_iter().filter(|k| !k.contains(":f:")));
    }
    keys
}

/// The algorithm's rule at 3 an hour: 42 is filled to its limit (on Redis
/// the fourth check's denial is cached; the embedded store keeps no
/// over-limit cache), 7 used twice; after 42's reset it is
/// admitted 3 again and 7 once. `nodes` are the Redis nodes to look in
/// (none for the embedded store); `keys` the stored keys the reset deletes.
async fn reset_frees_the_key_and_only_it(
    limiter: &Limiter,
    domain: &str,
    nodes: &[String],
    keys: u64,
) {
    assert_eq!(admitted(limiter, domain, "42", 5).await, 3, "{domain}: 42");
    assert_eq!(admitted(limiter, domain, "7", 2).await, 2, "{domain}: 7");
    if !nodes.is_empty() {
        assert!(!stored_keys(nodes, domain, "42").is_empty(), "{domain}");
    }
    let cleared = reset(limiter, domain, "42").await;
    assert_eq!(cleared.store_keys, keys, "{domain}: {cleared:?}");
    let cached = usize::from(!nodes.is_empty());
    assert_eq!(cleared.cached_denials, cached, "{domain}: {cleared:?}");
    assert_eq!(cleared.pending_hits, 0, "{domain}: {cleared:?}");
    assert_eq!(stored_keys(nodes, domain, "42"), Vec::<String>::new());
    assert_eq!(
        admitted(limiter, domain, "42", 5).await,
        3,
        "{domain}: 42 after its reset"
    );
    assert_eq!(
        admitted(limiter, domain, "7", 3).await,
        1,
        "{domain}: 7 kept its count"
    );
}

/// Redis keys one counter of `algorithm` holds: a sliding log's set and
/// its sequence, one window or one bucket for the others.
fn redis_keys_of(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::SlidingWindowLog => 2,
        _ => 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_frees_a_reset_key_on_redis() {
    common::clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let domain = algorithm.to_string();
        let yaml = one_rule(&domain, &format!("    algorithm: {algorithm}\n"), 3);
        let limiter = redis_limiter(&redis.url(), &yaml).await;
        let keys = redis_keys_of(algorithm);
        reset_frees_the_key_and_only_it(&limiter, &domain, &[redis.url()], keys).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_frees_a_reset_key_in_memory() {
    common::clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;
    for algorithm in Algorithm::ALL {
        let domain = algorithm.to_string();
        let yaml = one_rule(&domain, &format!("    algorithm: {algorithm}\n"), 3);
        let limiter = Limiter::from_yaml(&yaml, MemoryStore::new()).expect("rules");
        reset_frees_the_key_and_only_it(&limiter, &domain, &[], 1).await;
    }
}

/// `split: 4` at 8 an hour: 42's four sub-counters are full (8 admitted of
/// 200 asked), 7 used 3 times; the reset clears all four, and 42 is
/// admitted 8 again, 7 five more.
async fn a_split_key_is_freed_in_every_sub_counter(
    limiter: &Limiter,
    domain: &str,
    nodes: &[String],
) {
    assert_eq!(admitted(limiter, domain, "42", 200).await, 8, "{domain}");
    assert_eq!(admitted(limiter, domain, "7", 3).await, 3, "{domain}");
    if !nodes.is_empty() {
        assert_eq!(stored_keys(nodes, domain, "42").len(), 4, "{domain}");
    }
    let cleared = reset(limiter, domain, "42").await;
    assert_eq!(cleared.store_keys, 4, "{domain}: {cleared:?}");
    assert_eq!(stored_keys(nodes, domain, "42"), Vec::<String>::new());
    assert_eq!(admitted(limiter, domain, "42", 200).await, 8, "{domain}");
    assert_eq!(admitted(limiter, domain, "7", 200).await, 5, "{domain}");
}

const SPLIT: &str = "    split: 4\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_key_is_freed_on_redis_and_in_memory() {
    common::clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let yaml = one_rule("split", SPLIT, 8);
    let limiter = redis_limiter(&redis.url(), &yaml).await;
    a_split_key_is_freed_in_every_sub_counter(&limiter, "split", &[redis.url()]).await;
    let limiter = Limiter::from_yaml(&yaml, MemoryStore::new()).expect("rules");
    a_split_key_is_freed_in_every_sub_counter(&limiter, "split", &[]).await;
}

/// Every algorithm, and a split key whose sub-counters live in other slots
/// (and on other masters), on a 3-master Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_and_a_split_key_are_freed_on_a_cluster() {
    common::clear_of_window_boundary(HOUR, Duration::from_secs(120)).await;
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.nodes.iter().map(RedisServer::url).collect();
    for algorithm in Algorithm::ALL {
        let domain = algorithm.to_string();
        let yaml = one_rule(&domain, &format!("    algorithm: {algorithm}\n"), 3);
        let limiter = redis_limiter(&cluster.url(), &yaml).await;
        let keys = redis_keys_of(algorithm);
        reset_frees_the_key_and_only_it(&limiter, &domain, &nodes, keys).await;
    }
    let limiter = redis_limiter(&cluster.url(), &one_rule("split", SPLIT, 8)).await;
    a_split_key_is_freed_in_every_sub_counter(&limiter, "split", &nodes).await;
}

/// The approximate path at 10 an hour, flushed only when the test says
/// (a sync interval of an hour, batches of 1,000): 6 hits flushed, 4 more
/// admitted and pending, 7's 3 pending. The reset deletes the flushed
/// count and drops the 4 pending hits, so a flush afterwards does not bring
/// them back; 42 is then admitted 10 again, 7 seven more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approximate_key_loses_its_flushed_and_unflushed_hits() {
    common::clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let nodes = [redis.url()];
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
    ] {
        let domain = format!("approximate_{algorithm}");
        let options = format!(
            "    algorithm: {algorithm}\n    accuracy: approximate\n    sync_interval: 1h\n    \
             max_batch: 1000\n"
        );
        let limiter = redis_limiter(&redis.url(), &one_rule(&domain, &options, 10)).await;
        assert_eq!(admitted(&limiter, &domain, "42", 6).await, 6, "{domain}");
        limiter.flush().await.expect("flush");
        assert_eq!(stored_keys(&nodes, &domain, "42").len(), 1, "{domain}");
        assert_eq!(admitted(&limiter, &domain, "42", 6).await, 4, "{domain}");
        assert_eq!(admitted(&limiter, &domain, "7", 3).await, 3, "{domain}");

        let cleared = reset(&limiter, &domain, "42").await;
        limiter.flush().await.expect("flush");
        assert_eq!(
            stored_keys(&nodes, &domain, "42"),
            Vec::<String>::new(),
            "{domain}: a flush after the reset brought old hits back"
        );
        assert_eq!(cleared.store_keys, 1, "{domain}: {cleared:?}");
        assert_eq!(cleared.pending_hits, 4, "{domain}: {cleared:?}");
        assert_eq!(stored_keys(&nodes, &domain, "7").len(), 1, "{domain}");
        assert_eq!(admitted(&limiter, &domain, "42", 12).await, 10, "{domain}");
        assert_eq!(admitted(&limiter, &domain, "7", 10).await, 7, "{domain}");
    }
}

/// A burst of 3 (token bucket) and 5 a day (sliding log) on one key: 42 is
/// held by the burst, 7 used twice. The reset clears both limits (the
/// bucket, and the log's set and sequence under the second limit's
/// prefix): 42 gets its burst back, 7 keeps what it used of both.
const LIMITS: &str = "domain: limits\ndescriptors:\n  - key: customer\n    limits:\n      \
     - {algorithm: token_bucket, burst: 3, rate_limit: {unit: hour, requests_per_unit: 3, name: per_customer}}\n      \
     - {algorithm: sliding_window_log, rate_limit: {unit: day, requests_per_unit: 5}}\n";

async fn every_limit_of_a_limits_rule_is_freed(limiter: &Limiter, nodes: &[String], keys: u64) {
    assert_eq!(admitted(limiter, "limits", "42", 5).await, 3);
    assert_eq!(admitted(limiter, "limits", "7", 2).await, 2);
    let cleared = reset(limiter, "limits", "42").await;
    assert_eq!(cleared.store_keys, keys, "{cleared:?}");
    assert_eq!(stored_keys(nodes, "limits", "42"), Vec::<String>::new());
    assert_eq!(admitted(limiter, "limits", "42", 5).await, 3);
    assert_eq!(admitted(limiter, "limits", "7", 5).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_of_a_limits_rule_is_freed_on_redis_and_in_memory() {
    let redis = RedisServer::start();
    let limiter = redis_limiter(&redis.url(), LIMITS).await;
    every_limit_of_a_limits_rule_is_freed(&limiter, &[redis.url()], 3).await;
    let limiter = Limiter::from_yaml(LIMITS, MemoryStore::new()).expect("rules");
    every_limit_of_a_limits_rule_is_freed(&limiter, &[], 2).await;
}

/// With a rule name, the descriptor must match that rule: a reset of
/// something else, or of a name no rule has, clears nothing and says why;
/// a descriptor no rule matches clears nothing and is no error.
#[tokio::test]
async fn a_reset_naming_a_rule_the_descriptor_does_not_match_is_refused() {
    let yaml = "domain: api\ndescriptors:\n  - key: customer\n    rate_limit: {name: per_customer, \
                unit: hour, requests_per_unit: 1}\n  - key: ip\n    rate_limit: {name: per_ip, \
                unit: hour, requests_per_unit: 1}\n";
    let limiter = Limiter::from_yaml(yaml, MemoryStore::new()).expect("rules");
    assert_eq!(admitted(&limiter, "api", "42", 2).await, 1);
    let refused = |r: Result<_, ResetError>| match r {
        Err(ResetError::Invalid(e)) => (e.field, e.reason),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let (field, reason) = refused(
        limiter
            .reset("api", &[("customer", "42")], Some("per_ip"))
            .await,
    );
    assert_eq!(field, "rule");
    assert!(reason.contains("api|customer"), "{reason}");
    let (field, reason) = refused(
        limiter
            .reset("api", &[("customer", "42")], Some("per_nobody"))
            .await,
    );
    assert_eq!(field, "rule");
    assert!(reason.contains("no rule"), "{reason}");
    // Refused resets cleared nothing; the named one does.
    assert_eq!(admitted(&limiter, "api", "42", 1).await, 0);
    let outcome = limiter
        .reset("api", &[("customer", "42")], Some("per_customer"))
        .await
        .expect("reset");
    assert_eq!(outcome.rules.len(), 1);
    assert_eq!(admitted(&limiter, "api", "42", 1).await, 1);
    let nothing = limiter
        .reset("api", &[("path", "/")], None)
        .await
        .expect("no match is no error");
    assert!(nothing.rules.is_empty());
}

/// The stores' own clear, on a clock of the test's: every algorithm's keys
/// (a windowed counter's previous window too, which a sliding counter
/// still reads), a second limit's under its own prefix, and nothing of
/// another key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stores_clear_deletes_every_window_and_limit_of_the_key_only() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&RedisConfig::new(redis.url()))
        .await
        .expect("connect");
    let memory = MemoryStore::new();
    let mut conn = redis.connection();
    let limit = |rule: &str, algorithm| Limit {
        rule: rule.into(),
        params: Params::new(algorithm, 5, HOUR, None).expect("params"),
    };
    let keys = ["k".to_owned()];
    for algorithm in Algorithm::ALL {
        let rule = algorithm.to_string();
        let l = limit(&rule, algorithm);
        for either in [&store as &dyn Check, &memory] {
            either.hit(&l, "k", NOW - HOUR_US).await;
            either.hit(&l, "k", NOW).await;
            either.hit(&l, "other", NOW).await;
        }
        let counters = Counters {
            rule: &rule,
            keys: &keys,
            limits: 1,
            periods: &[HOUR_US],
        };
        // Two windows, a log's set and sequence, or one bucket.
        let expected = match algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => 1,
            _ => 2,
        };
        let cleared = store.clear(&counters, Some(NOW)).await.expect("clear");
        assert_eq!(cleared, expected, "{algorithm}");
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("mr:{{{rule}:*"))
            .query(&mut conn)
            .expect("KEYS");
        assert!(
            left.iter()
                .all(|k| k.starts_with(&format!("mr:{{{rule}:other}}")))
        );
        assert!(!left.is_empty(), "{algorithm}: the other key went too");
        // The embedded store keeps one entry a key, whatever the window.
        let cleared = memory.clear(&counters, Some(NOW)).await.expect("clear");
        assert_eq!(cleared, 1, "{algorithm}");
        let d = memory
            .check(&l, "other", 1, Some(NOW))
            .await
            .expect("check");
        assert_eq!(d.remaining, 3, "{algorithm}: the other key kept its count");
    }
    // Two limits: the second's keys under `<prefix>:1`.
    let limits = [
        limit("multi", Algorithm::FixedWindow),
        limit("multi", Algorithm::SlidingWindowLog),
    ];
    store
        .check_all(&limits, "k", 1, Some(NOW))
        .await
        .expect("check");
    memory.check_all_at(&limits, "k", 1, NOW).expect("check");
    let counters = Counters {
        rule: "multi",
        keys: &keys,
        limits: 2,
        periods: &[HOUR_US],
    };
    assert_eq!(store.clear(&counters, Some(NOW)).await.expect("clear"), 3);
    assert_eq!(memory.clear(&counters, Some(NOW)).await.expect("clear"), 2);
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    let others: Vec<String> = redis::cmd("KEYS")
        .arg("mr:*other*")
        .query(&mut conn)
        .expect("KEYS");
    assert_eq!(dbsize as usize, others.len(), "keys of k are left");
}

/// One hit on either store, for a loop over both.
trait Check {
    fn hit<'a>(
        &'a self,
        limit: &'a Limit,
        key: &'a str,
        now: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
}

impl<S: Store> Check for S {
    fn hit<'a>(
        &'a self,
        limit: &'a Limit,
        key: &'a str,
        now: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>> {
        Box::pin(async move {
            let d = self.check(limit, key, 1, Some(now)).await.expect("check");
            assert!(d.allowed, "{key} at {now}: {d:?}");
        })
    }
}
