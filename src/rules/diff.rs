//! A unified-style line diff of two rule sets, file by file: what `meridian
//! ctl rules diff` prints and `GET /api/v1/rules/diff` answers. Pure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Lines kept around each change in [`diff`].
const CONTEXT_LINES: usize = 3;

/// Largest (old lines × new lines) one file's diff computes: the table
/// costs 4 bytes per cell, so at most 16 MiB (the admin API computes diffs
/// too, on a bounded number of connections).
const MAX_DIFF_CELLS: usize = 4 * 1024 * 1024;

/// A unified-style diff of two rule sets, file by file, each file headed
/// by its side's prefix (`current/`, `3/`, or empty for a local file) (a file only on one
/// side is shown whole as added or removed); empty when they are equal.
pub fn diff(
    a_label: &str,
    a: &BTreeMap<String, String>,
    b_label: &str,
    b: &BTreeMap<String, String>,
) -> String {
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
        out.push_str(&line_diff(old, new));
    }
    out
}

/// The hunks turning `old` into `new`, from a longest common subsequence.
fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a.len().saturating_mul(b.len()) > MAX_DIFF_CELLS {
        return format!(
            "@@ too large to compare here ({} and {} lines): compare `rules get` outputs with diff(1)\n",
            a.len(),
            b.len()
        );
    }
    // lcs[i * w + j]: how many lines a[i..] and b[j..] have in common.
    let w = b.len() + 1;
    let mut lcs = vec![0u32; (a.len() + 1) * w];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i * w + j] = if a[i] == b[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    // The edit script: (' ' | '-' | '+', line).
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
            // Removals before additions, as diff(1) shows a changed line.
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
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
        let old_start = ops[..start].iter().filter(|o| o.0 != '+').count() + 1;
        let new_start = ops[..start].iter().filter(|o| o.0 != '-').count() + 1;
        let old_len = ops[start..end].iter().filter(|o| o.0 != '+').count();
        let new_len = ops[start..end].iter().filter(|o| o.0 != '-').count();
        let _ = writeln!(out, "@@ -{old_start},{old_len} +{new_start},{new_len} @@");
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

    #[test]
    fn a_changed_line_is_one_hunk_with_its_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            line_diff(old, new),
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
}
