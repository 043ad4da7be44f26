//! Arbitrary JSON bytes → `Config::from_json` → (if valid) every derived size.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vramlab::model::Config;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let path = Path::new("fuzz/config.json");
    match Config::from_json(path, &v) {
        Ok(c) => {
            let _ = c.param_count();
            let _ = c.kv_bytes_per_token(4);
            let _ = vramlab::model::weights::storage_bytes(&c, candle_core::DType::F32);
            // What synth-weights writes reads back to the same config.
            let back = Config::from_json(path, &c.to_hf_json()).expect("to_hf_json reads back");
            assert_eq!(back, c);
        }
        Err(e) => common::check_err(path, &e),
    }
});
