//! The l7 input stream as its own target: the first byte picks HTTP/1 or HTTP/2 (with the
//! client preface), the rest is `l7_input`'s event layout.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "l7_input.rs"]
mod l7_input;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    l7_input::run(rest, mode & 1 == 1);
});
