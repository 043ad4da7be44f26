//! The generated parts of the docs are current, and the scenario index is whole.
//!
//! - Every block of a result or reference page (docs/src/results/*.md, docs/src/reference/*.md)
//!   and of README.md between
//!   `<!-- generated: vramlab ARGS -->` and `<!-- end generated -->` is what `vramlab ARGS`
//!   prints now, run from the repository root (`vramlab report RESULTS.csv --markdown ...`).
//!   A marker ending in `exit=N` expects that exit status (`vramlab compare` exits 1 on the
//!   regressions it reports); otherwise the command must succeed.
//!   After a deliberate change, `VRAMLAB_BLESS=1 cargo test -p vramlab --test docs_generated`
//!   rewrites every block (as `--test help` does for docs/src/reference/cli.md).
//! - scenarios/README.md links every scenarios/*.toml file, and every scenario file it links
//!   exists.
//! - The torch probe's harness/python/vramlab/probe/schema.json is what `vramlab schema --json` prints.
mod common;
use std::path::{Path, PathBuf};

const START: &str = "<!-- generated: vramlab ";
const END: &str = "<!-- end generated -->";

fn bless() -> bool {
    std::env::var_os("VRAMLAB_BLESS").is_some_and(|v| v != "0")
}

/// The files of `dir` whose names end in `ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file() && p.to_string_lossy().ends_with(ext))
        .collect();
    out.sort();
    out
}

/// What `vramlab ARGS` prints, run from the repository root (`ARGS` may end in `exit=N`, the
/// status it must exit with; 0 when absent).
fn run(page: &Path, args: &str) -> String {
    let mut words: Vec<&str> = args.split_whitespace().collect();
    let want = match words.last().and_then(|w| w.strip_prefix("exit=")) {
        Some(n) => {
            let n = n.parse::<i32>().expect("exit=N takes an integer");
            words.pop();
            n
        }
        None => 0,
    };
    let out = common::vramlab()
        .args(&words)
        .output()
        .expect("vramlab runs");
    assert_eq!(
        out.status.code(),
        Some(want),
        "{}: `vramlab {args}` exited otherwise: {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `text` with every generated block replaced by what its command prints now, the commands of
/// the stale blocks, and the number of blocks. `page` (repository-relative) names the page in
/// messages.
fn regenerate(page: &Path, text: &str) -> (String, Vec<String>, usize) {
    let mut out = String::new();
    let mut stale = Vec::new();
    let mut blocks = 0;
    let mut rest = text;
    while let Some(i) = rest.find(START) {
        let line_end = rest[i..]
            .find('\n')
            .map(|n| i + n + 1)
            .unwrap_or_else(|| panic!("{}: a generated marker ends the file", page.display()));
        let marker = rest[i..line_end].trim_end();
        let args = marker
            .strip_prefix(START)
            .and_then(|m| m.strip_suffix("-->"))
            .unwrap_or_else(|| panic!("{}: malformed marker `{marker}`", page.display()))
            .trim();
        let end = rest[line_end..].find(END).unwrap_or_else(|| {
            panic!("{}: `{marker}` has no `{END}`", page.display());
        }) + line_end;
        let want = run(page, args);
        if rest[line_end..end] != want {
            stale.push(format!("vramlab {args}"));
        }
        out.push_str(&rest[..line_end]);
        out.push_str(&want);
        blocks += 1;
        rest = &rest[end..];
    }
    out.push_str(rest);
    (out, stale, blocks)
}

#[test]
fn generated_result_tables_are_current() {
    let root = common::root();
    let dir = root.join("docs/src/results");
    let mut blocks = 0;
    let mut failures = Vec::new();
    let mut pages = files(&dir, ".md");
    pages.extend(files(&root.join("docs/src/reference"), ".md"));
    pages.push(root.join("README.md"));
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("read the page");
        let name = page.strip_prefix(&root).unwrap_or(&page);
        let (want, stale, n) = regenerate(name, &text);
        blocks += n;
        if stale.is_empty() {
            continue;
        }
        if bless() {
            std::fs::write(&page, want).expect("write the page");
        } else {
            failures.push(format!(
                "{}: stale generated block(s) from {}",
                name.display(),
                stale.join("; ")
            ));
        }
    }
    assert!(blocks > 0, "no generated block under {}", dir.display());
    assert!(
        failures.is_empty(),
        "{}\nregenerate them with `VRAMLAB_BLESS=1 cargo test -p vramlab --test docs_generated` \
         and commit them",
        failures.join("\n")
    );
}

/// The `.toml` link targets of `text` (`[...](NAME.toml)`).
fn toml_links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .filter(|t| t.ends_with(".toml"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_scenario_index_lists_every_scenario() {
    let dir = common::root().join("scenarios");
    let index = dir.join("README.md");
    let text = std::fs::read_to_string(&index).expect("scenarios/README.md exists");
    let linked = toml_links(&text);
    let missing: Vec<String> = files(&dir, ".toml")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| !linked.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "{} does not list {} (add a line with its class and purpose)",
        index.display(),
        missing.join(", ")
    );
    let dangling: Vec<&String> = linked
        .iter()
        .filter(|t| !t.contains('/') && !dir.join(t).is_file())
        .collect();
    assert!(
        dangling.is_empty(),
        "{} names scenario files that do not exist: {dangling:?}",
        index.display()
    );
}

/// The torch probe's copy of the CSV schema (harness/python/vramlab/probe/schema.json, which its writer
/// reads) is what `vramlab schema --json` prints now: one definition of the columns, the record
/// type's. `VRAMLAB_BLESS=1` rewrites it.
#[test]
fn the_probes_schema_is_the_binarys() {
    let path = common::root().join("harness/python/vramlab/probe/schema.json");
    let want = run(&path, "schema --json");
    if bless() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is stale: it is not what `vramlab schema --json` prints; \
         VRAMLAB_BLESS=1 cargo test -p vramlab --test docs_generated rewrites it",
        path.display()
    );
}
