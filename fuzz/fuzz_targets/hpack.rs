//! HPACK: the decoder l7, the redactor and the shim share, on arbitrary blocks, in step with an
//! independent one (loona-hpack). Blocks are the input split at 0xff 0x00 pairs, decoded in
//! order on one connection: no panic, and every block loona reads, ours reads the same.
#![no_main]
use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use retry_agent::l7::hpack::{DEFAULT_TABLE_SIZE, Decoder};

fuzz_target!(|data: &[u8]| {
    let mut ours = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut theirs = loona_hpack::Decoder::new();
    theirs.set_max_allowed_table_size(DEFAULT_TABLE_SIZE);
    let mut rest = data;
    loop {
        let (block, next) = match rest.windows(2).position(|w| w == [0xff, 0x00]) {
            Some(i) => (&rest[..i], Some(&rest[i + 2..])),
            None => (rest, None),
        };
        let mut got = Vec::new();
        let r = ours.decode(block, |n, v| got.push((n.to_vec(), v.to_vec())));
        let mut want = Vec::new();
        let t = theirs.decode_with_cb(block, |n: Cow<'_, [u8]>, v: Cow<'_, [u8]>| {
            want.push((n.into_owned(), v.into_owned()))
        });
        match (r, t) {
            (Ok(()), Ok(())) => assert_eq!(got, want),
            (Err(e), Ok(())) => panic!("loona read {want:?}, ours failed: {e}"),
            // Either failed: the tables may differ from here on.
            _ => return,
        }
        match next {
            Some(n) => rest = n,
            None => return,
        }
    }
});
