//! The Redis store: one atomic Lua script per check on the node that owns the
//! key, standalone or Cluster.
//!
//! Connections: standalone uses a `ConnectionManager` (one multiplexed
//! connection that reconnects by itself); Cluster uses the cluster client,
//! which keeps one multiplexed connection per node and follows MOVED/ASK;
//! Sentinel keeps one multiplexed connection to the master the sentinels
//! name and asks them again when it is lost or demoted (`sentinel`).
//! Scripts go out as EVALSHA; on NOSCRIPT (a restarted or failed-over Redis)
//! the script is loaded and the call retried once. Checks that arrive
//! together share one script call (`coalesce`). A server running one event
//! loop per thread gives each thread its own connection (`lanes`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisError, Script};
use tokio::sync::oneshot;

mod clear;
mod coalesce;
mod flush;
mod lanes;
mod reserve;
mod saved_table;
mod sentinel;

pub(crate) use flush::{Delta, Flushed, Global, slot};
pub use saved_table::StoredTable;
// Only the server's worker threads bind a lane.
#[cfg(feature = "server")]
pub(crate) use lanes::bind_thread;

use super::{Counters, Limit, Store, StoreError, key};
use crate::algorithm::{Algorithm, Decision, DenyReason, Micros, precheck};

/// The Lua source of each algorithm, prelude and epilogue included (see
/// `scripts/prelude.lua`).
pub(crate) fn script_source(algorithm: Algorithm) -> &'static str {
    macro_rules! with_prelude {
        ($file:literal) => {
            concat!(
                include_str!("scripts/prelude.lua"),
                include_str!($file),
                include_str!("scripts/epilogue.lua")
            )
        };
    }
    match algorithm {
        Algorithm::FixedWindow => with_prelude!("scripts/fixed_window.lua"),
        Algorithm::SlidingWindowLog => with_prelude!("scripts/sliding_log.lua"),
        Algorithm::SlidingWindowCounter => with_prelude!("scripts/sliding_counter.lua"),
        Algorithm::TokenBucket => concat!(
            include_str!("scripts/bucket_rescale.lua"),
            with_prelude!("scripts/token_bucket.lua")
        ),
        Algorithm::LeakyBucket => concat!(
            include_str!("scripts/bucket_rescale.lua"),
            with_prelude!("scripts/leaky_bucket.lua")
        ),
    }
}

/// The multi-limit script (`scripts/multi.lua`): [`multi_library`], then
/// its `check_all()`. Built once.
pub(crate) fn multi_source() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| format!("{}return (check_all())\n", multi_library()))
}

/// The prelude, every algorithm's body as its own `decide_<index>`, then
/// multi.lua's functions: what the multi, reserve and settle scripts share.
pub(crate) fn multi_library() -> &'static str {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(|| {
        const HEADER: &str = "local function decide(prefix, cost)\n";
        let prelude = include_str!("scripts/prelude.lua");
        let prelude = prelude.strip_suffix(HEADER).unwrap_or(prelude);
        let bodies = [
            include_str!("scripts/fixed_window.lua"),
            include_str!("scripts/sliding_log.lua"),
            include_str!("scripts/sliding_counter.lua"),
            include_str!("scripts/token_bucket.lua"),
            include_str!("scripts/leaky_bucket.lua"),
        ];
        let mut out = String::from(include_str!("scripts/bucket_rescale.lua"));
        out.push_str(prelude);
        for (algorithm, body) in Algorithm::ALL.iter().zip(bodies) {
            out.push_str(&format!(
                "local function decide_{}(prefix, cost)\n{body}\nend\n",
                *algorithm as usize
            ));
        }
        out.push_str(include_str!("scripts/multi.lua"));
        out
    })
}

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host:port[/db]` (`rediss://` for TLS) for one server.
    /// Several URLs, or one `redis+cluster://host:port[,host:port…]`
    /// (`rediss+cluster://` for TLS), mean a Redis Cluster (seed nodes).
    /// `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER[/db]`
    /// (`rediss+sentinel://` for TLS) means the master the sentinels name
    /// (port 26379 when none is given); after a failover the store follows
    /// the new master. The credentials authenticate to the master and to the
    /// sentinels.
    pub urls: Vec<String>,
    /// Longest a single check may take before it fails with `Timeout` (and the
    /// rule's fail mode decides). Checks take well under a millisecond normally.
    pub deadline: Duration,
    /// Longest connecting (and each reconnect attempt) may take.
    pub connect_timeout: Duration,
    /// PEM CA certificate(s) to verify `rediss://` servers with, instead of the
    /// system's trust store (private CAs are the norm for Redis).
    pub ca_cert: Option<Vec<u8>>,
    /// Threads that may each open their own connection ([`RedisStore::open_lane`]).
    pub lanes: usize,
}

impl RedisConfig {
    /// A config for one server or Cluster URL, with a 100 ms check deadline, a 2 s
    /// connect timeout, the system's trust store and no per-thread lanes.
    pub fn new(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            urls: vec![url.into()],
            deadline: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(2),
            ca_cert: None,
            lanes: 0,
        }
    }
}

/// Clones share the connection(s): the approximate path's flusher holds one.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    /// One per algorithm, indexed by `Algorithm as usize`; each knows its SHA1.
    scripts: [Script; 5],
    /// The approximate path's flush (`scripts/approximate_flush.lua`).
    flush: Script,
    /// Several limits of one descriptor in one call (`scripts/multi.lua`).
    multi: Script,
    /// An operator's reset of counters (`scripts/clear.lua`): rare, so not
    /// preloaded; its first call loads it on NOSCRIPT.
    clear: Script,
    /// Reservations (`scripts/reserve.lua`, `settle.lua`,
    /// `outstanding.lua`): loaded on first use (NOSCRIPT).
    reservations: Arc<reserve::Scripts>,
    deadline: Duration,
    /// Where checks queue to share script calls; `None` in the coalescing
    /// task's own copy, which sends them.
    coalescer: Option<Arc<coalesce::Coalescer>>,
    /// Per-thread connections; `None` in a lane's own store.
    lanes: Option<Arc<lanes::Lanes>>,
    /// Set while a Cluster repair call is out (see [`RedisStore::repair`]);
    /// one per connection, so lanes have their own.
    repairing: Arc<AtomicBool>,
    /// How long a repair call may take (the connect timeout).
    repair_timeout: Duration,
}

/// Clones are cheap handles onto the same multiplexed connection(s).
#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterHandle),
    Sentinel(sentinel::SentinelConnection),
}

/// A Cluster connection that `repair` may replace with a fresh one.
#[derive(Clone)]
struct ClusterHandle {
    /// Makes the replacement: discovery from the seed nodes again.
    client: Arc<ClusterClient>,
    /// std's lock: held only to clone or swap the handle, never across an await.
    current: Arc<std::sync::RwLock<ClusterConnection>>,
}

impl ClusterHandle {
    fn connection(&self) -> ClusterConnection {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl RedisStore {
    /// Connects — giving up after twice `connect_timeout`, as Cluster discovery
    /// can hang on an unreachable seed — and preloads the scripts.
    pub async fn connect(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        // rediss:// needs a rustls crypto provider; the first store installs ring's
        // (an error only means one is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut store = RedisStore {
            connection: open(config).await?,
            scripts: Algorithm::ALL.map(|a| Script::new(script_source(a))),
            flush: flush::flush_script(),
            multi: Script::new(multi_source()),
            clear: clear::clear_script(),
            reservations: Arc::new(reserve::Scripts::new()),
            deadline: config.deadline,
            coalescer: None,
            lanes: (config.lanes > 0).then(|| Arc::new(lanes::Lanes::new(config))),
            repairing: Arc::new(AtomicBool::new(false)),
            repair_timeout: config.connect_timeout,
        };
        store.preload(config.connect_timeout).await;
        store.coalescer = Some(Arc::new(coalesce::Coalescer::start(store.clone())));
        Ok(store)
    }

    /// Loads every script now, so the first checks do not each pay a NOSCRIPT
    /// and a SCRIPT LOAD within their deadline. Best effort: a script missing
    /// later (a restart, a failover) is still loaded on NOSCRIPT. On a Cluster
    /// SCRIPT LOAD reaches one node only, so there it is left to NOSCRIPT.
    async fn preload(&self, within: Duration) {
        let loading = async {
            let reservations = self.reservations.all();
            for script in self
                .scripts
                .iter()
                .chain([&self.flush, &self.multi])
                .chain(reservations)
            {
                match self.connection.clone() {
                    Connection::Standalone(mut c) => script.load_async(&mut c).await?,
                    Connection::Sentinel(mut c) => script.load_async(&mut c).await?,
                    Connection::Cluster(_) => return Ok(()),
                };
            }
            Ok::<(), RedisError>(())
        };
        match tokio::time::timeout(within, loading).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not preload scripts; they load on first use")
            }
            Err(_) => tracing::warn!("preloading scripts timed out; they load on first use"),
        }
    }

    /// PING within the deadline.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        let call = async {
            match self.connection.clone() {
                Connection::Standalone(mut c) => ping.query_async::<String>(&mut c).await,
                Connection::Cluster(c) => ping.query_async::<String>(&mut c.connection()).await,
                Connection::Sentinel(mut c) => ping.query_async::<String>(&mut c).await,
            }
        };
        tokio::time::timeout(self.deadline, call)
            .await
            .map_err(|_| StoreError::Timeout(self.deadline))?
            .map_err(|e| classify(e, self.deadline))?;
        Ok(())
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, Connection::Cluster(_))
    }

    /// The longest one call may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    fn script(&self, algorithm: Algorithm) -> &Script {
        &self.scripts[algorithm as usize]
    }
}

impl Store for RedisStore {
    async fn check(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        if let Some(denied) = precheck(&limit.params, cost)? {
            return Ok(denied);
        }
        self.run_script(limit, key, cost, now).await
    }

    async fn peek(
        &self,
        limit: &Limit,
        key: &str,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        self.run_script(limit, key, 0, now).await
    }

    async fn clear(&self, counters: &Counters<'_>, now: Option<Micros>) -> Result<u64, StoreError> {
        self.clear_counters(counters, now).await
    }
}

impl RedisStore {
    /// Decides `cost` hits on `key` under every one of `limits` in one call
    /// of the multi script: admitted only when all admit, and a denial
    /// charges none (see `scripts/multi.lua`). One decision per limit. The
    /// call is not shared with other checks (its arguments differ per rule).
    pub async fn check_all(
        &self,
        limits: &[Limit],
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        let Some(first) = limits.first() else {
            return Ok(Vec::new());
        };
        // A cost of 0 is a check-only peek, which precheck refuses.
        for limit in limits.iter().filter(|_| cost > 0) {
            if let Some(denied) = precheck(&limit.params, cost)? {
                return Ok(vec![denied]);
            }
        }
        let prefix = key::key_prefix(&first.rule, key)?;
        let mut cmd = Cmd::with_capacity(4 + 10 * limits.len(), 64 + 96 * limits.len());
        cmd.arg("EVALSHA")
            .arg(self.multi.get_hash())
            .arg(limits.len());
        for j in 0..limits.len() {
            // The first limit keeps the single-limit keys; the others get
            // their own suffix inside the same hash tag.
            match j {
                0 => cmd.arg(prefix.as_str()),
                j => cmd.arg(format!("{prefix}:{j}")),
            };
        }
        match now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        for limit in limits {
            limit_args(&mut cmd, &limit.params).arg(cost);
        }
        let reply = self.here().invoke(&self.multi, &cmd).await?;
        reply.chunks(6).map(decision_from_reply).collect()
    }

    /// Runs the algorithm's script; a cost of 0 decides without consuming.
    async fn run_script(
        &self,
        limit: &Limit,
        key: &str,
        cost: u64,
        now: Option<Micros>,
    ) -> Result<Decision, StoreError> {
        let params = &limit.params;
        let scale = params.scale();
        let call = coalesce::CallKey {
            algorithm: params.algorithm(),
            now,
            limit: [
                params.limit(),
                params.period_us(),
                params.tick_us(),
                scale.unit,
                scale.refill,
                scale.capacity,
                params.ttl_floor_us(),
            ],
        };
        let prefix = key::key_prefix(&limit.rule, key)?;
        let store = self.here();
        let Some(coalescer) = &store.coalescer else {
            return Err(StoreError::Reply(
                "the coalescing task's store cannot queue checks".into(),
            ));
        };
        if let Some(on_the_wire) = coalescer.direct() {
            let reply = store.call_script(call, &[(prefix.as_str(), cost)]).await;
            drop(on_the_wire);
            return decision_from_reply(&reply?);
        }
        let (reply, decision) = oneshot::channel();
        let queued = coalesce::Queued {
            call,
            prefix,
            cost,
            reply,
        };
        if !coalescer.queue(queued) {
            return Err(stopped());
        }
        // The call itself is bounded by the same deadline; this one also
        // covers the wait in the queue.
        match tokio::time::timeout(self.deadline, decision).await {
            Err(_) => Err(StoreError::Timeout(self.deadline)),
            Ok(Err(_)) => Err(stopped()),
            Ok(Ok(decision)) => decision,
        }
    }

    /// One call of `call`'s script deciding `checks` (key prefix, cost) in
    /// order; six integers a check (see `scripts/prelude.lua`).
    async fn call_script(
        &self,
        call: coalesce::CallKey,
        checks: &[(&str, u64)],
    ) -> Result<Vec<i64>, StoreError> {
        let script = self.script(call.algorithm);
        // Built here rather than through `redis::ScriptInvocation`, which
        // allocates a buffer for every key and argument and then copies them
        // all into the command.
        let mut cmd = Cmd::with_capacity(11 + 2 * checks.len(), 128 + 64 * checks.len());
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(checks.len());
        for (prefix, _) in checks {
            cmd.arg(*prefix);
        }
        match call.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(&call.limit[..]);
        for (_, cost) in checks {
            cmd.arg(*cost);
        }
        self.invoke(script, &cmd).await
    }

    /// Sends an EVALSHA of `script` to the node that owns its first key,
    /// within the deadline, with errors classified. A Redis that lost its
    /// scripts (restart, failover) answers NOSCRIPT: load it and retry once.
    pub(crate) async fn invoke(&self, script: &Script, cmd: &Cmd) -> Result<Vec<i64>, StoreError> {
        let call = async {
            let first = self.query(cmd).await;
            match first {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // The same load the `redis` crate's own script calls do
                    // (on a Cluster it reaches every primary).
                    match self.connection.clone() {
                        Connection::Standalone(mut c) => script.load_async(&mut c).await?,
                        Connection::Cluster(c) => script.load_async(&mut c.connection()).await?,
                        Connection::Sentinel(mut c) => script.load_async(&mut c).await?,
                    };
                    self.query(cmd).await
                }
                other => other,
            }
        };
        let result = tokio::time::timeout(self.deadline, call)
            .await
            .map_err(|_| StoreError::Timeout(self.deadline))
            .and_then(|r| r.map_err(|e| classify(e, self.deadline)));
        if let Err(e) = &result
            && e.is_transient()
        {
            self.repair(cmd);
        }
        result
    }

    /// After a failed call on a Cluster, sends one harmless read to the
    /// failed call's slot in the background, with the connect timeout
    /// rather than the check deadline; if even that fails, replaces the
    /// connection with a fresh one (discovery from the seed nodes).
    ///
    /// The cluster client learns of a promoted replica only while a request
    /// to that slot is in progress (it reconnects, is redirected, refreshes
    /// its slot map), and a check's deadline — or the breaker, which lets
    /// one check through a second — ends every such request long before
    /// that; and a client that keeps reconnecting to a killed master may
    /// never refresh. Measured (tests/integration/cluster_failover.rs), a killed
    /// master's slots stayed failed for good under load without this. At
    /// most one repair is out per connection.
    fn repair(&self, failed: &Cmd) {
        let Connection::Cluster(handle) = &self.connection else {
            return;
        };
        // EVALSHA's first key (argument 3) names the slot.
        let Some(key) = failed.args_iter().nth(3).and_then(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
            _ => None,
        }) else {
            return;
        };
        if self.repairing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (handle, repairing, within) =
            (handle.clone(), self.repairing.clone(), self.repair_timeout);
        tokio::spawn(async move {
            let read = redis::cmd("EXISTS").arg(key).to_owned();
            let mut connection = handle.connection();
            let outcome =
                tokio::time::timeout(within, read.query_async::<i64>(&mut connection)).await;
            if !matches!(outcome, Ok(Ok(_))) {
                tracing::info!(
                    "a redis cluster slot stays unreachable; reconnecting from the seed nodes"
                );
                match tokio::time::timeout(within, handle.client.get_async_connection()).await {
                    Ok(Ok(fresh)) => {
                        *handle.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "reconnecting to the redis cluster failed")
                    }
                    Err(_) => tracing::warn!("reconnecting to the redis cluster timed out"),
                }
            }
            repairing.store(false, Ordering::Release);
        });
    }

    async fn query(&self, cmd: &Cmd) -> Result<Vec<i64>, RedisError> {
        match self.connection.clone() {
            Connection::Standalone(mut c) => cmd.query_async(&mut c).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.connection()).await,
            Connection::Sentinel(c) => c.query(cmd).await,
        }
    }
}

/// One connection (standalone) or cluster client (Cluster) as `config` says;
/// its I/O task runs on the calling runtime.
async fn open(config: &RedisConfig) -> Result<Connection, StoreError> {
    if let [url] = config.urls.as_slice()
        && let Some(parsed) = sentinel::parse_sentinel_url(url)
    {
        let parsed = parsed.map_err(|reason| {
            StoreError::InvalidInput(crate::algorithm::InvalidInput::new(
                "Redis Sentinel URL",
                sentinel::without_credentials(url),
                reason,
            ))
        })?;
        let connecting = sentinel::SentinelConnection::connect(
            &parsed,
            config.ca_cert.as_deref(),
            config.connect_timeout,
            config.deadline,
        );
        return tokio::time::timeout(config.connect_timeout * 2, connecting)
            .await
            .map_err(|_| StoreError::Timeout(config.connect_timeout * 2))?
            .map(Connection::Sentinel)
            .map_err(|e| classify(e, config.connect_timeout));
    }
    let connecting = async {
        match cluster_nodes(&config.urls) {
            Some(nodes) => {
                let mut builder = ClusterClient::builder(nodes)
                    .connection_timeout(config.connect_timeout)
                    .response_timeout(config.deadline)
                    // Each attempt within the deadline, but a call may go on
                    // retrying (reconnect, redirect, slot refresh) past it:
                    // checks are cut at the deadline by `invoke` anyway, and
                    // `repair` needs the retries to run to the end.
                    .overall_response_timeout(None);
                if let Some(ca) = &config.ca_cert {
                    builder = builder.certs(certificates(ca));
                }
                let client = builder.build()?;
                let connection = client.get_async_connection().await?;
                Ok(Connection::Cluster(ClusterHandle {
                    client: Arc::new(client),
                    current: Arc::new(std::sync::RwLock::new(connection)),
                }))
            }
            None => {
                let url = config.urls.first().map(String::as_str).unwrap_or_default();
                let client = match &config.ca_cert {
                    Some(ca) => redis::Client::build_with_tls(url, certificates(ca))?,
                    None => redis::Client::open(url)?,
                };
                let manager = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.deadline))
                    .set_number_of_retries(2);
                Ok(Connection::Standalone(
                    client.get_connection_manager_with_config(manager).await?,
                ))
            }
        }
    };
    // Cluster discovery can hang on an unreachable seed; bound the whole connect.
    tokio::time::timeout(config.connect_timeout * 2, connecting)
        .await
        .map_err(|_| StoreError::Timeout(config.connect_timeout * 2))?
        .map_err(|e| classify(e, config.connect_timeout))
}

/// The coalescing task is gone: only when the runtime that started it shut down.
fn stopped() -> StoreError {
    StoreError::Connection(RedisError::from((
        redis::ErrorKind::Io,
        "the store's coalescing task stopped",
    )))
}

fn certificates(ca: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.to_vec()),
    }
}

/// `Some(seed nodes)` when the URLs describe a Cluster.
fn cluster_nodes(urls: &[String]) -> Option<Vec<String>> {
    if let [url] = urls {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            ("redis", rest)
        } else {
            ("rediss", url.strip_prefix("rediss+cluster://")?)
        };
        return Some(
            rest.split(',')
                .map(|node| format!("{scheme}://{}", node.trim()))
                .collect(),
        );
    }
    (urls.len() > 1).then(|| urls.to_vec())
}

/// Sorts a client error into the store's classes; `waited` is the timeout that
/// applied, reported if the client gave up on it.
fn classify(e: RedisError, waited: Duration) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout(waited)
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
    {
        StoreError::Connection(e)
    } else {
        StoreError::Server(e)
    }
}

fn decision_from_reply(reply: &[i64]) -> Result<Decision, StoreError> {
    let &[allowed, limit, remaining, reset, retry, delay] = reply else {
        return Err(StoreError::Reply(format!(
            "expected 6 integers, got {reply:?}"
        )));
    };
    let non_negative = |v: i64| {
        u64::try_from(v).map_err(|_| StoreError::Reply(format!("negative value in {reply:?}")))
    };
    let allowed = allowed == 1;
    Ok(Decision {
        allowed,
        limit: non_negative(limit)?,
        remaining: non_negative(remaining)?,
        reset_after_us: non_negative(reset)?,
        retry_after_us: non_negative(retry)?,
        delay_us: non_negative(delay)?,
        reason: (!allowed).then_some(DenyReason::OverLimit),
    })
}

/// The eight arguments by which the multi-limit scripts read one limit
/// (`multi.lua`'s `load`): each caller adds that limit's ninth (a check's
/// cost, a reservation's limit index).
pub(super) fn limit_args<'c>(cmd: &'c mut Cmd, params: &crate::algorithm::Params) -> &'c mut Cmd {
    let scale = params.scale();
    cmd.arg(params.algorithm() as usize)
        .arg(params.limit())
        .arg(params.period_us())
        .arg(params.tick_us())
        .arg(scale.unit)
        .arg(scale.refill)
        .arg(scale.capacity)
        .arg(params.ttl_floor_us())
}
