#!/usr/bin/env bash
# Builds the seed corpora under fuzz/corpus/<target>/ from files in the repository (scenarios,
# presets, the bad-input corpus) and a few small generated GGUF/safetensors files.
# Run from the repository root: fuzz/seed.sh
set -euo pipefail
C=fuzz/corpus
mkdir -p $C/scenario $C/config $C/csv $C/gguf $C/safetensors
cp scenarios/*.toml harness/tests/data/*.toml $C/scenario/
cp harness/tests/bad-inputs/*.toml $C/scenario/
for d in harness/presets/*/; do cp "$d/config.json" "$C/config/$(basename "$d").json"; done
cp harness/tests/data/*.json harness/tests/bad-inputs/*.json $C/config/
cp harness/tests/bad-inputs/*.csv $C/csv/
python3 - "$C" <<'PY'
import json, struct, sys
c = sys.argv[1]
# CSV: the bad-input rows with a valid schema version.
rows = open("harness/tests/bad-inputs/csv-wrong-schema-version.csv").read().splitlines()
open(f"{c}/csv/valid.csv", "w").write(rows[0] + "\n" + "1" + rows[1][1:] + "\n")

# GGUF v3: a tiny llama header (metadata + tensor infos, no data).
def s(x): b = x.encode(); return struct.pack("<Q", len(b)) + b
def kv(k, t, v):
    out = s(k) + struct.pack("<I", t)
    if t == 4: out += struct.pack("<I", v)
    elif t == 6: out += struct.pack("<f", v)
    elif t == 8: out += s(v)
    elif t == 9: out += struct.pack("<IQ", 8, len(v)) + b"".join(s(x) for x in v)
    return out
d, f, L, h, kvh, V = 8, 16, 1, 2, 1, 4
meta = [("general.architecture", 8, "llama"), ("general.alignment", 4, 32),
        ("llama.embedding_length", 4, d), ("llama.attention.head_count", 4, h),
        ("llama.attention.head_count_kv", 4, kvh), ("llama.feed_forward_length", 4, f),
        ("llama.block_count", 4, L), ("llama.context_length", 4, 64),
        ("llama.rope.freq_base", 6, 10000.0), ("tokenizer.ggml.tokens", 9, ["a", "b", "c", "d"])]
hd = d // h
shapes = [("token_embd.weight", [V, d]), ("output_norm.weight", [d])]
for i in range(L):
    for n, sh in [("attn_norm", [d]), ("attn_q", [h*hd, d]), ("attn_k", [kvh*hd, d]),
                  ("attn_v", [kvh*hd, d]), ("attn_output", [d, h*hd]), ("ffn_norm", [d]),
                  ("ffn_gate", [f, d]), ("ffn_up", [f, d]), ("ffn_down", [d, f])]:
        shapes.append((f"blk.{i}.{n}.weight", sh))
out = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(meta))
out += b"".join(kv(*m) for m in meta)
off = 0
for n, sh in shapes:
    out += s(n) + struct.pack("<I", len(sh)) + b"".join(struct.pack("<Q", x) for x in reversed(sh))
    out += struct.pack("<IQ", 0, off)  # f32
    size = 4
    for x in sh: size *= x
    off += (size + 31) // 32 * 32
open(f"{c}/gguf/tiny-llama.gguf", "wb").write(out)
open(f"{c}/gguf/tiny-llama-v1.gguf", "wb").write(b"GGUF" + struct.pack("<III", 1, 0, 1) + struct.pack("<I", 5) + b"x.foo" + struct.pack("<II", 4, 7))

# safetensors: two tiny tensors and metadata.
hdr = {"__metadata__": {"format": "pt"},
       "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
       "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
h = json.dumps(hdr).encode()
open(f"{c}/safetensors/tiny.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(22))
PY
head -c 12000 .cache/models/all-minilm-l6-v2/model.safetensors > $C/safetensors/minilm-head.safetensors || true
ls $C/* | head -100 >/dev/null
echo "seeded: $(ls $C/scenario | wc -l) scenario, $(ls $C/config | wc -l) config, $(ls $C/csv | wc -l) csv, $(ls $C/gguf | wc -l) gguf, $(ls $C/safetensors | wc -l) safetensors"
