//! `vramlab gpus`: the GPU catalogue (`crate::gpu`), the one table `estimate --gpu`,
//! `estimate --emulate` and `emulate --gpu` judge and present, with every name each GPU
//! answers to and where its figures come from. `--markdown` prints the reference page's table
//! (docs/src/reference/gpu-catalogue.md embeds it; a test fails when it is stale).
use crate::gpu::{self, Gpu, Vendor, CONTEXT_BYTES};
use anyhow::Result;
use serde::Serialize;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the catalogue was printed; 1 a failure (writing to stdout); 2 bad \
                  input: an unknown flag."
)]
pub struct Args {
    #[command(flatten)]
    pub format: super::TableFormat,
}

/// One GPU as `--json` prints it.
#[derive(Serialize)]
struct GpuJson<'a> {
    key: &'a str,
    names: Vec<&'static str>,
    label: &'a str,
    cuda_name: &'a str,
    vendor: Vendor,
    marketed_gb: u64,
    total_bytes: u64,
    usable_bytes: u64,
    compute_capability: String,
    sms: u32,
    l2_bytes: u64,
    emulated: bool,
    source: &'a str,
}

fn cc(g: &Gpu) -> String {
    format!("{}.{}", g.compute_capability.0, g.compute_capability.1)
}

pub fn run(a: Args) -> Result<()> {
    let all = gpu::all();
    if a.format.json {
        let rows: Vec<GpuJson> = all
            .iter()
            .map(|g| GpuJson {
                key: &g.key,
                names: gpu::aliases(&g.key),
                label: &g.label,
                cuda_name: &g.name,
                vendor: g.vendor,
                marketed_gb: g.marketed_gb,
                total_bytes: g.total_bytes,
                usable_bytes: g.usable_bytes(),
                compute_capability: cc(g),
                sms: g.sms,
                l2_bytes: g.l2_bytes,
                emulated: g.vendor == Vendor::Nvidia,
                source: &g.source,
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "context_bytes": CONTEXT_BYTES,
                "gpus": rows,
            }))?
        );
        return Ok(());
    }
    if a.format.markdown {
        println!("| `--gpu` | also answers to | name CUDA reports | class | memory (bytes) | CC | SMs | L2 | emulated | source |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for g in &all {
            let aliases: Vec<String> = gpu::aliases(&g.key)
                .iter()
                .map(|a| format!("`{a}`"))
                .collect();
            println!(
                "| {} | {} | {} | {} GB | {} | {} | {} | {} | {} | {} |",
                g.key,
                aliases.join(", "),
                g.name,
                g.marketed_gb,
                crate::units::grouped(g.total_bytes),
                cc(g),
                g.sms,
                crate::units::human(g.l2_bytes),
                if g.vendor == Vendor::Nvidia {
                    "yes"
                } else {
                    "no (AMD)"
                },
                g.source.replace('|', "\\|"),
            );
        }
        return Ok(());
    }
    println!(
        "{:<14} {:<8} {:>20}  {:<5} {:<40} also answers to",
        "--gpu", "class", "memory (bytes)", "CC", "name CUDA reports"
    );
    for g in &all {
        println!(
            "{:<14} {:<8} {:>20}  {:<5} {:<40} {}",
            g.key,
            format!("{} GB", g.marketed_gb),
            crate::units::grouped(g.total_bytes),
            cc(g),
            g.name,
            gpu::aliases(&g.key).join(", ")
        );
    }
    println!(
        "\nNames compare without case, spaces, dashes or a vendor word (\"RTX 4090\", rtx4090 and \
         rtx-4090 are one GPU); a memory size may drop its gb (h100-80). Every GPU's usable \
         memory is its total less the CUDA context's {} B. --json gives the sources.",
        crate::units::grouped(CONTEXT_BYTES)
    );
    Ok(())
}
