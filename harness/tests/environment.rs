//! The environment-variable table (`harness/src/environment.rs`, `vramlab env`) against the
//! repository: every `VRAMLAB_*` name the code, the scripts, the tests or the docs mention is
//! in the table (or is not a variable: a header guard, a C macro, a test's own fixture), and
//! every variable in the table is read where the table says.
mod common;
use common::root;
use std::collections::{BTreeMap, BTreeSet};
use vramlab::environment::VARS;

/// `VRAMLAB_*` words that are not environment variables, each with why.
const NOT_VARIABLES: &[(&str, &str)] = &[
    ("VRAMLAB_CUDART_10", "a C macro of the CUDA 10 stub build"),
    ("VRAMLAB_EMU_CUDA_H", "a header guard"),
    ("VRAMLAB_EMU_INTERNAL_H", "a header guard"),
    ("VRAMLAB_EMU_RECORD_H", "a header guard"),
    ("VRAMLAB_EMULATOR_TESTS_CHECK_H", "a header guard"),
    ("VRAMLAB_PACKAGE", "a marker the wheel test prints"),
    ("VRAMLAB_TEST_X", "set and read by one unit test"),
    ("VRAMLAB_SURELY_UNSET_VAR", "a test's unset variable"),
    (
        "VRAMLAB_FRESH_LONG_1",
        "a long value fresh-machine.sh sets to check the environment",
    ),
    (
        "VRAMLAB_FRESH_LONG_2",
        "a long value fresh-machine.sh sets to check the environment",
    ),
];

/// The files git tracks, but results, the changelog (history may name what is gone) and the
/// table itself.
fn files() -> Vec<(String, String)> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split('\0')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            !p.starts_with("results/")
                && !p.starts_with("docs/src/results/")
                && *p != "CHANGELOG.md"
                && *p != "harness/src/environment.rs"
                && *p != "harness/tests/environment.rs"
        })
        .filter_map(|p| {
            let text = std::fs::read_to_string(root().join(p)).ok()?;
            Some((p.to_string(), text))
        })
        .collect()
}

/// The `VRAMLAB_[A-Z0-9_]+` words of `text`; a prefix (`VRAMLAB_EMU_*`) is not a name.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("VRAMLAB_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let word = &tail[..end];
        if !word.ends_with('_') {
            out.insert(word.to_string());
        }
        rest = &tail[end.max(1)..];
    }
    out
}

#[test]
fn every_variable_named_anywhere_is_in_the_table_and_read_where_it_says() {
    let files = files();
    let table: BTreeSet<&str> = VARS.iter().map(|v| v.name).collect();
    let not: BTreeSet<&str> = NOT_VARIABLES.iter().map(|(n, _)| *n).collect();
    let mut unknown: BTreeMap<String, String> = BTreeMap::new();
    for (path, text) in &files {
        for n in names(text) {
            if !table.contains(n.as_str()) && !not.contains(n.as_str()) {
                unknown.entry(n).or_insert_with(|| path.clone());
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "not in harness/src/environment.rs (name: first file): {unknown:?}"
    );
    for v in VARS {
        for r in v.read_by {
            let found = files.iter().any(|(p, t)| {
                r.paths().iter().any(|d| p.starts_with(d)) && names(t).contains(v.name)
            });
            assert!(
                found,
                "{} is listed as read by {} ({:?}), which never names it",
                v.name,
                r.as_str(),
                r.paths()
            );
        }
    }
}

#[test]
fn the_prefix_scan_reads_names_not_prefixes() {
    let n = names("VRAMLAB_EMU_* and ${VRAMLAB_MODELS}/x, \"VRAMLAB_EMU_L2\"");
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["VRAMLAB_EMU_L2", "VRAMLAB_MODELS"]
    );
}
