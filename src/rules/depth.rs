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

/// One open flow collection: `[` or `{`, and how many implicit `key:` pairs
/// are open inside a `[` (they close at the next `,` or `]`).
#[derive(Debug, Clone, Copy)]
struct Flow {
    list: bool,
    pairs: usize,
    /// The depth outside this collection, and the deepest reached inside it.
    base: usize,
    peak: usize,
    /// Most levels of a collection closed inside this one since its last `,`
    /// (0: none). If a `:` follows, that collection was a key: in a `[` the
    /// implicit pair then holds it, one level deeper than counted.
    key: usize,
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
    /// Where the outermost open flow collection was entered from block
    /// context: the column of its node's first token (its `[` / `{`, or a
    /// tag or anchor before it), where a map opens if it turns out to be a
    /// key.
    flow_column: usize,
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
        flow_column: 0,
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
        self.block.len() + self.flow.iter().map(|f| 1 + f.pairs).sum::<usize>()
    }

    fn note_depth(&mut self) {
        self.note(self.depth());
    }

    fn note(&mut self, depth: usize) {
        if let Some(f) = self.flow.last_mut() {
            f.peak = f.peak.max(depth);
        }
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
                if indent as isize > parent && !(indent == 0 && document_marker(line)) {
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
        // Only at column 0: an indented `---` is text (`  --- k:` is a key).
        if indent == 0 && document_marker(line) {
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
        // The column of the current node's first property (tag or anchor)
        // or alias: a key's map opens there, not at the key's text.
        let mut node_start: Option<usize> = None;
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
                    // `*a : v`, `!t : v`: the key before `:` is that node.
                    let column = if b == b':' {
                        node_start.unwrap_or(at)
                    } else {
                        at
                    };
                    self.open(column, kind);
                    node_start = None;
                    at += 1;
                }
                b'!' | b'&' | b'*' => {
                    // A tag, anchor or alias: one token (which flow indicators
                    // end), then maybe a value.
                    node_start.get_or_insert(at);
                    at += 1;
                    while at < line.len() && !is_space(line[at]) && !b"[]{},".contains(&line[at]) {
                        at += 1;
                    }
                }
                b'[' | b'{' => {
                    self.flow_column = node_start.unwrap_or(at);
                    self.flow_from(line, at, true);
                    return;
                }
                b'|' | b'>' => {
                    self.block_scalar(line, at);
                    return;
                }
                b'"' | b'\'' => match close_quote(line, at + 1, b) {
                    Some(after) => {
                        let start = node_start.unwrap_or(at);
                        node_start = None;
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
                    let start = node_start.take().unwrap_or(at);
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
                    let base = self.depth();
                    self.flow.push(Flow {
                        list: b == b'[',
                        pairs: 0,
                        base,
                        peak: base + 1,
                        key: 0,
                    });
                    self.note_depth();
                    scalar_start = true;
                }
                b']' | b'}' => {
                    let (levels, peak) = self
                        .flow
                        .pop()
                        .map_or((0, 0), |f| (f.peak - f.base, f.peak));
                    scalar_start = false;
                    if let Some(parent) = self.flow.last_mut() {
                        // Two collections before one `:` (`[a]{b: c}: d`):
                        // the parser's key may begin at the first.
                        parent.key = parent.key.max(levels);
                        parent.peak = parent.peak.max(peak);
                    } else {
                        // Back in block context: a flow key may be followed by `: value`.
                        let next = skip_spaces(line, at + 1);
                        if line.get(next) == Some(&b':') {
                            // The collection was a key: its map opens where
                            // it began, and the key nests inside that map.
                            self.open(self.flow_column, Kind::Map);
                            self.note(self.block.len() + levels);
                            self.block_from(line, next + 1);
                        } else if next < line.len() {
                            // Not valid YAML after a value, but the parser
                            // reads on before it says so: so does the count.
                            self.block_from(line, next);
                        }
                        return;
                    }
                }
                b',' => {
                    if let Some(f) = self.flow.last_mut() {
                        f.pairs = 0;
                        f.key = 0;
                    }
                    scalar_start = true;
                }
                // Inside plain text (`b? c`) a `?` is text, and so is what
                // follows it: a quote there opens nothing.
                b'?' if !scalar_start => {}
                // A tag or anchor before a node: the node (a quote, a `:`
                // that opens a pair) may still start after it.
                b'!' | b'&' if scalar_start => {
                    while at + 1 < line.len()
                        && !is_space(line[at + 1])
                        && !b"[]{},".contains(&line[at + 1])
                    {
                        at += 1;
                    }
                }
                b':' | b'?' => {
                    // Counted as a pair even where `:` is text (`a:b`): an
                    // over-count of one, never an under-count. A `:` where
                    // the pair's value starts opens a pair inside it.
                    if let Some(f) = self.flow.last_mut()
                        && f.list
                        && (f.pairs == 0 || scalar_start && b == b':')
                    {
                        f.pairs += 1;
                        // A collection just closed was the pair's key: it
                        // sits inside the pair.
                        let key = std::mem::take(&mut f.key);
                        self.note(self.depth() + key);
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

/// `---` or `...` starting a line (then a space or its end): a document
/// marker, which ends any plain text before it.
fn document_marker(line: &[u8]) -> bool {
    (line.starts_with(b"---") || line.starts_with(b"...")) && indicator(line, 2)
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
