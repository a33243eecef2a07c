//! HTTP/2 reassembly: the client preface is prepended so the fuzzer starts at frames and HPACK.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "l7_input.rs"]
mod l7_input;

fuzz_target!(|data: &[u8]| l7_input::run(data, true));
