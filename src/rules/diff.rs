//! A unified-style line diff of two rule sets, file by file: what `meridian
//! ctl rules diff` prints and `GET /api/v1/rules/diff` answers. Pure.
//!
//! The edit script is Myers' greedy shortest one ("An O(ND) difference
//! algorithm", 1986), run on what lies between the files' common head and
//! tail: time O((N + M) · D) for D changed lines, memory O(D²). The admin
//! API computes diffs for whoever may read rules, so both are capped (issue
//! 28: the former quadratic table took 2 s and 16 MiB a file, for every file
//! of a version): past [`MAX_EDITS`] changed lines, or once one call has
//! spent [`MAX_STEPS`], a file is reported as too large to compare here.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// Lines kept around each change in [`diff`].
const CONTEXT_LINES: usize = 3;

/// Most changed lines (removed + added) one file's diff looks for. The
/// search keeps, for each d ≤ D, the furthest point of the d + 1 diagonals
/// it reached: (D + 1)(D + 2) / 2 × 4 bytes, so at most 8 MiB.
pub const MAX_EDITS: usize = 2_000;

/// Most steps (a diagonal visited, or one pair of lines compared, or one line
/// split or indexed) one [`diff`] call spends over all its files, whatever
/// their shape: about 0.1 s of one core in a release build.
pub const MAX_STEPS: u64 = 40_000_000;

/// Marks a diagonal the search has not reached in a row of the trace.
const UNREACHED: u32 = u32::MAX;

/// A unified-style diff of two rule sets, file by file, each file headed
/// by its side's prefix (`current/`, `3/`, or empty for a local file) (a file only on one
/// side is shown whole as added or removed); empty when they are equal.
pub fn diff(
    a_label: &str,
    a: &BTreeMap<String, String>,
    b_label: &str,
    b: &BTreeMap<String, String>,
) -> String {
    let mut budget = Budget { left: MAX_STEPS };
    let mut out = String::new();
    let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for name in names {
        let old = a.get(name).map_or("", String::as_str);
        let new = b.get(name).map_or("", String::as_str);
        if a.contains_key(name) && b.contains_key(name) && old == new {
            continue;
        }
        let _ = writeln!(
            out,
            "--- {a_label}{name}{}",
            if a.contains_key(name) {
                ""
            } else {
                " (absent)"
            }
        );
        let _ = writeln!(
            out,
            "+++ {b_label}{name}{}",
            if b.contains_key(name) {
                ""
            } else {
                " (absent)"
            }
        );
        out.push_str(&line_diff(old, new, &mut budget));
    }
    out
}

/// What one [`diff`] call may still spend.
struct Budget {
    left: u64,
}

impl Budget {
    /// Takes `steps`; false once the budget is used up.
    fn spend(&mut self, steps: u64) -> bool {
        self.left = self.left.saturating_sub(steps);
        self.left > 0
    }
}

/// Why a file's diff was not computed.
#[derive(Debug, PartialEq)]
enum TooLarge {
    /// More than [`MAX_EDITS`] lines differ (or provably will).
    Edits,
    /// The call's [`MAX_STEPS`] ran out.
    Work,
}

/// The hunks turning `old` into `new`, or a line saying why not.
fn line_diff(old: &str, new: &str, budget: &mut Budget) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    match edit_script(&a, &b, budget) {
        Ok(ops) => hunks(&ops),
        Err(why) => format!(
            "@@ too large to compare here ({} and {} lines: {}): compare `rules get` outputs with diff(1)\n",
            a.len(),
            b.len(),
            match why {
                TooLarge::Edits => format!("more than {MAX_EDITS} changed lines"),
                TooLarge::Work => format!("this diff's {MAX_STEPS} steps are spent"),
            }
        ),
    }
}

/// The edit script: (' ' | '-' | '+', line), removals before the additions
/// that replace them, as diff(1) shows a changed line.
fn edit_script<'t>(
    a: &[&'t str],
    b: &[&'t str],
    budget: &mut Budget,
) -> Result<Vec<(char, &'t str)>, TooLarge> {
    if !budget.spend((a.len() + b.len()) as u64) {
        return Err(TooLarge::Work);
    }
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a_mid, b_mid) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut ops = Vec::with_capacity(a.len() + b_mid.len());
    ops.extend(a[..head].iter().map(|l| (' ', *l)));
    ops.extend(middle(a_mid, b_mid, budget)?);
    ops.extend(a[a.len() - tail..].iter().map(|l| (' ', *l)));
    Ok(ops)
}

/// The shortest edit script of two sequences with no common head or tail.
fn middle<'t>(
    a: &[&'t str],
    b: &[&'t str],
    budget: &mut Budget,
) -> Result<Vec<(char, &'t str)>, TooLarge> {
    if a.is_empty() || b.is_empty() {
        return Ok(a
            .iter()
            .map(|l| ('-', *l))
            .chain(b.iter().map(|l| ('+', *l)))
            .collect());
    }
    if a.len() >= UNREACHED as usize || b.len() >= UNREACHED as usize {
        return Err(TooLarge::Edits);
    }
    // Lines as numbers, so the search compares integers.
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let mut id = |line: &'t str| {
        let next = ids.len() as u32;
        *ids.entry(line).or_insert(next)
    };
    let a_ids: Vec<u32> = a.iter().map(|l| id(l)).collect();
    let b_ids: Vec<u32> = b.iter().map(|l| id(l)).collect();
    // A line one side holds more often than the other is removed or added
    // that many times in any script: a lower bound on D, in linear time, so
    // two unrelated files cost no search.
    let mut surplus = vec![0i64; ids.len()];
    for &x in &a_ids {
        surplus[x as usize] += 1;
    }
    for &y in &b_ids {
        surplus[y as usize] -= 1;
    }
    if surplus.iter().map(|s| s.unsigned_abs()).sum::<u64>() > MAX_EDITS as u64 {
        return Err(TooLarge::Edits);
    }
    let (n, m) = (a.len(), b.len());
    // trace holds row d (d + 1 diagonals k = -d, -d+2, …, d) from d(d+1)/2:
    // the furthest x reached on diagonal k (y = x - k) with d edits.
    let mut trace: Vec<u32> = Vec::new();
    for d in 0..=MAX_EDITS {
        let row = d * (d + 1) / 2;
        let mut steps = 0u64;
        for j in 0..=d {
            let k = 2 * j as isize - d as isize;
            let start = if d == 0 {
                Some((0, false))
            } else {
                step(&trace[row - d..row], d, k, n, m)
            };
            let Some((mut x, _)) = start else {
                trace.push(UNREACHED);
                steps += 1;
                continue;
            };
            let mut y = x.wrapping_add_signed(-k);
            let from = x;
            while x < n && y < m && a_ids[x] == b_ids[y] {
                x += 1;
                y += 1;
            }
            steps += 1 + (x - from) as u64;
            trace.push(x as u32);
            if x == n && y == m {
                return backtrack(&trace, d, a, b);
            }
        }
        if !budget.spend(steps) {
            return Err(TooLarge::Work);
        }
    }
    Err(TooLarge::Edits)
}

/// The point on diagonal `k` that d edits reach before following equal
/// lines, from row d - 1 (`prev`): one line added from diagonal k + 1
/// (`true`), or one removed from k - 1 (`false`), whichever gets further
/// (the addition on a tie, which puts a changed line's removal first).
/// Moves stay inside the grid, so every path the search keeps is a real
/// script.
fn step(prev: &[u32], d: usize, k: isize, n: usize, m: usize) -> Option<(usize, bool)> {
    let d = d as isize;
    let at = |diagonal: isize| -> Option<usize> {
        if diagonal < -(d - 1) || diagonal > d - 1 {
            return None;
        }
        let x = prev[((diagonal + d - 1) / 2) as usize];
        (x != UNREACHED).then_some(x as usize)
    };
    let add = at(k + 1).filter(|&x| x.wrapping_add_signed(-(k + 1)) < m);
    let remove = at(k - 1).filter(|&x| x < n).map(|x| x + 1);
    match (add, remove) {
        (Some(x), Some(r)) if x >= r => Some((x, true)),
        (_, Some(r)) => Some((r, false)),
        (Some(x), None) => Some((x, true)),
        (None, None) => None,
    }
}

/// Walks the trace back from (n, m), reached with `d` edits.
fn backtrack<'t>(
    trace: &[u32],
    d: usize,
    a: &[&'t str],
    b: &[&'t str],
) -> Result<Vec<(char, &'t str)>, TooLarge> {
    let (n, m) = (a.len(), b.len());
    let mut reversed = Vec::with_capacity(n + m);
    let (mut x, mut y) = (n, m);
    for d in (1..=d).rev() {
        let row = d * (d + 1) / 2;
        let k = x as isize - y as isize;
        // The forward pass took this very step, so it exists.
        let (after, added) = step(&trace[row - d..row], d, k, n, m).ok_or(TooLarge::Work)?;
        while x > after {
            reversed.push((' ', a[x - 1]));
            x -= 1;
            y -= 1;
        }
        if added {
            reversed.push(('+', b[y - 1]));
            y -= 1;
        } else {
            reversed.push(('-', a[x - 1]));
            x -= 1;
        }
    }
    while x > 0 {
        reversed.push((' ', a[x - 1]));
        x -= 1;
    }
    reversed.reverse();
    Ok(reversed)
}

/// The unified hunks of an edit script, with [`CONTEXT_LINES`] around each
/// change; changes closer than twice that share a hunk.
fn hunks(ops: &[(char, &str)]) -> String {
    // Lines of each side before ops[i].
    let mut old_at = Vec::with_capacity(ops.len() + 1);
    let mut new_at = Vec::with_capacity(ops.len() + 1);
    let (mut old, mut new) = (0, 0);
    for (op, _) in ops {
        old_at.push(old);
        new_at.push(new);
        old += usize::from(*op != '+');
        new += usize::from(*op != '-');
    }
    old_at.push(old);
    new_at.push(new);
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = String::new();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT_LINES);
        let mut end = changed[k];
        while k + 1 < changed.len() && changed[k + 1] <= end + 2 * CONTEXT_LINES + 1 {
            k += 1;
            end = changed[k];
        }
        let end = (end + CONTEXT_LINES + 1).min(ops.len());
        let _ = writeln!(
            out,
            "@@ -{},{} +{},{} @@",
            old_at[start] + 1,
            old_at[end] - old_at[start],
            new_at[start] + 1,
            new_at[end] - new_at[start]
        );
        for (op, line) in &ops[start..end] {
            let _ = writeln!(out, "{op}{line}");
        }
        k += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget { left: MAX_STEPS }
    }

    /// The script's length by a plain LCS table: removals + additions =
    /// n + m - 2·LCS for a shortest script.
    fn shortest(a: &[&str], b: &[&str]) -> usize {
        let w = b.len() + 1;
        let mut lcs = vec![0usize; (a.len() + 1) * w];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                lcs[i * w + j] = if a[i] == b[j] {
                    lcs[(i + 1) * w + j + 1] + 1
                } else {
                    lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
                };
            }
        }
        a.len() + b.len() - 2 * lcs[0]
    }

    #[test]
    fn a_changed_line_is_one_hunk_with_its_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            line_diff(old, new, &mut budget()),
            "@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
    }

    #[test]
    fn equal_rule_sets_have_an_empty_diff_and_a_new_file_is_shown_whole() {
        let a = BTreeMap::from([("r.yaml".to_string(), "x\n".to_string())]);
        assert_eq!(diff("1/", &a, "2/", &a), "");
        let mut b = a.clone();
        b.insert("s.yaml".into(), "y\n".into());
        assert_eq!(
            diff("1/", &a, "2/", &b),
            "--- 1/s.yaml (absent)\n+++ 2/s.yaml\n@@ -1,0 +1,1 @@\n+y\n"
        );
    }

    #[test]
    fn scripts_are_shortest_and_turn_old_into_new() {
        // Small alphabets make many equal lines, the search's hard case.
        let mut seed = 7u64;
        let mut next = move |bound: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % bound
        };
        let words = ["a", "b", "c", "d"];
        for _ in 0..500 {
            let a: Vec<&str> = (0..next(12)).map(|_| words[next(4) as usize]).collect();
            let b: Vec<&str> = (0..next(12)).map(|_| words[next(4) as usize]).collect();
            let ops = edit_script(&a, &b, &mut budget()).expect("small inputs fit");
            let old: Vec<&str> = ops.iter().filter(|o| o.0 != '+').map(|o| o.1).collect();
            let new: Vec<&str> = ops.iter().filter(|o| o.0 != '-').map(|o| o.1).collect();
            assert_eq!((old, new), (a.clone(), b.clone()));
            let edits = ops.iter().filter(|o| o.0 != ' ').count();
            assert_eq!(edits, shortest(&a, &b), "{a:?} -> {b:?}: {ops:?}");
        }
    }

    #[test]
    fn far_apart_changes_in_a_long_file_are_cheap_and_exact() {
        let old: String = (0..50_000).map(|i| format!("line {i}\n")).collect();
        let new = old
            .replace("line 10\n", "line ten\n")
            .replace("line 49990\n", "line 49,990\n");
        let mut b = budget();
        let out = line_diff(&old, &new, &mut b);
        assert!(
            out.contains("-line 10\n+line ten\n") && out.contains("-line 49990\n+line 49,990\n"),
            "{out}"
        );
        assert!(MAX_STEPS - b.left < 500_000, "spent {}", MAX_STEPS - b.left);
    }

    #[test]
    fn more_changes_than_the_cap_or_the_budget_are_refused_within_bounds() {
        // Unrelated files: refused by the line count, before any search.
        let old: String = (0..5_000).map(|i| format!("a{i}\n")).collect();
        let new: String = (0..5_000).map(|i| format!("b{i}\n")).collect();
        let mut b = budget();
        assert!(line_diff(&old, &new, &mut b).contains("more than 2000 changed lines"));
        assert!(MAX_STEPS - b.left <= 10_000);
        // The same lines in another order pass that test but not the search.
        let shuffled: String = (0..5_000)
            .map(|i| format!("a{}\n", (i * 7919) % 5_000))
            .collect();
        let mut b = budget();
        assert_eq!(
            edit_script(
                &old.lines().collect::<Vec<_>>(),
                &shuffled.lines().collect::<Vec<_>>(),
                &mut b
            ),
            Err(TooLarge::Edits)
        );
        // Many such files in one call: the later ones find the budget spent.
        let a: BTreeMap<String, String> = (0..40)
            .map(|i| (format!("{i}.yaml"), old.clone()))
            .collect();
        let z: BTreeMap<String, String> = (0..40)
            .map(|i| (format!("{i}.yaml"), shuffled.clone()))
            .collect();
        let out = diff("1/", &a, "2/", &z);
        assert!(
            out.contains("steps are spent"),
            "{}",
            &out[..out.len().min(2_000)]
        );
    }
}
