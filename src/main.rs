//! `meridian`: command-line dispatch only.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "meridian",
    version,
    about = "Multi-region rate limiter: each region decides against its own Redis; \
             a Raft-backed coordinator divides global limits between regions."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the regional limiter service (Envoy RLS v3, gRPC, HTTP).
    Limiter,
    /// Run a coordinator node (Raft cluster holding rules, regions, allocations).
    Coordinator,
    /// Operate a coordinator cluster through its admin API.
    Ctl,
    /// Run the whole system on this machine: 3 coordinators, 2 regions, traffic.
    Demo,
    /// Replay multi-region traffic in virtual time and measure the bounds.
    Simulate,
    /// Load-test a limiter and report latency histograms.
    Bench(meridian::bench::BenchArgs),
    /// Check and explain rule files.
    Rules,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let name = match cli.command {
        Command::Bench(args) => return bench(args),
        Command::Limiter => "limiter",
        Command::Coordinator => "coordinator",
        Command::Ctl => "ctl",
        Command::Demo => "demo",
        Command::Simulate => "simulate",
        Command::Rules => "rules",
    };
    eprintln!("meridian {name}: not yet implemented");
    std::process::ExitCode::FAILURE
}

fn bench(args: meridian::bench::BenchArgs) -> std::process::ExitCode {
    let outcome = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| Ok(runtime.block_on(meridian::bench::run(args))?));
    match outcome {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meridian bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
