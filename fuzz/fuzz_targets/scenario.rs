//! Scenario TOML → `Spec::parse` → (if valid) the grid expansion.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vramlab::scenario::{expand, Spec};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.toml");
    match Spec::parse(path, text) {
        Ok(spec) => {
            // A valid scenario may still be large; only expand ones of a bounded size.
            let n: usize = spec
                .sweep
                .0
                .iter()
                .map(|s| {
                    s.batch.len()
                        .saturating_mul(s.context.len())
                        .saturating_mul(s.precision.len())
                        .saturating_mul(s.repeats)
                        .saturating_mul(s.kv_cache.len().max(1))
                        .saturating_mul(s.optimizer.len().max(1))
                        .saturating_mul(s.grad_accum.len().max(1))
                })
                .fold(0usize, |a, b| a.saturating_add(b));
            if n <= 10_000 {
                let _ = expand(&spec);
            }
        }
        Err(e) => common::check_err(path, &e),
    }
});
