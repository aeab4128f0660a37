//! Redis behind Sentinel: the master is whichever node the sentinels name now.
//!
//! The redis crate finds the master through the sentinels (`SentinelClient`,
//! which also checks that the node it names answers `ROLE` as a master) but
//! hands back a plain multiplexed connection that stays on that node. After a
//! failover the old master is either gone (the connection fails) or back as a
//! replica (writes answer `READONLY`); either way this connection asks the
//! sentinels again and retries the command once on the master they name.
//!
//! The lookup runs in a task of its own, so a check whose deadline ends
//! mid-lookup does not cancel it: the next check finds the new master
//! connected. Checks failing together share one lookup (a generation number
//! tells a lookup already done from one still needed).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, FromRedisValue, IntoConnectionInfo,
    RedisError, RedisResult, ServerErrorKind, TlsCertificates, TlsMode,
};

/// The default Sentinel port, for hosts given without one.
const SENTINEL_PORT: u16 = 26379;

/// What a `redis+sentinel://` URL says (see [`parse_sentinel_url`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentinelUrl {
    pub tls: bool,
    /// `user:password` as written in the URL (percent-encoded), if any.
    pub userinfo: Option<String>,
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
}

/// Parses `redis+sentinel://[user:pass@]host[:port][,host[:port]…]/MASTER[/DB]`
/// (`rediss+sentinel://` for TLS). `None` when `url` is not a Sentinel URL;
/// an error names what is wrong with one that is.
pub(super) fn parse_sentinel_url(url: &str) -> Option<Result<SentinelUrl, String>> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        (false, rest)
    } else {
        (true, url.strip_prefix("rediss+sentinel://")?)
    };
    Some(parse_sentinel_rest(tls, rest))
}

/// `url` with any `user:password@` removed, for error messages.
pub(super) fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

fn parse_sentinel_rest(tls: bool, rest: &str) -> Result<SentinelUrl, String> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    // Passwords may hold '@': credentials end at the last one.
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (Some(authority[..at].to_string()), &authority[at + 1..]),
        None => (None, authority),
    };
    let sentinels = hosts
        .split(',')
        .map(|host| {
            let host = host.trim();
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port)) => {
                    let port = port.parse::<u16>().map_err(|_| {
                        format!("sentinel address {host:?}: port {port:?} is not a number 0-65535")
                    })?;
                    (name, port)
                }
                None => (host, SENTINEL_PORT),
            };
            if name.is_empty() {
                return Err(format!("sentinel address {host:?} has no host"));
            }
            Ok((name.to_string(), port))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut segments = path.split('/');
    let master = segments.next().unwrap_or_default();
    if master.is_empty() {
        return Err(
            "no master name: write redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER-NAME".into(),
        );
    }
    let db = match segments.next().filter(|s| !s.is_empty()) {
        Some(db) => db
            .parse::<i64>()
            .map_err(|_| format!("database {db:?} after the master name is not a number"))?,
        None => 0,
    };
    if let Some(extra) = segments.next() {
        return Err(format!(
            "unexpected {extra:?} after /MASTER/DB (the URL has at most two path segments)"
        ));
    }
    Ok(SentinelUrl {
        tls,
        userinfo,
        sentinels,
        master: master.to_string(),
        db,
    })
}

/// A connection to the master the sentinels name. Clones share it.
#[derive(Clone)]
pub(super) struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    /// Asks the sentinels. tokio's Mutex: the lookup awaits while holding it,
    /// and holding it is what makes concurrent failures share one lookup.
    client: tokio::sync::Mutex<SentinelClient>,
    /// The master's connection now; std's lock, never held across an await.
    current: RwLock<Current>,
    /// Connect and response timeouts of each master connection.
    config: AsyncConnectionConfig,
    /// Longest one lookup (sentinels, then the master) may take.
    lookup_timeout: Duration,
    /// The database the URL selects.
    db: i64,
    /// The master's name at the sentinels, for logs.
    master: String,
}

#[derive(Clone)]
struct Current {
    /// Bumped by every lookup, successful or not.
    generation: u64,
    /// `None` after a lookup failed: the next command looks up again.
    connection: Option<MultiplexedConnection>,
}

impl SentinelConnection {
    /// Builds the sentinel client for `url` and connects to the master it names.
    pub(super) async fn connect(
        url: &SentinelUrl,
        ca: Option<&[u8]>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<SentinelConnection> {
        let client = sentinel_client(url, ca)?;
        let connection = SentinelConnection {
            inner: Arc::new(Inner {
                client: tokio::sync::Mutex::new(client),
                current: RwLock::new(Current {
                    generation: 0,
                    connection: None,
                }),
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout)),
                lookup_timeout: connect_timeout,
                db: url.db,
                master: url.master.clone(),
            }),
        };
        connection.inner.clone().look_up(0).await?;
        Ok(connection)
    }

    /// Sends `cmd` to the master; on a lost connection or a `READONLY` reply
    /// (the node was demoted) finds the master again and retries once.
    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        let Current {
            generation,
            connection,
        } = self
            .inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut connection = match connection {
            Some(c) => c,
            None => self.look_up_in_task(generation).await?,
        };
        match cmd.query_async(&mut connection).await {
            Err(e) if master_moved(&e) => {
                tracing::debug!(error = %e, "redis master lost; asking the sentinels");
                let mut connection = self.look_up_in_task(generation).await?;
                cmd.query_async(&mut connection).await
            }
            Err(e) if e.is_timeout() => {
                // A master cut off by the network fails no call, it just
                // stops answering: ask the sentinels in the background, and
                // let this call's fail mode decide.
                tokio::spawn(self.inner.clone().look_up(generation));
                Err(e)
            }
            other => other,
        }
    }

    /// [`Inner::look_up`] in a task of its own, so that the caller's deadline
    /// does not cut a lookup short.
    async fn look_up_in_task(&self, seen: u64) -> RedisResult<MultiplexedConnection> {
        tokio::spawn(self.inner.clone().look_up(seen))
            .await
            .map_err(|e| {
                RedisError::from((
                    ErrorKind::Io,
                    "the sentinel lookup task stopped",
                    e.to_string(),
                ))
            })?
    }

    /// The master's connection for calls that need one directly (SCRIPT LOAD).
    pub(super) async fn master(&self) -> RedisResult<MultiplexedConnection> {
        let current = self
            .inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match current.connection {
            Some(c) => Ok(c),
            None => self.look_up_in_task(current.generation).await,
        }
    }
}

impl Inner {
    /// A connection to the master the sentinels name now — unless a lookup
    /// since generation `seen` already made one, which is then returned.
    async fn look_up(self: Arc<Self>, seen: u64) -> RedisResult<MultiplexedConnection> {
        let mut client = self.client.lock().await;
        {
            let current = self.current.read().unwrap_or_else(|e| e.into_inner());
            if current.generation != seen
                && let Some(connection) = &current.connection
            {
                return Ok(connection.clone());
            }
        }
        let found = tokio::time::timeout(
            self.lookup_timeout,
            client.get_async_connection_with_config(&self.config),
        )
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::Io,
                "no master from the sentinels within the connect timeout",
            )))
        });
        match &found {
            Ok(_) => {
                tracing::info!(master = %self.master, "connected to the redis master the sentinels name")
            }
            Err(e) => {
                tracing::warn!(master = %self.master, error = %e, "no redis master from the sentinels")
            }
        }
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        current.generation += 1;
        current.connection = found.as_ref().ok().cloned();
        drop(current);
        drop(client);
        found
    }
}

/// Whether `e` means the node this connection talks to is no longer the
/// master: it is unreachable, or it answered as a replica.
fn master_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// The sentinel client for `url`. The URL's credentials and database apply
/// to the master; the same credentials authenticate to the sentinels (a
/// Sentinel deployment with `requirepass` on the data nodes usually sets the
/// same on the sentinels; without credentials neither is sent any).
fn sentinel_client(url: &SentinelUrl, ca: Option<&[u8]>) -> RedisResult<SentinelClient> {
    let addrs = url.sentinels.iter().map(|(host, port)| {
        if url.tls {
            ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.clone(), *port)
        }
    });
    let mut builder = SentinelClientBuilder::new(addrs, &url.master, SentinelServerType::Master)?
        .set_client_to_redis_db(url.db);
    if let Some(userinfo) = &url.userinfo {
        // The redis crate's own URL parser percent-decodes the credentials.
        let parsed = format!("redis://{userinfo}@localhost").into_connection_info()?;
        let settings = parsed.redis_settings();
        if let Some(user) = settings.username() {
            builder = builder
                .set_client_to_redis_username(user)
                .set_client_to_sentinel_username(user);
        }
        if let Some(password) = settings.password() {
            builder = builder
                .set_client_to_redis_password(password)
                .set_client_to_sentinel_password(password);
        }
    }
    if url.tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(ca) = ca {
            let certificates = || TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.to_vec()),
            };
            builder = builder
                .set_client_to_redis_certificates(certificates())
                .set_client_to_sentinel_certificates(certificates());
        }
    }
    builder.build()
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move { self.query(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            let mut connection = self.master().await?;
            connection.req_packed_commands(cmd, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<SentinelUrl, String> {
        parse_sentinel_url(url).expect("a sentinel URL")
    }

    #[test]
    fn sentinel_urls_name_hosts_master_and_db() {
        assert_eq!(
            parse("redis+sentinel://a:1,b/mymaster"),
            Ok(SentinelUrl {
                tls: false,
                userinfo: None,
                sentinels: vec![("a".into(), 1), ("b".into(), SENTINEL_PORT)],
                master: "mymaster".into(),
                db: 0,
            })
        );
        let full = parse("rediss+sentinel://u:p%40ss@h:2/m/3").expect("valid");
        assert!(full.tls);
        assert_eq!(full.userinfo.as_deref(), Some("u:p%40ss"));
        assert_eq!((full.master.as_str(), full.db), ("m", 3));
        assert_eq!(parse_sentinel_url("redis://h:1"), None);
    }

    #[test]
    fn broken_sentinel_urls_say_what_is_wrong() {
        let err = |url| parse(url).expect_err(url);
        assert!(err("redis+sentinel://h:1").contains("no master name"));
        assert!(err("redis+sentinel://h:1/").contains("no master name"));
        assert!(err("redis+sentinel://h:x/m").contains("port \"x\""));
        assert!(err("redis+sentinel://h:1,/m").contains("has no host"));
        assert!(err("redis+sentinel://h:1/m/zero").contains("database \"zero\""));
        assert!(err("redis+sentinel://h:1/m/0/x").contains("unexpected \"x\""));
        assert_eq!(
            without_credentials("redis+sentinel://u:s3cret@h:1/m"),
            "redis+sentinel://h:1/m"
        );
    }
}
