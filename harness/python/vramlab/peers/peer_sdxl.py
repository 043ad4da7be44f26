"""The program behind published image-generation peer rows: HF's "Exploring simple optimizations
for SDXL" notebook (huggingface/notebooks, diffusers/exploring_simple optimizations_for_sdxl.ipynb,
October 2023), run by `vramlab validate --emulate` on an emulated GPU.

The notebook loads StableDiffusionXLPipeline (stabilityai/stable-diffusion-xl-base-1.0), in fp32
or with `torch_dtype=torch.float16`, applies one setup (eager UNet attention, CPU offload of the
models or of every module, VAE slicing, text embeddings computed beforehand by its own
`encode_prompt` with the text encoders deleted, the Tiny AutoEncoder), and calls it three times on
"a photo of an astronaut riding a horse on mars" with 4 images per prompt and 25 steps, then
prints `torch.cuda.max_memory_allocated()`. This is the same pipeline class, setup calls and
pipeline call. The differences, forced by the emulator and none changing a byte the allocator
holds:
- each component is built from its config.json on `meta` and allocated on the device (or, for
  the offload setups, on the CPU, where the pipeline's hooks copy it to the device as the notebook
  loads it): no weights to read;
- the tokenizers are word-level ones over the prompt's words: the prompt becomes other token
  ids, padded to the same 77 positions the text encoders see;
- `--calls` pipeline calls (the notebook's three repeat the same peaks);
- diffusers before 0.27 finds the scheduler's first step by reading the timesteps on the device,
  which the emulator answers with zeros; the program sets that index (0) itself.
The configs are those `vramlab synth-weights --pipeline sdxl --configs-only` writes, with the
UNet's `addition_time_embed_dim` (256 in SDXL base's config), which vramlab's candle UNet does not
use, added back. torch.compile is not run: its Triton kernels and CUDA graphs are not emulated.
"""
import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import torch

# The torch probe's component builder and materialize: the `probe` package beside this file's
# folder (vramlab/probe), imported by its folder's name, so that any stack's interpreter runs
# this file by path without vramlab installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
PROBE = "probe"

PROMPT = "a photo of an astronaut riding a horse on mars"
# SDXL base's scheduler_config.json (EulerDiscreteScheduler).
SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                 num_train_timesteps=1000, steps_offset=1, timestep_spacing="leading",
                 interpolation_type="linear", prediction_type="epsilon", use_karras_sigmas=False)
# SDXL base's unet/config.json keys that vramlab's preset leaves out.
UNET_EXTRA = {"addition_time_embed_dim": 256}


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="the pipeline's configs (model_index.json, unet/, ...)")
    p.add_argument("--fp32", action="store_true", help="load in fp32 (else torch_dtype=float16)")
    p.add_argument("--eager", action="store_true", help="pipe.unet.set_default_attn_processor()")
    p.add_argument("--model-offload", action="store_true", help="pipe.enable_model_cpu_offload()")
    p.add_argument("--seq-offload", action="store_true", help="pipe.enable_sequential_cpu_offload()")
    p.add_argument("--vae-slicing", action="store_true", help="pipe.enable_vae_slicing()")
    p.add_argument("--precomputed-embeds", action="store_true",
                   help="the notebook's encode_prompt, text encoders deleted, embeddings passed")
    p.add_argument("--tiny-vae", action="store_true", help="pipe.vae = AutoencoderTiny (taesdxl)")
    p.add_argument("--images", type=int, default=4, help="num_images_per_prompt")
    p.add_argument("--steps", type=int, default=25, help="num_inference_steps")
    p.add_argument("--calls", type=int, default=3, help="pipeline calls")
    return p.parse_args()


def tokenizer():
    """A word-level tokenizer over the prompt's words (CLIP's vocabulary and merges are not here):
    it pads every prompt to CLIP's 77 positions, as the real one does, with other token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<|endoftext|>"] + sorted(set(PROMPT.split()))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=77,
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")


def build(torch, name: str, root: Path, dtype, device):
    """One component from its config on `meta`, allocated on `device`: the text encoders with the
    stack's own default attention (eager CLIP before transformers 4.4x), the UNet and the VAE
    through the torch probe's builder."""
    materialize = importlib.import_module(f"{PROBE}.common").materialize
    build_component = importlib.import_module(f"{PROBE}.generate").build_component
    if not name.startswith("text_encoder"):
        return build_component(torch, "sd", name, root / name, dtype, None, device)
    import transformers
    cfg = transformers.CLIPTextConfig.from_dict(json.loads((root / name / "config.json").read_text()))
    cls = (transformers.CLIPTextModelWithProjection if name == "text_encoder_2"
           else transformers.CLIPTextModel)
    with torch.device("meta"):
        model = cls(cfg).to(dtype)
    return materialize(torch, model, device).eval()


def encode_prompt(tokenizers, encoders):
    """The notebook's encode_prompt (no negative prompt: zeros)."""
    embeds = []
    for tok, enc in zip(tokenizers, encoders):
        ids = tok([PROMPT], padding="max_length", max_length=tok.model_max_length,
                  truncation=True, return_tensors="pt").input_ids
        out = enc(ids.to(enc.device), output_hidden_states=True)
        pooled = out[0]
        embeds.append(out.hidden_states[-2])
    embeds = torch.concat(embeds, dim=-1)
    return embeds, torch.zeros_like(embeds), pooled, torch.zeros_like(pooled)


def main():
    a = parse()
    from diffusers import AutoencoderTiny, EulerDiscreteScheduler, StableDiffusionXLPipeline
    root = Path(a.dir)
    cfg = json.loads((root / "unet" / "config.json").read_text())
    unet_root = Path(tempfile.mkdtemp(prefix="vramlab-peer-"))
    (unet_root / "unet").mkdir()
    (unet_root / "unet" / "config.json").write_text(json.dumps({**UNET_EXTRA, **cfg}))
    dtype = torch.float32 if a.fp32 else torch.float16
    # from_pretrained loads on the CPU; `.to("cuda")` moves it all but in the offload setups.
    place = "cpu" if a.model_offload or a.seq_offload else "cuda"
    call = dict(num_images_per_prompt=a.images, num_inference_steps=a.steps)
    if a.precomputed_embeds:
        toks = [tokenizer(), tokenizer()]
        encs = [build(torch, c, root, dtype, "cuda") for c in ("text_encoder", "text_encoder_2")]
        # Outside no_grad, as the notebook calls it: the embeddings keep the encoders' autograd
        # graph, and with it their weights, after `del`.
        pe, npe, pp, npp = encode_prompt(toks, encs)
        del encs
        call.update(prompt_embeds=pe, negative_prompt_embeds=npe, pooled_prompt_embeds=pp,
                    negative_pooled_prompt_embeds=npp)
    # The notebook's flush() before each setup: the peak counts from loading the pipeline on.
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if a.precomputed_embeds:
        text = dict(text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None)
    else:
        text = dict(text_encoder=build(torch, "text_encoder", root, dtype, place),
                    text_encoder_2=build(torch, "text_encoder_2", root, dtype, place),
                    tokenizer=tokenizer(), tokenizer_2=tokenizer())
        call["prompt"] = PROMPT
    # The pipeline is built with SDXL's own VAE: the Tiny AutoEncoder replaces it after
    # from_pretrained, on the CPU, before `.to("cuda")`.
    pipe = StableDiffusionXLPipeline(
        unet=build(torch, "unet", unet_root, dtype, place),
        vae=build(torch, "vae", root, dtype, "cpu" if a.tiny_vae else place),
        scheduler=EulerDiscreteScheduler(**SCHEDULER), **text)
    if a.tiny_vae:
        materialize = importlib.import_module(f"{PROBE}.common").materialize
        with torch.device("meta"):
            tiny = AutoencoderTiny().to(dtype)  # taesdxl's config is AutoencoderTiny's defaults
        pipe.vae = materialize(torch, tiny, place).eval()
    if a.eager:
        # set_default_attn_processor(): AttnProcessor everywhere (diffusers 0.22's own call
        # fails when peft is installed, as it is in the stack and was not in the notebook).
        from diffusers.models.attention_processor import AttnProcessor
        pipe.unet.set_attn_processor(AttnProcessor())
    if a.model_offload:
        pipe.enable_model_cpu_offload()
    if a.seq_offload:
        pipe.enable_sequential_cpu_offload()
    if a.vae_slicing:
        # The pipeline's enable_vae_slicing() (removed in later diffusers) is the VAE's own.
        pipe.vae.enable_slicing()
    pipe.set_progress_bar_config(disable=True)
    if hasattr(pipe.scheduler, "_init_step_index") and not hasattr(pipe.scheduler, "set_begin_index"):
        # diffusers before 0.27 finds the first step by comparing timesteps on the device, a
        # read the emulator answers with zeros; a text-to-image schedule starts at index 0.
        pipe.scheduler._init_step_index = lambda timestep: setattr(pipe.scheduler, "_step_index", 0)
    for _ in range(a.calls):
        pipe(**call)
    print(f"vramlab-peer: max_memory_allocated={torch.cuda.max_memory_allocated()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
