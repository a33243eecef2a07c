//! Huffman-coded strings decoded lately, found again by their coded octets.
//!
//! A client that sends a field as a literal rather than from the dynamic table sends the same
//! coded octets every time: names no table keeps, `content-type`, `:authority`, a method's
//! `:path`, a value sent "never indexed". Decoding is most of HPACK's cost (an octet a step,
//! ~2 ns each), a lookup here a hash of two words and a compare. One memo per thread, shared
//! by every decoder on it (l7's, the redactor's, the shim's): the same strings recur across a
//! node's connections, and one per decoder would cost each connection a kilobyte. A string's
//! decoding is a function of its octets, so whatever a slot holds is right for them; a
//! collision costs only the decode it would have cost anyway. A string is kept the second time
//! it is met in a row at its slot: one met once (a unique path, an id) costs a word written,
//! not a store, and does not evict what repeats.
use std::cell::RefCell;

use super::huffman::{self, InvalidHuffman};

/// Longest coded string kept: longer ones are mostly unique (trace ids, tokens, query strings).
const MAX_CODED: usize = 32;
/// Symbols a coded string of `MAX_CODED` octets can hold (the shortest code is five bits).
const MAX_TEXT: usize = MAX_CODED * 8 / 5;
/// Direct-mapped: 256 slots of 96 bytes, 24 KiB a thread.
const SLOTS: usize = 256;

#[derive(Clone, Copy)]
struct Slot {
    /// The hash of the last string met here and not kept: met again next, it is kept.
    candidate: u64,
    /// 0 when empty: an empty string is never looked up.
    coded_len: u8,
    text_len: u8,
    coded: [u8; MAX_CODED],
    text: [u8; MAX_TEXT],
}

const EMPTY: Slot = Slot {
    candidate: 0,
    coded_len: 0,
    text_len: 0,
    coded: [0; MAX_CODED],
    text: [0; MAX_TEXT],
};

thread_local! {
    static MEMO: RefCell<Box<[Slot; SLOTS]>> = RefCell::new(Box::new([EMPTY; SLOTS]));
}

/// [`huffman::decode`], answered from the memo when these octets were decoded lately.
pub fn decode(coded: &[u8], out: &mut Vec<u8>) -> Result<(), InvalidHuffman> {
    lookup(coded, out).map(|_| ())
}

/// `decode`, saying whether the memo answered.
fn lookup(coded: &[u8], out: &mut Vec<u8>) -> Result<bool, InvalidHuffman> {
    if coded.is_empty() || coded.len() > MAX_CODED {
        return huffman::decode(coded, out).map(|()| false);
    }
    MEMO.with(|memo| {
        let Ok(mut memo) = memo.try_borrow_mut() else {
            return huffman::decode(coded, out).map(|()| false);
        };
        let h = hash(coded);
        let slot = &mut memo[(h >> 56) as usize];
        if holds(slot, coded) {
            out.extend_from_slice(&slot.text[..usize::from(slot.text_len)]);
            return Ok(true);
        }
        let start = out.len();
        huffman::decode(coded, out)?;
        if slot.candidate != h {
            slot.candidate = h;
            return Ok(false);
        }
        let text = &out[start..];
        // Always true of a string that decoded (at most 8/5 symbols an octet); checked, not
        // assumed.
        if text.len() <= MAX_TEXT {
            slot.coded[..coded.len()].copy_from_slice(coded);
            slot.coded_len = coded.len() as u8;
            slot.text[..text.len()].copy_from_slice(text);
            slot.text_len = text.len() as u8;
            slot.candidate = 0;
        }
        Ok(false)
    })
}

/// The hash of 1..=`MAX_CODED` coded octets (its top eight bits their slot): their first and
/// last eight (four, or each octet, when shorter; overlapping) and their length, mixed. Read as
/// words in place: copying the octets out first (a call to `memcpy` and a stalled reload each)
/// cost more than the decoding it saved.
fn hash(coded: &[u8]) -> u64 {
    let (a, b) = ends(coded);
    (a ^ b.rotate_left(29) ^ coded.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Whether `slot` holds `coded` (1..=`MAX_CODED` octets), compared a word at a time.
fn holds(slot: &Slot, coded: &[u8]) -> bool {
    let n = coded.len();
    if usize::from(slot.coded_len) != n {
        return false;
    }
    let kept = &slot.coded[..n];
    if n < 8 {
        return ends(kept) == ends(coded);
    }
    // Whole words, then the last eight (overlapping the words before).
    (0..n / 8).all(|i| word(kept, 8 * i) == word(coded, 8 * i))
        && word(kept, n - 8) == word(coded, n - 8)
}

/// Two words that together cover all of `s` (1..: when shorter than eight octets, its first and
/// last four, or each octet).
fn ends(s: &[u8]) -> (u64, u64) {
    let n = s.len();
    if n >= 8 {
        return (word(s, 0), word(s, n - 8));
    }
    if n >= 4 {
        return (u64::from(half(s, 0)), u64::from(half(s, n - 4)));
    }
    let byte = |i: usize| u64::from(s.get(i).copied().unwrap_or(0));
    (byte(0) | byte(1) << 8 | byte(2) << 16, 0)
}

fn word(s: &[u8], at: usize) -> u64 {
    s.get(at..at + 8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn half(s: &[u8], at: usize) -> u32 {
    s.get(at..at + 4)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coded(s: &[u8]) -> Vec<u8> {
        let mut c = Vec::new();
        huffman::encode(s, &mut c);
        c
    }

    #[test]
    fn a_memo_answer_is_the_decoding_whatever_the_slots_hold() {
        // More strings than slots, so slots are shared and overwritten; each decoded twice in
        // a row and after the others: always what the decoder itself says.
        let strings: Vec<Vec<u8>> = (0..600u32)
            .map(|i| format!("/svc.v{}/Method{}", i % 7, i).into_bytes())
            .collect();
        for round in 0..2 {
            for s in &strings {
                let c = coded(s);
                for _ in 0..2 {
                    let mut out = b"prefix".to_vec();
                    decode(&c, &mut out).unwrap();
                    assert_eq!(&out[6..], &s[..], "round {round}");
                    assert_eq!(&out[..6], b"prefix");
                }
            }
        }
    }

    #[test]
    fn a_string_is_kept_when_met_twice_and_one_met_once_evicts_nothing() {
        let kept = coded(b"grpc-accept-encoding");
        let (mut out, mut answered) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            out.clear();
            answered.push(lookup(&kept, &mut out).unwrap());
            assert_eq!(out, b"grpc-accept-encoding");
        }
        // Decoded the first two times (kept the second), answered the third.
        assert_eq!(answered, [false, false, true]);
        // Strings met once, whatever slots they fall in, leave it kept.
        for i in 0..2000 {
            let once = coded(format!("/p/{i}").as_bytes());
            out.clear();
            assert!(!lookup(&once, &mut out).unwrap(), "/p/{i} was met once");
        }
        out.clear();
        assert!(lookup(&kept, &mut out).unwrap());
        assert_eq!(out, b"grpc-accept-encoding");
    }

    #[test]
    fn invalid_and_long_strings_are_not_kept() {
        // EOS in the string: an error every time, never a memo hit.
        for _ in 0..2 {
            let mut out = Vec::new();
            assert!(decode(&[0xff, 0xff, 0xff, 0xff], &mut out).is_err());
            assert!(out.is_empty());
        }
        // Longer than a slot takes: decoded every time, still right.
        let long = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = coded(long);
        assert!(c.len() > MAX_CODED);
        for _ in 0..2 {
            let mut out = Vec::new();
            decode(&c, &mut out).unwrap();
            assert_eq!(out, long);
        }
    }

    #[test]
    fn a_string_one_octet_away_from_a_kept_one_is_not_taken_for_it() {
        // Every coded length up to a slot's (and one past), every octet changed: what the memo
        // answers for the changed string is what the decoder says of it.
        let text = b"application/grpc+proto; charset=utf-8, x-request-id";
        for len in 1..=text.len() {
            let kept = coded(&text[..len]);
            if kept.len() > MAX_CODED + 1 {
                break;
            }
            let mut out = Vec::new();
            decode(&kept, &mut out).unwrap();
            assert_eq!(out, &text[..len]);
            for at in 0..kept.len() {
                let mut near = kept.clone();
                near[at] ^= 0x21;
                let expect = {
                    let mut e = Vec::new();
                    huffman::decode(&near, &mut e).map(|()| e)
                };
                let mut got = Vec::new();
                let got = decode(&near, &mut got).map(|()| got);
                assert_eq!(got, expect, "len {len}, octet {at}");
                // And the kept string still reads as itself.
                let mut again = Vec::new();
                decode(&kept, &mut again).unwrap();
                assert_eq!(again, &text[..len]);
            }
        }
    }
}
