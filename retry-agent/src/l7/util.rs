//! Small pure helpers: stable hashing, route templates, lenient header-value parsing.

/// FNV-1a, 64 bit: a fixed function, so body hashes are stable across runs and machines
/// (retry matching compares them between processes and between a live run and a replay).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) const fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// How many leading request-body bytes feed `body_hash`: enough to tell payloads apart, small
/// enough that the hash only ever covers bytes a default capture prefix holds.
pub(crate) const BODY_HASH_LIMIT: usize = 1024;

/// Hash of the first captured bytes of a request body, fed in pieces; stops at the first gap so
/// the result depends only on the bytes, not on the syscall boundaries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyHasher {
    h: Fnv,
    n: usize,
    stopped: bool,
}

impl Default for BodyHasher {
    fn default() -> Self {
        BodyHasher { h: Fnv::new(), n: 0, stopped: false }
    }
}

impl BodyHasher {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if self.stopped || self.n >= BODY_HASH_LIMIT {
            return;
        }
        let take = bytes.len().min(BODY_HASH_LIMIT - self.n);
        if let Some(b) = bytes.get(..take) {
            self.h.write(b);
            self.n += take;
        }
    }
    /// Bytes went by uncaptured: the prefix ends here.
    pub(crate) fn gap(&mut self) {
        self.stopped = true;
    }
    pub(crate) fn finish(&self) -> Option<u64> {
        (self.n > 0).then_some(self.h.finish())
    }
}

/// Longest path kept on an exchange (bytes); longer paths are cut, keeping memory bounded.
pub(crate) const MAX_PATH: usize = 512;
/// Longest authority kept.
pub(crate) const MAX_AUTHORITY: usize = 256;

/// Bytes to a bounded, lossy UTF-8 string.
pub(crate) fn bounded_string(b: &[u8], max: usize) -> String {
    let b = b.get(..b.len().min(max)).unwrap_or_default();
    String::from_utf8_lossy(b).into_owned()
}

/// The target of a request without its query string or fragment. An absolute-form target
/// (`http://host/path`, proxies) yields its path.
pub(crate) fn path_of_target(target: &[u8]) -> &[u8] {
    let mut t = target;
    if let Some(rest) = t.strip_prefix(b"http://").or_else(|| t.strip_prefix(b"https://")) {
        t = match rest.iter().position(|&c| c == b'/') {
            Some(i) => rest.get(i..).unwrap_or(b"/"),
            None => b"/",
        };
    }
    let end = t.iter().position(|&c| c == b'?' || c == b'#').unwrap_or(t.len());
    t.get(..end).unwrap_or(t)
}

/// Hash of a request target's query string (after `?`, before `#`), if it has one. Only the
/// hash is kept: queries carry tokens, and telling `?page=1` from `?page=2` is all we need.
pub(crate) fn query_hash_of_target(target: &[u8]) -> Option<u64> {
    let q = target.iter().position(|&c| c == b'?')?;
    let rest = target.get(q + 1..)?;
    let end = rest.iter().position(|&c| c == b'#').unwrap_or(rest.len());
    let mut h = Fnv::new();
    h.write(rest.get(..end)?);
    Some(h.finish())
}

/// The authority of an absolute-form target, if it is one.
pub(crate) fn authority_of_target(target: &[u8]) -> Option<&[u8]> {
    let rest = target.strip_prefix(b"http://").or_else(|| target.strip_prefix(b"https://"))?;
    let end = rest.iter().position(|&c| c == b'/' || c == b'?').unwrap_or(rest.len());
    rest.get(..end)
}

/// `path` with high-cardinality segments collapsed to `{id}`: all-digit segments, UUIDs, long
/// hex strings, and long tokens mixing letters and digits (opaque ids, base64).
pub fn route_template(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if is_id_segment(seg) {
            out.push_str("{id}");
        } else {
            out.push_str(seg);
        }
    }
    out
}

fn is_id_segment(seg: &str) -> bool {
    let b = seg.as_bytes();
    if b.is_empty() {
        return false;
    }
    if b.iter().all(u8::is_ascii_digit) {
        return true;
    }
    if is_uuid(b) {
        return true;
    }
    if b.len() >= 16 && b.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    // Opaque ids: long, and mixing digits with letters (a word never has 4+ digits).
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    b.len() >= 20
        && digits >= 4
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'=')
}

fn is_uuid(b: &[u8]) -> bool {
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A decimal number in a header value (leading/trailing whitespace allowed).
pub(crate) fn parse_u64(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &c| acc.checked_mul(10)?.checked_add(u64::from(c - b'0')))
}

pub(crate) fn parse_u32(v: &[u8]) -> Option<u32> {
    parse_u64(v).and_then(|n| u32::try_from(n).ok())
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
pub(crate) fn has_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|&c| c == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_templates_collapse_ids_only() {
        let cases = [
            ("/users/123/orders/9", "/users/{id}/orders/{id}"),
            ("/v1/items/550e8400-e29b-41d4-a716-446655440000", "/v1/items/{id}"),
            ("/blobs/deadbeefcafebabe0011", "/blobs/{id}"),
            ("/tokens/aB3dE5fG7hJ9kL1mN3pQ5", "/tokens/{id}"),
            ("/v1/health", "/v1/health"),
            ("/helloworld.Greeter/SayHello", "/helloworld.Greeter/SayHello"),
            ("/", "/"),
            ("/api/v2/", "/api/v2/"),
            ("/cafe", "/cafe"),
        ];
        for (p, want) in cases {
            assert_eq!(route_template(p), want, "{p}");
        }
    }

    #[test]
    fn targets_split_query_and_absolute_form() {
        assert_eq!(path_of_target(b"/a/b?x=1#f"), b"/a/b");
        assert_eq!(path_of_target(b"http://h:80/p?q"), b"/p");
        assert_eq!(path_of_target(b"http://h:80"), b"/");
        assert_eq!(authority_of_target(b"http://h:80/p"), Some(&b"h:80"[..]));
        assert_eq!(authority_of_target(b"/p"), None);
        assert_eq!(path_of_target(b"*"), b"*");
        assert_eq!(query_hash_of_target(b"/a/b"), None);
        assert_eq!(query_hash_of_target(b"/a?x=1#f"), query_hash_of_target(b"/b?x=1"));
        assert_ne!(query_hash_of_target(b"/a?x=1"), query_hash_of_target(b"/a?x=2"));
    }

    #[test]
    fn numbers_parse_strictly() {
        assert_eq!(parse_u64(b" 42 "), Some(42));
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"99999999999999999999"), None);
        assert_eq!(parse_u32(b"4294967296"), None);
        assert!(has_token(b"keep-alive, Upgrade", b"upgrade"));
        assert!(!has_token(b"keep-alive", b"close"));
    }

    #[test]
    fn body_hash_depends_on_bytes_not_pieces() {
        let mut a = BodyHasher::default();
        a.feed(b"hello world");
        let mut b = BodyHasher::default();
        b.feed(b"hello");
        b.feed(b" world");
        assert_eq!(a.finish(), b.finish());
        assert!(a.finish().is_some());
        let mut c = BodyHasher::default();
        c.feed(b"hello");
        c.gap();
        c.feed(b" world");
        assert_ne!(c.finish(), a.finish());
        assert_eq!(BodyHasher::default().finish(), None);
        // Fixed function: the value never changes between runs.
        let mut d = BodyHasher::default();
        d.feed(b"a");
        assert_eq!(d.finish(), Some(0xaf63_dc4c_8601_ec8c));
    }
}
