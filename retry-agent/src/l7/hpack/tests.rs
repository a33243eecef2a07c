//! The decoder against RFC 7541's examples and, on random blocks and damaged ones, against an
//! independent implementation (loona-hpack).
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::{borrow::Cow, collections::VecDeque};

use super::{huffman, *};
use crate::testkit::Rng;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Decoded fields, owned.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn fields(d: &mut Decoder, block: &[u8]) -> Result<Fields, HpackError> {
    let mut out = Vec::new();
    d.decode(block, |n, v| out.push((n.to_vec(), v.to_vec())))
        .map(|()| out)
}

fn pairs(list: &[(&str, &str)]) -> Fields {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

#[test]
fn huffman_decodes_the_rfc_examples() {
    for (coded, plain) in [
        ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
        ("a8eb 1064 9cbf", "no-cache"),
        ("25a8 49e9 5ba9 7d7f", "custom-key"),
        ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
    ] {
        let mut out = Vec::new();
        huffman::decode(&hex(coded), &mut out).unwrap();
        assert_eq!(out, plain.as_bytes());
        let mut enc = Vec::new();
        huffman::encode(plain.as_bytes(), &mut enc);
        assert_eq!(enc, hex(coded), "{plain}");
        assert_eq!(huffman::encoded_len(plain.as_bytes()), enc.len());
    }
}

#[test]
fn huffman_round_trips_every_octet_as_loona_decodes_it() {
    let mut rng = Rng::new(3);
    let mut strings: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    strings.push(Vec::new());
    strings.extend((0..3000).map(|_| {
        let len = rng.below(80);
        (0..len).map(|_| rng.next() as u8).collect()
    }));
    // Header text: codes of five to eight bits, two to a lookup.
    let text = b"abcdefghijklmnopqrstuvwxyz0123456789-_./:=;, ";
    strings.extend((0..3000).map(|_| {
        let len = rng.below(80);
        (0..len).map(|_| text[rng.below(text.len())]).collect()
    }));
    for s in strings {
        let mut enc = Vec::new();
        huffman::encode(&s, &mut enc);
        let mut ours = Vec::new();
        huffman::decode(&enc, &mut ours).unwrap();
        assert_eq!(ours, s);
        let theirs = loona_hpack::huffman::HuffmanDecoder::new()
            .decode(&enc)
            .unwrap();
        assert_eq!(theirs, s);
        // One bit flipped: the same verdict and octets as loona's, wherever the bit lies
        // (the eight-octet refill, the octet-wise tail, the padding).
        if !enc.is_empty() {
            let bit = rng.below(enc.len() * 8);
            enc[bit / 8] ^= 0x80 >> (bit % 8);
            ours.clear();
            let ours = huffman::decode(&enc, &mut ours).map(|()| ours.clone());
            let theirs = loona_hpack::huffman::HuffmanDecoder::new().decode(&enc);
            assert_eq!(ours.ok(), theirs.ok(), "{s:02x?} with bit {bit} flipped");
        }
    }
}

#[test]
fn huffman_refuses_eos_and_bad_padding() {
    let mut out = Vec::new();
    // EOS is thirty ones: four octets of ones hold it.
    assert!(huffman::decode(&[0xff, 0xff, 0xff, 0xff], &mut out).is_err());
    // '0' is 00000 (five bits); eight bits of padding is one octet too many.
    assert!(huffman::decode(&[0x07, 0xff], &mut out).is_err());
    // Padding must be ones.
    assert!(huffman::decode(&[0x00], &mut out).is_err());
    // Three ones of padding after '0' are fine.
    out.clear();
    huffman::decode(&[0x07], &mut out).unwrap();
    assert_eq!(out, b"0");
    // Random octets: never a panic, and the same verdict as loona's.
    let mut rng = Rng::new(11);
    for _ in 0..20000 {
        let raw: Vec<u8> = (0..rng.below(40)).map(|_| rng.next() as u8).collect();
        out.clear();
        let ours = huffman::decode(&raw, &mut out).map(|()| out.clone());
        let theirs = loona_hpack::huffman::HuffmanDecoder::new().decode(&raw);
        assert_eq!(ours.ok(), theirs.ok(), "{raw:02x?}");
    }
}

#[test]
fn requests_of_rfc_appendix_c4_decode_with_the_table_in_step() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let first = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
    assert_eq!(
        fields(&mut d, &first).unwrap(),
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(d.table_size(), (57, 4096));
    let second = hex("8286 84be 5886 a8eb 1064 9cbf");
    assert_eq!(
        fields(&mut d, &second).unwrap(),
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache")
        ])
    );
    assert_eq!(d.table_size(), (110, 4096));
    let third = hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf");
    assert_eq!(
        fields(&mut d, &third).unwrap(),
        pairs(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value")
        ])
    );
    assert_eq!(d.table_size(), (164, 4096));
}

#[test]
fn the_static_table_is_loonas() {
    let mut theirs = loona_hpack::Decoder::new();
    for (i, &(n, v)) in STATIC_TABLE.iter().enumerate() {
        let got = theirs.decode(&[0x80 | (i as u8 + 1)]).unwrap();
        assert_eq!(got, vec![(n.to_vec(), v.to_vec())], "index {}", i + 1);
    }
}

#[test]
fn malformed_blocks_are_errors() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    assert_eq!(fields(&mut d, &[0x80]), Err(HpackError::BadIndex(0)));
    assert_eq!(fields(&mut d, &[0x80 | 62]), Err(HpackError::BadIndex(62)));
    // A literal whose value runs past the block.
    assert_eq!(
        fields(&mut d, &[0x40, 0x01, b'a', 0x05, b'b']),
        Err(HpackError::Truncated)
    );
    // An integer that does not end.
    assert_eq!(
        fields(&mut d, &[0xff, 0xff, 0xff]),
        Err(HpackError::Truncated)
    );
    assert_eq!(
        fields(&mut d, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        Err(HpackError::IntegerOverflow)
    );
    // A size update above what the decoder allows.
    let mut big = vec![0x3f];
    let mut rest = 8192 - 31;
    while rest >= 128 {
        big.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    big.push(rest as u8);
    assert_eq!(
        fields(&mut d, &big),
        Err(HpackError::TableSize(8192, DEFAULT_TABLE_SIZE))
    );
    // Fields before an error were handed over.
    let mut got = Vec::new();
    let r = d.decode(&[0x82, 0x80], |n, v| got.push((n.to_vec(), v.to_vec())));
    assert_eq!(r, Err(HpackError::BadIndex(0)));
    assert_eq!(got, pairs(&[(":method", "GET")]));
}

/// A test encoder choosing every representation at random, with a table of its own.
struct Enc {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Enc {
    fn new() -> Self {
        Enc {
            table: VecDeque::new(),
            size: 0,
            max: DEFAULT_TABLE_SIZE,
        }
    }

    fn find(&self, n: &[u8], v: Option<&[u8]>) -> Option<usize> {
        let stat = STATIC_TABLE
            .iter()
            .map(|&(n, v)| (n, v))
            .chain(self.table.iter().map(|(n, v)| (&n[..], &v[..])));
        stat.enumerate()
            .find(|(_, (tn, tv))| *tn == n && v.is_none_or(|v| *tv == v))
            .map(|(i, _)| i + 1)
    }

    fn evict(&mut self, max: usize) {
        while self.size > max {
            let (n, v) = self.table.pop_back().unwrap();
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn block(&mut self, rng: &mut Rng, fields: &Fields) -> Vec<u8> {
        let mut out = Vec::new();
        if rng.below(8) == 0 {
            let max = rng.below(DEFAULT_TABLE_SIZE + 1);
            encode_int(&mut out, 0x20, 5, max);
            self.max = max;
            self.evict(max);
        }
        for (n, v) in fields {
            if let Some(i) = self.find(n, Some(v)).filter(|_| rng.below(3) > 0) {
                encode_int(&mut out, 0x80, 7, i);
                continue;
            }
            let (first, bits, index) = match rng.below(3) {
                0 => (0x40, 6, true),
                1 => (0x00, 4, false),
                _ => (0x10, 4, false),
            };
            match self.find(n, None).filter(|_| rng.below(2) == 0) {
                Some(i) => encode_int(&mut out, first, bits, i),
                None => {
                    out.push(first);
                    encode_str(&mut out, n, rng.below(2) == 0);
                }
            }
            encode_str(&mut out, v, rng.below(2) == 0);
            if index {
                let need = n.len() + v.len() + 32;
                if need > self.max {
                    self.table.clear();
                    self.size = 0;
                } else {
                    self.evict(self.max - need);
                    self.size += need;
                    self.table.push_front((n.clone(), v.clone()));
                }
            }
        }
        out
    }
}

fn random_fields(rng: &mut Rng) -> Fields {
    const NAMES: [&str; 8] = [
        ":method",
        ":path",
        ":status",
        "content-type",
        "traceparent",
        "grpc-status",
        "x-custom",
        "cookie",
    ];
    (0..1 + rng.below(8))
        .map(|_| {
            let n = NAMES[rng.below(NAMES.len())].as_bytes().to_vec();
            let v: Vec<u8> = match rng.below(3) {
                0 => b"GET".to_vec(),
                1 => format!("v{}", rng.below(20)).into_bytes(),
                _ => (0..rng.below(300)).map(|_| rng.next() as u8).collect(),
            };
            (n, v)
        })
        .collect()
}

fn loona_fields(d: &mut loona_hpack::Decoder<'static>, block: &[u8]) -> Option<Fields> {
    let mut out = Vec::new();
    d.decode_with_cb(block, |n: Cow<'_, [u8]>, v: Cow<'_, [u8]>| {
        out.push((n.into_owned(), v.into_owned()))
    })
    .ok()
    .map(|()| out)
}

#[test]
fn random_conversations_decode_as_sent_and_as_loona_reads_them() {
    let mut rng = Rng::new(29);
    for _ in 0..200 {
        let mut enc = Enc::new();
        let mut ours = Decoder::new(DEFAULT_TABLE_SIZE);
        let mut theirs = loona_hpack::Decoder::new();
        theirs.set_max_allowed_table_size(DEFAULT_TABLE_SIZE);
        for _ in 0..20 {
            let sent = random_fields(&mut rng);
            let block = enc.block(&mut rng, &sent);
            assert_eq!(fields(&mut ours, &block).unwrap(), sent);
            assert_eq!(loona_fields(&mut theirs, &block).unwrap(), sent);
            assert_eq!(ours.table_size(), (enc.size, enc.max));
        }
    }
}

#[test]
fn damaged_blocks_never_panic_and_read_as_loona_reads_them() {
    let mut rng = Rng::new(31);
    let mut agreed = 0;
    for _ in 0..300 {
        let mut enc = Enc::new();
        let mut ours = Decoder::new(DEFAULT_TABLE_SIZE);
        let mut theirs = loona_hpack::Decoder::new();
        theirs.set_max_allowed_table_size(DEFAULT_TABLE_SIZE);
        for _ in 0..10 {
            let sent = random_fields(&mut rng);
            let mut block = enc.block(&mut rng, &sent);
            for _ in 0..rng.below(3) {
                let at = rng.below(block.len());
                if let Some(b) = block.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
            if rng.below(4) == 0 {
                block.truncate(rng.below(block.len() + 1));
            }
            let got = fields(&mut ours, &block);
            // loona refuses a block that ends with a size update; otherwise the two agree on
            // every block they both read (an error leaves the tables unknowable: stop there).
            match (got, loona_fields(&mut theirs, &block)) {
                (Ok(o), Some(t)) => {
                    assert_eq!(o, t);
                    agreed += 1;
                }
                (Err(_), Some(t)) => panic!("loona read {t:?} from {block:02x?}"),
                _ => break,
            }
        }
    }
    assert!(agreed > 300, "only {agreed} damaged blocks compared");
}

#[test]
fn values_not_wanted_are_skipped_and_the_table_still_follows() {
    let mut rng = Rng::new(37);
    let mut skipped = 0;
    for _ in 0..100 {
        let mut enc = Enc::new();
        let mut some = Decoder::new(DEFAULT_TABLE_SIZE);
        for _ in 0..20 {
            let sent = random_fields(&mut rng);
            let block = enc.block(&mut rng, &sent);
            let mut got = Vec::new();
            some.decode_some(
                &block,
                |n| n.starts_with(b":"),
                |n, v| got.push((n.to_vec(), v.map(<[u8]>::to_vec))),
            )
            .unwrap();
            assert_eq!(got.len(), sent.len());
            for ((n, v), (sn, sv)) in got.iter().zip(&sent) {
                assert_eq!(n, sn);
                match v {
                    Some(v) => assert_eq!(v, sv),
                    None => {
                        assert!(!n.starts_with(b":"), "{n:?} was wanted");
                        skipped += 1;
                    }
                }
            }
            assert_eq!(some.table_size(), (enc.size, enc.max));
        }
    }
    assert!(skipped > 100, "only {skipped} values skipped");
}

#[test]
fn a_long_string_leaves_no_large_buffer_behind() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let long = vec![b'c'; 5000];
    let mut block = vec![0x00];
    encode_str(&mut block, b"cookie", true);
    encode_str(&mut block, &long, true);
    assert_eq!(
        fields(&mut d, &block).unwrap(),
        vec![(b"cookie".to_vec(), long)]
    );
    assert!(d.value_buf.capacity() <= MAX_KEPT_BUFFER);
    assert!(d.name_buf.capacity() <= MAX_KEPT_BUFFER);
}

/// Blocks of a connection whose start went by unseen: a decoder that forgot its table reads
/// static fields, literals and what was added since (by how many insertions ago, as the
/// sender counts), and counts the references into the unknown part instead of failing; an
/// entry added under a name that did not resolve keeps its place.
#[test]
fn a_forgotten_table_is_read_in_part() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    d.forget();
    assert!(d.partial());
    let mut b = Vec::new();
    // :method GET (static 2), then index 62 (the unseen part), then x-a: 1 added (literal name).
    b.push(0x82);
    b.push(0x80 | 62);
    b.push(0x40);
    encode_str(&mut b, b"x-a", false);
    encode_str(&mut b, b"1", true);
    assert_eq!(
        fields(&mut d, &b).unwrap(),
        pairs(&[(":method", "GET"), ("x-a", "1")])
    );
    assert_eq!(d.unresolved(), 1);
    // Added under a name from the unseen part (index 70: below it now), then :status 503 by
    // its static name, then index 63 (x-a, one insertion ago) and 64 (beyond what was seen).
    let mut b = Vec::new();
    encode_int(&mut b, 0x40, 6, 70);
    encode_str(&mut b, b"secret", false);
    encode_int(&mut b, 0x00, 4, 8);
    encode_str(&mut b, b"503", false);
    b.push(0x80 | 63);
    b.push(0x80 | 64);
    assert_eq!(
        fields(&mut d, &b).unwrap(),
        pairs(&[(":status", "503"), ("x-a", "1")])
    );
    assert_eq!(d.unresolved(), 2);
    // The unseen entry holds 62: it resolves to nothing, and does not shift x-a away.
    assert_eq!(
        fields(&mut d, &[0x80 | 62, 0x80 | 63]).unwrap(),
        pairs(&[("x-a", "1")])
    );
    assert_eq!(d.unresolved(), 1);
    // A whole decoder still calls a reference past its table an error.
    let mut whole = Decoder::new(DEFAULT_TABLE_SIZE);
    assert_eq!(
        fields(&mut whole, &[0x80 | 62]),
        Err(HpackError::BadIndex(62))
    );
    assert_eq!(whole.unresolved(), 0);
}
