//! safetensors bytes → our header check → `safetensors::SafeTensors::deserialize`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.safetensors");
    match vramlab::model::weights::check_bytes(path, data) {
        Ok(()) => {
            // Whatever our check accepts, the crate parses too (check_bytes calls it), and
            // every tensor view is readable.
            let st = safetensors::SafeTensors::deserialize(data).expect("checked");
            for (_, t) in st.tensors() {
                let _ = t.data().len();
            }
        }
        Err(e) => common::check_err(path, &e),
    }
});
