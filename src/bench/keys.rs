//! Which key each check addresses: uniform, Zipf-skewed, or one hot key.
//!
//! Keys are the indices `0..n`, written in decimal; index 0 is the most
//! popular under `zipf` and the hot key under `hot`.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Zipf exponent when `--dist zipf` gives none: the classic web-traffic skew.
pub const DEFAULT_ZIPF_S: f64 = 1.0;
/// Share of the hot key when `--dist hot` gives none.
pub const DEFAULT_HOT_FRACTION: f64 = 0.5;

/// The shape of `--dist`, before it knows how many keys there are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDist {
    Uniform,
    /// Key of rank r (1-based) drawn with probability ∝ 1 / r^s.
    Zipf {
        s: f64,
    },
    /// Key 0 gets `fraction` of the checks; the rest spread uniformly over the others.
    Hot {
        fraction: f64,
    },
}

impl FromStr for KeyDist {
    type Err = String;

    fn from_str(text: &str) -> Result<KeyDist, String> {
        let (name, param) = match text.split_once(':') {
            Some((name, param)) => (name, Some(param)),
            None => (text, None),
        };
        let number = |default: f64| -> Result<f64, String> {
            match param {
                None => Ok(default),
                Some(p) => p
                    .parse::<f64>()
                    .map_err(|_| format!("`{p}` is not a number")),
            }
        };
        match name {
            "uniform" if param.is_none() => Ok(KeyDist::Uniform),
            "zipf" => {
                let s = number(DEFAULT_ZIPF_S)?;
                if !(s.is_finite() && s >= 0.0) {
                    return Err(format!("zipf exponent must be ≥ 0, got {s}"));
                }
                Ok(KeyDist::Zipf { s })
            }
            "hot" => {
                let fraction = number(DEFAULT_HOT_FRACTION)?;
                if !(0.0..=1.0).contains(&fraction) {
                    return Err(format!("hot fraction must be in [0, 1], got {fraction}"));
                }
                Ok(KeyDist::Hot { fraction })
            }
            _ => Err(format!(
                "expected uniform, zipf[:S] or hot[:FRACTION], got `{text}`"
            )),
        }
    }
}

impl fmt::Display for KeyDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDist::Uniform => write!(f, "uniform"),
            KeyDist::Zipf { s } => write!(f, "zipf:{s}"),
            KeyDist::Hot { fraction } => write!(f, "hot:{fraction}"),
        }
    }
}

/// Draws key indices in `0..keys` with a [`KeyDist`].
#[derive(Debug, Clone)]
pub struct KeySampler {
    keys: u64,
    shape: Shape,
}

#[derive(Debug, Clone)]
enum Shape {
    Uniform,
    Zipf(Zipf<f64>),
    Hot { fraction: f64 },
}

impl KeySampler {
    /// `keys` must be at least 1.
    pub fn new(dist: KeyDist, keys: u64) -> Result<KeySampler, String> {
        if keys == 0 {
            return Err("at least one key is needed".into());
        }
        let shape = match dist {
            KeyDist::Uniform => Shape::Uniform,
            KeyDist::Zipf { s } => Shape::Zipf(
                Zipf::new(keys as f64, s).map_err(|e| format!("zipf:{s} over {keys} keys: {e}"))?,
            ),
            KeyDist::Hot { fraction } => Shape::Hot { fraction },
        };
        Ok(KeySampler { keys, shape })
    }

    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        match &self.shape {
            Shape::Uniform => rng.random_range(0..self.keys),
            // Zipf yields ranks 1..=n as floats; rank 1 is key 0.
            Shape::Zipf(zipf) => (zipf.sample(rng) as u64).clamp(1, self.keys) - 1,
            Shape::Hot { fraction } => {
                if self.keys == 1 || rng.random_bool(*fraction) {
                    0
                } else {
                    rng.random_range(1..self.keys)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const DRAWS: usize = 200_000;

    fn counts(dist: KeyDist, keys: u64) -> Vec<usize> {
        let sampler = KeySampler::new(dist, keys).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0; keys as usize];
        for _ in 0..DRAWS {
            counts[sampler.sample(&mut rng) as usize] += 1;
        }
        counts
    }

    fn share(count: usize) -> f64 {
        count as f64 / DRAWS as f64
    }

    #[test]
    fn parses_every_form_with_defaults() {
        assert_eq!("uniform".parse(), Ok(KeyDist::Uniform));
        assert_eq!("zipf".parse(), Ok(KeyDist::Zipf { s: 1.0 }));
        assert_eq!("zipf:1.3".parse(), Ok(KeyDist::Zipf { s: 1.3 }));
        assert_eq!("hot".parse(), Ok(KeyDist::Hot { fraction: 0.5 }));
        assert_eq!("hot:0.9".parse(), Ok(KeyDist::Hot { fraction: 0.9 }));
    }

    #[test]
    fn rejects_bad_shapes_and_parameters() {
        for bad in [
            "",
            "normal",
            "uniform:1",
            "zipf:x",
            "zipf:-1",
            "hot:1.5",
            "hot:nan",
        ] {
            assert!(bad.parse::<KeyDist>().is_err(), "{bad} accepted");
        }
        assert!(KeySampler::new(KeyDist::Uniform, 0).is_err());
    }

    #[test]
    fn display_round_trips() {
        for text in ["uniform", "zipf:1.2", "hot:0.25"] {
            assert_eq!(text.parse::<KeyDist>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn uniform_spreads_evenly_over_all_keys() {
        let counts = counts(KeyDist::Uniform, 10);
        for c in counts {
            assert!((share(c) - 0.1).abs() < 0.005, "share {}", share(c));
        }
    }

    #[test]
    fn zipf_rank_shares_follow_one_over_rank() {
        // s = 1 over 100 keys: P(rank r) = 1 / (r · H_100), H_100 ≈ 5.1874.
        let h100: f64 = (1..=100).map(|r| 1.0 / r as f64).sum();
        let counts = counts(KeyDist::Zipf { s: 1.0 }, 100);
        for rank in [1usize, 2, 10] {
            let expected = 1.0 / (rank as f64 * h100);
            let got = share(counts[rank - 1]);
            assert!(
                (got - expected).abs() < 0.005,
                "rank {rank}: {got} vs {expected}"
            );
        }
        let top10: usize = counts[..10].iter().sum();
        let expected: f64 = (1..=10).map(|r| 1.0 / (r as f64 * h100)).sum();
        assert!((share(top10) - expected).abs() < 0.01);
    }

    #[test]
    fn steeper_zipf_concentrates_more() {
        let flat = counts(KeyDist::Zipf { s: 0.5 }, 100)[0];
        let steep = counts(KeyDist::Zipf { s: 1.5 }, 100)[0];
        assert!(steep > 2 * flat);
    }

    #[test]
    fn hot_key_gets_its_fraction_and_the_rest_is_uniform() {
        let counts = counts(KeyDist::Hot { fraction: 0.3 }, 8);
        assert!((share(counts[0]) - 0.3).abs() < 0.005);
        for &c in &counts[1..] {
            assert!((share(c) - 0.1).abs() < 0.005, "cold share {}", share(c));
        }
    }

    #[test]
    fn a_single_key_takes_everything() {
        for dist in [
            KeyDist::Uniform,
            KeyDist::Zipf { s: 1.0 },
            KeyDist::Hot { fraction: 0.0 },
        ] {
            assert_eq!(counts(dist, 1), vec![DRAWS]);
        }
    }
}
