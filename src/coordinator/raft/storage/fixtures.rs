//! The committed snapshot fixtures and the state they hold, shared by the
//! storage tests of the format, the state machine and the data dir.

use super::format::Applied;
use crate::coordinator::drill::Drills;
use crate::coordinator::raft::{LogId, StoredMembership};
use crate::coordinator::state::Registry;

/// The cluster id in the version-2 fixture.
pub(super) const FIXTURE_CLUSTER_ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// The state the committed fixtures hold: two regions, a rule set put in
/// canary then rolled back, two allocation epochs (a split change and a
/// key entry) and, from version 2, a cluster id, so every replicated
/// type appears in them.
pub(super) fn fixture_applied() -> Applied {
    use std::collections::BTreeMap;

    use crate::allocation::{Allocations, KeyAllocation, RegionLease, RuleAllocation, Slot};
    use crate::coordinator::raft::Member;
    use crate::coordinator::state::{Command, RegionState, Stage};

    let mut registry = Registry::default();
    let mut commands = vec![
        Command::PutRegion {
            name: "eu".into(),
            weight: 1.0,
            state: RegionState::Active,
            at_unix_ms: 1_000,
        },
        Command::PutRegion {
            name: "us".into(),
            weight: 2.0,
            state: RegionState::Draining,
            at_unix_ms: 1_001,
        },
        Command::PutRules {
            files: BTreeMap::from([("a.yaml".into(), "domain: a\n".into())]),
            stage: Stage::All,
            at_unix_ms: 2_000,
        },
        Command::PutRules {
            files: BTreeMap::from([("a.yaml".into(), "domain: b\n".into())]),
            stage: Stage::Canary {
                regions: vec!["eu".into()],
            },
            at_unix_ms: 3_000,
        },
        Command::Rollback {
            to: None,
            at_unix_ms: 4_000,
        },
        Command::SetClusterId(FIXTURE_CLUSTER_ID.parse().expect("cluster id")),
    ];
    let slot = |granted| Slot {
        granted,
        bound: granted,
        target: granted,
        since: 1,
        ..Slot::default()
    };
    let mut state = Allocations::default();
    let mut next = Allocations {
        epoch: 1,
        at_ms: 5_000,
        regions: BTreeMap::from([(
            "eu".into(),
            RegionLease {
                valid_until_ms: 185_000,
                acked: 0,
                last_heard_ms: 4_900,
            },
        )]),
        rules: BTreeMap::from([(
            "a/global".into(),
            RuleAllocation {
                limit: 1_000,
                fallback: BTreeMap::from([("eu".into(), 30), ("us".into(), 60)]),
                split: BTreeMap::from([("eu".into(), slot(400)), ("us".into(), slot(600))]),
                high_water: 1_000,
                demand: BTreeMap::from([("eu".into(), 350.0), ("us".into(), 500.0)]),
                keys: BTreeMap::new(),
            },
        )]),
        ..Allocations::default()
    };
    commands.push(Command::Epoch(state.diff(&next)));
    state.apply(&state.diff(&next));
    next.epoch = 2;
    next.at_ms = 65_000;
    if let Some(rule) = next.rules.get_mut("a/global") {
        rule.keys.insert(
            "user-7".into(),
            KeyAllocation {
                shares: BTreeMap::from([("eu".into(), slot(900)), ("us".into(), slot(100))]),
                demand: BTreeMap::from([("eu".into(), 800.0)]),
            },
        );
    }
    commands.push(Command::Epoch(state.diff(&next)));
    // From version 3: a drill, stopped, with observations.
    use crate::coordinator::drill::{Actor, Event, Mode, StartDrill, Stop, StopReason, What};
    let actor = Actor {
        credential: "admin token sha256:0a1b2c3d".into(),
        from: "10.0.0.9:5123".into(),
        operator: Some("ops".into()),
    };
    commands.push(Command::StartDrill(StartDrill {
        region: "eu".into(),
        mode: Mode::Drain,
        duration_ms: Some(30_000),
        note: "quarterly drill".into(),
        force: false,
        by: actor.clone(),
        at_unix_ms: 70_000,
    }));
    commands.push(Command::DrillObserved {
        id: 1,
        events: vec![
            Event {
                at_unix_ms: 70_300,
                what: What::Acknowledged { epoch: 3 },
            },
            Event {
                at_unix_ms: 70_400,
                what: What::Window {
                    rule: "a/global".into(),
                    start_ms: 60_000,
                    admitted: BTreeMap::from([("eu".into(), 300), ("us".into(), 500)]),
                    estimated: vec!["us".into()],
                },
            },
        ],
    });
    commands.push(Command::StopDrill {
        id: 1,
        stop: Stop {
            at_unix_ms: 80_000,
            by: actor,
            reason: StopReason::Stopped,
        },
    });
    // From version 4: an override.
    commands.push(Command::SetOverrides(crate::overrides::OverrideChange {
        set: vec![crate::overrides::Override {
            domain: "a".into(),
            entries: vec![("user".into(), "7".into())],
            rule: "a|user".into(),
            key: "user=7".into(),
            limit: 5_000,
            burst: None,
            expires_at_unix_ms: Some(90_000_000),
            reason: "enterprise plan".into(),
            set_by: "admin token sha256:0a1b2c3d (ops)".into(),
            set_at_unix_ms: 85_000,
            rule_name: None,
        }],
        remove: Vec::new(),
        replace_all: false,
        import: None,
        at_unix_ms: 85_000,
    }));
    commands.push(Command::StartReset(
        crate::coordinator::resets::StartReset {
            domain: "a".into(),
            entries: vec![("user".into(), "7".into())],
            rule: None,
            key: None,
            by: actor_reset(),
            at_unix_ms: 86_000,
            regions: vec!["eu".into(), "us".into()],
        },
    ));
    commands.push(Command::ResetAnswered {
        id: 1,
        region: "eu".into(),
        answer: crate::coordinator::resets::RegionAnswer {
            at_unix_ms: 86_100,
            pod: "eu-0".into(),
            ok: true,
            detail: "2 store keys".into(),
        },
    });
    for command in commands {
        registry.apply(command);
    }
    assert_eq!(
        registry.drills.by_id.len(),
        1,
        "the fixture's drill was applied"
    );
    let leader = openraft::CommittedLeaderId::new(3, 1);
    let members = BTreeMap::from([(
        1,
        Member {
            raft_addr: "10.0.0.1:7000".into(),
            http_addr: "10.0.0.1:8080".into(),
        },
    )]);
    Applied {
        last_applied: Some(LogId::new(leader, 42)),
        membership: StoredMembership::new(
            Some(LogId::new(leader, 2)),
            openraft::Membership::new(vec![std::collections::BTreeSet::from([1])], members),
        ),
        registry,
    }
}

fn actor_reset() -> crate::coordinator::drill::Actor {
    crate::coordinator::drill::Actor {
        credential: "admin token sha256:0a1b2c3d".into(),
        from: "10.0.0.9:5124".into(),
        operator: None,
    }
}

/// [`fixture_applied`] as version 3 holds it: without overrides nor resets.
pub(super) fn fixture_applied_v3() -> Applied {
    let mut applied = fixture_applied();
    applied.registry.overrides = Default::default();
    applied.registry.resets = Default::default();
    applied.registry.override_imports = Default::default();
    applied
}

/// [`fixture_applied`] as version 2 holds it: without drills (nor overrides).
pub(super) fn fixture_applied_v2() -> Applied {
    let mut applied = fixture_applied_v3();
    applied.registry.drills = Drills::default();
    applied
}

/// [`fixture_applied`] as version 1 holds it: without a cluster id (nor drills).
pub(super) fn fixture_applied_v1() -> Applied {
    let mut applied = fixture_applied_v2();
    applied.registry.cluster_id = None;
    applied
}

/// A version-1 snapshot of [`fixture_applied_v1`], committed so that a
/// change to any stored type's encoding fails here instead of on an
/// operator's data dir. Never rewritten: a new
/// [`FORMAT_VERSION`](super::format::FORMAT_VERSION) adds its own file beside
/// it, the bytes of `encode_snapshot(&fixture_applied())` in that build. The
/// v1 file was first written from the build before format versions
/// (`4e0c7bf`); a test in `format` re-encodes its payload byte for byte
/// through `AppliedV1`.
pub(super) const SNAPSHOT_V1: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/raft/snapshot-v1.bin"
));

/// The version-2 snapshot of [`fixture_applied`], first written by the
/// build that introduced version 2; re-encoded byte for byte by a test in `format`.
pub(super) const SNAPSHOT_V2: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/raft/snapshot-v2.bin"
));

/// The version-3 snapshot of [`fixture_applied`], first written by the
/// build that introduced version 3; re-encoded byte for byte by a test in `format`.
pub(super) const SNAPSHOT_V3: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/raft/snapshot-v3.bin"
));

/// The version-4 snapshot of [`fixture_applied`], first written by the
/// build that introduced version 4; re-encoded byte for byte by a test in `format`.
pub(super) const SNAPSHOT_V4: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/raft/snapshot-v4.bin"
));
