//! Meridian's integration tests: real Redis, real coordinators and limiters
//! started as processes, real sockets.
//!
//! They are modules of one test binary rather than one binary per file:
//! each binary linked the whole crate and compiled `common` again, and the
//! harness ran them one after another, so a file whose last test waited on
//! a lease left the other thread idle. Run one file with
//! `cargo test --test integration <file>::` (e.g. `global_shift::`).
//!
//! Two tests stay binaries of their own: `rules_resolve_alloc` installs a
//! counting global allocator, and `simulate` is pure CPU that would slow
//! the timing-sensitive tests here.

mod common;

mod admin_auth;
mod approximate;
mod approximate_flood;
mod bench_cli;
mod capacity;
mod cluster;
mod cluster_failover;
mod cluster_id;
mod connection_floods;
mod control_plane_tls;
mod coordinator_api;
mod coordinator_cluster;
mod ctl;
mod dashboard;
mod dashboard_api;
mod demo;
mod deploy;
mod docs_examples;
mod docs_links;
mod drills;
mod envoy_fields;
mod envoy_stream_done;
mod equivalence;
mod global_cost;
mod global_failover;
mod global_in_window;
mod global_last_report;
mod global_partition;
mod global_restart;
mod global_shift;
mod global_top_up;
mod health;
mod hostile_requests;
mod leader_equivalence;
mod limiter_api;
mod limiter_coordinator;
mod logs;
mod multi_limit;
mod overrides;
mod raft_rpc;
mod redis_maxmemory;
mod redis_sentinel;
mod redis_store;
mod report_bounds;
mod report_interval;
mod reserve;
mod reset;
mod reset_regions;
mod rules_cli;
mod rules_diff_load;
mod tracing_otlp;
mod usage;
mod watch_bounds;
