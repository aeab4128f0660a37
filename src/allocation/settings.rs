//! The one check of the leader's settings. The coordinator's flags and a
//! simulator scenario's `[coordinator]` table both build a
//! [`LeaderConfig`] and ask it here, so a scenario is refused exactly when
//! the coordinator would refuse the same settings; each surface names the
//! setting its own way ([`Setting::flag`], [`Setting::field`]).

use super::cadence::report_interval_for;
use super::leader::LeaderConfig;

/// A setting of the leader, as the coordinator and the simulator name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// How often scheduled rounds run.
    RebalanceInterval,
    /// How long before each multiple of the interval a round ends.
    RoundLead,
    /// How long an allocation stays valid without renewal.
    Lease,
    /// Silence after which an `available` region's share moves.
    SuspectAfter,
    /// The clock skew the centre allows regions.
    SkewMargin,
    /// The demand estimator's smoothing.
    EwmaAlpha,
    /// Share granted above smoothed demand.
    Headroom,
    /// Each region's floor, a fraction of its static share.
    Floor,
    /// Moves smaller than this fraction of the limit are not published.
    Hysteresis,
    /// The most of the limit one round may move.
    MaxShift,
}

impl Setting {
    /// The coordinator's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Setting::RebalanceInterval => "--rebalance-interval",
            Setting::RoundLead => "--round-lead",
            Setting::Lease => "--lease",
            Setting::SuspectAfter => "--suspect-after",
            Setting::SkewMargin => "--skew-margin",
            Setting::EwmaAlpha => "--ewma-alpha",
            Setting::Headroom => "--headroom",
            Setting::Floor => "--floor",
            Setting::Hysteresis => "--hysteresis",
            Setting::MaxShift => "--max-shift",
        }
    }

    /// The simulator scenario's field.
    pub fn field(self) -> &'static str {
        match self {
            Setting::RebalanceInterval => "coordinator.rebalance_interval_s",
            Setting::RoundLead => "coordinator.round_lead_ms",
            Setting::Lease => "coordinator.lease_s",
            Setting::SuspectAfter => "coordinator.suspect_after_s",
            Setting::SkewMargin => "coordinator.skew_margin_ms",
            Setting::EwmaAlpha => "coordinator.ewma_alpha",
            Setting::Headroom => "coordinator.headroom",
            Setting::Floor => "coordinator.floor",
            Setting::Hysteresis => "coordinator.hysteresis",
            Setting::MaxShift => "coordinator.max_shift",
        }
    }
}

/// Why a configuration is refused: the setting at fault, and its value
/// with what is accepted (in words both surfaces share).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The setting at fault.
    pub setting: Setting,
    /// Its value, and what is accepted.
    pub reason: String,
}

/// The shortest rebalance interval: every round is a Raft commit.
pub const MIN_REBALANCE_INTERVAL_MS: i64 = 100;

/// `1500 ms`, `60 s`: a duration as the reasons print it.
fn duration(ms: i64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

impl LeaderConfig {
    /// Every setting in range and consistent with the others.
    pub fn check(&self) -> Result<(), Refusal> {
        let refuse = |setting, reason: String| Err(Refusal { setting, reason });
        let c = &self.rebalancer;
        let interval = self.rebalance_interval_ms;
        if interval < MIN_REBALANCE_INTERVAL_MS {
            return refuse(
                Setting::RebalanceInterval,
                format!(
                    "{}: at least {}",
                    duration(interval),
                    duration(MIN_REBALANCE_INTERVAL_MS)
                ),
            );
        }
        if !(0..=interval / 2).contains(&self.round_lead_ms) {
            return refuse(
                Setting::RoundLead,
                format!(
                    "{}: between 0 and half of the rebalance interval ({})",
                    duration(self.round_lead_ms),
                    duration(interval)
                ),
            );
        }
        // Leases are renewed with a third left, at that instant (not at the
        // next scheduled round), to regions heard within `suspect_after`:
        // a live region must be heard within it, and it within the lease.
        let reports = report_interval_for(interval) as i64;
        if c.suspect_after_ms < 2 * reports {
            return refuse(
                Setting::SuspectAfter,
                format!(
                    "{} must be at least two report intervals ({}: limiters report every {} \
                     with a {} rebalance interval), or a live region passes for silent between \
                     its reports and loses its lease",
                    duration(c.suspect_after_ms),
                    duration(2 * reports),
                    duration(reports),
                    duration(interval)
                ),
            );
        }
        if c.suspect_after_ms >= c.lease_ms {
            return refuse(
                Setting::Lease,
                format!(
                    "{} must be longer than the suspect-after time ({}): a lease is \
                     renewed only to a region heard within it",
                    duration(c.lease_ms),
                    duration(c.suspect_after_ms)
                ),
            );
        }
        if c.skew_margin_ms < 0 {
            return refuse(
                Setting::SkewMargin,
                format!("{}: must be 0 or more", c.skew_margin_ms),
            );
        }
        if !(c.ewma_alpha > 0.0 && c.ewma_alpha <= 1.0) {
            return refuse(
                Setting::EwmaAlpha,
                format!("{}: must be above 0 and at most 1", c.ewma_alpha),
            );
        }
        if !(c.headroom >= 0.0 && c.headroom.is_finite()) {
            return refuse(
                Setting::Headroom,
                format!("{}: must be 0 or more", c.headroom),
            );
        }
        let fractions = [
            (Setting::Floor, Some(c.floor)),
            (Setting::Hysteresis, Some(c.hysteresis)),
            (Setting::MaxShift, c.max_shift),
        ];
        for (setting, v) in fractions {
            if let Some(v) = v.filter(|v| !(0.0..=1.0).contains(v)) {
                return refuse(setting, format!("{v}: must be between 0 and 1"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::Config;

    fn config(interval_ms: i64, lease_ms: i64) -> LeaderConfig {
        LeaderConfig {
            rebalancer: Config {
                lease_ms,
                ..Config::default()
            },
            rebalance_interval_ms: interval_ms,
            round_lead_ms: 0,
            top_up: true,
        }
    }

    #[test]
    fn a_lease_no_longer_than_suspect_after_is_refused_naming_both() {
        let mut c = config(60_000, 20_000);
        c.rebalancer.suspect_after_ms = 20_000;
        let refused = c.check().expect_err("20 s lease, suspect after 20 s");
        assert_eq!(refused.setting, Setting::Lease);
        assert!(
            refused
                .reason
                .starts_with("20 s must be longer than the suspect-after time (20 s)"),
            "{}",
            refused.reason
        );
        // Renewals no longer wait for scheduled rounds: a lease shorter
        // than the rebalance interval is fine.
        assert!(config(60_000, 30_000).check().is_ok());
    }

    #[test]
    fn suspect_after_shorter_than_two_report_intervals_is_refused() {
        let mut c = config(60_000, 30_000);
        c.rebalancer.suspect_after_ms = 15_000;
        let refused = c.check().expect_err("reports every 10 s");
        assert_eq!(refused.setting, Setting::SuspectAfter);
        assert!(
            refused.reason.starts_with(
                "15 s must be at least two report intervals (20 s: limiters report every 10 s"
            ),
            "{}",
            refused.reason
        );
        c.rebalance_interval_ms = 2_000;
        assert!(c.check().is_ok(), "reports every 1 s");
    }

    #[test]
    fn every_setting_out_of_range_is_named() {
        let mut c = config(500, 1_500);
        c.round_lead_ms = 300;
        assert_eq!(c.check().map_err(|r| r.setting), Err(Setting::RoundLead));
        let mut c = config(60_000, 180_000);
        c.rebalancer.suspect_after_ms = 5_000;
        assert_eq!(c.check().map_err(|r| r.setting), Err(Setting::SuspectAfter));
        let mut c = config(60_000, 180_000);
        c.rebalancer.ewma_alpha = 0.0;
        assert_eq!(c.check().map_err(|r| r.setting), Err(Setting::EwmaAlpha));
        let mut c = config(60_000, 180_000);
        c.rebalancer.max_shift = Some(1.5);
        assert_eq!(c.check().map_err(|r| r.setting), Err(Setting::MaxShift));
        assert_eq!(
            config(50, 1_000).check().map_err(|r| r.setting),
            Err(Setting::RebalanceInterval)
        );
    }
}
