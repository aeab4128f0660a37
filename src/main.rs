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

#[derive(Subcommand)]
enum Command {
    /// Run the regional limiter service (Envoy RLS v3, gRPC, HTTP).
    Limiter,
    /// Run a coordinator node (Raft cluster holding rules, regions, allocations).
    Coordinator(meridian::coordinator::CoordinatorArgs),
    /// Operate a coordinator cluster through its admin API.
    Ctl,
    /// Run the whole system on this machine: 3 coordinators, 2 regions, traffic.
    Demo,
    /// Replay multi-region traffic in virtual time and measure the bounds.
    Simulate,
    /// Load-test a limiter and report latency histograms.
    Bench,
    /// Check and explain rule files.
    Rules,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let name = match cli.command {
        Command::Limiter => "limiter",
        Command::Coordinator(args) => return meridian::coordinator::main(args),
        Command::Ctl => "ctl",
        Command::Demo => "demo",
        Command::Simulate => "simulate",
        Command::Bench => "bench",
        Command::Rules => "rules",
    };
    eprintln!("meridian {name}: not yet implemented");
    std::process::ExitCode::FAILURE
}
