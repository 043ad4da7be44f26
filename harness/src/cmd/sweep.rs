//! `vramlab sweep`: parse the flags, then `sweep::run` (expand a scenario into points, measure
//! each, write CSV + manifest).
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 every point finished (rows `ok`, `oom` or `skipped`), or \
--dry-run listed them; 1 some points failed (rows `error`, or points missing after a worker \
died) or the sweep failed otherwise; 2 bad input: an unusable scenario, weights file or flag \
value (one line naming it)."
)]
pub struct Args {
    /// Scenario file (TOML; see scenarios/ and docs/src/reference/scenario.md for the keys).
    pub scenario: PathBuf,
    /// Output CSV; the manifest goes beside it as NAME.manifest.json.
    /// Default: `results/<scenario name>.csv`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Device to measure on: `cpu`, `cuda:N` or `emu:GPU` (a catalogued GPU emulated by the stub
    /// CUDA runtime, e.g. emu:h100-80gb: vramlab's CUDA build runs there, its rows say
    /// `meter = cuda-pool-emulated`). With `runtime = "torch"` in the scenario: `emu:GPU` or
    /// `cuda:N`. Overrides the scenario's `device`.
    #[arg(long)]
    pub device: Option<String>,
    /// Print the expanded point ids, one per line, and exit without measuring.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print one JSON object instead, `{"scenario": {...}, "plan": "llm" |
    /// "generate" | "finetune", "points": [...]}`: the scenario as parsed, and each point with
    /// every axis value it runs with (what the torch probe runs; docs/src/reference/scenario.md).
    #[arg(long, requires = "dry_run")]
    pub json: bool,
    /// Do not print the per-point summary table at the end.
    #[arg(long)]
    pub quiet: bool,
    /// A memory budget for the CPU device, emulating a smaller GPU: e.g. 2GiB, 512MiB, 1.5GB.
    /// A point whose phase would pass it is recorded `status=oom` and the sweep goes on.
    /// On `emu:GPU` (either runtime): the emulated GPU's total memory instead.
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,
    /// Resume into an existing --out (the default when it exists and its manifest's scenario
    /// hash matches): finished points are kept, partly measured points are re-run.
    #[arg(long, conflicts_with = "fresh")]
    pub resume: bool,
    /// Overwrite an existing --out instead of resuming.
    #[arg(long)]
    pub fresh: bool,
    /// Run shard K of N (1-based): a deterministic 1/N of the points (every mode), balanced
    /// by cost, with points that share loaded weights kept together. Run every K
    /// (one per GPU or node) with its own --out, then `vramlab merge` the outputs.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
    /// Internal: run points START:END of the grid in this process (a worker).
    #[arg(long, hide = true, value_name = "START:END")]
    pub worker: Option<String>,
    /// Internal: the run id a worker writes.
    #[arg(long, hide = true)]
    pub run_id: Option<String>,
    /// Internal: warm up each point at its own shapes (the group's warm-up ran out of memory).
    #[arg(long, hide = true)]
    pub point_warmup: bool,
}

pub fn run(args: Args) -> Result<()> {
    crate::sweep::run(&crate::sweep::Options {
        scenario: args.scenario,
        out: args.out,
        device: args.device,
        dry_run: args.dry_run,
        json: args.json,
        quiet: args.quiet,
        capacity: args.capacity,
        resume: args.resume,
        fresh: args.fresh,
        shard: args.shard,
        worker: args.worker,
        run_id: args.run_id,
        point_warmup: args.point_warmup,
    })
}
