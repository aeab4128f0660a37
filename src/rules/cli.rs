//! `meridian rules check|explain`: validate rule files and show which rule a
//! descriptor resolves to, without starting a limiter.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Accuracy, Resolved, Rule, RuleFile, RuleSet, format_duration};

/// Exit status for invalid rule files (and unreadable ones).
const INVALID: u8 = 2;

/// `meridian rules` options: which subcommand (`check`, `explain`, …) and its files.
#[derive(Debug, Args)]
pub struct RulesArgs {
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// Validate rule files: print every error as `FILE:LINE: FIELD: REASON`
    /// and exit 2, or print a one-line summary and exit 0.
    ///
    /// Files use envoyproxy/ratelimit's format (`domain`, nested `descriptors`
    /// with `key`, `value`, `rate_limit`) plus Meridian's fields beside
    /// `rate_limit` (algorithm, burst, period, fail_mode, scope, accuracy,
    /// sync_interval, max_batch, split, partition, fallback, fallback_hold, confirm_ban). All files are
    /// checked together: a domain may be defined in only one of them.
    Check {
        /// Rule files (YAML).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Show which rule a descriptor resolves to (limit, unit, name, shadow
    /// mode, algorithm, where it is defined) — or that none does.
    ///
    /// Arguments are rule files followed by the descriptor's entries as
    /// KEY=VALUE, in order (outermost first), e.g.
    /// `meridian rules explain rules.yaml --domain api user=42 path=/login`.
    /// The first argument containing `=` that is not an existing file starts
    /// the entries. Invalid files print their errors and exit 2.
    Explain {
        /// The domain the descriptor belongs to.
        #[arg(long)]
        domain: String,
        /// Print exactly one JSON object: matched, allow_listed, unlimited,
        /// requests_per_unit, unit (SECOND…YEAR or CUSTOM), period_ms, name,
        /// shadow_mode, rule_id, algorithm, burst, file, line, counter_key, …
        #[arg(long)]
        json: bool,
        /// Rule files, then KEY=VALUE entries.
        #[arg(required = true, value_name = "FILE... KEY=VALUE")]
        args: Vec<String>,
    },
}

/// Runs a `rules` subcommand; the exit code is the command's result.
pub fn run(args: RulesArgs) -> ExitCode {
    match args.command {
        RulesCommand::Check { files } => check(&files),
        RulesCommand::Explain { domain, json, args } => explain(&domain, json, &args),
    }
}

fn check(paths: &[PathBuf]) -> ExitCode {
    let Some(set) = load(paths) else {
        return ExitCode::from(INVALID);
    };
    let rules = set.rules().count();
    let domains = set.domains().count();
    println!(
        "ok: {} {}, {} {}, {} {}",
        set.file_count(),
        plural(set.file_count(), "file", "files"),
        domains,
        plural(domains, "domain", "domains"),
        rules,
        plural(rules, "rule", "rules"),
    );
    ExitCode::SUCCESS
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

/// Reads and parses the files; prints every error to stderr on failure.
fn load(paths: &[PathBuf]) -> Option<RuleSet> {
    let mut files = Vec::with_capacity(paths.len());
    let mut unreadable = false;
    for path in paths {
        match std::fs::read_to_string(path) {
            Ok(text) => files.push(RuleFile {
                name: path.display().to_string(),
                text,
            }),
            Err(e) => {
                eprintln!("{}: cannot read: {e}", path.display());
                unreadable = true;
            }
        }
    }
    match RuleSet::parse(&files) {
        Ok(set) if !unreadable => Some(set),
        Ok(_) => None,
        Err(errors) => {
            let mut err = std::io::stderr().lock();
            for e in &errors.0 {
                // Nothing useful to do if stderr is gone.
                let _ = writeln!(err, "{e}");
            }
            None
        }
    }
}

/// Splits `FILE... KEY=VALUE...`: entries start at the first argument with
/// a `=` that is not an existing file.
fn split_args(args: &[String]) -> (Vec<PathBuf>, Vec<(&str, &str)>) {
    let start = args
        .iter()
        .position(|a| a.contains('=') && !std::path::Path::new(a).is_file())
        .unwrap_or(args.len());
    let files = args[..start].iter().map(PathBuf::from).collect();
    let entries = args[start..]
        .iter()
        .map(|a| a.split_once('=').unwrap_or((a.as_str(), "")))
        .collect();
    (files, entries)
}

fn explain(domain: &str, json: bool, args: &[String]) -> ExitCode {
    let (paths, entries) = split_args(args);
    if paths.is_empty() {
        eprintln!("meridian rules explain: no rule files given");
        return ExitCode::from(INVALID);
    }
    if let Some((bad, _)) = entries.iter().find(|(k, _)| k.is_empty()) {
        eprintln!("meridian rules explain: entry {bad:?} has no key (write KEY=VALUE)");
        return ExitCode::from(INVALID);
    }
    let Some(set) = load(&paths) else {
        return ExitCode::from(INVALID);
    };
    let resolved = set.resolve(domain, &entries);
    let known_domain = set.domains().any(|d| d == domain);
    if json {
        println!("{}", explain_json(domain, known_domain, resolved.as_ref()));
    } else {
        print!(
            "{}",
            explain_text(domain, known_domain, &entries, resolved.as_ref())
        );
    }
    ExitCode::SUCCESS
}

/// The JSON contract of `explain --json` (see check.sh in the Envoy corpus).
fn explain_json(domain: &str, known_domain: bool, resolved: Option<&Resolved<'_>>) -> Value {
    let rule = resolved.and_then(|r| r.rule);
    let mut out = json!({
        "matched": rule.is_some(),
        "allow_listed": resolved.is_some_and(|r| r.rule.is_none()),
        "domain": domain,
        "domain_found": known_domain,
        "counter_key": resolved.map(|r| r.counter_key.as_str()),
        "metric_key": resolved.and_then(|r| r.metric_key.as_deref()),
        "unlimited": rule.is_some_and(|r| r.unlimited),
        "requests_per_unit": rule.map(|r| r.requests_per_unit),
        "unit": rule.filter(|r| !r.unlimited).map(|r| r.unit.name()),
        "period_ms": rule.and_then(|r| r.params.as_ref()).map(|p| p.period().as_millis() as u64),
        "name": rule.and_then(|r| r.name.as_deref()),
        "shadow_mode": rule.is_some_and(|r| r.shadow_mode),
    });
    if let (Some(rule), Value::Object(map)) = (rule, &mut out) {
        let params = rule.params.as_ref();
        let (sync_interval_ms, max_batch) = match rule.accuracy {
            Accuracy::Exact => (None, None),
            Accuracy::Approximate {
                sync_interval,
                max_batch,
            } => (Some(sync_interval.as_millis() as u64), max_batch),
        };
        let limits: Vec<Value> = rule
            .params
            .iter()
            .map(|p| (rule.unit, p))
            .chain(rule.also.iter().map(|(u, p)| (*u, p)))
            .map(|(unit, p)| {
                json!({
                    "requests_per_unit": p.limit(),
                    "unit": unit.name(),
                    "period_ms": p.period().as_millis() as u64,
                    "algorithm": p.algorithm().name(),
                    "burst": p.algorithm().has_burst().then(|| p.burst()),
                })
            })
            .collect();
        let extra = json!({
            "limits": limits,
            "rule_id": rule.id,
            "algorithm": params.map(|p| p.algorithm().name()),
            "burst": params.filter(|p| p.algorithm().has_burst()).map(|p| p.burst()),
            "replaces": rule.replaces,
            "detailed_metric": rule.detailed_metric,
            "value_to_metric": rule.value_to_metric,
            "fail_mode": rule.fail_mode.name(),
            "scope": rule.scope.name(),
            "accuracy": rule.accuracy.name(),
            "sync_interval_ms": sync_interval_ms,
            "max_batch": max_batch,
            "split": rule.split,
            "partition": rule.partition.name(),
            "fallback": rule.fallback,
            "fallback_hold_ms": rule.fallback_hold.as_millis() as u64,
            "file": rule.file,
            "line": rule.line,
        });
        if let Value::Object(extra) = extra {
            map.extend(extra);
        }
    }
    out
}

fn explain_text(
    domain: &str,
    known_domain: bool,
    entries: &[(&str, &str)],
    resolved: Option<&Resolved<'_>>,
) -> String {
    let shown: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut out = format!(
        "descriptor: domain {domain}, entries [{}]\n",
        shown.join(", ")
    );
    match resolved {
        None if !known_domain => {
            out.push_str(&format!(
                "no rule: domain {domain:?} is not defined in these files; not limited\n"
            ));
        }
        None => out.push_str("no rule: the entries match no path in the domain; not limited\n"),
        Some(Resolved {
            rule: None,
            counter_key,
            ..
        }) => {
            out.push_str(&format!(
                "allow-listed: the path ends at a descriptor without rate_limit; not limited \
                 (counter key {counter_key})\n"
            ));
        }
        Some(Resolved {
            rule: Some(rule),
            counter_key,
            metric_key,
        }) => {
            out.push_str(&format!(
                "rule:    {} ({}:{})\n",
                rule.id, rule.file, rule.line
            ));
            out.push_str(&format!("limit:   {}\n", describe_limit(rule)));
            if let Some(name) = &rule.name {
                out.push_str(&format!("name:    {name}\n"));
            }
            if !rule.replaces.is_empty() {
                out.push_str(&format!("replaces: {}\n", rule.replaces.join(", ")));
            }
            out.push_str(&format!("counter: {counter_key}\n"));
            if let Some(metric) = metric_key {
                out.push_str(&format!("metric:  {metric}\n"));
            }
        }
    }
    out
}

fn describe_limit(rule: &Rule) -> String {
    if rule.denies_all() {
        return format!(
            "0 per {}: every request over limit, decided without a counter",
            format_duration(rule.unit.duration())
        );
    }
    let Some(params) = rule.params.as_ref().filter(|_| !rule.unlimited) else {
        return "unlimited (matched, never limited, nothing counted)".to_owned();
    };
    let mut s = format!(
        "{} per {} ({}",
        rule.requests_per_unit,
        format_duration(params.period()),
        params.algorithm()
    );
    if params.algorithm().has_burst() {
        s.push_str(&format!(", burst {}", params.burst()));
    }
    s.push_str(&format!(
        ", fail {}, scope {}, {}",
        rule.fail_mode.name(),
        rule.scope.name(),
        rule.accuracy.name()
    ));
    if rule.split > 1 {
        s.push_str(&format!(", split {}", rule.split));
    }
    s.push(')');
    for (unit, p) in &rule.also {
        s.push_str(&format!(
            " and {} per {} ({}",
            p.limit(),
            format_duration(unit.duration()),
            p.algorithm()
        ));
        if p.algorithm().has_burst() {
            s.push_str(&format!(", burst {}", p.burst()));
        }
        s.push(')');
    }
    if rule.shadow_mode {
        s.push_str(", SHADOW MODE (counted, never denied)");
    }
    s
}
