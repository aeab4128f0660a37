//! Every relative link in the docs a reader follows — `README.md`, the pages
//! of `docs/`, `simulations/README.md` and `deploy/README.md` — leads to a
//! file of the repository, and every `#anchor` into a Markdown file to one of
//! its headings. Files move (the integration tests moved under
//! `tests/integration/` and left 13 links behind); this test is what notices.
//!
//! Pure std over the files: links are read from the Markdown outside fenced
//! code blocks and code spans, anchors are made from headings by GitHub's
//! rules.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents checked: the README, every page of `docs/`, and the
/// READMEs of the two folders the README sends readers to.
pub(crate) fn documents() -> Vec<PathBuf> {
    let repo = repo();
    let mut docs = vec![
        repo.join("README.md"),
        repo.join("simulations/README.md"),
        repo.join("deploy/README.md"),
    ];
    let pages = std::fs::read_dir(repo.join("docs")).expect("docs/ is readable");
    for entry in pages {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    docs.sort();
    docs
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, every other
/// character but letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of `text` outside fenced code blocks, with their 1-based
/// numbers: a `# comment` or a `](` inside a block is output, not Markdown.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// The anchors of the headings of a Markdown text, as GitHub numbers
/// repeats (`x`, `x-1`, `x-2`, …).
pub(crate) fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let base = anchor(title.trim_end_matches('#'));
        let mut slug = base.clone();
        let mut n = 0;
        while anchors.contains(&slug) {
            n += 1;
            slug = format!("{base}-{n}");
        }
        anchors.insert(slug);
    }
    anchors
}

/// `text` with the contents of its code spans blanked out, so that
/// `` `[a](b)` `` is not a link. Spans may run over lines within a
/// paragraph; a backtick left without a partner is literal.
fn without_code_spans(paragraph: &str) -> String {
    let ticks = paragraph.matches('`').count();
    let paired = ticks - ticks % 2;
    let mut seen = 0;
    let mut inside = false;
    paragraph
        .chars()
        .map(|c| {
            if c == '`' && seen < paired {
                seen += 1;
                inside = !inside;
                return c;
            }
            if inside && c != '\n' { ' ' } else { c }
        })
        .collect()
}

/// Every link target in a Markdown text with its line: inline links and
/// images (`[text](target "title")`) and reference definitions
/// (`[label]: target`), outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let lines = prose_lines(text);
    // Paragraphs: runs of consecutive non-blank prose lines.
    let mut paragraphs: Vec<Vec<(usize, &str)>> = Vec::new();
    let mut last = 0;
    for (number, line) in lines {
        if line.trim().is_empty() {
            last = 0;
            continue;
        }
        match paragraphs.last_mut() {
            Some(p) if last + 1 == number => p.push((number, line)),
            _ => paragraphs.push(vec![(number, line)]),
        }
        last = number;
    }
    for paragraph in paragraphs {
        let first = paragraph[0].0;
        let joined: Vec<&str> = paragraph.iter().map(|(_, l)| *l).collect();
        let plain = without_code_spans(&joined.join("\n"));
        for (at, _) in plain.match_indices("](") {
            let line = first + plain[..at].matches('\n').count();
            if let Some(target) = target_of(&plain[at + 2..]) {
                found.push((line, target));
            }
        }
        for (offset, line) in plain.lines().enumerate() {
            if let Some(target) = reference_definition(line) {
                found.push((first + offset, target.to_string()));
            }
        }
    }
    found
}

/// The target of a reference definition line, `[label]: target`.
fn reference_definition(line: &str) -> Option<&str> {
    let (label, target) = line.trim_start().strip_prefix('[')?.split_once("]:")?;
    if label.is_empty() || label.contains('[') {
        return None;
    }
    Some(unbracket(target.split_whitespace().next()?))
}

/// The destination of an inline link from the text after its `](`: up to
/// the closing parenthesis (balanced), without a title.
fn target_of(after: &str) -> Option<String> {
    let mut depth = 0usize;
    let mut end = None;
    for (i, c) in after.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                end = Some(i);
                break;
            }
            ')' => depth -= 1,
            '\n' => return None,
            _ => {}
        }
    }
    let inside = after[..end?].trim();
    let target = if inside.starts_with('<') {
        inside.split('>').next().unwrap_or(inside)
    } else {
        inside.split_whitespace().next().unwrap_or("")
    };
    Some(unbracket(target).to_string())
}

fn unbracket(target: &str) -> &str {
    target.trim_start_matches('<').trim_end_matches('>')
}

/// `path` with `.` and `..` resolved by name (the target may not exist, so
/// no `canonicalize`).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with each relative link of `doc` (inside `root`): a file
/// that does not exist, a path out of the repository, or an anchor that
/// names no heading of the Markdown file it points into.
fn broken_links(root: &Path, doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let dir = doc.parent().expect("a document has a folder");
    let mut broken = Vec::new();
    for (line, target) in links(&text) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (target.as_str(), None),
        };
        let resolved = if file.is_empty() {
            doc.to_path_buf()
        } else {
            normalise(&dir.join(file))
        };
        let at = format!("{name}:{line}: ({target})");
        if !resolved.starts_with(root) {
            broken.push(format!("{at} leads out of the repository"));
            continue;
        }
        if !resolved.exists() {
            broken.push(format!(
                "{at}: {} does not exist",
                resolved.strip_prefix(root).unwrap_or(&resolved).display()
            ));
            continue;
        }
        let Some(fragment) = fragment else { continue };
        if resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let target_text = std::fs::read_to_string(&resolved).unwrap_or_default();
        if !heading_anchors(&target_text).contains(fragment) {
            broken.push(format!(
                "{at}: {} has no heading with anchor #{fragment}",
                resolved.strip_prefix(root).unwrap_or(&resolved).display()
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_leads_to_a_file_and_heading() {
    let root = repo();
    let docs = documents();
    assert!(
        docs.len() >= 4,
        "the README, docs/ and two folder READMEs: {docs:?}"
    );
    let broken: Vec<String> = docs.iter().flat_map(|d| broken_links(&root, d)).collect();
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_checker_finds_a_missing_file_and_a_missing_heading_and_ignores_code() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path();
    std::fs::create_dir(root.join("docs")).expect("docs/");
    std::fs::write(
        root.join("docs/page.md"),
        "# A page: its title\n\n## Second, part `two`\n\n## Second, part `two`\n",
    )
    .expect("page");
    let readme = root.join("README.md");
    std::fs::write(
        &readme,
        "See [the page](docs/page.md), [its title](docs/page.md#a-page-its-title),\n\
         [part two](docs/page.md#second-part-two-1) and [back](#top).\n\
         [missing](docs/gone.md) and ![a picture](docs/none.png \"title\")\n\
         [bad anchor](docs/page.md#third), [outside](../elsewhere.md),\n\
         `[in code](docs/code.md)` and a span over lines `a\n\
         [also code](docs/code2.md)`.\n\n\
         ```\n[in a block](docs/block.md)\n# not a heading\n```\n\n\
         # Top\n\n[web](https://example.com/x) [ref]: docs/ref.md\n\n[ref]: docs/ref.md\n",
    )
    .expect("readme");
    let broken = broken_links(root, &readme);
    let expected = [
        "README.md:3: (docs/gone.md): docs/gone.md does not exist",
        "README.md:3: (docs/none.png): docs/none.png does not exist",
        "README.md:4: (docs/page.md#third): docs/page.md has no heading with anchor #third",
        "README.md:4: (../elsewhere.md) leads out of the repository",
        "README.md:17: (docs/ref.md): docs/ref.md does not exist",
    ];
    assert_eq!(broken, expected);
}
