//! What the bench samples before and after the measured window: a process's
//! CPU time from `/proc/PID/stat`, and Redis's command counts and CPU time from
//! `INFO commandstats` / `INFO cpu`. Parsing is pure; reading is at the bottom.

use std::collections::BTreeMap;
use std::time::Duration;

/// Linux reports utime/stime in USER_HZ ticks, which the kernel ABI fixes at
/// 100 per second for user space on every architecture.
const USER_HZ: u64 = 100;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected /proc/PID/stat format: {0}")]
    ProcStat(String),
    #[error("redis at {url}: {source}")]
    Redis {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("redis INFO has no {0}")]
    Info(&'static str),
}

/// User + system CPU time from the text of `/proc/PID/stat`.
pub fn parse_proc_stat_cpu(stat: &str) -> Result<Duration, ProbeError> {
    // Field 2 (comm) is in parentheses and may itself hold spaces and ')'; the
    // fields after the last ')' start at field 3 (state). utime is field 14, stime 15.
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| ProbeError::ProcStat("no ')' after the command name".into()))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |index: usize, name: &str| -> Result<u64, ProbeError> {
        fields
            .get(index)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| ProbeError::ProcStat(format!("no numeric {name} field")))
    };
    let ticks = tick(11, "utime")? + tick(12, "stime")?;
    Ok(Duration::from_micros(ticks * 1_000_000 / USER_HZ))
}

/// CPU time used so far by process `pid` (`"self"` for this process).
pub fn process_cpu(pid: &str) -> Result<Duration, ProbeError> {
    let path = format!("/proc/{pid}/stat");
    let text =
        std::fs::read_to_string(&path).map_err(|source| ProbeError::Read { path, source })?;
    parse_proc_stat_cpu(&text)
}

/// Calls per command from `INFO commandstats`
/// (`cmdstat_evalsha:calls=12,usec=30,...`), leaving out `info` itself,
/// which only the bench sends.
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// `used_cpu_sys + used_cpu_user` from `INFO cpu`, in microseconds.
pub fn parse_cpu_us(info: &str) -> Option<u64> {
    let seconds = |field: &str| -> Option<f64> {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))?
            .parse()
            .ok()
    };
    let total = seconds("used_cpu_sys")? + seconds("used_cpu_user")?;
    Some((total * 1e6).round() as u64)
}

/// Redis counters at one instant.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RedisSample {
    pub calls: BTreeMap<String, u64>,
    pub cpu_us: u64,
}

impl RedisSample {
    /// Calls per command between `before` and `self`, dropping commands not called.
    pub fn calls_since(&self, before: &RedisSample) -> BTreeMap<String, u64> {
        self.calls
            .iter()
            .map(|(name, &n)| {
                let earlier = before.calls.get(name).copied().unwrap_or(0);
                (name.clone(), n.saturating_sub(earlier))
            })
            .filter(|&(_, n)| n > 0)
            .collect()
    }
}

/// A connection for sampling the Redis the limiter uses.
pub struct RedisProbe {
    url: String,
    connection: redis::aio::MultiplexedConnection,
}

impl RedisProbe {
    pub async fn connect(url: &str) -> Result<RedisProbe, ProbeError> {
        let err = |source| ProbeError::Redis {
            url: url.to_owned(),
            source,
        };
        let client = redis::Client::open(url).map_err(err)?;
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(err)?;
        Ok(RedisProbe {
            url: url.to_owned(),
            connection,
        })
    }

    pub async fn sample(&mut self) -> Result<RedisSample, ProbeError> {
        let commandstats = self.info("commandstats").await?;
        let cpu = self.info("cpu").await?;
        Ok(RedisSample {
            calls: parse_commandstats(&commandstats),
            cpu_us: parse_cpu_us(&cpu).ok_or(ProbeError::Info("used_cpu_sys/used_cpu_user"))?,
        })
    }

    async fn info(&mut self, section: &str) -> Result<String, ProbeError> {
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.connection)
            .await
            .map_err(|source| ProbeError::Redis {
                url: self.url.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_cpu_is_utime_plus_stime() {
        let stat = "4242 (meridian) S 1 4242 4242 0 -1 4194560 1200 0 0 0 \
                    350 125 0 0 20 0 9 0 123456 1000000 2000 18446744073709551615";
        assert_eq!(
            parse_proc_stat_cpu(stat).unwrap(),
            Duration::from_millis(4750)
        );
    }

    #[test]
    fn proc_stat_survives_spaces_and_parens_in_the_command_name() {
        let stat = "7 (my (odd) name) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5 6 7";
        assert_eq!(
            parse_proc_stat_cpu(stat).unwrap(),
            Duration::from_millis(70)
        );
    }

    #[test]
    fn proc_stat_garbage_is_an_error() {
        assert!(parse_proc_stat_cpu("no parens here").is_err());
        assert!(parse_proc_stat_cpu("1 (x) S 1 2").is_err());
    }

    #[test]
    fn this_process_has_a_readable_cpu_time() {
        process_cpu("self").unwrap();
    }

    const COMMANDSTATS: &str = "# Commandstats\r\n\
        cmdstat_evalsha:calls=1000,usec=5000,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_info:calls=4,usec=100,usec_per_call=25.00,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_client|setinfo:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_ping:calls=3,usec=0,usec_per_call=0.00\r\n";

    #[test]
    fn commandstats_lists_calls_per_command_without_info() {
        let calls = parse_commandstats(COMMANDSTATS);
        let expected: BTreeMap<String, u64> =
            [("client|setinfo", 2), ("evalsha", 1000), ("ping", 3)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        assert_eq!(calls, expected);
    }

    #[test]
    fn cpu_is_sys_plus_user_in_microseconds() {
        let info = "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.500001\r\n\
                    used_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\n";
        assert_eq!(parse_cpu_us(info), Some(1_750_001));
        assert_eq!(parse_cpu_us("# CPU\r\n"), None);
    }

    #[test]
    fn calls_since_subtracts_and_drops_idle_commands() {
        let before = RedisSample {
            calls: parse_commandstats("cmdstat_evalsha:calls=10\ncmdstat_ping:calls=3\n"),
            cpu_us: 0,
        };
        let after = RedisSample {
            calls: parse_commandstats(
                "cmdstat_evalsha:calls=110\ncmdstat_ping:calls=3\ncmdstat_script|load:calls=1\n",
            ),
            cpu_us: 0,
        };
        let delta = after.calls_since(&before);
        assert_eq!(delta.get("evalsha"), Some(&100));
        assert_eq!(delta.get("script|load"), Some(&1));
        assert_eq!(delta.get("ping"), None);
    }
}
