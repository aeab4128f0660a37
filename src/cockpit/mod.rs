//! The cockpit: every surface an operator reads or drives the cluster
//! through, on top of the replicated core in [`coordinator`](crate::coordinator)
//! — the admin HTTP API ([`api`]), the dashboard it serves (`dashboard/`:
//! the page's assets, compiled in), the dashboard's history of every global
//! rule ([`history`]), the live update its event streams send ([`live`]) and
//! who may hold those streams ([`viewers`]).
//!
//! The cockpit imports the core; the core never imports the cockpit, except
//! where [`coordinator::run`](crate::coordinator::run) starts a node's
//! servers and loops: the one place both are wired together.

pub mod api;
pub mod history;
pub mod ledger_json;
pub mod live;
pub mod viewers;
