"""PyTorch reference for a vramlab scenario (docs/src/guides/torch-probe.md; ARCHITECTURE.md §3-§4).

    python3 harness/python/vramlab/probe SCENARIO.toml --out FILE.csv [--device cuda:0|cpu]
                  [--torch-optim foreach|for-loop|fused] [--attention eager|sdpa]
    python3 harness/python/vramlab/probe SCENARIO.toml --dry-run | --check
    python3 harness/python/vramlab/probe SCENARIO.toml --device emu:GPU [--gpu-memory SIZE]
                  [--gpus N]

`vramlab sweep` runs it as its workers for a scenario with `runtime = "torch"` (one per group
of points, `--worker-point ID`...; harness/src/sweep/torch.rs). `--gpus N`: training as rank 0
of FSDP full shard over N GPUs, in one process (llm.fully_sharded).

Reads the same scenario TOML as `vramlab sweep` and runs vramlab's own points of it (`vramlab sweep
--dry-run --json`, the binary from $VRAMLAB_BIN, PATH, or this checkout's target/; grid.py), builds each
model with Hugging Face transformers from the same config.json (the real class of its
`model_type`, e.g. LlamaForCausalLM), with real weights where the scenario names them
(`hf:DIR` safetensors, `gguf:FILE` through transformers' GGUF loader, dequantized), runs the same
phases (load; prefill, decode every k steps, total; forward, backward, optimizer, step_total),
and writes the same CSV schema as harness/src/record.rs, feature_* columns included (so
`vramlab fit` reads it), with a manifest beside it whose runtime is `torch-X.Y+transformers-Z`.

Definitions that match the harness: gradient accumulation runs micro-batches of
batch/n; attention is `eager` (scores materialized, as in our models) unless --attention sdpa;
`mixed-*` keeps f32 master weights and casts them to 16 bits inside the forward (autograd casts
the gradients back onto the f32 masters, so AdamW's state is f32), as harness's `to_dtype` does;
with `checkpointing = "layer"` the forward runs under torch.autocast instead, as the HF Trainer's
bf16/fp16 does (the recomputation in backward re-enters it; llm.train_forward); the parameter
dtype is asserted after building.

Recorded in each row: `kernels` = `reference` (torch's own ops), `attention` = eager|sdpa,
`optimizer` = the optimizer and its torch implementation (`adamw-foreach`, `adamw-for-loop`, `adamw-fused`;
`sgd-…` likewise). torch's CPU optimizers default to the for-loop: the choice is always explicit.

Meters:
- `--device cuda:N` (meter `torch-cuda`): baseline = memory_allocated / memory_reserved,
  reset_peak_memory_stats, run, synchronize, peak = max_memory_allocated / max_memory_reserved;
  device_used = total - free (mem_get_info), non_pool = device_used - reserved.
- `--device cpu` (meter `cpu-preload`): allocated = live heap bytes counted by
  libvramlab_preload.so (harness/preload), which must be in LD_PRELOAD (scripts/torch-cpu.sh
  does it); reserved = VmRSS, its peak VmHWM reset through /proc/self/clear_refs; device_used =
  MemTotal - MemAvailable; non_pool = RSS - allocated. Each point starts with malloc_trim(0).
  Each point first runs once unmeasured at its own shapes (oneDNN keeps per-shape state the
  first time a shape runs); --no-onednn turns oneDNN off.
- `--device emu:GPU` (meter `torch-emulated`): the same as cuda:0, on an emulated GPU
  (docs/src/guides/emulator.md): the probe runs itself again under `vramlab emulate --gpu GPU`
  (the binary from $VRAMLAB_BIN, PATH, or this checkout's target/). Every model is built from its
  config on the device, reading no weights (values do not change memory); the device name ends
  in "(emulated)"; device_used is total - free of the emulated device (cudaMalloc's bytes plus
  the CUDA context constant).

Generation (`mode = "generate"`): diffusers' UNet2DConditionModel / AutoencoderKL /
FluxTransformer2DModel / WanTransformer3DModel / AutoencoderKLWan and transformers' CLIP / T5 /
umT5 encoders from the same diffusers directory
vramlab loads (`synthetic:MODEL` = $VRAMLAB_MODELS/synthetic-gen/MODEL-DTYPE-vae-DTYPE, written
by `vramlab sweep`; `diffusers:DIR`), the rows of harness/src/workload/generate.rs (see
generate.py).

Bad input (a scenario the probe cannot run, e.g. `kernels = "fused"`): one line, exit 2.
--dry-run imports neither torch nor transformers.
"""
import argparse
import gc
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Union

from .common import InputError, emulated, git_rev, now_rfc3339, self_args, short_hash, vramlab_bin
from .csvout import SCHEMA_VERSION, Writer
from .generate import gen_group_len, gen_layout, run_generate_group
from .grid import as_list, parse_source
from .grid import features as row_features
from .grid import load as load_scenario
from .llm import (
    build_model,
    compute_dtype,
    encode_point,
    infer_point,
    logits_kw,
    point_cols,
    train_point,
    warm_up,
)
from .meters import CudaMeter, NullMeter, PreloadMeter

SWEEP_KEYS = {"source", "mode", "precision", "batch", "context", "kv_cache", "decode_steps",
              "prompt_len", "decode_every", "repeats", "optimizer", "checkpointing", "grad_accum",
              "trainable", "train_steps", "lr", "kernels", "attention",
              "resolution", "frames", "cfg", "vae_decode", "tile", "overlap", "vae_precision",
              "denoise_steps"}
# Our fused kernels and flash attention are candle ops. A language model's attention is its
# point's `attention` axis (eager or sdpa, transformers' attn_implementation) where its [sweep]
# table has one, else --attention.
RUNNABLE = {"mode": {"infer", "encode", "train", "generate"},
            "precision": {"f32", "f16", "bf16", "mixed-bf16", "mixed-f16"},
            "kernels": {"reference"}, "attention": {"eager", "sdpa"},
            "checkpointing": {"none", "layer"}, "optimizer": {"adamw", "sgd"}}


def check_runnable(path: Path, spec: dict, plan: str, points: list):
    """What the probe cannot run is refused before anything is measured (exit 2). `plan` and
    `points` are vramlab's (grid.points)."""
    if plan == "finetune":
        raise InputError(f"{path}: the torch probe cannot run `mode = [\"train\"]` on a diffusion "
                         "pipeline (the denoiser's LoRA is measured by vramlab only)")
    for i, s in enumerate(as_list(spec["sweep"])):
        if plan == "generate":
            check_generate(path, s, [p for p in points if p["table"] == i])
            continue
        for k, v in s.items():
            if k not in SWEEP_KEYS:
                raise InputError(f"{path}: the torch probe cannot run `{k} = {json.dumps(v)}`")
            bad = [x for x in as_list(v) if k in RUNNABLE and x not in RUNNABLE[k]]
            if bad:
                raise InputError(f"{path}: the torch probe cannot run `{k} = {json.dumps(bad[0])}`")


def check_ranks(args, points: list):
    """`--gpus N` (FSDP full shard, rank 0's figures) runs full or frozen-embeddings training
    on a GPU, emulated or real; anything else is one line, exit 2."""
    if args.gpus < 1:
        raise InputError(f"--gpus {args.gpus}: must be 1 or more")
    if args.offload and args.gpus == 1:
        raise InputError("--offload: FSDP's CPU offload of the ranks' shards needs --gpus 2 or more")
    if args.gpus == 1:
        return
    if args.device == "cpu":
        raise InputError(f"--gpus {args.gpus}: ranks run on a GPU (cuda:N or emu:GPU), not the CPU")
    for p in points:
        tr = p["train"]["trainable"] if p["mode"] == "train" else None
        if tr not in ("full", "frozen-embeddings"):
            what = f"trainable = \"{tr}\"" if tr else f"mode = \"{p['mode']}\""
            raise InputError(f"--gpus {args.gpus}: FSDP full shard is emulated for full and "
                             f"frozen-embeddings training, not {what} ({p['id']})")


def peft_version() -> str:
    import peft
    return peft.__version__


def check_generate(path: Path, s: dict, points: list):
    """A generation table (`s`, whose `points` these are): its keys, attention (eager or
    sliced; the probe's --attention says eager or sdpa), and each point's diffusers directory
    (no torch)."""
    for k, v in s.items():
        if k not in SWEEP_KEYS or k in ("kv_cache", "optimizer", "checkpointing", "grad_accum",
                                        "trainable", "kernels"):
            raise InputError(f"{path}: the torch probe cannot run `{k} = {json.dumps(v)}` with mode \"generate\"")
    bad = [a for a in s.get("attention", []) if a not in ("eager", "sliced")]
    if bad:
        raise InputError(f"{path}: the torch probe cannot run `attention = \"{bad[0]}\"` for generation")
    if s.get("mode") != ["generate"]:
        raise InputError(f"{path}: [sweep] mode \"generate\" runs alone in its [sweep] table")
    for p in points:
        try:
            lay = gen_layout(p)
        except InputError as e:
            raise InputError(f"{path}: {e}") from None
        if lay["family"] == "wan" and "frames" not in s:
            raise InputError(f"{path}: `frames` is missing: {p['model_id']} is a video model "
                             "(frames 4k+1, e.g. [5, 9])")


def run(args, scenario) -> int:
    """Measures `scenario`'s points (grid.load) as `args` say."""
    spec, text, plan, points = scenario
    check_runnable(args.scenario, spec, plan, points)
    worker = args.worker_point is not None
    if worker:
        # A worker of `vramlab sweep` (runtime = "torch"): the points it was given, in grid order.
        wanted = set(args.worker_point)
        points = [p for p in points if p["id"] in wanted]
        missing = wanted - {p["id"] for p in points}
        if missing:
            raise InputError(f"{args.scenario}: no point `{sorted(missing)[0]}` in this scenario")
    cpu = args.device == "cpu"
    # The preload meter's refusal (no LD_PRELOAD) comes before torch is imported.
    preload = PreloadMeter() if cpu else None
    import torch
    import transformers

    meter: Union[PreloadMeter, CudaMeter]
    if preload is not None:
        meter = preload
        device = torch.device("cpu")
        # oneDNN (bf16/f16 matmuls on CPU) keeps per-shape state: megabytes retained the first
        # time each shape runs. Each point's unmeasured rehearsal creates it; --no-onednn turns
        # oneDNN off (bf16 matmuls then take torch's slow reference kernels).
        torch.backends.mkldnn.enabled = not args.no_onednn
        dev_name, drv, cuda_v = platform.processor() or platform.machine(), "", ""
        pool = {"meter": meter.kind, "allocator": "glibc malloc via libvramlab_preload.so",
                "onednn": not args.no_onednn}
        gpu = None
    else:
        if not torch.cuda.is_available():
            print("error: torch sees no CUDA device", file=sys.stderr)
            return 1
        device = torch.device(args.device)
        torch.cuda.set_device(device)
        if args.gpus > 1:
            # Rank 0 of `--gpus` in one process: torch's fake process group (collectives move no
            # data; every buffer FSDP allocates for them is rank 0's own).
            import torch.distributed as dist
            from torch.testing._internal.distributed.fake_pg import FakeStore
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.gpus)
        meter = CudaMeter(torch, device)
        props = torch.cuda.get_device_properties(device)
        dev_name, cuda_v = props.name, str(torch.version.cuda)
        if emulated():
            dev_name += " (emulated)"
        drv = ""
        try:
            drv = Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1].split()[0]
        except (OSError, IndexError):
            pass
        pool = {"meter": meter.kind, "allocator": torch.cuda.get_allocator_backend(),
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        if args.gpus > 1:
            pool["ranks"] = {"world_size": args.gpus, "rank": 0, "sharding": "fsdp-full-shard",
                             "process_group": "fake", "cpu_offload": args.offload}
        if emulated():
            pool["emulated"] = {"context_bytes": int(os.environ.get("VRAMLAB_EMU_CONTEXT", "0")),
                                "weights": "built from each config on the device, not read"}
        gpu = dict(name=props.name, total_memory=props.total_memory,
                   compute_capability=f"{props.major}.{props.minor}")
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
              "mixed-bf16": torch.float32, "mixed-f16": torch.float32}
    runtime = f"torch-{torch.__version__}+transformers-{transformers.__version__}"
    generating = any(p["mode"] == "generate" for p in points)
    if generating:
        import diffusers
        runtime += f"+diffusers-{diffusers.__version__}"
    started_at = now_rfc3339()
    run_id = args.run_id or f"{re.sub('[:-]', '', started_at)}-torch-{os.getpid():x}"
    shash = short_hash(text.encode())
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    manifest_path = out.with_name(out.stem + ".manifest.json")
    manifest = dict(
        schema_version=SCHEMA_VERSION, run_id=run_id, started_at=started_at, finished_at=None,
        csv=str(out), scenario_path=str(args.scenario), scenario_hash=shash, scenario_text=text,
        backend="cpu" if cpu else "cuda", device=args.device, device_name=dev_name,
        pool=pool, runtime=runtime, attention=args.attention, torch_optim=args.torch_optim,
        lora=args.lora, lora_dropout=args.lora_dropout,
        versions=dict(vramlab="torch_probe", git_rev=git_rev(), python=platform.python_version(),
                      torch=torch.__version__, transformers=transformers.__version__,
                      diffusers=diffusers.__version__ if generating else None,
                      peft=peft_version() if args.lora == "peft" else None,
                      cuda_driver=drv, cuda_runtime=cuda_v),
        gpu=gpu, host=dict(hostname=socket.gethostname(), os=platform.release(), cpus=os.cpu_count(),
                           torch_threads=torch.get_num_threads()),
        points=len(points), status_counts={},
    )
    if os.environ.get("VRAMLAB_PROBE_STACK"):
        manifest["stack"] = os.environ["VRAMLAB_PROBE_STACK"]  # the scenario's `stack` axis

    def write_manifest():
        # A worker's parent (vramlab sweep) writes the manifest, from what report_device says.
        if not worker:
            manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

    def point_done(p):
        # The protocol of harness/src/sweep/supervisor.rs, on stdout.
        if worker:
            print(f"vramlab-point-done {p['id']}", flush=True)

    write_manifest()
    if worker:
        print("vramlab-device " + json.dumps(dict(
            gpu=gpu, pool=pool, device_name=dev_name, runtime=runtime,
            probe={k: manifest[k] for k in ("attention", "torch_optim", "lora", "versions")})),
            flush=True)
    writer = Writer(out, append=worker)
    counts: dict[str, int] = {}
    print(f"torch_probe {spec['name']}: {len(points)} points -> {out} ({runtime}, {meter.kind}, "
          f"attention {args.attention}, optimizer {args.torch_optim})", file=sys.stderr)

    common = dict(
        schema_version=SCHEMA_VERSION, run_id=run_id, vramlab_version="torch_probe",
        git_rev=git_rev(), backend="cpu" if cpu else "cuda", device_name=dev_name,
        driver_version=drv, cuda_version=cuda_v, candle_version="",
        kernels="reference", attention=args.attention, pool_release="", scenario_hash=shash,
        meter=meter.kind,
    )
    if args.gpus > 1:
        common["message"] = (f"rank 0 of {args.gpus}: FSDP full shard (fake process group)"
                             + (", shards offloaded to the CPU" if args.offload else ""))
    i = 0
    while i < len(points):
        if points[i]["mode"] == "generate":
            n = gen_group_len(points, i)
            run_generate_group(torch, points[i:i + n], common, writer, meter, device, args, counts)
            for p in points[i:i + n]:
                point_done(p)
            i += n
            continue
        # One model per source, precision and attention (transformers fixes the attention
        # implementation when it builds the model).
        def key(p):
            return (p["source"], p["precision"], p.get("attention") or args.attention)
        src, prec, attn = key(points[i])
        n = 0
        while i + n < len(points) and key(points[i + n]) == (src, prec, attn):
            n += 1
        group, i = points[i:i + n], i + n
        kind, path = parse_source(src)
        base = dict(common, attention=attn,
                    weight_source={"hf": "safetensors", "gguf": "gguf", "synthetic": "synthetic"}[kind])
        dtype = dtypes[prec]
        model = None
        try:
            meter.trim()
            started = meter.start()
            config, model = build_model(torch, transformers, kind, path, dtype, attn, device,
                                        gpus=args.gpus, compute=compute_dtype(torch, prec),
                                        offload=args.offload)
            model.eval()
            load_mem, load_ms = meter.finish(started)
            load_err = None
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - recorded per point, the sweep goes on
            oom = not cpu and isinstance(e, torch.cuda.OutOfMemoryError)
            load_err = ("oom" if oom else "error", " ".join(str(e).split())[:300])
        if load_err:
            # param_count 0: the model was never built (the message says why).
            for p in group:
                writer.write(dict(base, **point_cols(p, args.torch_optim), phase="load", param_count=0,
                                  status=load_err[0], message=load_err[1]))
                counts[load_err[0]] = counts.get(load_err[0], 0) + 1
                point_done(p)
            model = None
            meter.trim()
            continue
        assert model is not None  # built, or the group was recorded above
        # transformers keeps some modules in f32 whatever the dtype (DeepSeek-V3's router:
        # `_keep_in_fp32_modules_strict`); anything else in another dtype is a probe bug.
        keep32 = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ()) + tuple(
            getattr(model, "_keep_in_fp32_modules", None) or ())
        wrong = {str(q.dtype) for n, q in model.named_parameters()
                 if q.dtype != dtype and not (q.dtype == torch.float32 and any(k in n for k in keep32))}
        if wrong:
            raise RuntimeError(f"{src}: parameters built as {sorted(wrong)}, not {dtype}")
        nparams = sum(q.numel() for q in model.parameters())
        base.update(architecture=model.config.model_type, param_count=nparams)
        lkw = logits_kw(model)
        warm_up(torch, transformers, model, group, device, lkw, args.lora, args.lora_targets,
                args.lora_dropout)
        for p in group:
            cols = dict(base, **point_cols(p, args.torch_optim), started_at=now_rfc3339())
            meter.trim()
            load_f = row_features(args.scenario, p["id"], [("load", 0)], args.lora_targets)[0]
            writer.write(dict(cols, phase="load", kv_tokens=0, status="ok", elapsed_ms=load_ms,
                              message="weights built once per (model, precision); shared by the group",
                              **load_mem, **load_f))
            try:
                # An unmeasured rehearsal at the point's own shapes first: torch's CPU kernels
                # (oneDNN) keep per-shape state the first time a shape runs.
                if p["mode"] == "train":
                    train_point(torch, model, p, device, NullMeter(), args.torch_optim, rehearse=True,
                                lora_impl=args.lora, lora_targets=args.lora_targets,
                                lora_dropout=args.lora_dropout)
                    rows = train_point(torch, model, p, device, meter, args.torch_optim,
                                       lora_impl=args.lora, lora_targets=args.lora_targets,
                                       lora_dropout=args.lora_dropout)
                elif p["mode"] == "encode":
                    encode_point(torch, model, p, device, NullMeter())
                    rows = encode_point(torch, model, p, device, meter)
                else:
                    infer_point(torch, transformers, model, model.config, p, dtype, device, NullMeter(), lkw)
                    rows = infer_point(torch, transformers, model, model.config, p, dtype, device, meter, lkw)
                fs = row_features(args.scenario, p["id"], [(r["phase"], r.get("kv_tokens") or 0)
                                                            for r in rows], args.lora_targets)
                for r, f in zip(rows, fs):
                    writer.write(dict(cols, **r, **f, status="ok"))
                status = "ok"
            except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                oom = not cpu and isinstance(e, torch.cuda.OutOfMemoryError)
                msg = " ".join(str(e).split())[:300]
                m = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", str(e))
                first = "prefill" if p["mode"] == "infer" else "forward"
                status = "oom" if oom else "error"
                writer.write(dict(cols, phase=first, status=status,
                                  message=(f"requested {m.group(1)}: " if m else "") + msg))
            counts[status] = counts.get(status, 0) + 1
            print(f"  {p['id']}: {status}", file=sys.stderr)
            point_done(p)
        del model
        # A model in reference cycles (FSDP's modules and their hooks) outlives `del`: the next
        # group would start with it still allocated.
        gc.collect()
        meter.trim()

    manifest["finished_at"] = now_rfc3339()
    manifest["status_counts"] = counts
    write_manifest()
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f" -> {out}", file=sys.stderr)
    return 1 if counts.get("error") else 0


def without(argv: list, flag: str) -> list:
    """`argv` less `flag VALUE` and `flag=VALUE`: what runs this probe again with another."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            rest.append(a)
    return rest


STACKS = {"default": "venv", "torch-2.2": "stacks/torch-2.2/venv"}


def stack_python(name: str) -> str:
    """The python of a pinned software stack's venv in the torch cache (scripts/torch-env.sh
    --stack NAME; `default`: scripts/torch-env.sh), as harness/src/vocab/runtime.rs's Stack::venv."""
    if name not in STACKS:
        raise InputError(f"stack `{name}`: unknown (known: {', '.join(STACKS)})")
    cache = Path(os.environ.get("VRAMLAB_TORCH_CACHE") or Path.home() / ".cache" / "vramlab-torch")
    py = cache / STACKS[name] / "bin" / "python"
    if not py.is_file():
        flag = "" if name == "default" else f" --stack {name}"
        raise InputError(f"stack `{name}`: not installed ({py} is missing; `scripts/torch-env.sh{flag}` "
                         "installs it)")
    return str(py)


def stack_out(out: Path, name: str) -> Path:
    """Where a stack's rows go: --out itself for the default stack, FILE-STACK.csv for another."""
    return out if name == "default" else out.with_name(f"{out.stem}-{name}{out.suffix}")


def run_stacks(args, stacks: list, argv: list) -> int:
    """A scenario's `stack = [...]`: this probe again under each stack's python, one CSV each
    (stack_out), with the same point ids, for `vramlab compare` between stacks. The worst exit
    code wins; a stack that fails does not stop the others."""
    if not isinstance(stacks, list) or not stacks or not all(isinstance(x, str) for x in stacks):
        raise InputError(f"{args.scenario}: `stack` must be a list of stack names")
    pythons = {name: stack_python(name) for name in stacks}
    rest = without(argv, "--out")
    worst = 0
    for name in stacks:
        out = stack_out(args.out, name)
        print(f"stack {name}: {pythons[name]} -> {out}", file=sys.stderr)
        env = dict(os.environ, VRAMLAB_PROBE_STACK=name)
        done = subprocess.run([pythons[name], *self_args(), *rest, "--out", str(out)], env=env)
        worst = max(worst, done.returncode)
    return worst


def run_emulated(args, argv: list) -> int:
    """`--device emu:GPU`: this probe again, as cuda:0, under `vramlab emulate --gpu GPU`."""
    gpu = args.device.split(":", 1)[1]
    rest = without(argv, "--device")
    memory = ["--gpu-memory", args.gpu_memory] if args.gpu_memory else []
    rest = without(rest, "--gpu-memory")
    # No --timeout: a sweep's worker measures a whole group of points, and the sweep itself
    # records each point's failure.
    cmd = [vramlab_bin(), "emulate", "--gpu", gpu, *memory, "--timeout", "0", "--", sys.executable,
           *self_args(), *rest, "--out", str(args.out), "--device", "cuda:0"]
    # The probe's own progress is on stderr; emulate's per-step table is not needed here. A
    # worker's stdout carries its protocol to vramlab sweep (emulate's table there is ignored).
    worker = args.worker_point is not None
    done = subprocess.run(cmd, stdout=None if worker else subprocess.DEVNULL)
    return done.returncode


def parser() -> argparse.ArgumentParser:
    """The probe's command line (scripts/torch-cpu.sh checks its arguments against the same
    flags, listed there: test_script_args.py keeps the two lists equal)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--out", type=Path, help="output CSV (manifest beside it)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N (torch's caching allocator), cpu "
                    "(the preload meter; use scripts/torch-cpu.sh) or emu:GPU (an emulated GPU, "
                    "e.g. emu:h100-80gb)")
    ap.add_argument("--torch-optim", choices=["foreach", "for-loop", "fused"], default="foreach",
                    help="the optimizer implementation (recorded in the optimizer column)")
    ap.add_argument("--attention", choices=["eager", "sdpa"], default="eager",
                    help="attention implementation (recorded in the kernels column); eager "
                    "materializes the scores like vramlab's models")
    ap.add_argument("--lora", choices=["hooks", "peft"], default="hooks",
                    help="a lora-rN point's adapters: forward hooks on the query and value "
                    "projections (vramlab's definition, the default) or peft's get_peft_model with "
                    "its defaults, as labs run it (recorded in the manifest)")
    ap.add_argument("--lora-targets", metavar="LIST", default=None,
                    help="with --lora peft: the modules to adapt, as vramlab's --lora-targets "
                    "writes them (q,k,v,o,gate,up,down,experts; experts through peft's "
                    "target_parameters); default: peft's own")
    ap.add_argument("--lora-dropout", metavar="P", type=float, default=0.0,
                    help="with --lora peft: peft's lora_dropout, the probability each adapter's "
                    "input is dropped (default 0, peft's own)")
    ap.add_argument("--no-onednn", action="store_true",
                    help="cpu: turn oneDNN off (no per-shape kernel state; bf16 much slower)")
    ap.add_argument("--dry-run", action="store_true", help="print the point ids and exit")
    ap.add_argument("--check", action="store_true",
                    help="check that the probe can run the scenario (exit 2 naming what it cannot), "
                    "then exit; imports no torch")
    ap.add_argument("--gpus", type=int, default=1, metavar="N",
                    help="training on N GPUs with FSDP full shard: rank 0's figures, in one process "
                    "through torch's fake process group (full or frozen-embeddings training)")
    ap.add_argument("--offload", action="store_true",
                    help="with --gpus: FSDP's CPU offload (each rank's parameter, gradient and "
                    "optimizer-state shards in host memory, the optimizer step on the CPU)")
    ap.add_argument("--gpu-memory", metavar="SIZE",
                    help="emu:GPU: the emulated GPU's total memory (vramlab emulate --gpu-memory)")
    # A worker of `vramlab sweep` with runtime = "torch" (harness/src/sweep/torch.rs): these
    # points only (repeated), appended to --out under the parent's run id, no manifest, and
    # the supervisor's protocol on stdout.
    ap.add_argument("--worker-point", action="append", metavar="ID", help=argparse.SUPPRESS)
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
        spec, plan, points = scenario.spec, scenario.plan, scenario.points
        if args.check or args.dry_run:
            if args.check:
                check_runnable(args.scenario, spec, plan, points)
            else:
                for p in points:
                    print(p["id"])
            return 0
        if not 0.0 <= args.lora_dropout < 1.0 or (args.lora_dropout and args.lora != "peft"):
            raise InputError(f"--lora-dropout {args.lora_dropout}: a probability in [0, 1), "
                             "for peft's adapters (--lora peft)")
        if args.gpu_memory and not args.device.startswith("emu:"):
            raise InputError(f"--gpu-memory {args.gpu_memory}: only for --device emu:GPU")
        if args.out is None:
            args.out = Path("results") / f"{spec['name']}-torch.csv"
        if args.out.suffix != ".csv":
            raise InputError(f"--out {args.out}: must end in .csv")
        check_ranks(args, points)
        if "stack" in spec and not os.environ.get("VRAMLAB_PROBE_STACK"):
            return run_stacks(args, spec["stack"], argv if argv is not None else sys.argv[1:])
        if args.device.startswith("emu:"):
            return run_emulated(args, argv if argv is not None else sys.argv[1:])
        if args.device != "cpu" and not re.fullmatch(r"cuda(:[0-9]+)?", args.device):
            raise InputError(f"--device {args.device}: must be cpu, cuda:N or emu:GPU")
        return run(args, scenario)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
