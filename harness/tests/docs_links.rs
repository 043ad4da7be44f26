//! The documents hold together: every relative link in README.md, ARCHITECTURE.md,
//! CONTRIBUTING.md, CHANGELOG.md and the book under docs/ resolves, the README stays short,
//! every page of the book is listed in its SUMMARY.md, and no source file cites design notes
//! that live outside the repository. Plain std: no mdBook needed.
use std::fs;
use std::path::{Path, PathBuf};

/// The repository root (the parent of `harness/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("harness/ has a parent folder")
        .to_path_buf()
}

/// Every file under `dir` whose name ends with one of `exts`, skipping hidden folders and
/// `target`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.expect("a directory entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" {
                files(&p, exts, out);
            }
        } else if exts.iter().any(|x| name.ends_with(x)) {
            out.push(p);
        }
    }
}

/// The targets of the Markdown links `[text](target)` of `text`, outside fenced code blocks
/// and inline code spans, without a link title.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Every other backtick-delimited piece is a code span.
        let prose = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_string());
            rest = &after[end..];
        }
    }
    out
}

/// Links a file system cannot check: web and mail addresses, anchors in the same page, and
/// mdBook's draft chapters (an empty target).
fn not_a_file(target: &str) -> bool {
    target.is_empty()
        || target.starts_with('#')
        || target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
}

#[test]
fn relative_links_resolve() {
    let root = root();
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    files(&root.join("docs"), &[".md"], &mut docs);
    assert!(docs.len() > 4, "no Markdown pages under docs/");
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let dir = doc.parent().expect("a file has a folder");
        for target in link_targets(&text) {
            if not_a_file(&target) {
                continue;
            }
            checked += 1;
            let path = target.split('#').next().unwrap_or("");
            if !dir.join(path).exists() {
                let name = doc.strip_prefix(root.as_path()).unwrap_or(doc.as_path());
                broken.push(format!("{}: {target}", name.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "relative links that resolve to nothing:\n{}",
        broken.join("\n")
    );
    println!(
        "{checked} relative links in {} documents resolve",
        docs.len()
    );
}

#[test]
fn readme_is_at_most_250_lines() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md");
    let n = text.lines().count();
    assert!(
        n <= 250,
        "README.md has {n} lines: keep it at most 250 and move the rest into docs/"
    );
}

#[test]
fn every_book_page_is_in_the_summary() {
    let src = root().join("docs").join("src");
    let summary = fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let listed = link_targets(&summary);
    let mut pages = Vec::new();
    files(&src, &[".md"], &mut pages);
    let missing: Vec<String> = pages
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(src.as_path())
                .expect("a page under docs/src");
            rel.to_string_lossy().replace('\\', "/")
        })
        .filter(|p| p != "SUMMARY.md" && !listed.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "pages of docs/src missing from docs/src/SUMMARY.md: {missing:?}"
    );
}

#[test]
fn no_source_cites_the_design_notes() {
    // Built from two pieces, so that this file does not match itself.
    let needle = ["DESIGN", ".md"].concat();
    let root = root();
    let mut sources = Vec::new();
    for dir in ["harness", "kernels", "scripts"] {
        files(
            &root.join(dir),
            &[".rs", ".sh", ".py", ".toml"],
            &mut sources,
        );
    }
    assert!(
        !sources.is_empty(),
        "no sources found under {}",
        root.display()
    );
    let hits: Vec<String> = sources
        .iter()
        .filter(|p| fs::read_to_string(p).is_ok_and(|t| t.contains(&needle)))
        .map(|p| {
            let name = p.strip_prefix(root.as_path()).unwrap_or(p.as_path());
            name.display().to_string()
        })
        .collect();
    assert!(
        hits.is_empty(),
        "these files cite {needle}, which is not in the repository (cite ARCHITECTURE.md §N \
         or a page of docs/ instead): {hits:?}"
    );
}
