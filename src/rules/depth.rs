//! A cheap pre-scan that bounds a YAML document's nesting depth before any
//! parser sees it.
//!
//! Why: marked-yaml builds and drops its node tree recursively, so a 100 KB
//! file of `- - - …` overflows the stack and aborts the process (the
//! coordinator on an admin PUT, a limiter following a file, `rules check`).
//! yaml-rust2 caps flow nesting at 255 but not block nesting. Every path that
//! reads untrusted rule YAML goes through [`check_depth`] (via
//! `RuleSet::parse`), so no parser runs on a document deeper than
//! [`MAX_DEPTH`].
//!
//! The count is an over-approximation where YAML is ambiguous to a line
//! scanner, never an under-count of what the parser would build:
//! - block collections: a stack of open `(column, list|map)`; a line closes
//!   every entry indented deeper than itself; `- `, `? ` and `: ` items and
//!   `key:` open one level each, so `- - - x` on one line counts 3;
//! - flow collections: each `[` / `{` opens a level, and an implicit
//!   `key: value` pair inside `[…]` counts one more (the parser builds a
//!   one-pair map there);
//! - quoted scalars (also across lines), comments and block scalars (`|`,
//!   `>`) are skipped, so brackets and dashes inside text do not count.
//!
//! Plain text continued over lines that each indent further is counted as
//! nesting; the error says so and how to avoid it.
//!
//! Pure: text in, verdict out.

use std::fmt;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Map,
}

/// One open flow collection: `[` or `{`, and whether an implicit `key:` pair
/// inside a `[` is open (it closes at the next `,` or `]`).
#[derive(Debug, Clone, Copy)]
struct Flow {
    list: bool,
    pair: bool,
}

/// What the scanner is inside of when a line ends.
#[derive(Debug, Clone, Copy)]
enum Carry {
    Structure,
    /// A quoted scalar left open (`"` or `'`).
    Quoted(u8),
    /// A block scalar's parent column (`-1` at the top level) and, when given
    /// with an indentation indicator, its content indentation.
    BlockHeader {
        parent: isize,
        indent: Option<usize>,
    },
    /// Inside a block scalar whose content lines indent at least this much.
    BlockBody(usize),
    /// After a plain scalar value that ended its line: lines indented deeper
    /// than this column (`-1` at the top level) continue its text, as the
    /// parser reads them, so a quote or a dash there is not structure.
    Plain(isize),
}

struct Scan {
    block: Vec<(usize, Kind)>,
    flow: Vec<Flow>,
    carry: Carry,
    /// Whether a scalar may start where the last flow line ended: a line
    /// break inside flow plain text (`[a⏎"b`) is a space, not a new token.
    flow_scalar_start: bool,
    limit: usize,
    line: usize,
    found: Option<TooDeep>,
}

/// `Ok` when `text` nests at most `limit` levels; otherwise where it first
/// went deeper. Linear in the text's length.
pub fn check_depth(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut scan = Scan {
        block: Vec::new(),
        flow: Vec::new(),
        carry: Carry::Structure,
        flow_scalar_start: true,
        limit,
        line: 0,
        found: None,
    };
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

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Whether `line[at]` is followed by a space, a tab or the end of the line:
/// what makes `-`, `?` and `:` indicators rather than text.
fn indicator(line: &[u8], at: usize) -> bool {
    line.get(at + 1).is_none_or(|&b| is_space(b))
}

fn skip_spaces(line: &[u8], mut at: usize) -> usize {
    while at < line.len() && is_space(line[at]) {
        at += 1;
    }
    at
}

impl Scan {
    fn depth(&self) -> usize {
        self.block.len()
            + self
                .flow
                .iter()
                .map(|f| 1 + usize::from(f.pair))
                .sum::<usize>()
    }

    fn note_depth(&mut self) {
        let depth = self.depth();
        if depth > self.limit && self.found.is_none() {
            self.found = Some(TooDeep {
                line: self.line,
                depth,
                limit: self.limit,
            });
        }
    }

    /// Opens a block collection of `kind` at `column`, or continues the one
    /// open there. A key at the column of a list that hangs under a map (the
    /// compact `key:\n- item` style) ends that list.
    fn open(&mut self, column: usize, kind: Kind) {
        while let Some(&(c, k)) = self.block.last() {
            if c > column || (c == column && k == Kind::List && kind == Kind::Map) {
                self.block.pop();
            } else {
                break;
            }
        }
        if self.block.last() != Some(&(column, kind)) {
            self.block.push((column, kind));
            self.note_depth();
        }
    }

    fn line_of(&mut self, line: &[u8]) {
        let indent = line.iter().take_while(|&&b| b == b' ').count();
        let blank = skip_spaces(line, 0) == line.len();
        match self.carry {
            Carry::Quoted(q) => {
                if let Some(after) = close_quote(line, 0, q) {
                    self.carry = Carry::Structure;
                    self.rest_after_scalar(line, after);
                }
                return;
            }
            Carry::BlockHeader {
                parent,
                indent: given,
            } => {
                if blank {
                    return;
                }
                let body = given.unwrap_or(indent);
                if indent as isize > parent && indent >= body {
                    self.carry = Carry::BlockBody(body);
                    return;
                }
                self.carry = Carry::Structure;
            }
            Carry::BlockBody(body) => {
                if blank || indent >= body {
                    return;
                }
                self.carry = Carry::Structure;
            }
            Carry::Plain(parent) => {
                if blank {
                    return;
                }
                if line[indent] == b'#' {
                    // A comment line ends plain text; it closes nothing.
                    self.carry = Carry::Structure;
                    return;
                }
                if indent as isize > parent {
                    // Text ends its run at a comment; what follows is structure.
                    if has_comment(line, indent) {
                        self.carry = Carry::Structure;
                    }
                    return;
                }
                self.carry = Carry::Structure;
            }
            Carry::Structure => {}
        }
        // A comment line closes no block, whatever its indentation.
        if blank || line[indent] == b'#' && self.flow.is_empty() {
            return;
        }
        if !self.flow.is_empty() {
            self.flow_from(line, 0, self.flow_scalar_start);
            return;
        }
        let mut at = indent;
        if line[at..].starts_with(b"---") && indicator(line, at + 2)
            || line[at..].starts_with(b"...") && indicator(line, at + 2)
        {
            // A document marker resets the block structure; content may follow.
            self.block.clear();
            at = skip_spaces(line, at + 3);
        } else if indent == 0 && line[0] == b'%' {
            return;
        }
        self.block_from(line, at);
    }

    /// Scans block-context content starting at `at` (not a space).
    fn block_from(&mut self, line: &[u8], mut at: usize) {
        // The first item on a line closes what is indented deeper.
        while let Some(&(c, _)) = self.block.last() {
            if c > at {
                self.block.pop();
            } else {
                break;
            }
        }
        while self.found.is_none() {
            at = skip_spaces(line, at);
            let Some(&b) = line.get(at) else { return };
            match b {
                b'#' if at == 0 || is_space(line[at - 1]) => break,
                b'-' | b'?' | b':' if indicator(line, at) => {
                    let kind = if b == b'-' { Kind::List } else { Kind::Map };
                    self.open(at, kind);
                    at += 1;
                }
                b'!' | b'&' | b'*' => {
                    // A tag, anchor or alias: one token (which flow indicators
                    // end), then maybe a value.
                    at += 1;
                    while at < line.len() && !is_space(line[at]) && !b"[]{},".contains(&line[at]) {
                        at += 1;
                    }
                }
                b'[' | b'{' => {
                    self.flow_from(line, at, true);
                    return;
                }
                b'|' | b'>' => {
                    self.block_scalar(line, at);
                    return;
                }
                b'"' | b'\'' => match close_quote(line, at + 1, b) {
                    Some(after) => {
                        let start = at;
                        at = after;
                        if let Some(next) = self.key_after(line, at, start) {
                            at = next;
                        } else {
                            return;
                        }
                    }
                    None => {
                        self.carry = Carry::Quoted(b);
                        return;
                    }
                },
                _ => {
                    // A plain scalar: a key if `:` + space follows it on this line.
                    let start = at;
                    match plain_end(line, at) {
                        (end, true) => {
                            self.open(start, Kind::Map);
                            at = end + 1;
                        }
                        (end, false) => {
                            if end == line.len() {
                                let parent = self.block.last().map_or(-1, |&(c, _)| c as isize);
                                self.carry = Carry::Plain(parent);
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// After a quoted scalar that ended at `at`: a key when `:` follows
    /// (returns where its value starts), else the end of the node.
    fn key_after(&mut self, line: &[u8], at: usize, start: usize) -> Option<usize> {
        let at = skip_spaces(line, at);
        if line.get(at) == Some(&b':') {
            self.open(start, Kind::Map);
            Some(at + 1)
        } else {
            None
        }
    }

    /// The rest of a line after a quoted scalar closed that began on an
    /// earlier line (a multi-line key is possible, a value more likely).
    fn rest_after_scalar(&mut self, line: &[u8], at: usize) {
        if !self.flow.is_empty() {
            self.flow_from(line, at, false);
            return;
        }
        let at = skip_spaces(line, at);
        if line.get(at) == Some(&b':') && indicator(line, at) {
            // A multi-line quoted key: its map's column is unknown; count a level.
            let column = self.block.last().map_or(0, |&(c, _)| c + 1);
            self.open(column, Kind::Map);
            self.block_from(line, at + 1);
        }
    }

    /// A `|` or `>` header at `at`: the lines after it are text indented
    /// deeper than the collection it belongs to.
    fn block_scalar(&mut self, line: &[u8], at: usize) {
        let parent = self.block.last().map_or(-1, |&(c, _)| c as isize);
        let given = line[at + 1..]
            .iter()
            .take_while(|b| !is_space(**b))
            .find(|b| b.is_ascii_digit() && **b != b'0')
            .map(|d| usize::from(d - b'0'));
        let indent = given.map(|d| (parent.max(0) as usize) + d);
        self.carry = Carry::BlockHeader { parent, indent };
    }

    /// Scans flow-context content from `at` to the end of the line; the flow
    /// stack carries over to the next line.
    /// `scalar_start`: whether a scalar may start at `at` (after an
    /// indicator), so that a quote inside plain text (`it's`, `a 'b`) is not
    /// taken for one; spaces keep it as it was.
    fn flow_from(&mut self, line: &[u8], mut at: usize, mut scalar_start: bool) {
        // Stops at the first level past the limit, so the stack stays short.
        while at < line.len() && self.found.is_none() {
            let b = line[at];
            match b {
                b'[' | b'{' => {
                    self.flow.push(Flow {
                        list: b == b'[',
                        pair: false,
                    });
                    self.note_depth();
                    scalar_start = true;
                }
                b']' | b'}' => {
                    self.flow.pop();
                    scalar_start = false;
                    if self.flow.is_empty() {
                        // Back in block context: a flow key may be followed by `: value`.
                        let next = skip_spaces(line, at + 1);
                        if line.get(next) == Some(&b':') {
                            self.block_from(line, next + 1);
                        }
                        return;
                    }
                }
                b',' => {
                    if let Some(f) = self.flow.last_mut() {
                        f.pair = false;
                    }
                    scalar_start = true;
                }
                b':' | b'?' => {
                    // Counted as a pair even where `:` is text (`a:b`): an
                    // over-count of one, never an under-count.
                    if let Some(f) = self.flow.last_mut()
                        && f.list
                        && !f.pair
                    {
                        f.pair = true;
                        self.note_depth();
                    }
                    scalar_start = indicator(line, at);
                }
                b'#' if at == 0 || is_space(line[at - 1]) => break,
                b'"' | b'\'' if scalar_start => match close_quote(line, at + 1, b) {
                    Some(after) => {
                        at = after;
                        scalar_start = false;
                        continue;
                    }
                    None => {
                        self.carry = Carry::Quoted(b);
                        return;
                    }
                },
                b' ' | b'\t' => {}
                _ => scalar_start = false,
            }
            at += 1;
        }
        self.flow_scalar_start = scalar_start;
    }
}

/// Whether a ` #` comment starts at or after `at`.
fn has_comment(line: &[u8], at: usize) -> bool {
    (at.max(1)..line.len()).any(|i| line[i] == b'#' && is_space(line[i - 1]))
        || line.get(at) == Some(&b'#')
}

/// Where the quoted scalar opened by `quote` ends (the index after its
/// closing quote), scanning from `at`; `None` when it continues on the next
/// line. `''` inside single quotes and `\x` inside double quotes are escapes.
fn close_quote(line: &[u8], mut at: usize, quote: u8) -> Option<usize> {
    while at < line.len() {
        match line[at] {
            b'\\' if quote == b'"' => at += 2,
            b'\'' if quote == b'\'' && line.get(at + 1) == Some(&b'\'') => at += 2,
            b if b == quote => return Some(at + 1),
            _ => at += 1,
        }
    }
    None
}

/// The end of a block plain scalar from `at`: `(index of ':', true)` when a
/// `: ` (or a `:` ending the line) makes it a key, else `(end, false)`. A
/// ` #` starts a comment.
fn plain_end(line: &[u8], mut at: usize) -> (usize, bool) {
    while at < line.len() {
        match line[at] {
            b':' if indicator(line, at) => return (at, true),
            b'#' if at > 0 && is_space(line[at - 1]) => return (at, false),
            _ => at += 1,
        }
    }
    (at, false)
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
