//! GGUF bytes → header (candle's `Content::read`, through our guard) → `config_of`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vramlab::model::gguf;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.gguf");
    let mut r = std::io::Cursor::new(data);
    match gguf::read_content(path, &mut r) {
        Ok(c) => {
            if let Err(e) = gguf::config_of(path, &c) {
                common::check_err(path, &e);
            }
        }
        Err(e) => common::check_err(path, &e),
    }
});
