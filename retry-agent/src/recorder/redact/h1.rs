//! HTTP/1 heads: the request or status line (path kept, query masked) and header lines (names
//! kept, values masked unless allow-listed), across records cut anywhere.
use super::{H2, HeadInfo, Line, Redacted, Stream, is_tchar, keep_value, mask_value};

/// Process head bytes from `i`; returns the next index.
pub(super) fn head_bytes(st: &mut Stream, b: &mut [u8], mut i: usize, red: &mut Redacted) -> usize {
    let Stream::Head {
        line,
        info,
        trailers,
    } = st
    else {
        return i;
    };
    let n = b.len();
    while i < n {
        let line_end = b
            .get(i..)
            .and_then(|r| memchr::memchr(b'\n', r))
            .map(|p| i + p);
        let end = line_end.unwrap_or(n);
        match *line {
            Line::First { spaces, query } => {
                first_line(b, i, end, spaces, query, info, line, red);
                if line_end.is_some() {
                    *line = Line::Start;
                }
            }
            Line::Keep | Line::Mask => {
                // Continuation of a line cut at the previous record.
                if *line == Line::Mask {
                    mask_value(b, i, end);
                }
                if line_end.is_some() {
                    *line = Line::Start;
                }
            }
            Line::Start => {
                let l = b.get(i..end).unwrap_or_default();
                if l == b"\r" || l.is_empty() && line_end.is_some() {
                    // End of head.
                    let done = i + l.len() + 1;
                    let info = std::mem::take(info);
                    // A head with a line that was not a header is not trusted for framing.
                    *st = if info.bad || *trailers || info.no_body {
                        Stream::Start
                    } else if info.h2_upgrade {
                        Stream::H2(Box::new(H2::new(false, true)))
                    } else if info.chunked {
                        Stream::ChunkSize
                    } else {
                        match info.content_length {
                            Some(len) if len > 0 => Stream::Body { remaining: len },
                            _ => Stream::Start,
                        }
                    };
                    return done.min(n);
                }
                let colon = memchr::memchr(b':', l);
                let name = colon.and_then(|c| l.get(..c)).unwrap_or(l);
                let valid_name = !name.is_empty() && name.iter().all(|&c| is_tchar(c));
                match colon {
                    Some(colon) if valid_name => {
                        let value_at = i + colon + 1;
                        let value = b.get(value_at..end).unwrap_or_default();
                        if name.eq_ignore_ascii_case(b"content-length") {
                            info.content_length = std::str::from_utf8(value)
                                .ok()
                                .and_then(|v| v.trim().parse().ok());
                        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                            info.chunked =
                                value.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"));
                        }
                        let keep = keep_value(name);
                        if !keep {
                            red.headers += 1;
                            mask_value(b, value_at, end);
                        }
                        if line_end.is_none() {
                            *line = if keep { Line::Keep } else { Line::Mask };
                        }
                    }
                    None if line_end.is_none() && valid_name => {
                        // Name cut by the end of the record: mask the rest of the line, whatever it is.
                        *line = Line::Mask;
                    }
                    _ => {
                        // Not `name: value` (a folded line, body bytes read as a head after a
                        // loss): masked, and the head is not trusted for framing.
                        red.headers += 1;
                        mask_value(b, i, end);
                        info.bad = true;
                        if line_end.is_none() {
                            *line = Line::Mask;
                        }
                    }
                }
            }
        }
        match line_end {
            Some(le) => i = le + 1,
            None => return n,
        }
    }
    i
}

/// The request line or status line, possibly in pieces: the query is masked wherever the cut.
#[expect(
    clippy::too_many_arguments,
    reason = "one line's state, passed apart to satisfy the borrow checker"
)]
pub(super) fn first_line(
    b: &mut [u8],
    from: usize,
    to: usize,
    mut spaces: u8,
    mut query: bool,
    info: &mut HeadInfo,
    line: &mut Line,
    red: &mut Redacted,
) {
    if spaces == 0 && !query && b.get(from..to).is_some_and(|l| l.starts_with(b"HTTP/1.")) {
        let code = b
            .get(from + 9..from + 12)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u16>().ok());
        info.no_body = code.is_some_and(|c| (100..200).contains(&c) || c == 204 || c == 304);
        info.h2_upgrade = code == Some(101);
        // A status line has no query: the `?` rule below never fires past the reason phrase's
        // start because a status line is marked as having passed its target.
        spaces = 2;
    }
    let mut masked = false;
    // Byte rules: a space ends a query and counts; `\r` is left alone; the first `?` after the
    // first space starts the query; inside it every other byte is masked. Applied run by run:
    // memchr finds the next byte that changes the state.
    let text = b.get_mut(from..to).unwrap_or_default();
    let mut i = 0;
    while i < text.len() {
        let rest = text.get_mut(i..).unwrap_or_default();
        if query {
            let run = memchr::memchr(b' ', rest).unwrap_or(rest.len());
            for c in rest.get_mut(..run).unwrap_or_default() {
                if *c != b'\r' {
                    *c = b'*';
                    masked = true;
                }
            }
            if run == rest.len() {
                break;
            }
            // The space that ends the query.
            query = false;
            spaces = spaces.saturating_add(1);
            i += run + 1;
            continue;
        }
        let next = if spaces == 1 {
            memchr::memchr2(b' ', b'?', rest)
        } else {
            memchr::memchr(b' ', rest)
        };
        let Some(p) = next else { break };
        if rest.get(p) == Some(&b' ') {
            query = false;
            spaces = spaces.saturating_add(1);
        } else {
            query = true;
        }
        i += p + 1;
    }
    if masked {
        red.headers += 1;
    }
    *line = Line::First { spaces, query };
}
