//! `meridian`: command-line dispatch only.

use clap::{CommandFactory, Parser, Subcommand};
use meridian::commands::{self, LogFormat};

/// The hot path allocates small, short-lived buffers on every check (protobuf
/// messages, Redis commands, keys); mimalloc serves those with less CPU than
/// glibc's allocator under many threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "meridian",
    version,
    about = "Multi-region rate limiter: each region decides against its own Redis; \
             a Raft-backed coordinator divides global limits between regions."
)]
struct Cli {
    /// How logs are written to stderr: text for people (coloured only on a
    /// terminal), json for log collectors (one object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the regional limiter service (Envoy RLS v3, gRPC, HTTP).
    Limiter(commands::LimiterArgs),
    /// Run a coordinator node (Raft cluster holding rules, regions, allocations).
    Coordinator(commands::CoordinatorArgs),
    /// Run the whole system on this machine: 3 coordinators, 2 regions, traffic.
    Demo(commands::DemoArgs),
    /// Replay multi-region traffic in virtual time and measure the bounds.
    Simulate(commands::SimulateArgs),
    /// Load-test a limiter: throughput, latency percentiles, cost per check.
    Bench(commands::BenchArgs),
    /// Check and explain rule files.
    Rules(commands::RulesArgs),
    /// Make a CA and the certificates the control plane's mutual TLS needs.
    Certs(commands::CertsArgs),
    /// Operate a running cluster from a terminal: rules, regions,
    /// allocations, leases, membership, a live view (the admin HTTP API).
    Ctl(commands::CtlArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    commands::install_crypto_provider();
    // openraft logs every election and snapshot step at info; a coordinator
    // shows its own and its libraries' info lines, openraft's warnings.
    let default_filter = match cli.command {
        Command::Coordinator(_) => "info,openraft=warn",
        _ => "meridian=info",
    };
    // The services export OTLP traces when OTEL_EXPORTER_OTLP_ENDPOINT is
    // set: every round of a coordinator, a share of a limiter's checks.
    let service = match cli.command {
        Command::Limiter(_) => Some(commands::Service {
            name: "meridian-limiter",
            ratio: commands::DEFAULT_CHECK_RATIO,
        }),
        Command::Coordinator(_) => Some(commands::Service {
            name: "meridian-coordinator",
            ratio: 1.0,
        }),
        _ => None,
    };
    let format = cli.log_format;
    // Traces need the runtime, so the services set up logs inside theirs.
    let logs = move || commands::init_logs(format, default_filter, service);
    if service.is_none() {
        drop(logs());
    }
    match cli.command {
        // Checks are served on the limiter's own worker threads; the main
        // thread only accepts connections and runs the control tasks.
        Command::Limiter(args) => run_on(true, logs, commands::limiter(args)),
        Command::Coordinator(args) => run_on(false, logs, async {
            Ok(commands::coordinator(args).await?)
        }),
        Command::Demo(args) => run(commands::demo(args)),
        Command::Simulate(args) => commands::simulate(args),
        Command::Bench(args) => run(async { Ok(commands::bench(args).await.map(drop)?) }),
        Command::Rules(args) => commands::rules(args),
        Command::Ctl(args) => commands::ctl(args, Cli::command),
        Command::Certs(args) => match commands::certs(args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Runs a service command on a multi-threaded runtime; an error is printed
/// with its causes and exits 1.
fn run(command: impl std::future::Future<Output = anyhow::Result<()>>) -> std::process::ExitCode {
    run_on(false, || None, command)
}

/// [`run`] on tokio's current-thread runtime when `one_thread` (the caller
/// runs its own threads), else on one worker thread per core. `logs` sets up
/// logging (and traces) inside the runtime; the exporter it returns is
/// flushed before the runtime stops.
fn run_on(
    one_thread: bool,
    logs: impl FnOnce() -> Option<commands::Exporter>,
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> std::process::ExitCode {
    let runtime = if one_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Runtime::new()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let exporter = {
        let _inside = runtime.enter();
        logs()
    };
    let outcome = runtime.block_on(async {
        let outcome = command.await;
        // The flush blocks until the export is done, and the export needs
        // this runtime's threads: a blocking thread waits for it.
        if let Some(exporter) = exporter {
            let _ = tokio::task::spawn_blocking(move || drop(exporter)).await;
        }
        outcome
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
