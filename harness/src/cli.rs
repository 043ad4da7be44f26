//! Command-line definition (clap): the subcommands; each subcommand's flags are its `Args` in
//! its file under `cmd/` (the flags several share are in `cmd/mod.rs`).
use clap::{Parser, Subcommand};

/// vramlab: how much memory does this model need, in this configuration? Measured, not guessed.
///
/// Byte figures in CSV and JSON are raw integers; tables show GB (1e9) and GiB (2^30).
#[derive(Debug, Parser)]
#[command(
    name = "vramlab",
    version,
    about,
    help_expected = true,
    after_help = "Exit codes: 0 success; 1 a failure (each subcommand's --help says when); 2 bad \
input: an unusable file or argument, named on one line."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure every point of a scenario and write a calibration CSV and its manifest.
    ///
    /// Each point gets one row per phase with baseline/peak/end allocated bytes, reserved bytes
    /// (RSS on CPU; the memory pool on CUDA), and analytic features, all in bytes. Inference:
    /// load, prefill, decode every k steps, total. Training, per step: forward, backward,
    /// optimizer, step_total. Weights are loaded once per (model, precision), in a worker
    /// process; rows are flushed and synced as they are measured, out-of-memory points are
    /// recorded `status=oom`, and an interrupted sweep resumes where it stopped.
    Sweep(crate::cmd::sweep::Args),
    /// Write synthetic weights (real shapes of a config.json, seeded values) as safetensors.
    SynthWeights(crate::cmd::synth_weights::Args),
    /// Greedy-decode from token ids (checks a model implementation).
    ///
    /// Formerly `vramlab generate`, which still works as an alias until the next release
    /// ("generate" is a diffusion pipeline everywhere else).
    #[command(alias = "generate")]
    Decode(crate::cmd::decode::Args),
    /// Fit per-group constants (NNLS) on calibration CSVs; report held-out error.
    Fit(crate::cmd::fit::Args),
    /// Estimate the memory of a configuration, the smallest GPU that fits it, and the largest
    /// batch and context that fit a given GPU.
    Estimate(crate::cmd::estimate::Args),
    /// Regression gate: compare a run with a baseline CSV, metric by metric, within noise
    /// margins (exit 0 within, 1 on a regression, 2 on unusable input).
    ///
    /// Joins rows on (point_id, phase, step) and prints the changes worst first in GB and GiB
    /// with the signed percentage, and the points present on one side only.
    Compare(crate::cmd::compare::Args),
    /// Merge the CSVs of a sharded sweep into one CSV with a combined manifest.
    ///
    /// The inputs must agree on schema, scenario hash and weights; exact duplicate rows are
    /// removed, and a point measured twice with different figures is an error naming both files.
    Merge(crate::cmd::merge::Args),
    /// Pack a results folder into a publishable calibration bundle (.tar.gz with a generated
    /// REPORT.md and SHA256SUMS), or check one with --verify.
    ///
    /// The report gives the device, runtime and versions of each run, the fit's held-out
    /// errors, estimates for three presets, the candle-vs-torch table when a torch CSV of the
    /// same scenario is present, and the sha256 of every file.
    Bundle(crate::cmd::bundle::Args),
    /// Plot calibration CSVs as SVG and PNG (axes in GiB): memory vs context and batch, the KV
    /// curve, training phases, predicted vs measured, candle vs torch.
    Plot(crate::cmd::plot::Args),
    /// Check the estimator against published measurements (a peers file such as
    /// results/peers/published.json).
    ///
    /// Per row the estimate, the measurement, the signed error and which terms the metric
    /// includes (NVML "used" includes the CUDA context and the caching allocator's reserve;
    /// `max_memory_allocated` neither; analytic rows are paper formulas), then the median and
    /// worst absolute error. Rows the estimator cannot express (Adafactor, 8-bit Adam,
    /// bitsandbytes int8/4-bit) are listed as not expressible.
    Validate(crate::cmd::validate::Args),
    /// Summarise a results CSV: scenario, schema, points, rows and runtime (from its manifest),
    /// then per point the largest peak allocated and peak reserved in bytes, with the phase
    /// that holds each and the point's status.
    ///
    /// `--markdown` prints GitHub Markdown tables with links: the tables the pages under
    /// docs/src/results embed (a test fails when one is stale).
    Report(crate::cmd::report::Args),
    /// Run a PyTorch program on an emulated GPU: PyTorch's own allocator reports allocated,
    /// reserved and out-of-memory for any catalogued GPU, with no GPU.
    ///
    /// `vramlab emulate --gpu a100-40gb -- python train.py --max_steps 3` prints, per phase
    /// (marked with `vramlab.phase`) or per optimizer step, the peaks of
    /// `torch.cuda.max_memory_allocated`, `max_memory_reserved`, and the NVML-equivalent "used"
    /// (reserved plus the CUDA context and modules), in GB and GiB; `--json` gives integer bytes.
    Emulate(crate::cmd::emulate::Args),
    /// List the GPU catalogue: every GPU's `totalGlobalMem` in bytes, its class, the names it
    /// answers to, and its sources.
    ///
    /// One table serves `estimate --gpu`, `estimate --emulate` and `emulate --gpu`, so the
    /// analytic and the emulated verdicts judge the same bytes. `--markdown` prints the table
    /// of docs/src/reference/gpu-catalogue.md; `--json` gives integer bytes.
    Gpus(crate::cmd::gpus::Args),
    /// List every VRAMLAB_* environment variable vramlab, its stubs, its Python package, its
    /// scripts and its tests read: who reads it, its default and what it does, and which are
    /// set in this shell.
    ///
    /// `--markdown` prints the table of docs/src/reference/environment.md; `--json` gives each
    /// variable with its value here.
    Env(crate::cmd::env::Args),
    /// Print the CSV schema: its version, the oldest version readers accept, and every column in
    /// order with the version that added it.
    ///
    /// One definition (the record type) serves `sweep`'s writer, every reader, and the torch
    /// probe, which reads `--json` (harness/python/vramlab/probe/schema.json) instead of keeping a
    /// column list of its own. `--markdown` prints the column table of docs/src/reference/csv.md.
    Schema(crate::cmd::schema::Args),
    /// Print the analytic `feature_*` figures of one point of a scenario at the rows asked for.
    ///
    /// Exact bytes from the model's config (ARCHITECTURE.md §9): the weights, the KV cache the
    /// row holds, the activation and logits terms, the optimizer state. `fit` regresses on them;
    /// every `sweep` row records them from the same definition, and the torch probe asks for its
    /// rows' figures here (`--json`), so they have no second copy.
    Features(crate::cmd::features::Args),
}

/// The width the generated reference renders help at (what `COLUMNS=100` gives a terminal).
pub const REFERENCE_WIDTH: usize = 100;

/// The command-line reference page (docs/src/reference/cli.md), generated from this
/// definition: a table of the subcommands, then the top-level help and every subcommand's
/// `--help` as printed at [`REFERENCE_WIDTH`] columns, each followed by one linkable line per
/// argument (`cli.md#vramlab-sweep--device`). The test `harness/tests/help.rs` fails
/// when the committed page differs; `VRAMLAB_BLESS=1 cargo test -p vramlab --test help`
/// rewrites it.
pub fn markdown_reference() -> String {
    use clap::CommandFactory;
    use std::fmt::Write as _;
    let mut top = Cli::command().term_width(REFERENCE_WIDTH);
    top.build();
    let subs: Vec<clap::Command> = top
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .cloned()
        .collect();
    let mut md = String::new();
    md.push_str(
        "# Command-line reference\n\n\
         <!-- Generated from the clap definition (harness/src/cli.rs, harness/src/cmd/) by \
         `VRAMLAB_BLESS=1 cargo test -p vramlab --test help`; do not edit by hand. -->\n\n\
         Every subcommand's `--help`, as `vramlab SUBCOMMAND --help` prints it at 100 columns \
         (`-h` prints a summary). Byte figures in CSV and JSON are raw integers; tables show GB \
         (1e9) and GiB (2^30).\n\n\
         | Subcommand | What it does |\n|---|---|\n",
    );
    for s in &subs {
        let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
        let _ = writeln!(
            md,
            "| [`{name}`](#vramlab-{name}) | {} |",
            about.replace('|', "\\|"),
            name = s.get_name()
        );
    }
    // Through the parser, as `vramlab ... --help` prints it (the long form only where some
    // argument has a long help, as clap decides).
    let help = |args: &[&str]| {
        let argv = std::iter::once("vramlab").chain(args.iter().copied());
        match top.clone().try_get_matches_from(argv) {
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.render().to_string(),
            _ => unreachable!("`{}` prints help", args.join(" ")),
        }
    };
    let _ = write!(
        md,
        "\n## vramlab\n\n```text\n{}\n```\n",
        trim_lines(&help(&["--help"]))
    );
    for s in &subs {
        let name = s.get_name();
        let _ = write!(
            md,
            "\n## vramlab {name}\n\n```text\n{}\n```\n",
            trim_lines(&help(&[name, "--help"]))
        );
        md.push_str(&argument_anchors(name, s));
    }
    md
}

/// One linkable line per argument of subcommand `name` (`#vramlab-sweep--device`, uv's style):
/// its usage and its short help.
fn argument_anchors(name: &str, s: &clap::Command) -> String {
    let args: Vec<&clap::Arg> = s
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if args.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nArguments and flags:\n\n");
    for a in args {
        let values = a
            .get_value_names()
            .map(|v| {
                v.iter()
                    .map(|n| format!("<{n}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let (anchor, usage) = match a.get_long() {
            Some(long) => (
                format!("vramlab-{name}--{long}"),
                format!(
                    "--{long}{}",
                    if a.get_num_args().is_some_and(|n| n.takes_values()) {
                        format!(" {values}")
                    } else {
                        String::new()
                    }
                ),
            ),
            None => (
                format!("vramlab-{name}-{}", a.get_id().as_str().to_lowercase()),
                if values.is_empty() {
                    a.get_id().to_string().to_uppercase()
                } else {
                    values
                },
            ),
        };
        // The short help: the first paragraph of the doc comment, on one line.
        let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        out += &format!("- <a id=\"{anchor}\"></a>[`{usage}`](#{anchor}): {help}\n");
    }
    out
}

/// `text` with each line's trailing whitespace removed, and no trailing blank lines.
pub fn trim_lines(text: &str) -> String {
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}
