"""The program behind a published peer row: transformers' "Efficient training on a single GPU"
guide (perf_train_gpu_one, January 2022), run by `vramlab validate --emulate` on an emulated GPU.

The guide trains bert-large-uncased for sequence classification (two labels) with the HF Trainer
on 512 random sequences of 512 tokens, and reads nvidia-smi after `trainer.train()`. This is the
same program: the same model class, dummy data, Trainer and arguments. Three differences, each
forced by the emulator and none changing a byte the allocator holds: the model is built from its
`config.json` on `meta` and materialized on the device (no weights to read), the Trainer stops
after `--max-steps` optimizer steps (the peaks repeat from the second step on), and nothing is
logged or saved. `--load-only` is the guide's first figure: the model moved to the GPU, no step.

`--optim adamw` is the guide's default optimizer: transformers' own AdamW (`adamw_hf`, a loop
over the parameters) where the stack still has it, else torch's (`adamw_torch`). The choice is
printed on stderr.
"""
import argparse
import sys
import tempfile

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    Trainer,
    TrainingArguments,
)
from transformers.training_args import OptimizerNames


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a folder holding the model's config.json")
    p.add_argument("--batch", type=int, default=4, help="per_device_train_batch_size")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient_accumulation_steps")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    p.add_argument("--checkpointing", action="store_true", help="gradient_checkpointing=True")
    p.add_argument("--fp16", action="store_true", help="fp16=True (autocast, fp32 master)")
    p.add_argument("--optim", default="adamw", help="adamw (the guide's default), adafactor")
    p.add_argument("--max-steps", type=int, default=3, help="optimizer steps")
    p.add_argument("--load-only", action="store_true", help="move the model to the GPU only")
    return p.parse_args()


class Dummy(torch.utils.data.Dataset):
    """The guide's dummy data: token ids in [100, 30000), labels all 0."""

    def __init__(self, n, seq_len):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(100, 30000, (n, seq_len), generator=g)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": torch.tensor(0)}


def main():
    a = parse()
    cfg = AutoConfig.from_pretrained(a.config, num_labels=2)
    if hasattr(torch.device, "__enter__"):
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(cfg)
        model = model.to_empty(device="cuda")
    else:
        # torch < 2.0 has no default-device context: the guide's own path, built on the CPU
        # and moved (the same one allocation per tensor on the device).
        model = AutoModelForSequenceClassification.from_config(cfg).to("cuda")
    if a.load_only:
        torch.cuda.synchronize()
        return 0
    names = {o.value for o in OptimizerNames}
    optim = a.optim
    if optim == "adamw":
        optim = "adamw_hf" if "adamw_hf" in names else "adamw_torch"
    print(f"vramlab-peer: optim={optim}", file=sys.stderr)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="vramlab-peer-"),
        per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=a.grad_accum,
        gradient_checkpointing=a.checkpointing,
        fp16=a.fp16,
        optim=optim,
        max_steps=a.max_steps,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        log_level="error",
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=Dummy(512, a.seq_len)).train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
