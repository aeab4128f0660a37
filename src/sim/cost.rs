//! Costs that settle later (issue 31) in the simulator: a scenario with a
//! `[cost]` table makes every request a call of log-normal tokens whose
//! cost is known only seconds after admission, and compares three ways of
//! charging it, each over the real rebalancer (the `meridian` strategy's
//! allocations), against an ideal global counter that knows each call's
//! tokens when it admits it:
//!
//! - **charge the estimate**: admit when the estimate fits, charge the
//!   estimate, never correct it (calls above it leak, calls below it
//!   over-charge);
//! - **charge after**: admit while the budget is not spent, charge the
//!   actual tokens when the call ends (Envoy's stream-done `hits_addend`
//!   without a request-time charge): calls in flight all pass;
//! - **reservations**: admit when the estimate fits and hold it, then refund
//!   or charge the excess (up to `max_overdraft`) at the end — the
//!   arithmetic of `algorithm::settle`, as the stores run it.
//!
//! The tokens and settle times are drawn once per step from their own
//! seeded stream and shared by every strategy, as the traffic is.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

use super::scenario::CostSpec;
use super::traffic::Batch;
use crate::algorithm::{KeyState, Micros, Params, settle};

/// How a call's cost is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Charging {
    /// The estimate at admission, never corrected.
    Estimate,
    /// Nothing at admission (admitted while the budget is not spent), the
    /// actual tokens when the call ends.
    After,
    /// A reservation of the estimate, settled at the actual tokens.
    Reserve,
}

impl Charging {
    /// Every way, in the order runs and reports list them.
    pub const ALL: [Charging; 3] = [Charging::Estimate, Charging::After, Charging::Reserve];

    /// The name used in reports and file names.
    pub fn name(self) -> &'static str {
        match self {
            Charging::Estimate => "charge-estimate",
            Charging::After => "charge-after",
            Charging::Reserve => "reservations",
        }
    }
}

/// One call: the tokens it turns out to cost, and how long after its
/// admission that is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Call {
    pub tokens: u64,
    pub settle_after_ms: i64,
}

/// The calls of every step: per region, per batch entry (same order as the
/// step's [`Batch`]es), one [`Call`] per hit.
pub type Calls = Vec<Vec<Vec<Call>>>;

/// Draws each call's tokens (log-normal, median `median`, shape `sigma`,
/// between 1 and `max_cost`) and settle time (uniform in the scenario's
/// range).
pub struct Costs {
    rng: StdRng,
    tokens: LogNormal<f64>,
    spec: CostSpec,
}

impl Costs {
    pub fn new(spec: &CostSpec, seed: u64) -> Costs {
        Costs {
            // A stream of its own: neither the traffic nor any strategy
            // perturbs the costs each one sees.
            rng: StdRng::seed_from_u64(seed ^ 0x636f_7374),
            // Validated: median > 0, sigma finite and ≥ 0.
            tokens: LogNormal::new(spec.median.ln(), spec.sigma)
                .unwrap_or_else(|_| LogNormal::new(0.0, 0.0).expect("a point mass at 1")),
            spec: spec.clone(),
        }
    }

    /// The calls of one step's `batches`.
    pub fn draw(&mut self, batches: &[Batch], out: &mut Calls) {
        out.resize_with(batches.len(), Vec::new);
        for (region, batch) in batches.iter().enumerate() {
            let calls = &mut out[region];
            calls.clear();
            for &(_, n) in batch {
                let one = (0..n)
                    .map(|_| Call {
                        tokens: (self.tokens.sample(&mut self.rng).round() as u64)
                            .clamp(1, self.spec.max_cost),
                        settle_after_ms: self
                            .rng
                            .random_range(self.spec.settle_min_ms..=self.spec.settle_max_ms),
                    })
                    .collect();
                calls.push(one);
            }
        }
    }
}

/// An admitted call not yet settled.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub region: usize,
    pub pod: usize,
    pub key: u32,
    /// When its estimate was charged (the reservation's time).
    pub charged_at_us: Micros,
    pub tokens: u64,
}

/// What settling one call did to its counter: (refunded, charged).
///
/// `Reserve` settles as a commit does (`algorithm::settle`: the refund back
/// where the estimate was charged, the excess up to `overdraft`); `After`
/// charges every token now, with no cap (that flow has none: its bound is
/// concurrency × the largest call); `Estimate` does nothing.
pub fn settle_call(
    charging: Charging,
    state: &mut KeyState,
    call: &Pending,
    estimate: u64,
    overdraft: u64,
    now: Micros,
    params: &Params,
) -> (u64, u64) {
    match charging {
        Charging::Estimate => (0, 0),
        Charging::After => {
            let uncapped = settle::max_exact_overdraft(params);
            (0, settle::charge(state, now, call.tokens, uncapped, params))
        }
        Charging::Reserve if call.tokens <= estimate => {
            let back = settle::refund(
                state,
                call.charged_at_us,
                now,
                estimate - call.tokens,
                params,
            );
            (back, 0)
        }
        Charging::Reserve => (
            0,
            settle::charge(state, now, call.tokens - estimate, overdraft, params),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use std::time::Duration;

    fn spec() -> CostSpec {
        CostSpec {
            estimate: 1_000,
            median: 600.0,
            sigma: 1.0,
            max_cost: 20_000,
            settle_min_ms: 1_000,
            settle_max_ms: 30_000,
            max_overdraft: Some(5_000),
        }
    }

    #[test]
    fn calls_are_log_normal_within_bounds_and_the_same_for_the_same_seed() {
        let batches = vec![vec![(0u32, 5_000u32)]];
        let (mut a, mut b) = (Calls::new(), Calls::new());
        Costs::new(&spec(), 7).draw(&batches, &mut a);
        Costs::new(&spec(), 7).draw(&batches, &mut b);
        assert_eq!(a, b);
        let calls = &a[0][0];
        assert_eq!(calls.len(), 5_000);
        let mut tokens: Vec<u64> = calls.iter().map(|c| c.tokens).collect();
        tokens.sort_unstable();
        let median = tokens[tokens.len() / 2];
        assert!((540..=660).contains(&median), "median {median}");
        assert!(tokens.iter().all(|&t| (1..=20_000).contains(&t)));
        assert!(
            calls
                .iter()
                .all(|c| (1_000..=30_000).contains(&c.settle_after_ms))
        );
    }

    #[test]
    fn a_reservation_settles_as_a_commit_and_charge_after_charges_everything() {
        let params = Params::new(
            Algorithm::FixedWindow,
            10_000,
            Duration::from_secs(60),
            None,
        )
        .expect("params");
        let t = 1_700_006_400_000_000;
        let call = |tokens| Pending {
            region: 0,
            pod: 0,
            key: 0,
            charged_at_us: t,
            tokens,
        };
        let mut state = KeyState::fresh(Algorithm::FixedWindow);
        assert!(state.decide(t, 9_000, &params).decision.allowed);
        let reserve = |state: &mut KeyState, tokens| {
            settle_call(
                Charging::Reserve,
                state,
                &call(tokens),
                1_000,
                500,
                t + 5,
                &params,
            )
        };
        assert_eq!(reserve(&mut state, 400), (600, 0));
        // 8,400 counted; an excess of 3,000 may take it to 10,500 only.
        assert_eq!(reserve(&mut state, 4_000), (0, 2_100));
        let after = settle_call(
            Charging::After,
            &mut state,
            &call(7_000),
            1_000,
            0,
            t + 6,
            &params,
        );
        assert_eq!(after, (0, 7_000), "no cap");
        let estimate = settle_call(
            Charging::Estimate,
            &mut state,
            &call(1),
            1_000,
            0,
            t + 7,
            &params,
        );
        assert_eq!(estimate, (0, 0));
    }
}
