//! Small pure helpers: stable hashing, route templates, lenient header-value parsing.

use super::exchange::Text;

/// The 128-bit key of every digest l7 puts on an exchange (query strings, request bodies).
/// Digests are keyed because they end up in dumps and API answers: an unkeyed hash of a short
/// secret (a PIN, a one-time code) is brute-forced offline in seconds. Only equality matters
/// (retry matching within one agent), so any key works; the agent sets a per-node one at start
/// ([`set_digest_key`]) and a process-random one is used until then.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DigestKey([u8; 16]);

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(..)")
    }
}

impl DigestKey {
    pub const LEN: usize = 16;

    pub const fn from_bytes(b: [u8; 16]) -> Self {
        DigestKey(b)
    }

    /// A fresh random key (the OS's generator; a clock-derived key if it is unavailable, which
    /// keeps digests keyed, only less secret).
    pub fn random() -> Self {
        let mut b = [0u8; 16];
        if getrandom::fill(&mut b).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let seed = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), t);
            b[..8].copy_from_slice(&seed.to_le_bytes());
            b[8..].copy_from_slice(&(t as u64).to_le_bytes());
        }
        DigestKey(b)
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// A keyed hasher (SipHash-1-3: a PRF for short inputs); `domain` separates the uses of one
    /// key so a digest of one kind never equals a digest of another kind of the same bytes.
    pub(crate) fn hasher(&self, domain: Domain) -> Keyed {
        self.hasher_of(domain as u8)
    }

    fn hasher_of(&self, octet: u8) -> Keyed {
        let mut h = siphasher::sip::SipHasher13::new_with_key(&self.0);
        std::hash::Hasher::write_u8(&mut h, octet);
        Keyed(h)
    }
}

static DIGEST_KEY: std::sync::OnceLock<DigestKey> = std::sync::OnceLock::new();

/// Set the process's digest key; the first call wins (returns false if one was already in use).
pub fn set_digest_key(k: DigestKey) -> bool {
    DIGEST_KEY.set(k).is_ok()
}

/// The process's digest key.
pub fn digest_key() -> &'static DigestKey {
    DIGEST_KEY.get_or_init(DigestKey::random)
}

/// A hasher of the process's key for `domain`, cloned from one made once: keying and the
/// domain octet cost as much as hashing a request's 100-byte body. Every digest of the
/// process's key goes through here (l7's, the recorder's, the shim's).
pub(crate) fn domain_hasher(domain: Domain) -> Keyed {
    // One per octet up to the highest domain's, indexed by the discriminant (a few unused).
    const MADE_LEN: usize = Domain::ShimBody as usize + 1;
    static MADE: std::sync::OnceLock<[Keyed; MADE_LEN]> = std::sync::OnceLock::new();
    let made = MADE.get_or_init(|| std::array::from_fn(|d| digest_key().hasher_of(d as u8)));
    match made.get(domain as usize) {
        Some(h) => h.clone(),
        None => digest_key().hasher(domain),
    }
}

/// A streaming keyed digest: the result depends on the bytes, not on how they were fed.
#[derive(Clone, Debug)]
pub struct Keyed(siphasher::sip::SipHasher13);

impl Keyed {
    pub fn write(&mut self, bytes: &[u8]) {
        std::hash::Hasher::write(&mut self.0, bytes);
    }
    pub fn finish(&self) -> u64 {
        std::hash::Hasher::finish(&self.0)
    }
}

/// Digest domains, one per kind of input, all here: the octet each writes first is its
/// discriminant, so two kinds cannot share one (the recorder's body runs once shared l7's
/// trace ids').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Domain {
    /// Request query strings (`Exchange::query_hash`).
    Query = 1,
    /// Request bodies' first bytes (`Exchange::body_hash`).
    Body = 2,
    /// Propagated trace ids (l7::trace): keyed like every digest that may reach a dump.
    Trace = 3,
    /// Body runs the recorder masks (their digest is what a dump shows of them). 3 before
    /// this domain was its own: dumps written before show other digests of the same bytes.
    BodyRun = 4,
    /// The shim's credential headers and bodies (never stored, never shown).
    ShimCredential = 0x10,
    ShimBody = 0x11,
}

#[cfg(test)]
impl Domain {
    const ALL: [Domain; 6] = [
        Domain::Query,
        Domain::Body,
        Domain::Trace,
        Domain::BodyRun,
        Domain::ShimCredential,
        Domain::ShimBody,
    ];
}

/// How many leading request-body bytes feed `body_hash`: enough to tell payloads apart, small
/// enough that the hash only ever covers bytes a default capture prefix holds.
pub(crate) const BODY_HASH_LIMIT: usize = 1024;

/// Hash of the first captured bytes of a request body, fed in pieces; stops at the first gap so
/// the result depends only on the bytes, not on the syscall boundaries.
/// The keyed hasher is made at the first body byte: most requests (GETs) have no body, and
/// every message start makes a fresh `BodyHasher`.
#[derive(Clone, Debug, Default)]
pub(crate) struct BodyHasher {
    h: Option<Keyed>,
    n: usize,
    stopped: bool,
}

impl BodyHasher {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if self.stopped || self.n >= BODY_HASH_LIMIT {
            return;
        }
        let take = bytes.len().min(BODY_HASH_LIMIT - self.n);
        if let Some(b) = bytes.get(..take)
            && !b.is_empty()
        {
            self.h
                .get_or_insert_with(|| domain_hasher(Domain::Body))
                .write(b);
            self.n += take;
        }
    }
    /// Bytes went by uncaptured: the prefix ends here.
    pub(crate) fn gap(&mut self) {
        self.stopped = true;
    }
    pub(crate) fn finish(&self) -> Option<u64> {
        self.h.as_ref().filter(|_| self.n > 0).map(Keyed::finish)
    }
}

/// Longest path kept on an exchange (bytes); longer paths are cut, keeping memory bounded.
pub(crate) const MAX_PATH: usize = 512;
/// Longest authority kept.
pub(crate) const MAX_AUTHORITY: usize = 256;

/// Bytes to a bounded, lossy UTF-8 string (inline when short: see [`Text`]).
pub(crate) fn bounded_string(b: &[u8], max: usize) -> Text {
    let b = b.get(..b.len().min(max)).unwrap_or_default();
    // Valid UTF-8 (nearly always ASCII) is checked by the vectorised validator and copied once;
    // only invalid bytes take the slower lossy path. Same result either way.
    match std::str::from_utf8(b) {
        Ok(s) => Text::new(s),
        Err(_) => Text::from(String::from_utf8_lossy(b)),
    }
}

/// The target of a request without its query string or fragment. An absolute-form target
/// (`http://host/path`, proxies) yields its path.
pub(crate) fn path_of_target(target: &[u8]) -> &[u8] {
    let mut t = target;
    if let Some(rest) = t
        .strip_prefix(b"http://")
        .or_else(|| t.strip_prefix(b"https://"))
    {
        t = match rest.iter().position(|&c| c == b'/') {
            Some(i) => rest.get(i..).unwrap_or(b"/"),
            None => b"/",
        };
    }
    let end = t
        .iter()
        .position(|&c| c == b'?' || c == b'#')
        .unwrap_or(t.len());
    t.get(..end).unwrap_or(t)
}

/// Keyed digest of a request target's query string (after `?`, before `#`), if it has one. Only
/// the digest is kept: queries carry tokens, and telling `?page=1` from `?page=2` is all we need.
pub(crate) fn query_hash_of_target(target: &[u8]) -> Option<u64> {
    let q = target.iter().position(|&c| c == b'?')?;
    let rest = target.get(q + 1..)?;
    let end = rest.iter().position(|&c| c == b'#').unwrap_or(rest.len());
    let mut h = domain_hasher(Domain::Query);
    h.write(rest.get(..end)?);
    Some(h.finish())
}

/// The authority of an absolute-form target, if it is one.
pub(crate) fn authority_of_target(target: &[u8]) -> Option<&[u8]> {
    let rest = target
        .strip_prefix(b"http://")
        .or_else(|| target.strip_prefix(b"https://"))?;
    let end = rest
        .iter()
        .position(|&c| c == b'/' || c == b'?')
        .unwrap_or(rest.len());
    rest.get(..end)
}

/// `path` with high-cardinality segments collapsed to `{id}`: all-digit segments, UUIDs, long
/// hex strings, and long tokens mixing letters and digits (opaque ids, base64).
pub fn route_template(path: &str) -> Text {
    // One pass: most paths have no id segment and are copied whole; the output is started only
    // at the first id segment, from the untouched prefix before it. Segments are found by a
    // plain byte loop: paths are short, and a searcher per segment cost more than the scan.
    let b = path.as_bytes();
    let mut out: Option<Text> = None;
    let mut start = 0;
    while start <= b.len() {
        let end = b
            .get(start..)
            .and_then(|r| r.iter().position(|&c| c == b'/'))
            .map_or(b.len(), |p| start + p);
        // Cut at '/' (ASCII) or the ends: always char boundaries.
        let seg = path.get(start..end).unwrap_or_default();
        if is_id_segment(seg) {
            let o = out.get_or_insert_with(|| {
                let mut o = Text::with_capacity(path.len());
                o.push_str(path.get(..start).unwrap_or_default());
                o
            });
            o.push_str("{id}");
        } else if let Some(o) = out.as_mut() {
            o.push_str(seg);
        }
        if end < b.len()
            && let Some(o) = out.as_mut()
        {
            o.push('/');
        }
        start = end + 1;
    }
    out.unwrap_or_else(|| Text::new(path))
}

/// Recent paths' routes: a service's requests repeat a few paths (a gRPC client calls a few
/// methods), and [`route_template`] was ~5% of the reassembler's time on gRPC. Direct-mapped on
/// the path's length and last byte; a miss costs one comparison.
#[derive(Default)]
pub(crate) struct Routes([Option<(Text, Text)>; Routes::SLOTS]);

impl Routes {
    const SLOTS: usize = 16;

    pub(crate) fn route(&mut self, path: &str) -> Text {
        let last = path.as_bytes().last().copied().unwrap_or(0);
        let i = (path.len() ^ usize::from(last).wrapping_mul(7)) % Self::SLOTS;
        let Some(slot) = self.0.get_mut(i) else {
            return route_template(path);
        };
        match slot {
            Some((p, r)) if p.as_str() == path => r.clone(),
            _ => {
                let r = route_template(path);
                *slot = Some((Text::new(path), r.clone()));
                r
            }
        }
    }
}

fn is_id_segment(seg: &str) -> bool {
    let b = seg.as_bytes();
    if b.is_empty() {
        return false;
    }
    if b.iter().all(u8::is_ascii_digit) {
        return true;
    }
    // Every other rule needs 16 bytes or more: most segments (words) stop here.
    if b.len() < 16 {
        return false;
    }
    if is_uuid(b) {
        return true;
    }
    if b.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    // Opaque ids: long, and mixing digits with letters (a word never has 4+ digits).
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    b.len() >= 20
        && digits >= 4
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'=')
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
    v.iter().try_fold(0u64, |acc, &c| {
        acc.checked_mul(10)?.checked_add(u64::from(c - b'0'))
    })
}

pub(crate) fn parse_u32(v: &[u8]) -> Option<u32> {
    parse_u64(v).and_then(|n| u32::try_from(n).ok())
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
pub(crate) fn has_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|&c| c == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_memo_answers_as_the_template_does() {
        let mut memo = Routes::default();
        // More paths than slots, sharing slots (same length and last byte), each asked twice.
        let paths: Vec<String> = (0..40)
            .map(|i| format!("/orders/{}/item{}", 1000 + i, i % 3))
            .chain((0..40).map(|i| format!("/a{i:02}/b")))
            .collect();
        for round in 0..2 {
            for p in &paths {
                assert_eq!(memo.route(p), route_template(p), "{p} (round {round})");
            }
        }
    }

    #[test]
    fn route_templates_collapse_ids_only() {
        let cases = [
            ("/users/123/orders/9", "/users/{id}/orders/{id}"),
            (
                "/v1/items/550e8400-e29b-41d4-a716-446655440000",
                "/v1/items/{id}",
            ),
            ("/blobs/deadbeefcafebabe0011", "/blobs/{id}"),
            ("/tokens/aB3dE5fG7hJ9kL1mN3pQ5", "/tokens/{id}"),
            ("/v1/health", "/v1/health"),
            (
                "/helloworld.Greeter/SayHello",
                "/helloworld.Greeter/SayHello",
            ),
            ("/", "/"),
            ("/api/v2/", "/api/v2/"),
            ("/cafe", "/cafe"),
            ("", ""),
            ("123", "{id}"),
            ("/123", "/{id}"),
            ("/a/123/", "/a/{id}/"),
            ("//7//", "//{id}//"),
            ("/x/01234567890123456789abcd", "/x/{id}"),
        ];
        for (p, want) in cases {
            assert_eq!(route_template(p), want, "{p}");
        }
    }

    /// The two-pass template this module had before the one-pass one, kept as the reference.
    fn route_template_two_pass(path: &str) -> String {
        fn is_id(seg: &str) -> bool {
            let b = seg.as_bytes();
            if b.is_empty() {
                return false;
            }
            if b.iter().all(u8::is_ascii_digit) || is_uuid(b) {
                return true;
            }
            if b.len() >= 16 && b.iter().all(u8::is_ascii_hexdigit) {
                return true;
            }
            let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
            b.len() >= 20
                && digits >= 4
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'=')
        }
        if !path.split('/').any(is_id) {
            return path.to_owned();
        }
        path.split('/')
            .map(|s| if is_id(s) { "{id}" } else { s })
            .collect::<Vec<_>>()
            .join("/")
    }

    #[test]
    fn one_pass_route_template_equals_the_two_pass_one() {
        // Paths built from an alphabet that reaches every rule (digits, hex, UUID dashes,
        // token characters, non-ASCII), by a small deterministic generator.
        let pieces = [
            "",
            "1",
            "42",
            "abc",
            "deadbeefdeadbeef",
            "DEADBEEFdeadbeef0",
            "v1",
            "é",
            "a-b_c=",
            "550e8400-e29b-41d4-a716-446655440000",
            "aB3dE5fG7hJ9kL1mN3pQ5",
            "x.y",
            "?",
            "{id}",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let n = (seed % 6) as usize;
            let mut p = String::new();
            for k in 0..n {
                if k > 0 || seed & 0x100 != 0 {
                    p.push('/');
                }
                p.push_str(pieces[((seed >> (8 + 4 * k)) % pieces.len() as u64) as usize]);
            }
            if seed & 0x200 != 0 {
                p.push('/');
            }
            assert_eq!(route_template(&p), route_template_two_pass(&p), "{p:?}");
        }
    }

    #[test]
    fn bounded_strings_are_lossy_and_cut() {
        assert_eq!(bounded_string(b"abc", 2), "ab");
        assert_eq!(bounded_string(b"a\xffb", 8), "a\u{fffd}b");
        // A cut inside a multi-byte character is replaced, as before.
        assert_eq!(bounded_string("aé".as_bytes(), 2), "a\u{fffd}");
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
        assert_eq!(
            query_hash_of_target(b"/a?x=1#f"),
            query_hash_of_target(b"/b?x=1")
        );
        assert_ne!(
            query_hash_of_target(b"/a?x=1"),
            query_hash_of_target(b"/a?x=2")
        );
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
        // Keyed: the unkeyed FNV-1a of "a" (what a dump once held) is not what comes out, and
        // the same bytes as a query give another digest.
        let mut d = BodyHasher::default();
        d.feed(b"a");
        assert_ne!(d.finish(), Some(0xaf63_dc4c_8601_ec8c));
        assert_ne!(d.finish(), query_hash_of_target(b"/?a"));
        let mut other = DigestKey::from_bytes([7; 16]).hasher(Domain::Body);
        other.write(b"a");
        assert_ne!(
            d.finish(),
            Some(other.finish()),
            "another key, another digest"
        );
    }

    #[test]
    fn every_domain_has_its_own_hasher() {
        for d in Domain::ALL {
            assert_eq!(domain_hasher(d).finish(), digest_key().hasher(d).finish());
            for e in Domain::ALL.into_iter().filter(|&e| e != d) {
                assert_ne!(
                    domain_hasher(d).finish(),
                    domain_hasher(e).finish(),
                    "{d:?} {e:?}"
                );
            }
        }
    }
}
