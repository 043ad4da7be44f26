//! The estimate's `cuBLAS workspace` row against PyTorch's own allocator on the emulated GPU,
//! per stack and card (docs/src/guides/estimate.md, "The cuBLAS workspace follows the card and
//! the stack"): one small matmul measures the workspace a matmul takes, and the same matmul with
//! its backward how many a training step holds at once. Needs the torch environments
//! (`#[ignore]`d; scripts/test.sh runs it).
mod common;
use common::{estimate_json, estimate_row};
use serde_json::Value;

/// Prints `WORKSPACE {"one": B, "train": B, "tensors": B}`: the peak allocated bytes over a
/// no-grad 64 × 64 matmul less its output (the workspace one matmul takes), and over the same
/// matmul with its backward less the largest bytes of tensors live at once (bounded by the
/// five tensors of 8 KiB each a backward can hold: output, its gradient, two input gradients
/// and the loss), so that "train" is the workspaces held at once.
const SCRIPT: &str = r#"
import json, torch
x = torch.randn(64, 64, device="cuda", dtype=torch.float16, requires_grad=True)
w = torch.randn(64, 64, device="cuda", dtype=torch.float16, requires_grad=True)
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
with torch.no_grad():
    y = x @ w
one = torch.cuda.max_memory_allocated() - base - y.numel() * y.element_size()
del y
torch.cuda.reset_peak_memory_stats()
(x @ w).float().sum().backward()
train = torch.cuda.max_memory_allocated() - base
print("WORKSPACE " + json.dumps({"one": one, "train": train, "tensors": 5 * 8192}))
"#;

fn python(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var}: scripts/torch-env.sh (scripts/test.sh)"))
}

/// The script's figures on the emulated `gpu` under `python`.
fn measured(gpu: &str, python: &str) -> Value {
    let out = common::vramlab()
        .args(["emulate", "--gpu", gpu, "--", python, "-c", SCRIPT])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{gpu}: {text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("WORKSPACE "))
        .unwrap_or_else(|| panic!("{gpu}: no WORKSPACE line:\n{text}"));
    serde_json::from_str(line).unwrap()
}

/// Each stack on a card before Hopper (A100, L4: 8.0, 8.9), on Hopper (9.0) and on Blackwell
/// (10.0, where torch 2.2's rule still gives the small workspace): the estimate's row for
/// inference is the workspace one matmul takes, to the byte, and for training the workspaces a
/// step holds at once, within the step's few tensors.
#[test]
#[ignore = "needs the torch environments (scripts/torch-env.sh, --stack torch-2.2; scripts/test.sh)"]
fn the_workspace_row_is_what_torch_allocates_per_card_and_stack() {
    let stacks = [
        ("default", python("VRAMLAB_TORCH_PYTHON")),
        ("torch-2.2", python("VRAMLAB_TORCH22_PYTHON")),
    ];
    let mut sizes = std::collections::BTreeSet::new();
    for (stack, py) in &stacks {
        for gpu in ["a100-40gb", "l4", "h100-80gb", "b200"] {
            let m = measured(gpu, py);
            let row = |mode: &[&str]| {
                let base = ["--model", "smollm2-135m", "--gpu", gpu, "--stack", stack];
                estimate_row(
                    &estimate_json(&[&base[..], mode].concat()),
                    "cuBLAS workspace",
                )
            };
            let one = m["one"].as_u64().unwrap();
            assert_eq!(
                row(&["--kv-cache", "growing"]),
                one,
                "{stack} on {gpu}: {m}"
            );
            let train = row(&["--mode", "train"]);
            let held = m["train"].as_u64().unwrap();
            assert!(
                train <= held && held - train <= m["tensors"].as_u64().unwrap(),
                "{stack} on {gpu}: training holds {held} B at its peak, the row says {train} B"
            );
            sizes.insert(one);
        }
    }
    // The two sizes, so that a card's rule cannot pass by both sides being one constant.
    assert_eq!(sizes.len(), 2, "{sizes:?}");
}
