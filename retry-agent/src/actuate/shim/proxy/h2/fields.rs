//! A decoded header block, as the relay keeps it: fields in order in one reused buffer.
use bytes::BytesMut;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::frame;

/// A decoded header block: fields in order, as spans of one buffer reused per connection.
#[derive(Default)]
pub(super) struct Fields {
    buf: Vec<u8>,
    spans: Vec<(usize, usize, usize)>,
}

impl Fields {
    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.spans.clear();
    }
    pub(super) fn push(&mut self, name: &[u8], value: &[u8]) {
        let start = self.buf.len();
        self.buf.extend_from_slice(name);
        self.buf.extend_from_slice(value);
        self.spans.push((start, name.len(), value.len()));
    }
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().filter_map(|&(s, n, v)| {
            Some((self.buf.get(s..s + n)?, self.buf.get(s + n..s + n + v)?))
        })
    }
    pub(super) fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
    /// The regular (non-pseudo) fields as a header map; fields http cannot hold are skipped.
    pub(super) fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::with_capacity(self.spans.len());
        for (n, v) in self.iter().filter(|(n, _)| !n.starts_with(b":")) {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
                h.append(n, v);
            }
        }
        h
    }
    /// Every field as the static table allows, never through the dynamic one
    /// ([`frame::put_field`]).
    pub(super) fn encode(&self) -> BytesMut {
        let mut b = BytesMut::with_capacity(self.buf.len() + 4 * self.spans.len());
        for (n, v) in self.iter() {
            frame::put_field(&mut b, n, v);
        }
        b
    }
}
