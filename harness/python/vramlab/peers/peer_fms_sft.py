"""The program behind published fine-tuning peer rows: fms-acceleration's benchmark (its
`scripts/benchmarks`, July 2024: torch 2.2.2, transformers 4.39.3, peft 0.11.1, accelerate
0.32.1, trl 0.9.6), run by `vramlab validate --emulate` as rank 0 on an emulated GPU.

The benchmark launches fms-hf-tuning's `sft_trainer.py` through `accelerate launch` with FSDP
(full shard, transformer-based wrap, backward prefetch BACKWARD_PRE, no mixed precision,
CPU-RAM-efficient loading with synchronised module states) on 1 or 2 processes, for Mistral-7B-v0.1
in float16 (`torch_dtype`, no autocast), alpaca-cleaned packed into 4096-token sequences, 100
steps of AdamW (torch's, eps 1e-4, weight decay 0.01) with gradient checkpointing, and either full
fine-tuning or LoRA (r 16, alpha 16, dropout 0.1, q/k/v/o projections). It reads the HF Trainer's
memory metrics (`skip_memory_metrics=False`) and nvidia-smi's peak used memory per device.

This runs the same libraries in the same order: the model class from its config, the tokenizer's
embedding resize, trl's SFTTrainer preparation of a peft model, the HF Trainer with the
benchmark's arguments under accelerate's FSDP plugin, configured through the environment
`accelerate launch` sets, and peft's FSDP wrap policy as sft_trainer sets it. The differences,
each forced by the emulator or the stack:
- the model is built on `meta` (no weights to read) and allocated on the device in one piece on
  one GPU, where the Trainer would move the CPU-loaded model there, or shard by shard by FSDP's
  `param_init_fn` (accelerate's, for synchronised module states) on more;
- on more than one GPU this process is rank 0 of torch's fake process group: collectives move
  no data, and NCCL's own buffers are not allocated;
- attention is PyTorch's SDPA, not flash-attn 2 (`use_flash_attn`), which has no wheel for the
  stack's torch and whose kernels the emulator cannot load; for a 4096-token Mistral sequence,
  transformers 4.39 then builds a 4-D causal mask (the sliding window equals the length);
- the packed sequences are random token ids in the tokenizer's range, fed as trl's packing feeds
  them (`input_ids` and `labels`, no attention mask); the Trainer stops after `--max-steps`
  steps (the peaks repeat from the second step on).
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

# Mistral's tokenizer holds 32000 tokens; sft_trainer adds `<pad>` (absent from it) and resizes
# the embeddings to a multiple of 8 (tokenizer_data_utils.tokenizer_and_embedding_resize).
PAD_TO_MULTIPLE = 8


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a folder holding the model's config.json")
    p.add_argument("--gpus", type=int, default=1, help="accelerate's --num_processes (this is rank 0)")
    p.add_argument("--batch", type=int, default=4, help="per_device_train_batch_size")
    p.add_argument("--seq-len", type=int, default=4096, help="max_seq_length (packed)")
    p.add_argument("--lora", action="store_true", help="peft_method lora (r 16, alpha 16, dropout 0.1)")
    p.add_argument("--max-steps", type=int, default=3, help="optimizer steps")
    return p.parse_args()


# The benchmark's accelerate.yaml (scripts/benchmarks/accelerate.yaml), as accelerate reads it.
ACCELERATE_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: 1
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_cpu_ram_efficient_loading: true
  fsdp_sync_module_states: true
mixed_precision: 'no'
machine_rank: 0
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
"""


def accelerate_launch(gpus: int):
    """Rank 0's environment under `accelerate launch --config_file accelerate.yaml
    --num_processes N`, computed by accelerate's own launcher (its parser fills the flags the
    file leaves out, use_orig_params among them; FSDP runs through torchrun, which adds the
    rank variables). The benchmark launches through accelerate only for more than one GPU; one
    GPU is a plain `python sft_trainer.py`: no FSDP, no process group."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env
    path = os.path.join(tempfile.mkdtemp(prefix="vramlab-peer-"), "accelerate.yaml")
    with open(path, "w") as f:
        f.write(ACCELERATE_YAML)
    args = launch_command_parser().parse_args(
        ["--config_file", path, f"--num_processes={gpus}", "--main_process_port=29500",
         "sft_trainer.py"])
    args, _, _ = _validate_launch_command(args)
    os.environ.update(prepare_multi_gpu_env(args))
    os.environ.update({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": str(gpus),
                       "LOCAL_WORLD_SIZE": str(gpus), "MASTER_ADDR": "127.0.0.1"})
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=gpus)


class Packed(torch.utils.data.Dataset):
    """trl's ConstantLengthDataset as the Trainer sees it: sequences of exactly `seq_len` tokens,
    `labels` a copy of `input_ids`."""

    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def main():
    a = parse()
    if a.gpus > 1:
        accelerate_launch(a.gpus)
    torch.cuda.set_device(0)
    from transformers import AutoConfig, AutoModelForCausalLM, PrinterCallback, Trainer, TrainingArguments

    cfg = AutoConfig.from_pretrained(a.config)
    tokens = cfg.vocab_size + 1  # `<pad>`
    cfg.vocab_size = -(-tokens // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float16,
                                                 attn_implementation="sdpa")
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="vramlab-peer-"),
        per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=1,
        gradient_checkpointing=True,
        learning_rate=2e-4 if a.lora else 2e-5,
        weight_decay=0.01,
        warmup_steps=10,
        adam_epsilon=1e-4,
        lr_scheduler_type="linear",
        num_train_epochs=1,
        max_steps=a.max_steps,
        save_strategy="no",
        logging_strategy="no",
        include_tokens_per_second=True,
        skip_memory_metrics=False,
        report_to="none",
        log_level="error",
        disable_tqdm=True,
    )
    if a.lora:
        # trl 0.9.6's SFTTrainer, for a peft config on an unquantized model with (reentrant)
        # gradient checkpointing.
        from peft import LoraConfig, get_peft_model
        model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(
            task_type="CAUSAL_LM", r=16, lora_alpha=16, lora_dropout=0.1,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    if a.gpus == 1:
        # Loaded on the CPU, then moved to the GPU by the Trainer.
        model = model.to_empty(device="cuda")
    trainer = Trainer(model=model, args=args,
                      train_dataset=Packed(a.batch * a.max_steps, a.seq_len, tokens - 1))
    trainer.remove_callback(PrinterCallback)  # the final metrics, printed on stdout
    if a.lora and a.gpus > 1:
        # sft_trainer.py: LoRA layers in FSDP units of their own (peft's wrap policy).
        from peft.utils.other import fsdp_auto_wrap_policy
        trainer.accelerator.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
    out = trainer.train()
    m = out.metrics
    # The benchmark's own reading (benchmark.py extract_gpu_memory_metrics): allocated at the
    # end of each Trainer stage, and that plus the stage's peak over its end.
    total, peaks = 0, []
    for stage in ("before_init_mem_gpu", "init_mem_gpu", "train_mem_gpu"):
        total += m.get(f"{stage}_alloc_delta", m.get(stage, 0))
        peaks.append(total + m.get(f"{stage}_peaked_delta", 0))
    print(f"vramlab-peer: trainer peak_torch_mem_alloc={max(peaks)} torch_mem_alloc={total}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
