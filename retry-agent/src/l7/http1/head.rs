//! HTTP/1 message heads: where a head ends, whether bytes start a message, and the request and
//! response heads read into what the exchange keeps and how the body is framed.
use super::{Framing, Side};
use crate::l7::{
    exchange::Method,
    msg::{
        NameLengths, ReqInfo, RespInfo, apply_request_header, apply_response_header, parse_method,
        path_string,
    },
    util::{
        MAX_AUTHORITY, authority_of_target, bounded_string, has_token, parse_u64, path_of_target,
        query_hash_of_target,
    },
};
/// End of a head (index after the blank line), searching from `from`. Bare LF line ends are
/// accepted, as most servers do.
pub(crate) fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(off) = buf.get(i..).and_then(|s| memchr::memchr(b'\n', s)) {
        let nl = i + off;
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

/// Whether bytes at a syscall boundary begin a message of this side: a request line (method
/// token, space, target) or a status line.
pub(crate) fn looks_like_start(side: Side, b: &[u8]) -> bool {
    match side {
        Side::Response => b.starts_with(b"HTTP/1."),
        Side::Request => {
            let m = b
                .iter()
                .take_while(|c| c.is_ascii_uppercase() || **c == b'-' || **c == b'_')
                .count();
            (1..=16).contains(&m)
                && b.get(m) == Some(&b' ')
                && b.get(m + 1)
                    .is_some_and(|&c| c == b'/' || c == b'*' || c.is_ascii_alphanumeric())
        }
    }
}

/// Whether `b` could still grow into a request line (all method-token characters so far).
pub(crate) fn could_start_request(b: &[u8]) -> bool {
    let token = b.strip_suffix(b" ").unwrap_or(b);
    token.len() <= 16
        && token
            .iter()
            .all(|c| c.is_ascii_uppercase() || *c == b'-' || *c == b'_')
}

/// Lines of a head without line ends; with `complete` false the last, unterminated line is
/// dropped.
fn head_lines(head: &[u8], complete: bool) -> HeadLines<'_> {
    let usable = if complete {
        head
    } else {
        match memchr::memrchr(b'\n', head) {
            Some(i) => head.get(..=i).unwrap_or_default(),
            None => &[],
        }
    };
    HeadLines {
        rest: usable,
        done: false,
    }
}

/// The lines of a head up to the first empty one (`split(b'\n')` then `take_while` non-empty,
/// with memchr finding the line ends: heads are most of what the HTTP/1 parser reads).
struct HeadLines<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> Iterator for HeadLines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.done {
            return None;
        }
        let line = match memchr::memchr(b'\n', self.rest) {
            Some(nl) => {
                let (line, rest) = self.rest.split_at(nl);
                self.rest = rest.get(1..).unwrap_or_default();
                line
            }
            None => {
                self.done = true;
                std::mem::take(&mut self.rest)
            }
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.done = true;
            return None;
        }
        Some(line)
    }
}

fn split_header(line: &[u8]) -> Option<(&[u8], &[u8])> {
    // obs-fold continuation lines are ignored (deprecated; never carries what we read).
    if line.first().is_some_and(|c| *c == b' ' || *c == b'\t') {
        return None;
    }
    let colon = memchr::memchr(b':', line)?;
    let (name, value) = line.split_at(colon);
    Some((
        name.trim_ascii(),
        value.get(1..).unwrap_or_default().trim_ascii(),
    ))
}

#[derive(Default)]
struct BodyHeaders {
    content_length: Option<u64>,
    bad_length: bool,
    chunked: bool,
    upgrade: bool,
}

/// The names [`BodyHeaders::apply`] reads.
const BODY_NAMES: NameLengths =
    NameLengths::of(&[b"content-length", b"transfer-encoding", b"connection"]);

impl BodyHeaders {
    fn apply(&mut self, name: &[u8], value: &[u8]) {
        if !BODY_NAMES.may_hold(name) {
            return;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            match (parse_u64(value), self.content_length) {
                (Some(n), None) => self.content_length = Some(n),
                (Some(n), Some(m)) if n == m => {}
                _ => self.bad_length = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Chunked is framing only when it is the final coding.
            let last = value
                .rsplit(|&c| c == b',')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            self.chunked = last.eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") && has_token(value, b"upgrade") {
            self.upgrade = true;
        }
    }

    /// RFC 9112 §6.3: chunked wins over Content-Length; a request with neither has no body; a
    /// response with neither runs to the close.
    fn framing(&self, side: Side) -> Option<Framing> {
        if self.chunked {
            return Some(Framing::Chunked);
        }
        if self.bad_length {
            return None;
        }
        Some(match (self.content_length, side) {
            (Some(n), _) => Framing::Length(n),
            (None, Side::Request) => Framing::Length(0),
            (None, Side::Response) => Framing::UntilClose,
        })
    }
}

/// Request line and headers. `None` when the request line is not HTTP/1.
pub(super) fn parse_request_head(head: &[u8], complete: bool) -> Option<(ReqInfo, Framing, bool)> {
    let mut lines = head_lines(head, complete);
    let first = lines.next();
    let mut req = ReqInfo {
        unknown: !complete,
        ..Default::default()
    };
    let Some(first) = first else {
        // Not even the request line was captured: a request, fields unknown.
        if !complete && looks_like_start(Side::Request, head) {
            req.method = head.split(|&c| c == b' ').next().map(parse_method);
            return Some((req, Framing::Length(0), false));
        }
        return None;
    };
    let mut parts = first.split(|&c| c == b' ').filter(|p| !p.is_empty());
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with(b"HTTP/1.") || !could_start_request(method) {
        return None;
    }
    req.method = Some(parse_method(method));
    req.path = Some(path_string(path_of_target(target)));
    req.query_hash = query_hash_of_target(target);
    if let Some(a) = authority_of_target(target) {
        req.authority = Some(bounded_string(a, MAX_AUTHORITY));
    }
    let mut body = BodyHeaders::default();
    let mut expect = false;
    for line in lines {
        let Some((name, value)) = split_header(line) else {
            continue;
        };
        body.apply(name, value);
        if name.eq_ignore_ascii_case(b"expect") && value.eq_ignore_ascii_case(b"100-continue") {
            expect = true;
        }
        apply_request_header(&mut req, name, value);
    }
    let mut framing = body.framing(Side::Request)?;
    if req.method == Some(Method::Connect) {
        framing = Framing::Length(0);
    }
    Some((req, framing, expect && framing != Framing::Length(0)))
}

/// Status line and headers: the response, its status, its own framing.
pub(super) fn parse_response_head(head: &[u8], complete: bool) -> Option<(RespInfo, u16, Framing)> {
    let mut lines = head_lines(head, complete);
    let first = lines.next()?;
    let rest = first.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let status = code
        .iter()
        .fold(0u16, |acc, &c| acc * 10 + u16::from(c - b'0'));
    let mut resp = RespInfo {
        unknown: !complete,
        ..Default::default()
    };
    resp.signals.status = Some(status);
    let mut body = BodyHeaders::default();
    for line in lines {
        let Some((name, value)) = split_header(line) else {
            continue;
        };
        body.apply(name, value);
        apply_response_header(&mut resp, name, value);
    }
    let framing = body.framing(Side::Response)?;
    let _ = body.upgrade;
    Some((resp, status, framing))
}
