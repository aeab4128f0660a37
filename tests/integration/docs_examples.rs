//! Every shell example in the docs runs here, so "real output" stays real:
//! the pages `docs_links` reads (`README.md`, `docs/*.md`,
//! `simulations/README.md`, `deploy/README.md`) are read block by block.
//!
//! - ` ```console `: each `$ ` line (continued by a trailing `\`) runs in
//!   bash and what it prints (stdout and stderr, as a terminal shows them)
//!   must match the lines below it: `...` alone on a line stands for any
//!   lines, `[..]` for the rest of a line up to the text that follows it,
//!   `[ROOT]` for the block's directory. A command must exit 0; show a
//!   failure's status with `; echo "exit=$?"`.
//! - ` ```console,ignore `: not run; the line before it must be an HTML
//!   comment `<!-- not run: why -->` (a running coordinator, Docker, …).
//! - ` ```yaml file=NAME ` (or `toml`): written as `NAME` into the directory
//!   of every later console block of the page, so a command checks the
//!   file the reader sees.
//! - ` ```text `, ` ```yaml `, ` ```toml `, ` ```rust `: not commands; a
//!   `$ ` line in a text block is refused (a command nobody runs).
//!
//! A fence without a language, or with another one, fails the test: no
//! block is skipped without saying so.
//!
//! Each console block runs in a temp directory of its own, holding the
//! page's files and a link to the repository's `simulations/`; `meridian`
//! is the binary under test and `cargo` is the checkout's, in this test's
//! profile. `DOCS_EXAMPLES=overwrite cargo test --test integration
//! docs_examples::` writes the real output over a differing one (elisions
//! included: review the diff).
//!
//! Why not trycmd, which reads console blocks in Markdown too: it runs no
//! shell (no pipes, no `echo "exit=$?"`), a page's commands write into the
//! checkout unless a `PAGE.in/` and `PAGE.out/` directory sits beside it,
//! and it takes every fence without a language for a test. Its matcher,
//! snapbox, is what compares here (same `...` and `[..]`, a diff on
//! failure).

use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::common::meridian_bin;
use super::docs_links::{documents, repo};

/// One fenced block: its info string, the line numbers (1-based) of its
/// opening fence and of its content lines.
#[derive(Debug)]
struct Block {
    fence: usize,
    info: String,
    lines: Vec<(usize, String)>,
}

/// The fenced blocks of a Markdown text, in order.
fn blocks(text: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<(&str, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (open.take(), marker) {
            (None, Some(m)) => {
                let info = trimmed.trim_start_matches(m.chars().next().unwrap_or('`'));
                open = Some((
                    m,
                    Block {
                        fence: number,
                        info: info.trim().to_string(),
                        lines: Vec::new(),
                    },
                ));
            }
            (Some((m, block)), Some(closing)) if m == closing => found.push(block),
            (Some((m, mut block)), _) => {
                block.lines.push((number, line.to_string()));
                open = Some((m, block));
            }
            (None, None) => {}
        }
    }
    // Markdown runs an unclosed fence to the end of the page.
    found.extend(open.map(|(_, block)| block));
    found
}

/// A command of a console block and the output the page shows for it.
#[derive(Debug)]
struct Example {
    line: usize,
    script: String,
    expected: String,
    /// The lines of the page holding `expected`, for overwriting.
    expected_lines: Range<usize>,
}

/// A console block to run: the page's files so far (name, content) and
/// its commands.
#[derive(Debug)]
struct Run {
    files: Vec<(String, String)>,
    examples: Vec<Example>,
}

/// What a page asks for: its console blocks and the blocks marked not run
/// (their fences' lines).
#[derive(Debug, Default)]
struct Page {
    runs: Vec<Run>,
    not_run: Vec<usize>,
}

/// What running a page found.
#[derive(Default)]
struct Outcome {
    /// Commands run.
    ran: usize,
    /// Commands that failed, with their place and output.
    failures: Vec<String>,
    /// Outputs that differ from the page's, as diffs.
    diffs: Vec<String>,
    /// The page's lines of each differing output and the real output.
    rewrites: Vec<(Range<usize>, String)>,
}

/// The page's blocks sorted into runs, files and not-run blocks, or what
/// is wrong with each block that is none of these (`name:line: …`).
fn page(name: &str, text: &str) -> Result<Page, Vec<String>> {
    let all: Vec<&str> = text.lines().collect();
    let mut page = Page::default();
    let mut files: Vec<(String, String)> = Vec::new();
    let mut wrong = Vec::new();
    for block in blocks(text) {
        let at = format!("{name}:{}", block.fence);
        let mut words = block
            .info
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|w| !w.is_empty());
        let lang = words.next().unwrap_or("");
        let attrs: Vec<&str> = words.collect();
        match lang {
            "console" if attrs.contains(&"ignore") => {
                if not_run_comment(&all, block.fence) {
                    page.not_run.push(block.fence);
                } else {
                    wrong.push(format!(
                        "{at}: a `console,ignore` block needs `<!-- not run: why -->` on the line before it"
                    ));
                }
            }
            "console" => match examples(&block) {
                Ok(examples) => page.runs.push(Run {
                    files: files.clone(),
                    examples,
                }),
                Err(e) => wrong.push(format!("{at}: {e}")),
            },
            "text" => {
                if let Some((n, _)) = block.lines.iter().find(|(_, l)| l.starts_with("$ ")) {
                    wrong.push(format!(
                        "{name}:{n}: a command in a `text` block: make the block `console` (run) or `console,ignore` (with why not)"
                    ));
                }
            }
            "yaml" | "toml" | "rust" => {
                if let Some(file) = attrs.iter().find_map(|a| a.strip_prefix("file=")) {
                    let content: Vec<&str> = block.lines.iter().map(|(_, l)| l.as_str()).collect();
                    files.push((file.to_string(), content.join("\n") + "\n"));
                }
            }
            "" => wrong.push(format!(
                "{at}: a fence without a language: `console` (run), `console,ignore` (not run, say why), or text, yaml, toml, rust"
            )),
            other => wrong.push(format!(
                "{at}: language `{other}`: use `console` for commands, or add `{other}` to the languages docs_examples knows"
            )),
        }
    }
    if wrong.is_empty() {
        Ok(page)
    } else {
        Err(wrong)
    }
}

/// Whether the lines just above the fence (1-based `fence`) end an HTML
/// comment that starts `<!-- not run:`.
fn not_run_comment(lines: &[&str], fence: usize) -> bool {
    let above = lines[..fence - 1]
        .iter()
        .rev()
        .skip_while(|l| l.trim().is_empty());
    let mut comment = Vec::new();
    for line in above {
        comment.push(line.trim());
        if line.contains("<!--") {
            break;
        }
    }
    comment.first().is_some_and(|l| l.ends_with("-->"))
        && comment
            .last()
            .is_some_and(|l| l.starts_with("<!-- not run:"))
}

/// The commands of a console block with their expected output.
fn examples(block: &Block) -> Result<Vec<Example>, String> {
    let mut examples: Vec<Example> = Vec::new();
    let mut lines = block.lines.iter().peekable();
    while let Some((number, line)) = lines.next() {
        let Some(command) = line.strip_prefix("$ ") else {
            if examples.is_empty() {
                return Err(format!(
                    "line {number}: a console block starts with a `$ ` command"
                ));
            }
            continue;
        };
        let mut script = command.to_string();
        while script.ends_with('\\') {
            let Some((_, next)) = lines.next() else { break };
            script.push('\n');
            script.push_str(next);
        }
        let mut output = Vec::new();
        while let Some((n, l)) = lines.next_if(|(_, l)| !l.starts_with("$ ")) {
            output.push((*n, l.as_str()));
        }
        let after = output.last().map_or(*number + 1, |(n, _)| n + 1);
        let first = output.first().map_or(after, |(n, _)| *n);
        examples.push(Example {
            line: *number,
            script,
            expected: output
                .iter()
                .map(|(_, l)| l.trim_end())
                .collect::<Vec<_>>()
                .join("\n")
                .trim_end()
                .to_string(),
            expected_lines: first..after,
        });
    }
    Ok(examples)
}

/// Where the commands run: `meridian` under test and the checkout's
/// `cargo` first on the PATH.
struct Tools {
    /// Holds `meridian` and `cargo`; removed when the test ends.
    _bin: tempfile::TempDir,
    path: String,
}

impl Tools {
    fn new() -> Tools {
        let bin = tempfile::tempdir().expect("a temp dir for the tools");
        std::os::unix::fs::symlink(meridian_bin(), bin.path().join("meridian"))
            .expect("link meridian");
        // `cargo run --example X` in a page runs the checkout's example, as
        // from its root, quietly (the page shows the program's output), in
        // the profile this test was built in (a release test run would
        // otherwise build the whole crate again in debug).
        let release = if cfg!(debug_assertions) {
            ""
        } else {
            "case \" $* \" in *\" --release \"*) ;; *) set -- --release \"$@\";; esac\n"
        };
        let shim = format!(
            "#!/bin/bash\nsub=\"$1\"; shift\n{release}exec '{}' \"$sub\" --quiet --manifest-path '{}' \"$@\"\n",
            env!("CARGO"),
            repo().join("Cargo.toml").display()
        );
        let cargo = bin.path().join("cargo");
        std::fs::write(&cargo, shim).expect("write the cargo shim");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755))
            .expect("make the shim executable");
        let path = format!(
            "{}:{}",
            bin.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Tools { _bin: bin, path }
    }

    /// `script` in bash in `dir`, stdout and stderr in one stream as a
    /// terminal shows them: its exit code and output.
    fn run(&self, dir: &Path, script: &str) -> (Option<i32>, String) {
        let mut command = Command::new("timeout");
        command
            .args(["120", "bash", "-c"])
            .arg(format!("exec 2>&1\n{script}"))
            .current_dir(dir)
            .env("PATH", &self.path)
            .env("NO_COLOR", "1")
            .env_remove("REDIS_URL")
            .env_remove("RUST_LOG");
        for (key, _) in std::env::vars_os() {
            let name = key.to_string_lossy();
            // What cargo sets for this test, not for a reader's shell: ring's
            // build script reruns when CARGO_MANIFEST_DIR changes, so a
            // nested `cargo run` with it set would rebuild the crate, and
            // the next `cargo test` again.
            let from_cargo = ["CARGO_PKG_", "CARGO_BIN_EXE_", "CARGO_CRATE_NAME"]
                .iter()
                .any(|p| name.starts_with(p))
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "OUT_DIR",
                ]
                .contains(&name.as_ref());
            if from_cargo || name.starts_with("MERIDIAN_") {
                command.env_remove(key);
            }
        }
        let out = command.output().expect("run bash");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

/// Output as compared: no trailing blanks on a line, no blank lines at
/// the end (a page's block cannot show them).
fn tidy(output: &str) -> String {
    let lines: Vec<&str> = output.lines().map(str::trim_end).collect();
    lines.join("\n").trim_end().to_string()
}

/// Runs a page's console blocks.
fn run_page(name: &str, page: &Page, tools: &Tools) -> Outcome {
    let mut outcome = Outcome::default();
    for Run { files, examples } in &page.runs {
        let dir = tempfile::tempdir().expect("a temp dir for a block");
        for (file, content) in files {
            std::fs::write(dir.path().join(file), content).expect("write a page's file");
        }
        std::os::unix::fs::symlink(repo().join("simulations"), dir.path().join("simulations"))
            .expect("link simulations/");
        let mut redactions = snapbox::Redactions::new();
        redactions
            .insert("[ROOT]", dir.path().to_path_buf())
            .expect("[ROOT] redaction");
        let assert = snapbox::Assert::new().redact_with(redactions.clone());
        for example in examples {
            let started = Instant::now();
            let (code, output) = tools.run(dir.path(), &example.script);
            outcome.ran += 1;
            let at = format!("{name}:{}: $ {}", example.line, example.script);
            eprintln!("{at} ({} ms)", started.elapsed().as_millis());
            let actual = tidy(&output);
            if code != Some(0) {
                outcome.failures.push(format!(
                    "{at}\nexited {code:?} (show a failure's status with `; echo \"exit=$?\"`):\n{actual}"
                ));
                continue;
            }
            let compared = assert.try_eq(
                Some(&"the command"),
                snapbox::Data::text(actual.clone()),
                snapbox::Data::text(example.expected.clone()),
            );
            if let Err(diff) = compared {
                outcome.diffs.push(format!("{at}\n{diff}"));
                outcome
                    .rewrites
                    .push((example.expected_lines.clone(), redactions.redact(&actual)));
            }
        }
    }
    outcome
}

/// `text` with each range of lines (1-based) replaced by its new text.
fn rewrite(text: &str, mut rewrites: Vec<(Range<usize>, String)>) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    rewrites.sort_by_key(|(range, _)| std::cmp::Reverse(range.start));
    for (range, new) in rewrites {
        let new: Vec<String> = new.lines().map(String::from).collect();
        lines.splice(range.start - 1..range.end - 1, new);
    }
    lines.join("\n") + "\n"
}

#[test]
fn every_console_example_in_the_docs_prints_what_the_docs_show() {
    let root = repo();
    let overwrite = std::env::var("DOCS_EXAMPLES").is_ok_and(|v| v == "overwrite");
    let tools = Tools::new();
    let mut wrong = Vec::new();
    let (mut ran, mut not_run) = (0, 0);
    for doc in documents() {
        let name = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{name}: {e}"));
        let page = match page(&name, &text) {
            Ok(page) => page,
            Err(errors) => {
                wrong.extend(errors);
                continue;
            }
        };
        not_run += page.not_run.len();
        let outcome = run_page(&name, &page, &tools);
        ran += outcome.ran;
        if overwrite && !outcome.rewrites.is_empty() {
            let count = outcome.rewrites.len();
            std::fs::write(&doc, rewrite(&text, outcome.rewrites)).expect("overwrite a page");
            eprintln!("{name}: wrote the real output of {count} command(s)");
        } else {
            wrong.extend(outcome.diffs);
        }
        wrong.extend(outcome.failures);
    }
    eprintln!("docs examples: {ran} commands run, {not_run} blocks marked not run");
    assert!(
        wrong.is_empty(),
        "{} docs example(s) wrong:\n\n{}",
        wrong.len(),
        wrong.join("\n\n")
    );
    // A parser that found nothing would pass everything.
    assert!(ran > 0, "no console command found in the docs");
}

#[test]
fn a_block_neither_run_nor_marked_not_run_is_refused() {
    let text = "\
# Page

```
$ meridian rules check rules.yaml
```

```console,ignore
$ meridian demo
```

<!-- not run: needs a coordinator -->
```console,ignore
$ meridian ctl leases
```

```text
$ meridian certs ca --dir pki
```

```sh
meridian simulate x.toml
```

```yaml file=rules.yaml
domain: api
```

```console
$ meridian rules check rules.yaml \\
    --log-format json
ok
...
$ meridian --version; echo \"exit=$?\"
```

```
unclosed
";
    let errors = page("page.md", text).expect_err("five blocks are wrong");
    let lines: Vec<&str> = errors
        .iter()
        .map(|e| e.split(": ").next().unwrap_or(""))
        .collect();
    assert_eq!(
        lines,
        [
            "page.md:3",
            "page.md:7",
            "page.md:17",
            "page.md:20",
            "page.md:36"
        ],
        "{errors:#?}"
    );
    let (_, tail) = text.split_once("```yaml").expect("the page's file");
    let good = format!(
        "```yaml{}",
        tail.split("\n\n```\nunclosed").next().unwrap_or("")
    );
    let page = page("page.md", &good).expect("a file and a console block");
    let Run { files, examples } = &page.runs[0];
    assert_eq!(
        files,
        &[("rules.yaml".to_string(), "domain: api\n".to_string())]
    );
    assert_eq!(examples.len(), 2);
    assert_eq!(
        examples[0].script,
        "meridian rules check rules.yaml \\\n    --log-format json"
    );
    assert_eq!(examples[0].expected, "ok\n...");
    assert_eq!(examples[0].expected_lines, 8..10);
    assert_eq!(examples[1].expected, "");
}
