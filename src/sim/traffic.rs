//! Demand: how many hits each customer asks for in each region, step by step.
//!
//! Customer `c` asks for `rate_c × share_r(t) × surges` hits per second in
//! region `r`, drawn as Poisson counts per step. Customers that ask for at
//! least one hit per step (and every customer a surge names) are drawn one by
//! one; the long Zipf tail is drawn as one Poisson total per region, spread
//! over tail customers by weight (an alias table). That keeps a step's cost
//! proportional to the hits it holds, not to the number of customers, and is
//! the same distribution as drawing each tail customer alone.
//!
//! Traffic is generated once per step and shared by every strategy, so they
//! are compared on exactly the same requests.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::weighted::WeightedAliasIndex;
use rand_distr::{Distribution, Poisson};

use super::scenario::{Scenario, Shape};

/// One step's requests in one region: (customer, hits), sorted by customer.
pub type Batch = Vec<(u32, u32)>;

pub struct Traffic {
    rng: StdRng,
    /// Hits per second of each customer, all regions together.
    rates: Vec<f64>,
    /// Customers drawn one by one, ascending.
    heavy: Vec<u32>,
    /// The rest, drawn through `alias`.
    tail: Vec<u32>,
    tail_rate: f64,
    alias: Option<WeightedAliasIndex<f64>>,
    draws: Vec<u32>,
}

impl Traffic {
    pub fn new(scenario: &Scenario, seed: u64) -> Traffic {
        let t = &scenario.traffic;
        let rates: Vec<f64> = (0..t.customers)
            .map(|k| t.rate / ((k + 1) as f64).powf(t.zipf))
            .collect();
        let step_s = scenario.step_ms as f64 / 1000.0;
        let named: Vec<usize> = t
            .surges
            .iter()
            .filter_map(|s| s.customers.as_ref())
            .flatten()
            .copied()
            .collect();
        let (mut heavy, mut tail) = (Vec::new(), Vec::new());
        for (k, rate) in rates.iter().enumerate() {
            if rate * step_s >= 1.0 || named.contains(&k) {
                heavy.push(k as u32);
            } else {
                tail.push(k as u32);
            }
        }
        let weights: Vec<f64> = tail.iter().map(|&k| rates[k as usize]).collect();
        let tail_rate = weights.iter().sum();
        let alias = (!tail.is_empty())
            .then(|| WeightedAliasIndex::new(weights).ok())
            .flatten();
        Traffic {
            // The traffic stream is its own: strategies draw from other
            // streams, so they cannot perturb the requests each one sees.
            rng: StdRng::seed_from_u64(seed ^ 0x7261_6666_6963),
            rates,
            heavy,
            tail,
            tail_rate,
            alias,
            draws: Vec::new(),
        }
    }

    /// Every region's requests for the step starting at `t_ms`.
    pub fn step(&mut self, scenario: &Scenario, t_ms: i64, out: &mut [Batch]) {
        let shares = shares(scenario, t_ms);
        let step_s = scenario.step_ms as f64 / 1000.0;
        for (r, batch) in out.iter_mut().enumerate() {
            batch.clear();
            if shares[r] <= 0.0 {
                continue;
            }
            for &c in &self.heavy {
                let lambda = self.rates[c as usize]
                    * shares[r]
                    * surge(scenario, Some(c as usize), r, t_ms)
                    * step_s;
                let n = poisson(&mut self.rng, lambda);
                if n > 0 {
                    batch.push((c, n));
                }
            }
            if let Some(alias) = &self.alias {
                let lambda = self.tail_rate * shares[r] * surge(scenario, None, r, t_ms) * step_s;
                let n = poisson(&mut self.rng, lambda);
                self.draws.clear();
                for _ in 0..n {
                    self.draws.push(self.tail[alias.sample(&mut self.rng)]);
                }
                self.draws.sort_unstable();
                for chunk in self.draws.chunk_by(|a, b| a == b) {
                    batch.push((chunk[0], chunk.len() as u32));
                }
            }
            batch.sort_unstable_by_key(|(c, _)| *c);
        }
    }
}

fn poisson(rng: &mut StdRng, lambda: f64) -> u32 {
    if lambda <= 0.0 {
        return 0;
    }
    match Poisson::new(lambda) {
        Ok(p) => p.sample(rng).min(u32::MAX as f64) as u32,
        Err(_) => 0,
    }
}

/// Each region's share of demand at `t_ms` (0 where the region is down: its
/// traffic fails over to the others in proportion to their shares).
pub fn shares(scenario: &Scenario, t_ms: i64) -> Vec<f64> {
    let t = &scenario.traffic;
    let base = t
        .shifts
        .iter()
        .rev()
        .find(|s| s.at_ms <= t_ms)
        .map_or(&t.mix, |s| &s.mix);
    let mut out: Vec<f64> = scenario
        .regions
        .iter()
        .zip(base)
        .map(|(region, share)| {
            let up = !region.failures.iter().any(|f| f.contains(t_ms));
            if !up {
                return 0.0;
            }
            match t.shape {
                Shape::Steady => *share,
                Shape::FollowTheSun => {
                    let hour = (t_ms as f64 / 3_600_000.0).rem_euclid(24.0);
                    let phase = 2.0 * std::f64::consts::PI * (hour - region.peak_hour) / 24.0;
                    // Busy around local noon, a trickle at night.
                    share * (0.05 + (0.5 + 0.5 * phase.cos()).powi(3))
                }
            }
        })
        .collect();
    let total: f64 = out.iter().sum();
    if total > 0.0 {
        for s in &mut out {
            *s /= total;
        }
    }
    out
}

/// The product of the surges in force for `customer` (`None`: the tail,
/// which only surges naming no customers reach) in region `r`.
fn surge(scenario: &Scenario, customer: Option<usize>, r: usize, t_ms: i64) -> f64 {
    scenario
        .traffic
        .surges
        .iter()
        .filter(|s| s.span.contains(t_ms) && s.region.is_none_or(|x| x == r))
        .filter(|s| match (&s.customers, customer) {
            (None, _) => true,
            (Some(list), Some(c)) => list.contains(&c),
            (Some(_), None) => false,
        })
        .map(|s| s.factor)
        .product()
}
