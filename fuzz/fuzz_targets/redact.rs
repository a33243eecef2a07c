//! Record-time redaction under hostile record boundaries: requests carrying secrets (query,
//! body, Cookie, `authorization` plain / Huffman / by dynamic-table name, `x-api-key`, gRPC
//! metadata), cut where the input says, pieces dropped (the redactor is told the offsets, as
//! the kernel's byte counts tell it), captured prefixes cut short, unrelated garbage on other
//! connections in between, losses announced. Whatever the input: no secret in the output,
//! plain or Huffman-coded, and every length kept.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use retry_agent::{
    capture::{ConnId, DataEvent, Direction, Role, Syscall},
    recorder::redact::Redactor,
};

const H1: &[u8] = b"POST /pay?token=SECRETQUERY1&pin=SECRET9 HTTP/1.1\r\nHost: shop\r\nAuthorization: Bearer SECRETAUTH\r\n\
Cookie: sid=SECRETCOOKIE\r\nX-Api-Key: SECRETAPIKEY\r\nx-auth-token: SECRETMETA\r\nContent-Length: 19\r\n\r\ncard=SECRETBODY1234\
GET /next?SECRETQ2 HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nSECRET\r\n0\r\nx-trailer: SECRETTRAILER\r\n\r\n";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// RFC 7541 C.4.3: Huffman "custom-key" / "custom-value" (the value stands for a secret).
const HUFF_KEY: &[u8] = &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f];
const HUFF_SECRET: &[u8] = &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf];

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn lit(out: &mut Vec<u8>, lead: &[u8], value: &[u8]) {
    out.extend_from_slice(lead);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn h2() -> Vec<u8> {
    let mut b1 = vec![0x83, 0x86];
    lit(&mut b1, &[0x04], b"/pkg.Svc/Call?token=SECRETPATH");
    lit(&mut b1, &[0x41], b"svc");
    b1.push(0x40);
    lit(&mut b1, &[], b"x-auth-token");
    lit(&mut b1, &[], b"SECRETMETA");
    lit(&mut b1, &[0x57], b"Bearer SECRETA1");
    lit(&mut b1, &[0x1f, 0x11], b"sid=SECRETCOOKIE");
    b1.push(0x00);
    lit(&mut b1, &[], b"x-api-key");
    lit(&mut b1, &[], b"SECRETAPIKEY");
    b1.push(0x10);
    b1.push(0x80 | HUFF_KEY.len() as u8);
    b1.extend_from_slice(HUFF_KEY);
    b1.push(0x80 | HUFF_SECRET.len() as u8);
    b1.extend_from_slice(HUFF_SECRET);
    let mut b2 = vec![0x83, 0x86, 0xc0];
    lit(&mut b2, &[0x04], b"/pkg.Svc/Call");
    lit(&mut b2, &[0x0f, 0x2f], b"Bearer SECRETA2");
    lit(&mut b2, &[0x0f, 0x30], b"SECRETMETA2");
    let (h1, h2) = b1.split_at(b1.len() / 2);
    let mut w = PREFACE.to_vec();
    w.extend(frame(0x4, 0, 0, &[]));
    w.extend(frame(0x1, 0x0, 1, h1));
    w.extend(frame(0x9, 0x4, 1, h2));
    w.extend(frame(0x0, 0x1, 1, b"\x00\x00\x00\x00\x0bSECRETBODY1"));
    w.extend(frame(0x1, 0x4, 3, &b2));
    w.extend(frame(0x0, 0x1, 3, b"SECRETBODY2"));
    w.extend(frame(0x1, 0x4, 5, &b1));
    w
}

fn ev(fd: u32, payload: &[u8], len: u64) -> DataEvent {
    DataEvent {
        conn: ConnId { pid: 1, fd, generation: 1 },
        role: Role::Client,
        direction: Direction::Egress,
        syscall: Syscall::Write,
        tuple: None,
        pid: 1,
        tid: 1,
        goid: None,
        interleaved: false,
        ts_enter_ns: 1,
        ts_exit_ns: 1,
        len,
        payload: Bytes::copy_from_slice(payload),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut ops)) = data.split_first() else { return };
    let wire = if mode & 1 == 0 { H1.to_vec() } else { h2() };
    let mut r = Redactor::new();
    let mut at = 0usize;
    // Each op: [kind][arg]; pieces of the secret stream are cut by `arg`.
    while at < wire.len() {
        let (&kind, rest) = ops.split_first().unwrap_or((&0, &[]));
        let (&arg, rest) = rest.split_first().unwrap_or((&0xff, &[]));
        ops = rest;
        let take = (usize::from(arg) + 1).min(wire.len() - at);
        let piece = &wire[at..at + take];
        match kind % 8 {
            // Dropped: never reaches the redactor.
            0 => {}
            // Garbage on another connection (no secret in it by construction).
            1 => {
                let g: Vec<u8> = ops.iter().take(usize::from(arg)).map(|&c| if c == b'S' { b's' } else { c }).collect();
                let (out, _) = r.redact_payload_at(&ev(9, &g, g.len() as u64), None);
                assert_eq!(out.len(), g.len());
                continue;
            }
            // A loss announced.
            2 => {
                r.lost_all();
                continue;
            }
            // Captured prefix only.
            3 => {
                let cap = usize::from(arg) % (take + 1);
                let (out, _) = r.redact_payload_at(&ev(3, &piece[..cap], take as u64), Some(at as u64));
                assert_eq!(out.len(), cap);
                assert!(!contains(&out, b"SECRET") && !contains(&out, HUFF_SECRET), "leak: {out:02x?}");
            }
            _ => {
                let (out, _) = r.redact_payload_at(&ev(3, piece, take as u64), Some(at as u64));
                assert_eq!(out.len(), piece.len());
                assert!(!contains(&out, b"SECRET") && !contains(&out, HUFF_SECRET), "leak: {:?}", String::from_utf8_lossy(&out));
            }
        }
        at += take;
    }
});
