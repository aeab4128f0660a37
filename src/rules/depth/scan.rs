//! The line scanner behind [`check_depth`](super::check_depth): it reads a
//! document line by line, keeping a stack of the block collections and the
//! flow collections open, what a line ends inside of (a quoted or block
//! scalar, plain text), and the deepest level reached. The rules it follows
//! are in the parent module's docs.

use super::TooDeep;

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

pub(super) struct Scan {
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
    /// The 1-based line being scanned.
    pub(super) line: usize,
    /// Where the nesting first went past `limit`, once it did.
    pub(super) found: Option<TooDeep>,
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
    /// A scan of a new document, refused past `limit` levels.
    pub(super) fn new(limit: usize) -> Scan {
        Scan {
            block: Vec::new(),
            flow: Vec::new(),
            carry: Carry::Structure,
            flow_scalar_start: true,
            flow_column: 0,
            limit,
            line: 0,
            found: None,
        }
    }

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

    /// Scans one line (without its line break).
    pub(super) fn line_of(&mut self, line: &[u8]) {
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
