//! `meridian coordinator`'s flags, and what they say once checked: the
//! rebalancer's and Raft's settings, the transport, the peers of `--init`,
//! the addresses this node is dialled by and its tokens. Each check's error
//! is the text `run` reports as a configuration error.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use openraft::{Config, SnapshotPolicy};

use super::raft::{Member, NodeId};
use super::validation;
use crate::cockpit::{api, history};

/// Environment variable read when `--admin-token-file` is not given.
pub const ADMIN_TOKEN_ENV: &str = "MERIDIAN_ADMIN_TOKEN";
/// Environment variable read when `--read-token-file` is not given.
pub const READ_TOKEN_ENV: &str = "MERIDIAN_READ_TOKEN";
/// Shortest token accepted: 16 random characters are beyond guessing at
/// the two tries per second a refused attempt allows a connection.
pub const MIN_TOKEN_CHARS: usize = 16;

/// `meridian coordinator` options.
#[derive(clap::Args, Debug, Clone)]
pub struct CoordinatorArgs {
    /// This node's Raft id: unique in the cluster and never reused after removal.
    #[arg(long)]
    pub id: NodeId,
    /// Directory for the Raft log, state machine and snapshots (created if missing).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// gRPC listen address (Raft between nodes, rule watches from limiters);
    /// also the address peers dial, so it must be reachable from them.
    #[arg(long)]
    pub raft_addr: SocketAddr,
    /// Admin HTTP API, /healthz and /metrics; peers forward writes here.
    #[arg(long)]
    pub http_addr: SocketAddr,
    /// The host name (or IP) peers and limiters dial this node by, with the
    /// ports of --raft-addr and --http-addr, when that is not the listen
    /// address: a Kubernetes StatefulSet pod's stable DNS name, say, whose IP
    /// changes when the pod moves (listen on 0.0.0.0 then). The node's
    /// certificate must name it (`meridian certs issue --host`) [default:
    /// the listen addresses].
    #[arg(long, value_name = "HOST")]
    pub advertise_host: Option<String>,
    /// Bootstrap a new cluster: `ID=RAFT_ADDR@HTTP_ADDR,...` including this
    /// node (each address `IP:PORT` or `HOST:PORT`). Ignored when the data
    /// dir already holds a cluster.
    #[arg(long, conflicts_with = "join")]
    pub init: Option<String>,
    /// Join a running cluster through any member's admin URL
    /// (`http://host:port`): added as learner, made voter once caught up.
    #[arg(long)]
    pub join: Option<String>,
    /// File holding the bearer token for admin writes (at least 16
    /// characters; chmod 600). Required, or MERIDIAN_ADMIN_TOKEN.
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
    /// The admin token itself; visible to every user in `ps`, so prefer
    /// --admin-token-file or MERIDIAN_ADMIN_TOKEN.
    #[arg(long, hide = true)]
    pub admin_token: Option<String>,
    /// File holding a token that reads (rules, regions, allocations, leases,
    /// cluster) then need, as `Authorization: Bearer` (the admin token works
    /// too) [env: MERIDIAN_READ_TOKEN]. Without it reads are open to anyone
    /// who reaches --http-addr; /healthz and /metrics always are.
    #[arg(long, value_name = "PATH")]
    pub read_token_file: Option<PathBuf>,
    /// `--admin-max-connections`, `--admin-header-timeout`,
    /// `--admin-idle-timeout`.
    #[command(flatten)]
    pub admin_listener: api::AdminListenerArgs,
    /// Samples the dashboard's history keeps per global rule and per key
    /// entry, one per epoch: 1,440 is 24 h at the default 60 s
    /// --rebalance-interval. Memory: about 48 + 40 × regions bytes a sample
    /// (see GET /api/v1/history).
    #[arg(long, default_value_t = history::DEFAULT_SAMPLES)]
    pub history_samples: usize,
    /// Leader heartbeat interval.
    #[arg(long, default_value_t = 250)]
    pub heartbeat_ms: u64,
    /// Minimum election timeout; the maximum is 1.5 times this. Keep it well
    /// above the heartbeat, the worst RTT between regions and a slow fsync.
    #[arg(long, default_value_t = 1500)]
    pub election_timeout_ms: u64,
    /// Build a snapshot (and compact the log) every this many entries.
    #[arg(long, default_value_t = 5000)]
    pub snapshot_logs: u64,
    /// Log entries kept behind the latest snapshot, so slightly lagging
    /// followers catch up from the log instead of a snapshot.
    #[arg(long, default_value_t = 1000)]
    pub snapshot_keep_logs: u64,

    /// Least a rule whose one counter every caller shares (all levels exact
    /// values, e.g. `path: /login`) may allow, in requests per minute: a PUT
    /// or a rollback to a version below it is refused (422), catching a limit
    /// that would throttle all traffic at once. A token_bucket or leaky_bucket
    /// must also admit the floor's per-second share at once: burst × 60 ≥ the
    /// floor (floor 600 → burst ≥ 10). While it is on, a limit of 0 on any
    /// rule, and a rule counting each value apart that allows each less than
    /// one a day, are refused too. A rule confirmed with `confirm_ban: true`
    /// passes all of these. On by default at one a second: a ban or a typo'd
    /// unit then needs that confirmation on every cluster. 0 turns the
    /// checks off.
    #[arg(long, default_value_t = validation::DEFAULT_SHARED_FLOOR_PER_MINUTE)]
    pub shared_rule_floor: f64,

    /// How often the leader re-divides global limits from reported demand
    /// (also after acknowledgements and top-up requests). Limiters report
    /// demand at the interval the coordinators give them on the watch
    /// stream: half of this, at most 10s, at least 500ms (10s at the
    /// default, 1s at 2s); a limiter's --report-interval may only shorten
    /// it. Pods whose reports still cover more than 1.5 times that interval
    /// are logged, counted in meridian_report_interval_mismatched_pods and
    /// listed on /readyz.
    #[arg(long, default_value = "60s", value_parser = crate::rules::parse_duration)]
    pub rebalance_interval: Duration,
    /// Scheduled rounds run this long before each multiple of
    /// --rebalance-interval in Unix time — before minute windows turn over,
    /// for a 60s interval — so capacity moved by a round is enforced at the
    /// window boundary instead of a window later. At most half the
    /// interval; by default 5s, or a quarter of a shorter interval.
    #[arg(long, value_parser = crate::rules::parse_duration)]
    pub round_lead: Option<Duration>,
    /// How long an allocation stays valid without renewal. A region cut off
    /// from every coordinator enforces its allocation this long, then its
    /// rules' fallback share for their fallback_hold, then nothing; a dead
    /// region's share is re-granted on the same schedule. Renewed by the
    /// first round after half of it, at the latest when a third of it is
    /// left (a round runs then, whatever --rebalance-interval), to regions
    /// heard within --suspect-after. Longer rides out a longer coordinator
    /// outage; shorter returns a dead region's share sooner.
    #[arg(long, default_value = "30s", value_parser = crate::rules::parse_duration)]
    pub lease: Duration,
    /// Silence after which a region counts as not heard: its lease is not
    /// renewed, and under `partition: available` its share above its
    /// fallback is given to others. Shorter than --lease, and at least two
    /// report intervals (half of --rebalance-interval, at most 10s).
    #[arg(long, default_value = "20s", value_parser = crate::rules::parse_duration)]
    pub suspect_after: Duration,
    /// Clock skew allowed between coordinators and regions: a lease counts as
    /// lapsed at the centre only this long after it ran out.
    #[arg(long, default_value = "1s", value_parser = crate::rules::parse_duration)]
    pub skew_margin: Duration,
    /// Weight of the newest demand sample in the moving average (0–1].
    #[arg(long, default_value_t = 0.5)]
    pub ewma_alpha: f64,
    /// Extra room granted above smoothed demand, as a fraction (0.1 = 10 %).
    #[arg(long, default_value_t = 0.1)]
    pub headroom: f64,
    /// Share of its static (weight) share every active region keeps.
    #[arg(long, default_value_t = 0.1)]
    pub floor: f64,
    /// Moves smaller than this fraction of a limit are not published.
    #[arg(long, default_value_t = 0.01)]
    pub hysteresis: f64,
    /// Most of a limit moved into or out of a region per epoch (fraction);
    /// off by default — shrink before grow already keeps the sum safe.
    #[arg(long)]
    pub max_shift: Option<f64>,
    /// Most watch streams (limiters following rules and allocations) this
    /// node serves at once; more are refused with RESOURCE_EXHAUSTED and the
    /// limiter tries another node.
    #[arg(long, default_value_t = 10_000)]
    pub max_watch_streams: usize,
    /// Most watch streams from one client: one region's certificate over
    /// TLS (all its pods together), one IP address with --insecure.
    #[arg(long, default_value_t = 1_000)]
    pub max_watch_streams_per_client: usize,
    /// Most bytes one watch message encodes to; larger allocation updates
    /// go in parts. Hidden: for tests that split a snapshot without
    /// building megabytes of state.
    #[arg(long, hide = true, default_value_t = crate::proto::WATCH_MESSAGE_BUDGET)]
    pub watch_message_bytes: usize,
    /// Register a region the first time its limiters report (weight 1).
    /// For development and the demo: otherwise an admin registers regions
    /// (PUT /api/v1/regions/NAME) and reports from others are refused, so
    /// nobody can make up regions that hold capacity in reserve.
    #[arg(long)]
    pub auto_register_regions: bool,
    /// Keys per global rule that may get their own allocation.
    #[arg(long, default_value_t = 1000)]
    pub max_key_entries: usize,
    /// `--tls-cert`, `--tls-key`, `--tls-ca`, `--insecure`.
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

impl CoordinatorArgs {
    /// The rebalancer's settings, checked (by
    /// [`LeaderConfig::check`](crate::allocation::leader::LeaderConfig::check),
    /// as a simulator scenario's are).
    pub fn allocator_config(&self) -> Result<crate::allocation::leader::LeaderConfig, String> {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let round_lead = self.round_lead.unwrap_or_else(|| {
            Duration::from_millis(crate::allocation::ROUND_LEAD_MS as u64)
                .min(self.rebalance_interval / 4)
        });
        let config = crate::allocation::leader::LeaderConfig {
            rebalance_interval_ms: ms(self.rebalance_interval),
            round_lead_ms: ms(round_lead),
            top_up: true,
            rebalancer: crate::allocation::Config {
                lease_ms: ms(self.lease),
                suspect_after_ms: ms(self.suspect_after),
                skew_margin_ms: ms(self.skew_margin),
                ewma_alpha: self.ewma_alpha,
                headroom: self.headroom,
                floor: self.floor,
                hysteresis: self.hysteresis,
                max_shift: self.max_shift,
                max_key_entries: self.max_key_entries,
            },
        };
        config
            .check()
            .map_err(|r| format!("{} {}", r.setting.flag(), r.reason))?;
        Ok(config)
    }

    /// The admin token (`--admin-token-file`, `MERIDIAN_ADMIN_TOKEN` or
    /// `--admin-token`): required, and at least [`MIN_TOKEN_CHARS`] long.
    pub fn admin_token(&self) -> Result<String, String> {
        let admin_token = crate::secret::credential(
            "admin-token",
            self.admin_token_file.as_deref(),
            ADMIN_TOKEN_ENV,
            self.admin_token.as_deref(),
        )?
        .ok_or_else(|| {
            format!("an admin token is required: --admin-token-file PATH or {ADMIN_TOKEN_ENV}")
        })?;
        if admin_token.chars().count() < MIN_TOKEN_CHARS {
            return Err(format!(
                "the admin token is {} characters long; at least {MIN_TOKEN_CHARS} are needed \
                 (e.g. `openssl rand -hex 16 > token && chmod 600 token`)",
                admin_token.chars().count()
            ));
        }
        Ok(admin_token)
    }

    /// The read token (`--read-token-file` or `MERIDIAN_READ_TOKEN`), if any.
    pub fn read_token(&self) -> Result<Option<String>, String> {
        crate::secret::credential(
            "read-token",
            self.read_token_file.as_deref(),
            READ_TOKEN_ENV,
            None,
        )
    }

    /// The members `--init` bootstraps, which must include this node.
    pub fn init_peers(&self) -> Result<Option<BTreeMap<NodeId, Member>>, String> {
        let init = match &self.init {
            Some(spec) => Some(parse_peers(spec).map_err(|e| format!("--init: {e}"))?),
            None => None,
        };
        if let Some(peers) = &init
            && !peers.contains_key(&self.id)
        {
            return Err(format!("--init must list this node (id {})", self.id));
        }
        Ok(init)
    }

    /// The transport the flags ask for: mutual TLS with this node's certificate,
    /// or plaintext with `--insecure` when every address involved is loopback.
    pub fn transport(
        &self,
        init: Option<&BTreeMap<NodeId, Member>>,
    ) -> Result<crate::tls::Transport, String> {
        let mut addrs = vec![
            ("--raft-addr", self.raft_addr.to_string()),
            ("--http-addr", self.http_addr.to_string()),
        ];
        if let Some(url) = &self.join {
            addrs.push(("--join", url.clone()));
        }
        if let Some(host) = &self.advertise_host {
            addrs.push(("--advertise-host", host.clone()));
        }
        for member in init.into_iter().flat_map(|m| m.values()) {
            addrs.push(("--init", member.raft_addr.clone()));
            addrs.push(("--init", member.http_addr.clone()));
        }
        crate::tls::Transport::from_args(&self.tls, crate::tls::Identity::Node(self.id), &addrs)
    }

    /// Raft's settings, checked by openraft.
    pub fn raft_config(&self) -> Result<Config, String> {
        let config = Config {
            cluster_name: "meridian".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_ms,
            // openraft's leader lease equals the maximum: followers refuse votes
            // until it expires, so a failover takes about max + one more timeout.
            // A narrow range keeps that short; the spread still avoids split votes.
            election_timeout_max: self.election_timeout_ms + self.election_timeout_ms / 2,
            // A snapshot of many rule versions can take a while to cross regions.
            install_snapshot_timeout: 10_000.max(self.election_timeout_ms * 4),
            // Each entry may carry a 1 MiB rule set: keep an append under the
            // gRPC message limit.
            max_payload_entries: 32,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_logs),
            max_in_snapshot_log_to_keep: self.snapshot_keep_logs,
            snapshot_max_chunk_size: 1024 * 1024,
            ..Config::default()
        };
        config.validate().map_err(|e| e.to_string())
    }

    /// The addresses this node is dialled by: `--advertise-host` with the
    /// listeners' ports, or the listen addresses themselves.
    pub fn advertised(&self) -> Result<Member, String> {
        let Some(host) = &self.advertise_host else {
            return Ok(Member {
                raft_addr: self.raft_addr.to_string(),
                http_addr: self.http_addr.to_string(),
            });
        };
        check_host(host).map_err(|why| format!("--advertise-host: {why}"))?;
        let host = match host.parse::<std::net::Ipv6Addr>() {
            Ok(_) => format!("[{host}]"),
            Err(_) => host.clone(),
        };
        Ok(Member {
            raft_addr: format!("{host}:{}", self.raft_addr.port()),
            http_addr: format!("{host}:{}", self.http_addr.port()),
        })
    }
}

/// Parses `--init`: `ID=RAFT_ADDR@HTTP_ADDR` entries separated by commas.
pub fn parse_peers(spec: &str) -> Result<BTreeMap<NodeId, Member>, String> {
    let mut peers = BTreeMap::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addrs) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?}: expected ID=RAFT_ADDR@HTTP_ADDR"))?;
        let id: NodeId = id
            .parse()
            .map_err(|_| format!("{entry:?}: {id:?} is not a node id"))?;
        let (raft_addr, http_addr) = addrs
            .split_once('@')
            .ok_or_else(|| format!("{entry:?}: expected ID=RAFT_ADDR@HTTP_ADDR"))?;
        for addr in [raft_addr, http_addr] {
            check_host_port(addr).map_err(|why| format!("{entry:?}: {addr:?}: {why}"))?;
        }
        let member = Member {
            raft_addr: raft_addr.to_string(),
            http_addr: http_addr.to_string(),
        };
        if peers.insert(id, member).is_some() {
            return Err(format!("node {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("no peers given".into());
    }
    Ok(peers)
}

/// A peer address as nodes dial it: `IP:PORT`, or `HOST:PORT` with a DNS
/// name (letters, digits, `-`, `.`).
fn check_host_port(addr: &str) -> Result<(), String> {
    if addr.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or("expected IP:PORT or HOST:PORT")?;
    port.parse::<u16>()
        .map_err(|_| format!("port {port:?} is not a number up to 65535"))?;
    check_host(host)
}

/// A DNS name or IP address peers can dial.
fn check_host(host: &str) -> Result<(), String> {
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if name_ok || host.parse::<std::net::IpAddr>().is_ok() {
        Ok(())
    } else {
        Err(format!(
            "host {host:?} is not a DNS name (letters, digits, - and .) or an IP address"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_may_be_named_by_ip_or_dns_name() {
        let peers = parse_peers(
            "1=10.0.0.5:7901@10.0.0.5:7902,\
             2=meridian-coordinator-1.meridian-coordinator.meridian.svc:7901@meridian-coordinator-1.meridian-coordinator.meridian.svc:7902",
        )
        .expect("valid peers");
        assert_eq!(peers[&1].raft_addr, "10.0.0.5:7901");
        assert_eq!(
            peers[&2].http_addr,
            "meridian-coordinator-1.meridian-coordinator.meridian.svc:7902"
        );
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: CoordinatorArgs,
    }

    fn config(flags: &[&str]) -> Result<crate::allocation::leader::LeaderConfig, String> {
        use clap::Parser;
        let argv = [
            "coordinator",
            "--id",
            "1",
            "--data-dir",
            "/nonexistent",
            "--raft-addr",
            "127.0.0.1:1",
            "--http-addr",
            "127.0.0.1:2",
        ];
        let cli = Cli::try_parse_from(argv.iter().chain(flags)).map_err(|e| e.to_string())?;
        cli.args.allocator_config()
    }

    #[test]
    fn a_lease_no_longer_than_suspect_after_is_refused_naming_both_flags() {
        let refused = config(&["--lease", "20s"]).expect_err("20 s lease, suspect after 20 s");
        assert!(
            refused.starts_with("--lease 20 s must be longer than the suspect-after time (20 s)"),
            "{refused}"
        );
        assert!(
            config(&[]).is_ok(),
            "the defaults (30 s lease, 20 s suspect-after, 60 s rounds) are consistent"
        );
        assert!(config(&["--lease", "60s", "--rebalance-interval", "20s"]).is_ok());
    }

    #[test]
    fn a_peer_address_without_a_port_or_with_a_scheme_is_refused_saying_why() {
        let no_port = parse_peers("1=node-1@node-1:7902").expect_err("no port");
        assert!(
            no_port.contains("expected IP:PORT or HOST:PORT"),
            "{no_port}"
        );
        let scheme = parse_peers("1=https://node-1:7901@node-1:7902").expect_err("scheme");
        assert!(scheme.contains("is not a DNS name"), "{scheme}");
        let port = parse_peers("1=node-1:99999@node-1:7902").expect_err("port");
        assert!(port.contains("port \"99999\""), "{port}");
    }
}
