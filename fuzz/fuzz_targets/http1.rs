//! HTTP/1 reassembly: arbitrary syscall boundaries, gaps, closes over arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "l7_input.rs"]
mod l7_input;

fuzz_target!(|data: &[u8]| l7_input::run(data, false));
