//! HPACK's Huffman code (RFC 7541 Appendix B), decoded an octet a step.
//!
//! The code is canonical (codes of one length are consecutive, in symbol order, and shorter codes
//! sort first), so it is fully given by each symbol's code length: `CODE_LENGTHS` is the
//! appendix's "len in bits" column and the codes are derived from it. The decoder is a state
//! machine over the code tree's 256 inner nodes: for each node and each octet, the node the eight
//! bits lead to and the symbols passed on the way (the shortest code is five bits, so at most
//! two). Built once per process from the same walk four bits at a time; 256 KiB, which an octet a
//! step needs: a nibble a step made two dependent loads per octet, the decoder's critical path,
//! and decoded half as fast.
use std::sync::OnceLock;

/// Code length of each symbol 0..=255 and of EOS (256).
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const EOS: u16 = 256;

/// A Huffman string that does not decode: a code for EOS, or padding that is longer than seven
/// bits or not the most significant bits of EOS (§5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid Huffman-coded string")]
pub struct InvalidHuffman;

/// Each symbol's code, right-aligned, derived from the lengths.
fn codes() -> [u32; 257] {
    let mut order: Vec<u16> = (0..=EOS).collect();
    order.sort_by_key(|&s| (CODE_LENGTHS[usize::from(s)], s));
    let mut codes = [0u32; 257];
    let mut code = 0u32;
    let mut prev_len = CODE_LENGTHS[usize::from(order[0])];
    for (k, &s) in order.iter().enumerate() {
        let len = CODE_LENGTHS[usize::from(s)];
        if k > 0 {
            code = (code + 1) << (len - prev_len);
        }
        prev_len = len;
        codes[usize::from(s)] = code;
    }
    codes
}

/// One step on an octet, packed: how many symbols were emitted on the way (bits 0–1), whether
/// EOS was met (`FAIL`, bit 2), the node reached (8–15: already the next step's row, so the
/// next index is a mask and an OR — the decoder's critical path — not a zero-extend, shift
/// and OR), the symbols (16–23, 24–31).
const FAIL: u32 = 1 << 2;
/// Bits of a step that hold the node reached, as its row's offset (`node << 8`).
const ROW: u32 = 0xff00;

struct Machine {
    /// Indexed by `node << 8 | octet`.
    steps: Box<[u32; 1 << 16]>,
    /// A string may end at this node: fewer than eight bits since the last symbol, all ones.
    accepts: [bool; 256],
}

/// A node's child: another inner node, or a symbol (leaf).
#[derive(Clone, Copy)]
enum Child {
    Inner(u8),
    Leaf(u16),
}

fn machine() -> &'static Machine {
    static MACHINE: OnceLock<Machine> = OnceLock::new();
    MACHINE.get_or_init(build)
}

fn build() -> Machine {
    let codes = codes();
    // The tree: inner nodes numbered as created, the root 0. 257 leaves make 256 inner nodes.
    let mut children: Vec<[Option<Child>; 2]> = vec![[None, None]];
    let mut depth_ones: Vec<(u8, bool)> = vec![(0, true)];
    for s in 0..=EOS {
        let len = CODE_LENGTHS[usize::from(s)];
        let code = codes[usize::from(s)];
        let mut node = 0usize;
        for i in (0..len).rev() {
            let bit = usize::from((code >> i) & 1 == 1);
            if i == 0 {
                children[node][bit] = Some(Child::Leaf(s));
                break;
            }
            node = match children[node][bit] {
                Some(Child::Inner(n)) => usize::from(n),
                _ => {
                    let n = children.len();
                    let (d, ones) = depth_ones[node];
                    children.push([None, None]);
                    depth_ones.push((d + 1, ones && bit == 1));
                    // A complete code of 257 symbols has exactly 256 inner nodes (0..=255).
                    children[node][bit] = Some(Child::Inner(n as u8));
                    n
                }
            };
        }
    }
    // Four bits from `node`: (node reached, symbol passed), or None when EOS is met.
    let nibble = |node: usize, nibble: usize| -> Option<(usize, Option<u8>)> {
        let mut node = node;
        let mut symbol = None;
        for i in (0..4).rev() {
            match children[node][(nibble >> i) & 1] {
                Some(Child::Inner(n)) => node = usize::from(n),
                Some(Child::Leaf(EOS)) | None => return None,
                Some(Child::Leaf(sym)) => {
                    symbol = Some(sym as u8);
                    node = 0;
                }
            }
        }
        Some((node, symbol))
    };
    // Built on the heap: 256 KiB is too much for a small thread's stack.
    let Ok(mut steps) = Box::<[u32; 1 << 16]>::try_from(vec![0u32; 1 << 16].into_boxed_slice())
    else {
        unreachable!("a boxed slice of 2^16 converts to an array of 2^16")
    };
    let mut accepts = [false; 256];
    for state in 0..children.len() {
        let (d, ones) = depth_ones[state];
        accepts[state] = ones && d <= 7;
        for octet in 0..256usize {
            let step = &mut steps[state << 8 | octet];
            let Some((mid, first)) = nibble(state, octet >> 4) else {
                *step = FAIL;
                continue;
            };
            let Some((next, second)) = nibble(mid, octet & 0x0f) else {
                *step = FAIL;
                continue;
            };
            let symbols: Vec<u8> = first.into_iter().chain(second).collect();
            let mut packed = (next as u32) << 8 | symbols.len() as u32;
            for (k, &sym) in symbols.iter().enumerate() {
                packed |= u32::from(sym) << (16 + 8 * k);
            }
            *step = packed;
        }
    }
    Machine { steps, accepts }
}

/// Decode `raw` and append the octets to `out`.
pub fn decode(raw: &[u8], out: &mut Vec<u8>) -> Result<(), InvalidHuffman> {
    let m = machine();
    // Borrowed once: read through `m` each step, the table's address was reloaded after every
    // store to `out` (it might have aliased).
    let steps: &[u32; 1 << 16] = &m.steps;
    let start = out.len();
    // Two symbols an octet at most; written unconditionally, the count says how many hold.
    out.resize(start + 2 * raw.len() + 2, 0);
    let mut at = start;
    let mut row = 0usize;
    for &b in raw {
        let step = steps[row | usize::from(b)];
        if step & FAIL != 0 {
            out.truncate(start);
            return Err(InvalidHuffman);
        }
        if let Some(w) = out.get_mut(at..at + 2) {
            w[0] = (step >> 16) as u8;
            w[1] = (step >> 24) as u8;
        }
        at += (step & 3) as usize;
        row = (step & ROW) as usize;
    }
    out.truncate(at);
    if m.accepts[row >> 8] {
        Ok(())
    } else {
        out.truncate(start);
        Err(InvalidHuffman)
    }
}

/// Huffman-code `s` (padded with the most significant bits of EOS), for tests and benchmarks
/// that need what real clients send.
#[cfg(any(test, feature = "testkit"))]
pub fn encode(s: &[u8], out: &mut Vec<u8>) {
    static CODES: OnceLock<[u32; 257]> = OnceLock::new();
    let codes = CODES.get_or_init(codes);
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &c in s {
        let len = u32::from(CODE_LENGTHS[usize::from(c)]);
        acc = (acc << len) | u64::from(codes[usize::from(c)]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

/// The octets `s` takes Huffman-coded.
#[cfg(any(test, feature = "testkit"))]
pub fn encoded_len(s: &[u8]) -> usize {
    let bits: usize = s
        .iter()
        .map(|&c| usize::from(CODE_LENGTHS[usize::from(c)]))
        .sum();
    bits.div_ceil(8)
}
