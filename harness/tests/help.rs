//! The help is complete and current: every flag and positional of every subcommand has help
//! (clap's `help_expected`, checked by `debug_assert`), the top level's and each subcommand's
//! `--help` match their snapshots (harness/tests/snapshots/help__*.snap; after a deliberate
//! change, `INSTA_UPDATE=always cargo test -p vramlab --test help` rewrites them, or
//! `cargo insta review`), and the generated CLI reference docs/src/reference/cli.md is current
//! (`VRAMLAB_BLESS=1 cargo test -p vramlab --test help` rewrites it).
mod common;
use clap::CommandFactory;
use vramlab::cli::{markdown_reference, trim_lines, Cli, REFERENCE_WIDTH};

/// `vramlab ARGS` (ending in `--help`) as a user reads it at 100 columns, each line's
/// trailing whitespace removed (clap pads blank lines inside an argument's help).
fn help(args: &[&str]) -> String {
    let out = common::vramlab()
        .args(args)
        .env("COLUMNS", REFERENCE_WIDTH.to_string())
        .env_remove("LINES")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    trim_lines(&String::from_utf8(out).expect("help is UTF-8"))
}

/// The subcommands a snapshot covers; `every_subcommand_has_a_snapshot` keeps the list whole.
const SUBCOMMANDS: &[&str] = &[
    "sweep",
    "synth-weights",
    "decode",
    "fit",
    "estimate",
    "compare",
    "merge",
    "bundle",
    "plot",
    "validate",
    "report",
    "emulate",
    "gpus",
    "env",
    "schema",
    "features",
];

#[test]
fn the_cli_definition_is_consistent_and_every_argument_has_help() {
    // `help_expected` is a debug assertion: it fires here, in a debug build, naming the
    // arguments without help.
    Cli::command().debug_assert();
}

#[test]
fn every_subcommand_has_a_snapshot() {
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name().to_string())
        .collect();
    assert_eq!(
        names, SUBCOMMANDS,
        "add a snapshot test for each new subcommand"
    );
}

#[test]
fn every_subcommand_help_gives_its_exit_codes() {
    for name in SUBCOMMANDS {
        let h = help(&[name, "--help"])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            h.contains("Exit codes: 0 ") && h.contains("; 1 ") && h.contains("; 2 "),
            "`vramlab {name} --help` gives no exit codes:\n{h}"
        );
    }
}

#[test]
fn help_names_no_repository_path_for_the_presets() {
    let h = help(&["estimate", "--help"]);
    assert!(!h.contains("harness/presets"), "{h}");
    for (name, _) in vramlab::estimate::model::PRESETS {
        assert!(h.contains(name), "--model's help omits the preset {name}");
    }
    for p in [
        "sd15",
        "sd21",
        "sdxl",
        "flux-dev",
        "flux-schnell",
        "wan2.1-t2v-1.3b",
    ] {
        assert!(h.contains(p), "--model's help omits the pipeline {p}");
    }
}

#[test]
fn top_level_help() {
    insta::assert_snapshot!("vramlab", help(&["--help"]));
}

macro_rules! subcommand_help {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            insta::assert_snapshot!($name, help(&[$name, "--help"]));
        }
    )*};
}

subcommand_help! {
    sweep_help => "sweep",
    synth_weights_help => "synth-weights",
    decode_help => "decode",
    fit_help => "fit",
    estimate_help => "estimate",
    compare_help => "compare",
    merge_help => "merge",
    bundle_help => "bundle",
    plot_help => "plot",
    validate_help => "validate",
    report_help => "report",
    gpus_help => "gpus",
    emulate_help => "emulate",
    env_help => "env",
    schema_help => "schema",
    features_help => "features",
}

/// docs/src/reference/cli.md is what `markdown_reference` generates now.
#[test]
fn the_cli_reference_page_is_current() {
    let path = common::root().join("docs/src/reference/cli.md");
    let want = markdown_reference();
    if std::env::var_os("VRAMLAB_BLESS").is_some_and(|v| v != "0") {
        std::fs::write(&path, &want).expect("write the CLI reference");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()))
            + 1;
        panic!(
            "{} is stale (first difference at line {line}): regenerate it with \
             `VRAMLAB_BLESS=1 cargo test -p vramlab --test help` and commit it",
            path.display()
        );
    }
}

/// The reference page shows each subcommand's help exactly as the binary prints it.
#[test]
fn the_cli_reference_matches_the_binary() {
    let md = markdown_reference();
    for name in SUBCOMMANDS {
        let h = help(&[name, "--help"]);
        assert!(
            md.contains(&format!("## vramlab {name}\n\n```text\n{h}\n```\n")),
            "the reference's `vramlab {name}` differs from `vramlab {name} --help`"
        );
    }
}

/// `vramlab generate` is `decode`'s old name, kept as an alias for one release (CHANGELOG).
#[test]
fn the_old_generate_name_is_an_alias_of_decode() {
    assert_eq!(help(&["generate", "--help"]), help(&["decode", "--help"]));
}
