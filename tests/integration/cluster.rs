//! Every algorithm on a real 3-master Redis Cluster, keys spread over all masters.

use crate::common;

use std::time::Duration;

use common::RedisCluster;
use meridian::algorithm::{Algorithm, Params};
use meridian::store::{Limit, RedisConfig, RedisStore, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_enforces_its_limit_on_every_master() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&RedisConfig::new(cluster.url()))
        .await
        .expect("connect to cluster");
    for algorithm in Algorithm::ALL {
        let l = Limit {
            rule: format!("cl-{algorithm}"),
            params: Params::new(algorithm, 3, Duration::from_secs(60), None).expect("params"),
        };
        for k in 0..30 {
            let key = format!("customer-{k}");
            for hit in 1..=4 {
                let d = store
                    .check(&l, &key, 1, None)
                    .await
                    .expect("check on cluster");
                assert_eq!(d.allowed, hit <= 3, "{algorithm} {key} hit {hit}: {d:?}");
            }
        }
    }
    let per_node = cluster.keys_per_node();
    assert!(
        per_node.iter().all(|&n| n > 0),
        "keys not spread over all masters: {per_node:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_keys_stay_in_one_slot_and_apart() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&RedisConfig::new(cluster.url()))
        .await
        .expect("connect to cluster");
    // Brace-laden keys must neither break the hash tag (CROSSSLOT inside the
    // script) nor share state with each other.
    let crafted = ["a}{b", "{a}", "a", "}{", "{}", "a:b", "%7B"];
    for algorithm in Algorithm::ALL {
        for key in crafted {
            let l = Limit {
                rule: "inj".into(),
                params: Params::new(algorithm, 1, Duration::from_secs(60), None).expect("params"),
            };
            let d = store
                .check(&l, key, 1, None)
                .await
                .expect("check crafted key");
            assert!(
                d.allowed,
                "{algorithm} {key:?} shared state with another key"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocation_table_is_kept_compare_and_set_by_epoch_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&RedisConfig::new(cluster.url()))
        .await
        .expect("connect to cluster");
    crate::redis_store::the_allocation_table_is_kept_compare_and_set_by_epoch(&store).await;
}
