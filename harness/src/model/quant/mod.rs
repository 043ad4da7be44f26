//! Checkpoint formats as transformers loads them: a `config.json`'s `quantization_config`
//! ([`Checkpoint`]) and the exact bytes each tensor of the normalized [`Config`] then takes on
//! the GPU ([`Checkpoint::plan`]). The formats are one vocabulary ([`Format`]); the JSON's
//! `quant_method` string is read once, at the file's boundary.
//!
//! Which tensors a format quantizes: a weight matrix of two or more dimensions inside the
//! decoder layers (its name holds a layer index, see [`super::in_layer`]), not named by the
//! config's `modules_to_not_convert` (bitsandbytes: `llm_int8_skip_modules`). Embeddings, norms,
//! biases and the LM head stay dense, in the query's dtype. A 2-D weight is a linear's
//! (out, in) (the architecture's `lora_in_out` reads it); a 3-D one is a fused expert stack as
//! transformers names the dequantized model, (experts, in, out) (gpt-oss's
//! `mlp.experts.gate_up_proj` (E, hidden, 2·f) and `mlp.experts.down_proj` (E, f, hidden)).
//!
//! The byte rules, per (out, in) matrix (E of them for an expert stack), from the loaders' own
//! buffers:
//! - `mxfp4` (transformers' `Mxfp4HfQuantizer`, gpt-oss): out·in/2 B of packed E2M1 values
//!   (`*_blocks`) and out·in/32 B of E8M0 scales (`*_scales`), one per 32 inputs.
//! - `fp8` block-scaled (`FineGrainedFP8Config`, DeepSeek-V3's `weight_block_size` [128, 128]):
//!   out·in B of e4m3 and ceil(out/128)·ceil(in/128) f32 `weight_scale_inv`.
//! - `awq` GEMM (AutoAWQ's `WQLinear_GEMM`): `qweight` (in, out/8) int32 = in·out/2 B at 4 bits,
//!   `qzeros` (in/g, out/8) int32 and `scales` (in/g, out) f16 (present whether or not
//!   `zero_point`).
//! - `gptq` (auto-gptq's / optimum's `QuantLinear`): `qweight` (in·bits/32, out) int32, `qzeros`
//!   (ceil(in/g), out·bits/32) int32, `scales` (ceil(in/g), out) f16 and `g_idx` (in) int32,
//!   stored with or without `desc_act`; g = in for `group_size` −1.
//! - bitsandbytes 4-bit (`Params4bit`, `functional.quantize_4bit` with transformers' block of
//!   64): n = out·in values packed two a byte (ceil(n/2) B), the `QuantState`'s code table (16
//!   f32, 64 B, made per tensor by `get_4bit_type`) and its absmax: one f32 per 64-value block,
//!   or with double quantization (`compress_statistics`) one byte per block, an f32 offset, and
//!   the nested `QuantState` of `quantize_blockwise(absmax, blocksize=256)`: one f32 absmax per
//!   256 blocks and a copy of the 256-entry f32 dynamic map (1,024 B).
//! - bitsandbytes 8-bit (`Int8Params`): out·in int8 and one f32 scale (`SCB`) per output row.
use super::Config;
use crate::error::bad_file;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// A checkpoint's quantization format (its `quantization_config`), or QLoRA's base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "method", rename_all = "lowercase")]
pub enum Format {
    /// OCP microscaling FP4: E2M1 values with an E8M0 scale per 32 (gpt-oss).
    Mxfp4,
    /// e4m3 weights with an f32 inverse scale per (out, in) block (DeepSeek-V3).
    Fp8 { block: [u64; 2] },
    /// AWQ, GEMM packing: `bits`-bit weights, zeros and f16 scales per `group` inputs.
    Awq { bits: u64, group: u64 },
    /// GPTQ: `bits`-bit weights, zeros and f16 scales per `group` inputs (None: one group a
    /// row, `group_size` −1), and the input permutation `g_idx`.
    Gptq { bits: u64, group: Option<u64> },
    /// bitsandbytes 4-bit (`load_in_4bit`): NF4 or FP4 values, absmax per 64.
    Bnb4 { kind: Bnb4Kind, double_quant: bool },
    /// bitsandbytes LLM.int8 (`load_in_8bit`): int8 rows with an f32 scale each.
    Int8,
}

/// bitsandbytes' 4-bit data types (`bnb_4bit_quant_type`): the same bytes, other code tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bnb4Kind {
    Nf4,
    Fp4,
}

/// bitsandbytes' 4-bit block: one absmax per 64 values (`Params4bit`'s default blocksize).
const BNB4_BLOCK: u64 = 64;
/// The nested quantization of the absmax: one f32 per 256 blocks (`quantize_blockwise`).
const BNB4_NESTED_BLOCK: u64 = 256;
/// A 4-bit code table: 16 f32 values.
const BNB4_CODE: u64 = 16 * 4;
/// The dynamic map a nested `QuantState` copies: 256 f32 values.
const BNB_DYNAMIC_MAP: u64 = 256 * 4;

impl Format {
    /// The format's short name (the weights row's and the `types` list's).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Mxfp4 => "mxfp4",
            Format::Fp8 { .. } => "fp8",
            Format::Awq { .. } => "awq",
            Format::Gptq { .. } => "gptq",
            Format::Bnb4 {
                kind: Bnb4Kind::Nf4,
                ..
            } => "nf4",
            Format::Bnb4 {
                kind: Bnb4Kind::Fp4,
                ..
            } => "fp4",
            Format::Int8 => "int8",
        }
    }

    /// Whether transformers multiplies by a dequantized copy of each weight, in the compute
    /// dtype, where no fused kernel runs: AWQ's and GPTQ's torch fallbacks
    /// (`dequantize_gemm`, `TorchQuantLinear`) and bitsandbytes' `MatMul4Bit` (every product
    /// but a single token's `gemv_4bit`, and again in its backward). MXFP4 (triton's
    /// `matmul_ogs`), FP8 (`w8a8_block_fp8_matmul`) and LLM.int8 (an int8 matmul of the
    /// quantized activations) multiply the stored bytes.
    pub fn dequantizes_per_matmul(&self) -> bool {
        matches!(
            self,
            Format::Awq { .. } | Format::Gptq { .. } | Format::Bnb4 { .. }
        )
    }

    /// Bytes of `e` matrices of (out, in) in this format, or why the shape cannot be stored.
    pub fn matrix_bytes(&self, e: u64, out: u64, inp: u64) -> Result<u64, String> {
        let n = out * inp;
        let whole = |what: &str, v: u64, by: u64| {
            if v.is_multiple_of(by) {
                Ok(())
            } else {
                Err(format!("{what} {v} is not a multiple of {by}"))
            }
        };
        let one = match *self {
            Format::Mxfp4 => {
                whole("the input width", inp, 32)?;
                n / 2 + n / 32
            }
            Format::Fp8 { block: [bo, bi] } => n + out.div_ceil(bo) * inp.div_ceil(bi) * 4,
            Format::Awq { bits, group } => {
                whole("the input width", inp, group)?;
                whole("the output width", out * bits, 32)?;
                let groups = inp / group;
                n * bits / 8 + groups * out * bits / 8 + groups * out * 2
            }
            Format::Gptq { bits, group } => {
                whole("the input width", inp * bits, 32)?;
                whole("the output width", out * bits, 32)?;
                let groups = group.map_or(1, |g| inp.div_ceil(g));
                n * bits / 8 + groups * out * bits / 8 + groups * out * 2 + inp * 4
            }
            Format::Bnb4 { double_quant, .. } => {
                let blocks = n.div_ceil(BNB4_BLOCK);
                let absmax = if double_quant {
                    blocks + 4 + blocks.div_ceil(BNB4_NESTED_BLOCK) * 4 + BNB_DYNAMIC_MAP
                } else {
                    blocks * 4
                };
                n.div_ceil(2) + BNB4_CODE + absmax
            }
            Format::Int8 => n + out * 4,
        };
        Ok(e * one)
    }
}

impl std::fmt::Display for Format {
    /// The format with its parameters, as the report names it ("awq int4 g128").
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::Mxfp4 | Format::Int8 => f.write_str(self.name()),
            Format::Fp8 { block: [o, i] } => write!(f, "fp8 e4m3 {o}x{i} blocks"),
            Format::Awq { bits, group } => write!(f, "awq int{bits} g{group}"),
            Format::Gptq { bits, group } => match group {
                Some(g) => write!(f, "gptq int{bits} g{g}"),
                None => write!(f, "gptq int{bits} per-row"),
            },
            Format::Bnb4 { double_quant, .. } => write!(
                f,
                "{}{}",
                self.name(),
                if *double_quant { " double-quant" } else { "" }
            ),
        }
    }
}

/// A checkpoint's quantization: its format and the modules it leaves dense.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub format: Format,
    /// `modules_to_not_convert` (bitsandbytes: `llm_int8_skip_modules`), matched as
    /// transformers' `should_convert_module` does: a module is left dense when a pattern
    /// matches its name from the start (the pattern a regular expression of literals, `.` and
    /// `*`) or its name ends with the pattern.
    pub not_convert: Vec<String>,
}

/// The exact weights of a config in a [`Checkpoint`]'s format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub format: Format,
    /// Quantized tensors and their bytes (scales, zeros and tables included).
    pub quantized: usize,
    pub quantized_bytes: u64,
    /// Dense tensors and their bytes at the dense dtype.
    pub dense: usize,
    pub dense_bytes: u64,
    /// Elements of the largest quantized matrix (one expert's for an expert stack): what a
    /// per-matmul dequantization materializes.
    pub largest_matrix: u64,
    /// Whether every quantized tensor is a MoE expert's.
    pub experts_only: bool,
}

impl Plan {
    /// Every weight byte.
    pub fn bytes(&self) -> u64 {
        self.quantized_bytes + self.dense_bytes
    }
    /// What the quantized tensors are, for the weights row: "experts" or "linears".
    pub fn what(&self) -> &'static str {
        if self.experts_only {
            "experts"
        } else {
            "linears"
        }
    }
    /// The per-matmul dequantization buffer at `compute_bytes` an element: the largest
    /// quantized matrix, dequantized ([`Format::dequantizes_per_matmul`]); 0 for a format
    /// that multiplies its stored bytes.
    pub fn dequant_bytes(&self, compute_bytes: u64) -> u64 {
        if self.format.dequantizes_per_matmul() {
            self.largest_matrix * compute_bytes
        } else {
            0
        }
    }
}

impl Checkpoint {
    /// QLoRA's base (Dettmers et al., arXiv:2305.14314; transformers'
    /// `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    /// bnb_4bit_use_double_quant=True)`): NF4 with double quantization on every linear of the
    /// layers, the head and embeddings dense.
    pub fn qlora() -> Checkpoint {
        Checkpoint {
            format: Format::Bnb4 {
                kind: Bnb4Kind::Nf4,
                double_quant: true,
            },
            not_convert: Vec::new(),
        }
    }

    /// The `quantization_config` of `config.json` (`v`, read from `path`): None without one; a
    /// one-line error naming the file for a method or key vramlab does not know.
    pub fn from_config_json(path: &Path, v: &Value) -> anyhow::Result<Option<Checkpoint>> {
        let Some(q) = v.get("quantization_config") else {
            return Ok(None);
        };
        let bad = |msg: String| bad_file(path, format!("quantization_config: {msg}"));
        let int = |key: &str, default: Option<i64>| -> anyhow::Result<i64> {
            match q.get(key) {
                Some(x) => x
                    .as_i64()
                    .ok_or_else(|| bad(format!("`{key}` must be an integer, got {x}"))),
                None => default.ok_or_else(|| bad(format!("`{key}` is missing"))),
            }
        };
        let flag = |key: &str| q.get(key).and_then(Value::as_bool).unwrap_or(false);
        let list = |key: &str| -> Vec<String> {
            q.get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`quant_method` is missing".into()))?;
        let positive = |key: &str, v: i64| -> anyhow::Result<u64> {
            u64::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("`{key}` must be positive, got {v}")))
        };
        let mut not_convert = list("modules_to_not_convert");
        let format = match method {
            "mxfp4" => Format::Mxfp4,
            "fp8" => {
                if let Some(f) = q.get("fmt").and_then(Value::as_str) {
                    if f != "e4m3" {
                        return Err(bad(format!("fp8 `fmt` {f}: only e4m3 is known")));
                    }
                }
                let block = match q.get("weight_block_size") {
                    None => [128, 128],
                    Some(b) => match b.as_array().map(|a| a.as_slice()) {
                        Some([o, i]) => match (o.as_u64(), i.as_u64()) {
                            (Some(o), Some(i)) if o > 0 && i > 0 => [o, i],
                            _ => return Err(bad(format!("`weight_block_size` {b}"))),
                        },
                        _ => return Err(bad(format!("`weight_block_size` {b}"))),
                    },
                };
                Format::Fp8 { block }
            }
            "awq" => {
                let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm");
                if !version.eq_ignore_ascii_case("gemm") {
                    return Err(bad(format!(
                        "awq version `{version}`: only the GEMM packing is known"
                    )));
                }
                let bits = positive("bits", int("bits", Some(4))?)?;
                if bits != 4 {
                    return Err(bad(format!("awq bits {bits}: AutoAWQ packs 4-bit weights")));
                }
                let group = positive("group_size", int("group_size", Some(128))?)?;
                Format::Awq { bits, group }
            }
            "gptq" => {
                let bits = positive("bits", int("bits", None)?)?;
                if ![2, 4, 8].contains(&bits) {
                    return Err(bad(format!(
                        "gptq bits {bits}: 2, 4 or 8 are known (3-bit packs across words)"
                    )));
                }
                let group = match int("group_size", Some(128))? {
                    -1 => None,
                    g => Some(positive("group_size", g)?),
                };
                Format::Gptq { bits, group }
            }
            "bitsandbytes" => {
                not_convert.extend(list("llm_int8_skip_modules"));
                let four = flag("load_in_4bit") || flag("_load_in_4bit");
                let eight = flag("load_in_8bit") || flag("_load_in_8bit");
                match (four, eight) {
                    (true, false) => {
                        let kind = match q.get("bnb_4bit_quant_type").and_then(Value::as_str) {
                            None | Some("fp4") => Bnb4Kind::Fp4,
                            Some("nf4") => Bnb4Kind::Nf4,
                            Some(t) => {
                                return Err(bad(format!(
                                    "`bnb_4bit_quant_type` {t}: nf4 or fp4 are known"
                                )))
                            }
                        };
                        Format::Bnb4 {
                            kind,
                            double_quant: flag("bnb_4bit_use_double_quant"),
                        }
                    }
                    (false, true) => Format::Int8,
                    _ => {
                        return Err(bad(
                            "bitsandbytes needs exactly one of `load_in_4bit` and `load_in_8bit`"
                                .into(),
                        ))
                    }
                }
            }
            other => {
                return Err(bad(format!(
                    "quant_method `{other}` is not a format vramlab knows (mxfp4, fp8, awq, gptq, bitsandbytes)"
                )))
            }
        };
        if let Some(p) = not_convert.iter().find(|p| pattern(p).is_none()) {
            return Err(bad(format!(
                "modules_to_not_convert `{p}`: only literals, `.` and `*` are read"
            )));
        }
        Ok(Some(Checkpoint {
            format,
            not_convert,
        }))
    }

    /// Whether tensor `name` of shape `shape` is stored quantized, and if so as how many
    /// (out, in) matrices: (matrices, out, in).
    fn quantized(&self, cfg: &Config, name: &str, shape: &[usize]) -> Option<(u64, u64, u64)> {
        if shape.len() < 2 || !super::in_layer(name) || name.ends_with("_bias") {
            return None;
        }
        let (module, matrix) = match name.strip_suffix(".weight") {
            Some(m) => (
                m,
                cfg.architecture.lora_in_out(shape).map(|(i, o)| (1, o, i)),
            ),
            // A fused expert stack: (experts, in, out), a parameter of the `experts` module.
            None => (
                name.rsplit_once('.').map_or(name, |(m, _)| m),
                match shape {
                    &[e, i, o] => Some((e, o, i)),
                    _ => None,
                },
            ),
        };
        let (e, o, i) = matrix?;
        if self.not_convert.iter().any(|p| excludes(p, module)) {
            return None;
        }
        Some((e as u64, o as u64, i as u64))
    }

    /// The weights of `cfg` in this format, dense tensors at `dense_bytes` an element; an error
    /// naming the first tensor the format cannot store.
    pub fn plan(&self, cfg: &Config, dense_bytes: u64) -> Result<Plan, String> {
        let mut plan = Plan {
            format: self.format,
            quantized: 0,
            quantized_bytes: 0,
            dense: 0,
            dense_bytes: 0,
            largest_matrix: 0,
            experts_only: true,
        };
        for (name, shape) in cfg.tensor_shapes() {
            match self.quantized(cfg, &name, &shape) {
                Some((e, o, i)) => {
                    let b = self.format.matrix_bytes(e, o, i).map_err(|why| {
                        format!("{}: {name} {shape:?}: {why}", self.format.name())
                    })?;
                    plan.quantized += 1;
                    plan.quantized_bytes += b;
                    plan.largest_matrix = plan.largest_matrix.max(o * i);
                    plan.experts_only &= name.contains(".experts.");
                }
                None => {
                    plan.dense += 1;
                    plan.dense_bytes +=
                        shape.iter().map(|&d| d as u64).product::<u64>() * dense_bytes;
                }
            }
        }
        plan.experts_only &= plan.quantized > 0;
        Ok(plan)
    }
}

/// One element of a `modules_to_not_convert` pattern: a literal character or `.` (any), each
/// possibly repeated by a following `*`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Atom {
    /// None: `.`, any character.
    c: Option<char>,
    star: bool,
}

/// The atoms of a pattern, or None for one with other regular-expression syntax.
fn pattern(p: &str) -> Option<Vec<Atom>> {
    let mut out: Vec<Atom> = Vec::new();
    for ch in p.chars() {
        match ch {
            '*' => out.last_mut().filter(|a| !a.star)?.star = true,
            '.' => out.push(Atom {
                c: None,
                star: false,
            }),
            '\\' | '[' | ']' | '(' | ')' | '{' | '}' | '+' | '?' | '|' | '^' | '$' => return None,
            c => out.push(Atom {
                c: Some(c),
                star: false,
            }),
        }
    }
    Some(out)
}

/// Whether atoms `p` match a prefix of `s` (Python's `re.match`).
fn match_prefix(p: &[Atom], s: &[char]) -> bool {
    let Some((a, rest)) = p.split_first() else {
        return true;
    };
    let one = |c: char| a.c.is_none_or(|x| x == c);
    if a.star {
        // Zero repetitions, or one more and the same atom again.
        match_prefix(rest, s) || (s.first().is_some_and(|&c| one(c)) && match_prefix(p, &s[1..]))
    } else {
        s.first().is_some_and(|&c| one(c)) && match_prefix(rest, &s[1..])
    }
}

/// Whether `modules_to_not_convert` pattern `p` leaves module `module` dense, as transformers'
/// `should_convert_module`: `re.match(p, module)` or `module.endswith(p)`.
fn excludes(p: &str, module: &str) -> bool {
    let chars: Vec<char> = module.chars().collect();
    module.ends_with(p) || pattern(p).is_some_and(|atoms| match_prefix(&atoms, &chars))
}

#[cfg(test)]
mod tests;
