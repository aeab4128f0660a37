//! A cheap pre-scan that bounds a YAML document's nesting depth before any
//! parser sees it.
//!
//! Why: yaml-rust2's `Parser::load`, which marked-yaml drives, recurses once
//! per mapping or sequence start event (whatever tags or anchors the node
//! carries, and even after marked-yaml has given up on the document), and
//! marked-yaml drops its node tree recursively, so a 100 KB file of
//! `- - - …` overflows the stack and aborts the process (the coordinator on
//! an admin PUT, a limiter following a file, `rules check`). Every path that
//! reads untrusted rule YAML goes through [`check_depth`] (via
//! `RuleSet::parse`), so no parser runs on a document deeper than
//! [`MAX_DEPTH`].
//!
//! The count is an over-approximation where YAML is ambiguous to a line
//! scanner, never an under-count of what the parser would build:
//! - block collections: a stack of open `(column, list|map)`; a line closes
//!   every entry indented deeper than itself; `- `, `? ` and `: ` items and
//!   `key:` open one level each, so `- - - x` on one line counts 3;
//! - a key's map opens at the key node's first token, as the parser's simple
//!   key does: its tag or anchor (`!t &a key:`), an alias used as the key
//!   (`*a :`), or the `[` / `{` of a flow collection used as the key
//!   (`[a]: v`), which itself sits one level inside that map. Counting the
//!   map at the key text's own column instead let each line of
//!   `!a k:` indented two deeper than the last close the one before, so
//!   10,000 levels passed as one (issue 28);
//! - flow collections: each `[` / `{` opens a level, and an implicit
//!   `key: value` pair inside `[…]` counts one more (the parser builds a
//!   one-pair map there), and so does each `:` that starts such a pair's
//!   value (`[a: : b`, a map inside the pair's map);
//! - quoted scalars (also across lines), comments and block scalars (`|`,
//!   `>`) are skipped, so brackets and dashes inside text do not count;
//! - `---` and `...` are document markers at column 0 only (`  --- k:` is a
//!   key, and once ended a document's count at any indentation).
//!
//! Checked against yaml-rust2's own event stream (a throwaway harness, not
//! in the build: it needs yaml-rust2 as a direct dependency): 300,000
//! mutated documents with tags, anchors, aliases, flow keys and markers
//! inserted, and 200,000 random line templates repeated 100 levels deep.
//! Only documents the parser rejects are ever counted short, by one level
//! at most, which never compounds with depth.
//!
//! Plain text continued over lines that each indent further is counted as
//! nesting; the error says so and how to avoid it.
//!
//! Pure: text in, verdict out.

mod scan;

use std::fmt;

use self::scan::Scan;

/// Deepest nesting accepted. Real rule files nest fewer than 20 levels (each
/// descriptor level is a list plus a map); the parser's recursion is safe far
/// beyond this on a 2 MiB thread stack (tokio's worker default).
pub const MAX_DEPTH: usize = 64;

/// A document nested deeper than the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDeep {
    /// 1-based line where the nesting first went past the limit.
    pub line: usize,
    /// The depth reached on that line (the limit plus one, or more when one
    /// line opens several levels).
    pub depth: usize,
    /// The limit that was exceeded.
    pub limit: usize,
}

impl fmt::Display for TooDeep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nested {} levels deep here; at most {} are accepted (lists, maps and [ ] {{ }} each \
             count one; real rule files nest fewer than 20): flatten the file. If this line is \
             part of a multi-line text value, quote it or use a block scalar (|) so it is not \
             counted as nesting",
            self.depth, self.limit
        )
    }
}

impl std::error::Error for TooDeep {}

/// `Ok` when `text` nests at most `limit` levels; otherwise where it first
/// went deeper. Linear in the text's length.
pub fn check_depth(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut scan = Scan::new(limit);
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (i, line) in lines(text).enumerate() {
        scan.line = i + 1;
        scan.line_of(line.as_bytes());
        if let Some(found) = scan.found {
            return Err(found);
        }
    }
    Ok(())
}

/// Lines split at `\n`, `\r\n` and a lone `\r`: YAML breaks lines at each.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let s = rest?;
        match s.find(['\n', '\r']) {
            Some(at) => {
                let skip = if s[at..].starts_with("\r\n") { 2 } else { 1 };
                rest = Some(&s[at + skip..]);
                Some(&s[..at])
            }
            None => {
                rest = None;
                Some(s)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use marked_yaml::Node;
    use proptest::prelude::*;

    use super::*;

    fn depth_of(text: &str) -> usize {
        // The smallest limit the text passes is its depth.
        (0..200)
            .find(|&limit| check_depth(text, limit).is_ok())
            .expect("depth under 200")
    }

    #[test]
    fn counts_block_nesting_like_the_parser() {
        assert_eq!(depth_of("a: 1\nb: 2\n"), 1);
        assert_eq!(depth_of("a:\n  b:\n    c: 1\n"), 3);
        assert_eq!(depth_of("- - - x\n"), 3);
        assert_eq!(depth_of("a:\n- b: 1\n  c: 2\n- d\nz: 1\n"), 3);
        let descriptors = "domain: d\ndescriptors:\n- key: a\n  descriptors:\n  - key: b\n    \
                           rate_limit: {unit: second, requests_per_unit: 1}\n";
        assert_eq!(depth_of(descriptors), 6);
    }

    #[test]
    fn counts_flow_nesting_and_implicit_pairs() {
        assert_eq!(depth_of("a: [[1], {b: [2]}]\n"), 4);
        assert_eq!(depth_of("a: [b: [c: 1]]\n"), 5);
        assert_eq!(depth_of("a: [\n  [\n    [1]\n  ]\n]\nb: 1\n"), 4);
    }

    #[test]
    fn ignores_text_in_quotes_comments_and_block_scalars() {
        assert_eq!(depth_of("a: \"[[[[ - - -\"\nb: '{{{{'\n"), 1);
        assert_eq!(depth_of("a: x # [[[[[[\n# - - - - -\n"), 1);
        assert_eq!(depth_of("a: it's [[[[\n"), 1);
        assert_eq!(depth_of("a: \"one\n  [[[[[ two\"\nb: 1\n"), 1);
        assert_eq!(depth_of("a: |\n  - - - - [[[[\n  {{{{\nb: 1\n"), 1);
        assert_eq!(depth_of("a: [\"]]]\", 'x''y[']\n"), 2);
    }

    #[test]
    fn text_under_a_block_scalar_header_ends_at_its_parent_indent() {
        // `- - -` at column 0 is structure again, not text.
        let text = "a: |\n  text\nb:\n- - - -\n";
        assert_eq!(depth_of(text), 5);
        // An explicit indentation indicator: a shallower line ends the text.
        let text = "a: |4\n    text\n  - - - -\n";
        assert!(depth_of(text) >= 4);
    }

    #[test]
    fn hundred_kilobytes_of_nesting_is_refused_at_the_limit() {
        for (text, line) in [
            (
                format!("domain: d\ndescriptors:\n{}x\n", "- ".repeat(50_000)),
                3,
            ),
            (
                format!("domain: d\ndescriptors: {}\n", "[".repeat(100_000)),
                2,
            ),
            (
                format!("domain: d\ndescriptors: {}\n", "{a: ".repeat(25_000)),
                2,
            ),
            (
                (0..5000)
                    .map(|i| format!("{}a:\n", " ".repeat(i)))
                    .collect(),
                MAX_DEPTH + 1,
            ),
        ] {
            let e = check_depth(&text, MAX_DEPTH).unwrap_err();
            assert_eq!((e.line, e.limit), (line, MAX_DEPTH), "{e}");
            assert!(e.depth > MAX_DEPTH);
            assert!(e.to_string().contains("at most 64"), "{e}");
        }
    }

    /// Levels of `line(i)`, each indented two more than the last, under a
    /// `descriptors:` key (so they nest 2 + n deep in the parser).
    fn indented(head: &str, n: usize, line: impl Fn(usize) -> String) -> String {
        let mut text = format!("domain: d\n{head}descriptors:\n");
        for i in 0..n {
            text.push_str(&" ".repeat(2 * i + 2));
            text.push_str(&line(i));
            text.push('\n');
        }
        text
    }

    /// Keys that do not start at their own column: a tag or an anchor before
    /// the key, an alias as the key, a flow collection as the key. The
    /// parser's block mapping starts at the first of those tokens (a simple
    /// key begins at its node's properties), so each line nests one deeper;
    /// 10,000 such levels overflowed the parser's stack (audit, issue 28).
    #[test]
    fn keys_after_properties_and_flow_keys_nest_at_their_first_token() {
        let cases = [
            ("tagged key", indented("", 10_000, |_| "!a k:".into())),
            (
                "anchored key",
                indented("", 10_000, |i| format!("&a{i} k:")),
            ),
            (
                "tag and anchor",
                indented("", 10_000, |_| "!t &a k:".into()),
            ),
            (
                "tagged quoted key",
                indented("", 10_000, |_| "!a \"k\":".into()),
            ),
            (
                "anchored quoted key",
                indented("", 10_000, |_| "&a 'k':".into()),
            ),
            (
                "alias key",
                indented("anchor: &a x\n", 10_000, |_| "*a :".into()),
            ),
            ("flow list key", indented("", 10_000, |_| "[a]:".into())),
            ("flow map key", indented("", 10_000, |_| "{a: b}:".into())),
            (
                "tagged flow key",
                indented("", 10_000, |_| "!a [a]:".into()),
            ),
            (
                "list of tagged keys",
                indented("", 10_000, |_| "- !a k:".into()),
            ),
            ("tagged list items", indented("", 10_000, |_| "- !a".into())),
            ("tagged values", indented("", 10_000, |_| "k: !a".into())),
            (
                "indented document markers",
                indented("", 10_000, |_| "--- k:".into()),
            ),
            (
                "tagged flow",
                format!("domain: d\ndescriptors: {}\n", "!a [".repeat(10_000)),
            ),
            (
                "anchored flow maps",
                format!("domain: d\ndescriptors: {}\n", "&a {k: ".repeat(10_000)),
            ),
        ];
        let missed: Vec<String> = cases
            .iter()
            .filter_map(|(construct, text)| match check_depth(text, MAX_DEPTH) {
                Err(e) if e.depth > MAX_DEPTH && e.line <= MAX_DEPTH + 4 => None,
                other => Some(format!("{construct}: {other:?}")),
            })
            .collect();
        assert!(missed.is_empty(), "not refused at the limit: {missed:#?}");
    }

    /// The same constructs a few levels deep count as the parser builds them
    /// (a flow key sits inside the map it keys, so it is one level deeper).
    #[test]
    fn properties_and_flow_keys_count_one_level_a_key() {
        for (text, depth) in [
            ("!a k:\n  !a k:\n    !a k: 1\n", 3),
            ("&a k:\n  &b k:\n    *a : 1\n", 3),
            ("!a \"k\":\n  !a 'j': 1\n", 2),
            ("[a]:\n  {b: c}:\n    x: 1\n", 3),
            ("[[[a]]]: 1\n", 4),
            ("[[a: b]]: 1\n", 4),
            ("a: [{d: e}: x]\n", 4),
            ("a: [[[x]: y]: z]\n", 6),
            ("a: [k: : x]\n", 4),
            ("a: [k: &a : x]\n", 4),
            ("a:\n  --- b:\n    c: 1\n", 3),
            ("- !a k:\n    - &b j: 1\n", 4),
            ("k: !a\n  j: &x\n    i: 1\n", 3),
        ] {
            assert_eq!(depth_of(text), depth, "{text}");
        }
    }

    #[test]
    fn lone_carriage_returns_break_lines() {
        let text = "a:\r b:\r  c:\r   d: 1\r";
        assert_eq!(depth_of(text), 4);
    }

    /// A YAML tree to render in block and flow styles.
    #[derive(Debug, Clone)]
    enum Tree {
        Scalar(String),
        List(Vec<Tree>, bool),
        Map(Vec<(String, Tree)>, bool),
    }

    /// Scalars that look like structure to a careless scanner.
    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]{1,6}",
            Just("it's".to_owned()),
            Just("\"[[ - { #\"".to_owned()),
            Just("'a: [b'".to_owned()),
            Just("'x''y {'".to_owned()),
            Just("\"multi\n   line [[[\"".to_owned()),
            Just("a#b".to_owned()),
            Just("|\n  - - [[ {\n  text".to_owned()),
        ]
    }

    fn tree() -> impl Strategy<Value = Tree> {
        scalar()
            .prop_map(Tree::Scalar)
            .prop_recursive(8, 64, 4, |inner| {
                prop_oneof![
                    (prop::collection::vec(inner.clone(), 1..4), any::<bool>())
                        .prop_map(|(items, flow)| Tree::List(items, flow)),
                    (
                        prop::collection::vec(("[a-z]{1,4}", inner), 1..4),
                        any::<bool>()
                    )
                        .prop_map(|(entries, flow)| {
                            let mut seen = std::collections::HashSet::new();
                            let entries = entries
                                .into_iter()
                                .filter(|(k, _)| seen.insert(k.clone()))
                                .collect();
                            Tree::Map(entries, flow)
                        }),
                ]
            })
    }

    fn flow(tree: &Tree, out: &mut String) {
        match tree {
            // Block scalars and multi-line text have no flow form.
            Tree::Scalar(s) if s.starts_with('|') || s.contains('\n') => out.push('x'),
            Tree::Scalar(s) if s == "it's" => out.push_str("its"),
            Tree::Scalar(s) => out.push_str(s),
            Tree::List(items, _) => {
                out.push('[');
                for (i, t) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    flow(t, out);
                }
                out.push(']');
            }
            Tree::Map(entries, _) => {
                out.push('{');
                for (i, (k, t)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(k);
                    out.push_str(": ");
                    flow(t, out);
                }
                out.push('}');
            }
        }
    }

    /// Renders `tree` as the value after `key:` or `- ` at `indent`.
    fn value(tree: &Tree, indent: usize, out: &mut String) {
        match tree {
            Tree::Scalar(s) => {
                out.push(' ');
                out.push_str(&s.replace('\n', &format!("\n{}", " ".repeat(indent + 2))));
                out.push('\n');
            }
            Tree::List(_, true) | Tree::Map(_, true) => {
                out.push(' ');
                flow(tree, out);
                out.push('\n');
            }
            _ => {
                out.push('\n');
                block(tree, indent + 2, out);
            }
        }
    }

    fn block(tree: &Tree, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match tree {
            Tree::Scalar(_) => unreachable!("scalars are values"),
            Tree::List(items, _) => {
                for t in items {
                    out.push_str(&pad);
                    out.push('-');
                    value(t, indent, out);
                }
            }
            Tree::Map(entries, _) => {
                for (k, t) in entries {
                    out.push_str(&pad);
                    out.push_str(k);
                    out.push(':');
                    value(t, indent, out);
                }
            }
        }
    }

    fn real_depth(node: &Node) -> usize {
        match node {
            Node::Scalar(_) => 0,
            Node::Sequence(s) => 1 + s.iter().map(real_depth).max().unwrap_or(0),
            Node::Mapping(m) => 1 + m.iter().map(|(_, v)| real_depth(v)).max().unwrap_or(0),
        }
    }

    fn document(entries: Vec<(String, Tree)>) -> String {
        let mut text = String::new();
        block(&Tree::Map(entries, false), 0, &mut text);
        text
    }

    /// What a mutation inserts: structure, quotes, comments and line breaks.
    const EDITS: &[&str] = &[
        "- ", "[", "{", "]", "}", "\"", "'", "#", "\n", " ", ":", "|", "\r", "? ", "\n  - ",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The scan never counts less than the tree the parser builds, and a
        /// valid document is not counted wildly deeper than it is.
        #[test]
        fn never_under_counts_a_document_the_parser_accepts(
            entries in prop::collection::vec(("[a-z]{1,4}", tree()), 1..4),
        ) {
            let text = document(entries);
            if let Ok(root) = marked_yaml::parse_yaml(0, &text) {
                let real = real_depth(&root);
                let counted = depth_of(&text);
                prop_assert!(counted >= real, "counted {counted} < real {real}:\n{text}");
                prop_assert!(counted <= 2 * real + 2, "counted {counted} for {real}:\n{text}");
            }
        }

        /// Byte edits of a valid document (what a broken save or an attacker
        /// makes): whatever the parser still accepts is never under-counted.
        #[test]
        fn never_under_counts_a_mutated_document(
            entries in prop::collection::vec(("[a-z]{1,4}", tree()), 1..3),
            edits in prop::collection::vec(
                (any::<prop::sample::Index>(), prop::sample::select(EDITS)),
                1..6,
            ),
        ) {
            let mut bytes = document(entries).into_bytes();
            for (at, insert) in edits {
                let at = at.index(bytes.len() + 1);
                bytes.splice(at..at, insert.bytes());
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if let Ok(root) = marked_yaml::parse_yaml(0, &text) {
                let real = real_depth(&root);
                let counted = depth_of(&text);
                // An empty document loads as an empty map (depth 1) the scan cannot see.
                prop_assert!(counted >= real || real == 1, "counted {counted} < real {real}:\n{text:?}");
            }
        }
    }
}
