//! Six checks against each algorithm in the embedded store, one every 100 ms of
//! simulated time, limit 3 per second: "ok, N left" or "no, retry after T". With `REDIS_URL` set, the same checks
//! run against that Redis instead.
//!
//! Run: `cargo run --example quickstart` (or `REDIS_URL=redis://127.0.0.1:PORT …`)

use std::time::Duration;

use meridian::algorithm::{Algorithm, Params};
use meridian::store::{Limit, MemoryStore, RedisConfig, RedisStore, Store};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match std::env::var("REDIS_URL") {
        Ok(url) => run(&RedisStore::connect(&RedisConfig::new(url)).await?).await,
        Err(_) => run(&MemoryStore::new()).await,
    }
}

async fn run(store: &impl Store) -> anyhow::Result<()> {
    let start = 1_800_000_000_000_000; // a whole second, in µs
    for algorithm in Algorithm::ALL {
        let limit = Limit {
            rule: "quickstart".into(),
            params: Params::new(algorithm, 3, Duration::from_secs(1), None)?,
        };
        print!("{:<24}", algorithm.name());
        for i in 0..6 {
            let d = store
                .check(&limit, "customer-42", 1, Some(start + i * 100_000))
                .await?;
            if d.allowed {
                print!("  ok, {} left ", d.remaining);
            } else {
                print!("  no, {:>3} ms ", d.retry_after().as_millis());
            }
        }
        println!();
    }
    Ok(())
}
