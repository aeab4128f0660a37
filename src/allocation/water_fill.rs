//! Weighted max-min fair division of integer capacity: the one division
//! the rebalancer's targets and a transition's grows both use.

/// Reused buffers of one water-filling, so a round over a million keys
/// allocates nothing per key.
#[derive(Default)]
pub struct Fill {
    pub(super) want: Vec<f64>,
    pub(super) weights: Vec<f64>,
    pub(super) given: Vec<u64>,
    share: Vec<f64>,
    open: Vec<usize>,
    next: Vec<usize>,
    order: Vec<usize>,
}

/// Weighted max-min fair division of `capacity` (integer units) between
/// claims `want` with weights: every claim gets min(want, λ·weight) for the
/// level λ that uses the capacity (or satisfies every claim). Integer
/// remainders go to the largest fractional parts, ties to the lower index, so
/// the result is deterministic and sums to at most `capacity`.
pub fn water_fill(capacity: u64, want: &[f64], weights: &[f64]) -> Vec<u64> {
    let mut out = Vec::new();
    water_fill_into(capacity, want, weights, &mut out, &mut Fill::default());
    out
}

/// [`water_fill`] into `out`, with reused buffers.
pub fn water_fill_into(
    capacity: u64,
    want: &[f64],
    weights: &[f64],
    out: &mut Vec<u64>,
    fill: &mut Fill,
) {
    let n = want.len();
    out.clear();
    out.resize(n, 0);
    if n == 0 || capacity == 0 {
        return;
    }
    let cap = capacity as f64;
    let total_want: f64 = want.iter().sum();
    let share = &mut fill.share;
    share.clear();
    share.resize(n, 0.0);
    if total_want.is_finite() && total_want <= cap {
        share.copy_from_slice(want);
    } else {
        // Raise the level until the capacity is used: claims below their
        // fair share are satisfied and leave the pool.
        fill.open.clear();
        fill.open.extend((0..n).filter(|&i| want[i] > 0.0));
        let mut left = cap;
        while !fill.open.is_empty() {
            let w: f64 = fill.open.iter().map(|&i| weights[i]).sum();
            let level = left / w;
            fill.next.clear();
            let mut sated = false;
            for &i in &fill.open {
                if want[i] <= level * weights[i] {
                    share[i] = want[i];
                    left -= want[i];
                    sated = true;
                } else {
                    fill.next.push(i);
                }
            }
            if !sated {
                for &i in &fill.next {
                    share[i] = level * weights[i];
                }
                break;
            }
            std::mem::swap(&mut fill.open, &mut fill.next);
        }
    }
    let mut used = 0u64;
    for i in 0..n {
        out[i] = share[i].max(0.0).floor() as u64;
        used += out[i];
    }
    let mut spare = capacity.saturating_sub(used);
    if spare > 0 {
        let order = &mut fill.order;
        order.clear();
        order.extend(
            (0..n).filter(|&i| share[i] - (out[i] as f64) > 1e-9 && (out[i] as f64) < want[i]),
        );
        order.sort_by(|&a, &b| {
            let fa = share[a] - out[a] as f64;
            let fb = share[b] - out[b] as f64;
            fb.total_cmp(&fa).then(a.cmp(&b))
        });
        for &i in order.iter() {
            if spare == 0 {
                break;
            }
            out[i] += 1;
            spare -= 1;
        }
    }
}
