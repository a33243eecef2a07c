//! Redaction over every 2- and 3-way split of HTTP/1 and HTTP/2 requests carrying secrets in
//! the query, body, Cookie, `authorization` (plain, Huffman, dynamic table), `x-api-key` and
//! gRPC metadata, also with the middle piece dropped: no secret, plain or Huffman-coded, out.
use bytes::Bytes;

use super::{Redactor, h2};
use crate::capture::{ConnId, DataEvent, Direction, Role, Syscall};

const H1: &[u8] = b"POST /pay?token=SECRETQUERY1&pin=SECRET9 HTTP/1.1\r\nHost: shop\r\nAuthorization: Bearer SECRETAUTH\r\n\
Cookie: sid=SECRETCOOKIE\r\nX-Api-Key: SECRETAPIKEY\r\nx-auth-token: SECRETMETA\r\nContent-Length: 19\r\n\r\ncard=SECRETBODY1234";

fn ev(payload: &[u8], len: u64) -> DataEvent {
    ev_on(1, payload, len)
}

fn ev_on(generation: u64, payload: &[u8], len: u64) -> DataEvent {
    DataEvent {
        conn: ConnId {
            pid: 1,
            fd: 3,
            generation,
        },
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

/// Redact `pieces` (each `(offset, bytes)`) in order on one fresh stream; the output of each.
fn redact_pieces(pieces: &[(u64, &[u8])]) -> Vec<Vec<u8>> {
    redact_on(&mut Redactor::new(), 1, pieces)
}

/// The same on connection `generation` of a shared redactor (cheaper for many cases).
fn redact_on(r: &mut Redactor, generation: u64, pieces: &[(u64, &[u8])]) -> Vec<Vec<u8>> {
    pieces
        .iter()
        .map(|(off, p)| {
            let (out, _) = r.redact_payload_at(&ev_on(generation, p, p.len() as u64), Some(*off));
            assert_eq!(out.len(), p.len(), "lengths are kept");
            out.to_vec()
        })
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// No secret in `out`: not as text, not as any of the Huffman literals that carried one.
fn assert_clean(out: &[u8], huffman: &[Vec<u8>], what: &str) {
    assert!(
        !contains(out, b"SECRET"),
        "{what}: leak: {}",
        String::from_utf8_lossy(out)
    );
    for h in huffman {
        assert!(
            !contains(out, h),
            "{what}: a Huffman-coded secret survived: {h:02x?}"
        );
    }
}

/// Every 2- and 3-way split of `wire`, whole and with the middle piece dropped. `stride`
/// thins out the 3-way splits whose middle piece is longer than 24 bytes (every short middle
/// piece, which cuts one field twice, is kept); the `redact` fuzz target covers the rest.
fn every_split(wire: &[u8], huffman: &[Vec<u8>], stride: usize) {
    let n = wire.len();
    let mut r = Redactor::new();
    let mut conn = 0u64;
    let mut next = || {
        conn += 1;
        conn
    };
    for a in 1..n {
        let out = redact_on(&mut r, next(), &[(0, &wire[..a]), (a as u64, &wire[a..])]).concat();
        assert_clean(&out, huffman, &format!("split at {a}"));
    }
    for a in 1..n {
        for b in (a + 1..n).filter(|b| b - a <= 24 || (b - a) % stride == 0) {
            let (x, y, z) = (&wire[..a], &wire[a..b], &wire[b..]);
            let out = redact_on(&mut r, next(), &[(0, x), (a as u64, y), (b as u64, z)]);
            assert_clean(&out.concat(), huffman, &format!("split at {a}, {b}"));
            let out = redact_on(&mut r, next(), &[(0, x), (b as u64, z)]);
            assert_clean(
                &out.concat(),
                huffman,
                &format!("split at {a}, {b}, middle dropped"),
            );
        }
    }
}

#[test]
fn http1_every_split_and_drop_keeps_no_secret() {
    every_split(H1, &[], 1);
    // Whole, the product's fields are kept.
    let out = redact_pieces(&[(0, H1)]).concat();
    let t = String::from_utf8_lossy(&out);
    for kept in [
        "POST /pay?",
        " HTTP/1.1\r\n",
        "Host: shop",
        "Content-Length: 19",
        "X-Api-Key: ",
        "x-auth-token: ",
    ] {
        assert!(t.contains(kept), "{kept:?} missing: {t}");
    }
}

#[test]
fn a_request_line_split_in_its_query_masks_the_rest() {
    let cut = H1.iter().position(|&c| c == b'&').unwrap_or(20);
    let out = redact_pieces(&[(0, &H1[..cut]), (cut as u64, &H1[cut..])]).concat();
    assert!(
        !contains(&out, b"pin="),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(contains(&out, b" HTTP/1.1\r\nHost: shop\r\n"));
}

#[test]
fn lines_that_are_not_headers_are_masked() {
    // Body bytes read as a head (after a loss the redactor was not told about).
    let out = redact_pieces(&[(
        0,
        b"GET / HTTP/1.1\r\nHost: a\r\nSECRETLINE\r\n{\"pw\": \"SECRETJSON\"}\r\n\r\n",
    )])
    .concat();
    assert_clean(&out, &[], "garbage head lines");
    assert!(contains(&out, b"Host: a"));
}

#[test]
fn a_loss_masks_until_a_message_starts() {
    let mut r = Redactor::new();
    let _ = r.redact_payload(&ev(b"GET / HTTP/1.1\r\nHost: a", 23));
    r.lost_all();
    let (out, _) = r.redact_payload(&ev(b"SECRETCONTINUED\r\n\r\n", 19));
    assert!(!contains(&out, b"SECRET"));
    let (out, _) = r.redact_payload(&ev(b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n", 28));
    assert!(
        contains(&out, b"Host: b"),
        "resynchronised at the next message"
    );
}

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

/// RFC 7541 C.4.3: Huffman "custom-key" and "custom-value".
const HUFF_CUSTOM_KEY: &[u8] = &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f];
const HUFF_CUSTOM_VALUE: &[u8] = &[0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf];

/// Two requests on one connection: literals plain and Huffman, new names, and names that only
/// the dynamic table knows in the second block.
fn h2_wire() -> Vec<u8> {
    let mut b1 = vec![0x83, 0x86]; // :method POST, :scheme http
    lit(&mut b1, &[0x04], b"/pkg.Svc/Call?token=SECRETPATH"); // :path, without indexing
    lit(&mut b1, &[0x41], b"svc"); // :authority, incremental
    // x-auth-token (gRPC metadata), new name, incremental indexing: dynamic 63 after the next.
    b1.push(0x40);
    b1.push(12);
    b1.extend_from_slice(b"x-auth-token");
    b1.push(10);
    b1.extend_from_slice(b"SECRETMETA");
    lit(&mut b1, &[0x57], b"Bearer SECRETA1"); // authorization (static 23), incremental: dynamic 62
    lit(&mut b1, &[0x1f, 0x11], b"sid=SECRETCOOKIE"); // cookie (static 32), never indexed
    b1.push(0x00); // x-api-key, literal new name without indexing
    lit(&mut b1, &[], b"x-api-key");
    lit(&mut b1, &[], b"SECRETAPIKEY");
    b1.push(0x10); // Huffman name and Huffman value, never indexed
    b1.push(0x80 | HUFF_CUSTOM_KEY.len() as u8);
    b1.extend_from_slice(HUFF_CUSTOM_KEY);
    b1.push(0x80 | HUFF_CUSTOM_VALUE.len() as u8);
    b1.extend_from_slice(HUFF_CUSTOM_VALUE);
    lit(&mut b1, &[0x0f, 0x10], b"application/grpc"); // content-type (static 31)
    let mut b2 = vec![0x83, 0x86, 0xc0]; // ..., :authority from the dynamic table (64)
    lit(&mut b2, &[0x04], b"/pkg.Svc/Call");
    lit(&mut b2, &[0x0f, 0x2f], b"Bearer SECRETA2"); // name = dynamic 62 (authorization)
    lit(&mut b2, &[0x0f, 0x30], b"SECRETMETA2"); // name = dynamic 63 (x-auth-token)
    let mut w = h2::PREFACE.to_vec();
    w.extend(frame(0x4, 0, 0, &[]));
    w.extend(frame(0x1, 0x4, 1, &b1));
    w.extend(frame(0x0, 0x1, 1, b"\x00\x00\x00\x00\x0bSECRETBODY1"));
    w.extend(frame(0x1, 0x4, 3, &b2));
    w.extend(frame(0x0, 0x1, 3, b"SECRETBODY2"));
    w
}

#[test]
fn http2_whole_masks_by_decoded_name() {
    let wire = h2_wire();
    let out = redact_pieces(&[(0, &wire)]).concat();
    assert_clean(&out, &[HUFF_CUSTOM_VALUE.to_vec()], "whole");
    // What the product reads is kept: the path without its query, authority, content-type.
    for kept in [
        &b"/pkg.Svc/Call?"[..],
        b"svc",
        b"application/grpc",
        b"x-auth-token",
        b"x-api-key",
    ] {
        assert!(
            contains(&out, kept),
            "{:?} missing",
            String::from_utf8_lossy(kept)
        );
    }
    // The masked blocks still decode, in step (a replay reads them).
    let mut d = loona_hpack::Decoder::new();
    let mut at = h2::PREFACE.len() + 9;
    let mut names = Vec::new();
    while let Some(h) = out.get(at..at + 9) {
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        if h[3] == 0x1 {
            let block = &out[at + 9..at + 9 + len];
            d.decode_with_cb(block, |n, v| {
                assert!(
                    !contains(&v, b"SECRET"),
                    "{:?}",
                    String::from_utf8_lossy(&v)
                );
                names.push(n.into_owned());
            })
            .expect("masked block decodes");
        }
        at += 9 + len;
    }
    assert!(
        names.iter().any(|n| n == b"custom-key"),
        "the Huffman name decodes"
    );
}

/// A connection older than capture: its first blocks refer to a table that went by unseen. A
/// field named by an entry added since is judged by that name (an `:authority` kept, gRPC
/// metadata masked); one named from the unseen part is masked. Before, every name from the
/// dynamic table was masked for the connection's life, the `:authority` its peer indexed
/// since included.
#[test]
fn http2_older_than_capture_judges_names_added_since() {
    // :authority (static 1) with incremental indexing, then a new name, incremental: dynamic 62
    // is x-auth-token, 63 :authority.
    let mut b1 = Vec::new();
    lit(&mut b1, &[0x41], b"svc");
    b1.push(0x40);
    lit(&mut b1, &[], b"x-auth-token");
    lit(&mut b1, &[], b"SECRETMETA1");
    // Literals without indexing named by dynamic 62, 63 and 64 (the unseen part).
    let mut b2 = vec![0xbf];
    lit(&mut b2, &[0x0f, 0x2f], b"SECRETMETA2");
    lit(&mut b2, &[0x0f, 0x30], b"svc-two");
    lit(&mut b2, &[0x0f, 0x31], b"SECRETUNSEEN");
    let mut wire = frame(0x1, 0x4, 7, &b1);
    wire.extend(frame(0x1, 0x4, 9, &b2));
    for pieces in [vec![(0, &wire[..])], {
        let at = frame(0x1, 0x4, 7, &b1).len();
        vec![(0, &wire[..at]), (at as u64, &wire[at..])]
    }] {
        let out = redact_pieces(&pieces).concat();
        assert_clean(&out, &[], "older than capture");
        assert!(
            contains(&out, b"svc-two"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        assert!(contains(&out, b"svc"));
    }
}

#[test]
fn http2_every_split_and_drop_keeps_no_secret() {
    every_split(&h2_wire(), &[HUFF_CUSTOM_VALUE.to_vec()], 7);
}

#[test]
fn http2_huffman_path_keeps_its_path_not_its_query() {
    // A Huffman-coded :path without a query (RFC 7541 C.4.1's "www.example.com") is kept as sent.
    let mut block = vec![0x82, 0x86];
    block.push(0x04);
    block.push(0x80 | 12);
    block.extend_from_slice(&[
        0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
    ]);
    let mut w = h2::PREFACE.to_vec();
    w.extend(frame(0x1, 0x5, 1, &block));
    let out = redact_pieces(&[(0, &w)]).concat();
    assert_eq!(out, w, "a :path without a query is kept as sent");
}

/// Found by the `redact` fuzz target: after a loss, a record of DATA payload that happened to
/// read as a zero-length frame resynchronised the stream and kept its "frame header" bytes.
#[test]
fn body_bytes_after_a_loss_do_not_pass_for_frames() {
    let mut r = Redactor::new();
    let wire = h2_wire();
    let _ = r.redact_payload_at(&ev(&wire[..40], 40), Some(0));
    let body = b"\x00\x00\x00\x00\x0bSECRETBODY";
    let (out, _) = r.redact_payload_at(&ev(body, body.len() as u64), Some(1000));
    assert!(
        !contains(&out, b"SECR") && !contains(&out, b"BODY"),
        "{out:02x?}"
    );
}

/// Go's net/http reads a keep-alive connection's next request one byte first: a record cut
/// inside the method (or `HTTP/1.`) redacts as the whole message would, so a replay parses the
/// same request the live run did; a held prefix that no message follows masks what comes.
#[test]
fn a_message_start_cut_inside_its_first_token_redacts_as_whole() {
    let whole = redact_pieces(&[(0, H1)]).concat();
    for cut in 1..6 {
        let out = redact_pieces(&[(0, &H1[..cut]), (cut as u64, &H1[cut..])]).concat();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&whole),
            "cut at {cut}"
        );
    }
    let resp: &[u8] =
        b"HTTP/1.1 502 Bad Gateway\r\nSet-Cookie: SECRETCOOKIE\r\nContent-Length: 4\r\n\r\nSECR";
    let whole = redact_pieces(&[(0, resp)]).concat();
    let out = redact_pieces(&[(0, &resp[..3]), (3, &resp[3..])]).concat();
    assert_eq!(out, whole);
    assert_clean(&out, &[], "status line cut at 3");
    // "G", then bytes that make no method: masked.
    let out = redact_pieces(&[(0, b"G"), (1, b"ARBAGE SECRETDATA\r\n")]).concat();
    assert_clean(&out, &[], "a prefix nothing followed");
}

/// The per-byte request-line masking the redactor had before it jumped with memchr, kept as
/// the reference the faster one must equal, piece by piece.
fn first_line_per_byte(line: &mut [u8], mut spaces: u8, mut query: bool) -> (u8, bool, bool) {
    let mut masked = false;
    for c in line.iter_mut() {
        match *c {
            b' ' => {
                query = false;
                spaces = spaces.saturating_add(1);
            }
            b'\r' => {}
            b'?' if spaces == 1 && !query => query = true,
            _ if query => {
                *c = b'*';
                masked = true;
            }
            _ => {}
        }
    }
    (spaces, query, masked)
}

#[test]
fn request_line_masking_equals_the_per_byte_rules() {
    let alphabet = b"GET /a?b=1& ?\r\nxHTTP/1.1";
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 24) as usize;
        let line: Vec<u8> = (0..len)
            .map(|k| alphabet[((seed >> (k % 60)) as usize + k * 7) % alphabet.len()])
            .collect();
        let (spaces, query) = ((seed >> 40) as u8 % 4, seed & (1 << 50) != 0);
        let mut want = line.clone();
        let (w_spaces, w_query, w_masked) = first_line_per_byte(&mut want, spaces, query);
        let mut got = line.clone();
        let mut info = super::HeadInfo::default();
        let mut at = super::Line::Start;
        let mut red = super::Redacted::default();
        let n = got.len();
        // Not a status line: first_line's HTTP/1. rule applies to spaces 0 only, skip those.
        if spaces == 0 && !query && line.starts_with(b"HTTP/1.") {
            continue;
        }
        super::h1::first_line(&mut got, 0, n, spaces, query, &mut info, &mut at, &mut red);
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&line));
        assert_eq!(
            at,
            super::Line::First {
                spaces: w_spaces,
                query: w_query
            }
        );
        assert_eq!(red.headers, u64::from(w_masked));
    }
}

#[test]
fn name_tables_equal_the_lists() {
    for c in 0..=255u8 {
        let old = c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
        assert_eq!(super::is_tchar(c), old, "{c}");
    }
    let keep_by_lists = |name: &[u8]| {
        let is = |list: &[&str]| list.iter().any(|k| k.as_bytes().eq_ignore_ascii_case(name));
        !is(super::SECRET_HEADERS)
            && !is(super::PRESENCE_ONLY)
            && (is(super::KEEP_HEADERS) || is(super::KEEP_PSEUDO))
    };
    let mut names: Vec<String> = [
        super::KEEP_HEADERS,
        super::KEEP_PSEUDO,
        super::SECRET_HEADERS,
        super::PRESENCE_ONLY,
    ]
    .iter()
    .flat_map(|l| l.iter())
    .flat_map(|n| {
        [
            n.to_string(),
            n.to_uppercase(),
            format!("{n}x"),
            n[1..].to_string(),
        ]
    })
    .collect();
    names.extend(
        [
            "",
            "x-api-key",
            "user-agent",
            ":path",
            &"a".repeat(64),
            &"a".repeat(300),
        ]
        .map(String::from),
    );
    for n in &names {
        assert_eq!(
            super::keep_value(n.as_bytes()),
            keep_by_lists(n.as_bytes()),
            "{n}"
        );
    }
}

/// A request body's run is led by its digest (equal bodies, equal digests: a dump shows which
/// requests were the same); a response body is only masked, every byte a dot.
#[test]
fn request_bodies_keep_a_digest_and_response_bodies_are_dots() {
    let body = b"card=SECRETBODY1234";
    let on = |role, direction, head: &[u8]| {
        let mut p = head.to_vec();
        p.extend_from_slice(body);
        let mut e = ev(&p, p.len() as u64);
        (e.role, e.direction) = (role, direction);
        let (out, red) = Redactor::new().redact_payload(&e);
        assert_eq!(red.body_bytes, body.len() as u64);
        out.get(head.len()..)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    };
    let req = b"POST /pay HTTP/1.1\r\nContent-Length: 19\r\n\r\n";
    let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n";
    for (role, dir) in [
        (Role::Client, Direction::Egress),
        (Role::Server, Direction::Ingress),
        (Role::Unknown, Direction::Egress),
    ] {
        let out = on(role, dir, req);
        let (digest, dots) = out.split_at(16);
        assert!(
            digest.iter().all(u8::is_ascii_hexdigit),
            "{role:?} {dir:?}: {out:?}"
        );
        assert!(dots.iter().all(|&c| c == b'.'));
        assert_eq!(out, on(role, dir, req), "the same body, the same digest");
    }
    for (role, dir) in [
        (Role::Client, Direction::Ingress),
        (Role::Server, Direction::Egress),
    ] {
        assert_eq!(
            on(role, dir, resp),
            vec![b'.'; body.len()],
            "{role:?} {dir:?}"
        );
    }
}

/// A kernel summary's request redacts as the same record would on a fresh connection, and a
/// whole one leaves nothing tracked; one that ends inside its body leaves its connection in
/// that body, so the rest (sent later, as data) is masked as body, not read as a new head.
#[test]
fn a_summary_request_redacts_as_a_whole_record_would() {
    let mut r = Redactor::new();
    let get =
        b"GET /a?token=SECRETQUERY1 HTTP/1.1\r\nHost: shop\r\nCookie: sid=SECRETCOOKIE\r\n\r\n";
    for (wire, tracked_after) in [(get.as_slice(), 0), (H1, 0), (&H1[..H1.len() - 8], 1)] {
        let d = ev(wire, wire.len() as u64);
        let mut buf = wire.to_vec();
        let red = r.redact_summary_request(&d, &mut buf);
        let (want, want_red) = Redactor::new().redact_payload(&d);
        assert_eq!(buf, want.to_vec());
        assert_eq!(
            (red.headers, red.body_bytes, red.dots_at_end),
            (want_red.headers, want_red.body_bytes, want_red.dots_at_end)
        );
        assert_clean(&buf, &[], "summary request");
        assert_eq!(r.tracked(), tracked_after);
    }
    // The body's last 8 bytes follow as data: body, digested and masked.
    let rest = &H1[H1.len() - 8..];
    let (out, red) = r.redact_payload(&ev(rest, rest.len() as u64));
    assert_eq!(red.body_bytes, 8);
    assert!(
        !contains(&out, b"1234"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
}
