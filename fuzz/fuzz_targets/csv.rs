//! CSV bytes → records, through the reader `vramlab fit` and `estimate` use.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.csv");
    if let Err(e) = vramlab::export::csv::read_from(path, data) {
        common::check_err(path, &e);
    }
});
