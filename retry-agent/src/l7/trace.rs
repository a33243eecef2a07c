//! Propagated trace context: the trace id a request carries in `traceparent` (W3C), `b3`,
//! `x-b3-traceid`, `uber-trace-id` or `x-request-id`, kept as a hash only (never the value).
//! Services that forward it to their outbound calls let the engine tie a call to the inbound
//! request it was made for, whatever thread or event-loop turn did the I/O.
use super::util::{Domain, domain_hasher};

/// Which header gave the trace id; a lower rank wins when a request carries several, so the
/// same request hashes the same whatever order its headers came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TraceSource {
    TraceParent,
    B3,
    B3TraceId,
    Uber,
    RequestId,
}

/// Longest `x-request-id` kept (longer ones are not ids but payloads).
const MAX_REQUEST_ID: usize = 128;

/// The lengths of the names [`trace_of_header`] reads (a filter before comparing names).
pub(crate) const TRACE_NAMES: super::msg::NameLengths = super::msg::NameLengths::of(&[
    b"traceparent",
    b"b3",
    b"x-b3-traceid",
    b"uber-trace-id",
    b"x-request-id",
]);

/// The trace id in one request header, if the header is one of ours and well formed.
pub(crate) fn trace_of_header(name: &[u8], value: &[u8]) -> Option<(TraceSource, u64)> {
    let v = value.trim_ascii();
    if name.eq_ignore_ascii_case(b"traceparent") {
        traceparent(v).map(|h| (TraceSource::TraceParent, h))
    } else if name.eq_ignore_ascii_case(b"b3") {
        // `{trace}-{span}[-{sampled}[-{parent}]]`; a bare sampling flag carries no trace id.
        let mut f = v.split(|&b| b == b'-');
        let trace = f.next()?;
        f.next()?;
        hex_trace_id(trace).map(|h| (TraceSource::B3, h))
    } else if name.eq_ignore_ascii_case(b"x-b3-traceid") {
        hex_trace_id(v).map(|h| (TraceSource::B3TraceId, h))
    } else if name.eq_ignore_ascii_case(b"uber-trace-id") {
        // `{trace}:{span}:{parent}:{flags}`, sometimes URL-encoded (`%3A`).
        let end = v.iter().position(|&b| b == b':' || b == b'%')?;
        hex_trace_id(v.get(..end)?).map(|h| (TraceSource::Uber, h))
    } else if name.eq_ignore_ascii_case(b"x-request-id") {
        let ok = !v.is_empty() && v.len() <= MAX_REQUEST_ID && v.iter().all(u8::is_ascii_graphic);
        ok.then(|| {
            let mut h = domain_hasher(Domain::Trace);
            h.write(b"x-request-id\0");
            h.write(v);
            (TraceSource::RequestId, h.finish())
        })
    } else {
        None
    }
}

/// The trace id of a request's headers, by the same rank as the reassembler's (so the shim and
/// the engine call the same requests the same).
pub fn trace_of_headers<'a>(
    headers: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Option<u64> {
    headers
        .into_iter()
        .filter(|(n, _)| TRACE_NAMES.may_hold(n))
        .filter_map(|(n, v)| trace_of_header(n, v))
        .min_by_key(|t| t.0)
        .map(|t| t.1)
}

/// `{version:2}-{trace:32}-{parent:16}-{flags:2}` (version ff is invalid; a later version may
/// append fields after a `-`, the first four keep their places). Read at fixed offsets: a
/// split on `-` and a check per field was a tenth of gRPC reassembly when every call carried
/// one.
fn traceparent(v: &[u8]) -> Option<u64> {
    let (head, more) = (v.get(..55)?, v.get(55..).unwrap_or_default());
    let dash = |i: usize| head.get(i) == Some(&b'-');
    if !(dash(2) && dash(35) && dash(52)) {
        return None;
    }
    let (version, parent, flags) = (head.get(..2)?, head.get(36..52)?, head.get(53..55)?);
    if !all_hex(version)
        || version.eq_ignore_ascii_case(b"ff")
        || !all_hex(parent)
        || !all_hex(flags)
    {
        return None;
    }
    if !more.is_empty() && (version == b"00" || more.first() != Some(&b'-')) {
        return None;
    }
    hex_trace_id(head.get(3..35)?)
}

fn all_hex(s: &[u8]) -> bool {
    s.iter().fold(true, |ok, &c| ok & hex_lower(c, c | 0x20))
}

/// Whether `c` is a hex digit, given `l = c | 0x20` (a digit, or a letter in lower case).
fn hex_lower(c: u8, l: u8) -> bool {
    c.wrapping_sub(b'0') < 10 || l.wrapping_sub(b'a') < 6
}

/// A hex trace id of up to 32 digits, not all zero, hashed in one form for every header: lower
/// case, left-padded to 128 bits (how OpenTelemetry widens a 64-bit B3 or Jaeger id), so a
/// service that receives `b3` and sends `traceparent` still matches.
fn hex_trace_id(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 32 {
        return None;
    }
    // The padded, lower-cased form built in place and hashed in one write (byte-sized writes
    // were a fifth of the gRPC reassembly's time when every call carried a traceparent).
    let mut id = [b'0'; 32];
    let (mut bad, mut nonzero) = (0u8, 0u8);
    for (d, &c) in id[32 - s.len()..].iter_mut().zip(s) {
        // `| 0x20` lower-cases a letter and leaves a digit alone: one form for both, and no
        // branch per byte, so the loop vectorises.
        let l = c | 0x20;
        bad |= u8::from(!hex_lower(c, l));
        nonzero |= c ^ b'0';
        *d = l;
    }
    if bad != 0 || nonzero == 0 {
        return None;
    }
    let mut h = domain_hasher(Domain::Trace);
    h.write(b"trace-id\0");
    h.write(&id);
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l7::util::digest_key;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn id(name: &str, value: &str) -> Option<u64> {
        trace_of_header(name.as_bytes(), value.as_bytes()).map(|(_, h)| h)
    }

    /// The branch-free test agrees with the standard library's on every byte.
    #[test]
    fn hex_test_agrees_with_std_on_every_byte() {
        for c in 0..=u8::MAX {
            assert_eq!(hex_lower(c, c | 0x20), c.is_ascii_hexdigit(), "{c:#x}");
            if c.is_ascii_hexdigit() {
                assert_eq!(c | 0x20, c.to_ascii_lowercase());
            }
        }
    }

    /// The id is the keyed digest of `trace-id\0` and the 32 padded lower-case digits, however
    /// they are fed (dumps and live runs of other versions compare equal).
    #[test]
    fn the_id_is_the_digest_of_the_padded_form() {
        let mut h = digest_key().hasher(Domain::Trace);
        h.write(b"trace-id\0");
        for b in b"00000000000000000af7651916cd43dd" {
            h.write(&[*b]);
        }
        assert_eq!(hex_trace_id(b"0AF7651916CD43DD"), Some(h.finish()));
        assert_eq!(hex_trace_id(b"0000"), None);
        assert_eq!(hex_trace_id(b"0g"), None);
        assert_eq!(hex_trace_id(&[b'a'; 33]), None);
    }

    #[test]
    fn every_form_gives_the_same_id_for_the_same_trace() {
        let tp = trace_of_header(b"traceparent", TP.as_bytes());
        assert_eq!(tp.map(|t| t.0), Some(TraceSource::TraceParent));
        let tp = tp.map(|t| t.1);
        assert!(tp.is_some());
        assert_eq!(
            id(
                "TraceParent",
                " 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01 "
            ),
            tp
        );
        assert_eq!(
            id("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1"),
            tp
        );
        assert_eq!(
            id("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"),
            tp
        );
        assert_eq!(id("X-B3-TraceId", "4bf92f3577b34da6a3ce929d0e0e4736"), tp);
        assert_eq!(
            id(
                "uber-trace-id",
                "4bf92f3577b34da6a3ce929d0e0e4736:00f067aa0ba902b7:0:1"
            ),
            tp
        );
        assert_eq!(
            id(
                "uber-trace-id",
                "4bf92f3577b34da6a3ce929d0e0e4736%3A00f067aa0ba902b7%3A0%3A1"
            ),
            tp
        );
        // 64-bit ids widen like OpenTelemetry widens them; Jaeger drops leading zeros.
        let short = id("x-b3-traceid", "a3ce929d0e0e4736");
        assert!(short.is_some());
        assert_eq!(
            id(
                "traceparent",
                "00-0000000000000000a3ce929d0e0e4736-00f067aa0ba902b7-01"
            ),
            short
        );
        assert_eq!(id("uber-trace-id", "a3ce929d0e0e4736:1:0:1"), short);
        assert_eq!(id("uber-trace-id", "00a3ce929d0e0e4736:1:0:1"), short);
        assert_ne!(short, tp);
    }

    /// A later version may append fields after a `-`; the first four keep their places.
    #[test]
    fn a_later_version_may_append_fields() {
        let tp = id("traceparent", TP);
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(id("traceparent", later), tp);
        assert_eq!(id("traceparent", &format!("{later}-what-next")), tp);
        assert_eq!(id("traceparent", &format!("{later}x")), None);
        assert_eq!(
            id("traceparent", &format!("{TP}-")),
            None,
            "version 00 has four"
        );
        assert_eq!(id("traceparent", &TP[..54]), None);
        assert_eq!(id("traceparent", &TP.replacen('-', "_", 1)), None);
    }

    #[test]
    fn different_traces_and_request_ids_differ() {
        let other = id(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01",
        );
        assert!(other.is_some());
        assert_ne!(other, id("traceparent", TP));
        let r1 = trace_of_header(b"x-request-id", b"f81d4fae-7dec-11d0-a765-00a0c91e6bf6");
        assert_eq!(r1.map(|t| t.0), Some(TraceSource::RequestId));
        assert!(r1.is_some());
        assert_ne!(
            r1.map(|t| t.1),
            id("x-request-id", "f81d4fae-7dec-11d0-a765-00a0c91e6bf7")
        );
        // The same digits as a request id and as a trace id are different ids.
        assert_ne!(
            id("x-request-id", "a3ce929d0e0e4736"),
            id("x-b3-traceid", "a3ce929d0e0e4736")
        );
    }

    #[test]
    fn malformed_values_are_ignored() {
        for (n, v) in [
            ("traceparent", ""),
            (
                "traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            ),
            (
                "traceparent",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            ),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            ),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            ),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
            ),
            ("b3", "1"),
            ("b3", "d"),
            ("b3", "0000000000000000-00f067aa0ba902b7-1"),
            ("x-b3-traceid", "not-hex"),
            ("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e47364bf9"),
            ("uber-trace-id", "4bf92f3577b34da6"),
            ("uber-trace-id", ":1:0:1"),
            ("x-request-id", ""),
            ("x-request-id", "has space"),
            ("x-forwarded-for", "10.0.0.1"),
        ] {
            assert_eq!(
                trace_of_header(n.as_bytes(), v.as_bytes()),
                None,
                "{n}: {v}"
            );
        }
        assert_eq!(
            trace_of_header(b"x-request-id", &[b'a'; MAX_REQUEST_ID + 1]),
            None
        );
        // A later version may append fields.
        assert!(
            id(
                "traceparent",
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-abc"
            )
            .is_some()
        );
    }
}
