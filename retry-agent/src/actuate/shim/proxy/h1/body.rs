//! Where an HTTP/1 message body ends (RFC 9112 §6): by its length, by its chunks, or at the
//! close. The relay passes the bytes on as they are and only needs to know where the next
//! message starts, and the body's data for the request key's digest.

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (a request without a length, a HEAD's or a 204/304 response).
    None,
    Length(u64),
    Chunked(Chunked),
    /// A response without a length: it ends when the callee closes.
    UntilClose,
}

/// Where a chunked body's walk is (RFC 9112 §7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunked {
    /// Reading the chunk size's hex digits (the value so far, whether any digit came).
    Size(u64, bool),
    /// Past the size: extensions, up to the line's end.
    Ext(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk, at the start of a trailer line (an empty one ends the body).
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
}

impl Chunked {
    pub fn start() -> Chunked {
        Chunked::Size(0, false)
    }
}

/// A body that does not frame as HTTP/1 says.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunked body")]
pub struct Malformed;

/// The walk over the next bytes of a body.
#[derive(Debug, PartialEq, Eq)]
pub struct Step {
    /// Bytes of `data` that belong to this body.
    pub used: usize,
    /// The body ended within them.
    pub ended: bool,
}

impl Framing {
    /// Walks `data` (what follows the bytes walked before), calling `each` with the body's own
    /// data (not chunk sizes or trailers). `Framing::None` ends at once.
    pub fn walk(&mut self, data: &[u8], mut each: impl FnMut(&[u8])) -> Result<Step, Malformed> {
        match self {
            Framing::None => Ok(Step {
                used: 0,
                ended: true,
            }),
            Framing::Length(left) => {
                let take = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                each(&data[..take]);
                *left -= take as u64;
                Ok(Step {
                    used: take,
                    ended: *left == 0,
                })
            }
            Framing::UntilClose => {
                each(data);
                Ok(Step {
                    used: data.len(),
                    ended: false,
                })
            }
            Framing::Chunked(c) => walk_chunked(c, data, each),
        }
    }
}

fn walk_chunked(
    c: &mut Chunked,
    data: &[u8],
    mut each: impl FnMut(&[u8]),
) -> Result<Step, Malformed> {
    let mut at = 0;
    while at < data.len() {
        if let Chunked::Data(left) = c {
            let take = usize::try_from(*left)
                .unwrap_or(usize::MAX)
                .min(data.len() - at);
            each(&data[at..at + take]);
            at += take;
            *left -= take as u64;
            if *left == 0 {
                *c = Chunked::DataCr;
            }
            continue;
        }
        let b = data[at];
        at += 1;
        *c = match (*c, b) {
            (Chunked::Size(n, _), b) if b.is_ascii_hexdigit() => {
                let d = u64::from((b as char).to_digit(16).ok_or(Malformed)?);
                Chunked::Size(
                    n.checked_mul(16)
                        .and_then(|n| n.checked_add(d))
                        .ok_or(Malformed)?,
                    true,
                )
            }
            (Chunked::Size(n, true), b';' | b' ' | b'\t') => Chunked::Ext(n),
            (Chunked::Size(n, true), b'\r') | (Chunked::Ext(n), b'\r') => Chunked::SizeLf(n),
            (Chunked::Ext(n), b'\n')
            | (Chunked::Size(n, true), b'\n')
            | (Chunked::SizeLf(n), b'\n') => {
                if n == 0 {
                    Chunked::TrailerStart
                } else {
                    Chunked::Data(n)
                }
            }
            (Chunked::Ext(n), _) => Chunked::Ext(n),
            (Chunked::DataCr, b'\r') => Chunked::DataLf,
            (Chunked::DataCr | Chunked::DataLf, b'\n') => Chunked::start(),
            (Chunked::TrailerStart, b'\r') => Chunked::EndLf,
            (Chunked::TrailerStart | Chunked::EndLf, b'\n') => {
                *c = Chunked::start();
                return Ok(Step {
                    used: at,
                    ended: true,
                });
            }
            (Chunked::Trailer, b'\r') => Chunked::TrailerLf,
            (Chunked::TrailerLf | Chunked::Trailer, b'\n') => Chunked::TrailerStart,
            (Chunked::TrailerStart | Chunked::Trailer, _) => Chunked::Trailer,
            _ => return Err(Malformed),
        };
    }
    Ok(Step {
        used: at,
        ended: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks `body` in pieces of `n` bytes: (bytes used, ended, data seen).
    fn walk(mut f: Framing, body: &[u8], n: usize) -> Result<(usize, bool, Vec<u8>), Malformed> {
        let mut seen = Vec::new();
        let mut used = 0;
        for piece in body.chunks(n) {
            let s = f.walk(piece, |d| seen.extend_from_slice(d))?;
            used += s.used;
            if s.ended {
                return Ok((used, true, seen));
            }
        }
        Ok((used, false, seen))
    }

    #[test]
    fn chunks_end_where_the_last_one_and_its_trailers_do() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-t: 1\r\n\r\nGET /next";
        let end = body.len() - b"GET /next".len();
        for n in [1, 2, 3, 7, body.len()] {
            assert_eq!(
                walk(Framing::Chunked(Chunked::start()), body, n),
                Ok((end, true, b"hello world".to_vec())),
                "pieces of {n}"
            );
        }
        assert_eq!(
            walk(Framing::Chunked(Chunked::start()), b"0\r\n\r\n", 1),
            Ok((5, true, vec![]))
        );
        assert_eq!(
            walk(
                Framing::Chunked(Chunked::start()),
                b"A\r\n0123456789\r\n0\r\n\r\n",
                4
            ),
            Ok((20, true, b"0123456789".to_vec()))
        );
    }

    #[test]
    fn a_length_ends_the_body_and_no_framing_ends_at_once() {
        assert_eq!(
            walk(Framing::Length(3), b"abcdef", 2),
            Ok((3, true, b"abc".to_vec()))
        );
        assert_eq!(
            walk(Framing::Length(9), b"abc", 2),
            Ok((3, false, b"abc".to_vec()))
        );
        assert_eq!(
            Framing::None.walk(b"abc", |_| {}),
            Ok(Step {
                used: 0,
                ended: true
            })
        );
        assert_eq!(
            walk(Framing::UntilClose, b"abc", 2),
            Ok((3, false, b"abc".to_vec()))
        );
    }

    #[test]
    fn bad_chunks_are_errors() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloXX",
            b"ffffffffffffffffff\r\n",
        ] {
            assert_eq!(
                walk(Framing::Chunked(Chunked::start()), bad, 1).map(|_| ()),
                Err(Malformed),
                "{bad:?}"
            );
        }
    }
}
