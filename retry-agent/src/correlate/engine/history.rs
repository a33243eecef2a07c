//! A process's histories (its recent inbound requests, its failed outbound calls), oldest
//! first, with the two ways verdicts read them: a time span's entries and one key's entries. A
//! busy process holds thousands of each (all it served and all that failed over the keep
//! horizon, within the engine-wide cap); a verdict reads those of its own span or trace, which
//! a walk of the whole history per verdict (or per retry) would make cost as much as the
//! history is long.
use std::collections::{VecDeque, hash_map::Entry};

use super::Child;
use crate::{
    correlate::table::{Map, map},
    l7::ExchangeId,
};

/// One inbound request: (start, end, exchange, propagated trace id, failed).
pub(super) type InEntry = (u64, u64, ExchangeId, Option<u64>, bool);
/// One failed outbound call, with the thread (or goroutine) that made it.
pub(super) type FailEntry = (Child, u64);

/// Capacity (entries) past which a history that emptied to a quarter of it gives room back.
const SHRINK_FROM: usize = 1024;

/// What a history needs of its entries.
pub(super) trait Held {
    /// When it ended (spans are found by it).
    fn end(&self) -> u64;
    /// The key it is found by, if any.
    fn key(&self) -> Option<u64>;
}

impl Held for InEntry {
    fn end(&self) -> u64 {
        self.1
    }
    /// The propagated trace id (the trace link's lookups).
    fn key(&self) -> Option<u64> {
        self.3
    }
}

impl Held for FailEntry {
    fn end(&self) -> u64 {
        self.0.end
    }
    /// The retry key (a retry marks its request's earlier failed attempts).
    fn key(&self) -> Option<u64> {
        (self.0.retry_key != 0).then_some(self.0.retry_key)
    }
}

/// Entries numbered as pushed: the front's number is `first`, so an entry's place is its number
/// minus `first` however many went before it.
pub(super) struct History<E> {
    entries: VecDeque<E>,
    /// The latest end among each entry and all before it (non-decreasing even though entries
    /// come in answer order, which is not quite end order): the entries that may have ended at
    /// or after `t` are those from the first whose reach is `t` or more.
    reach: VecDeque<u64>,
    first: u64,
    /// Numbers of the entries with each key, oldest first: the first one inline (most keys
    /// occur once), the rest after it (a deque: a key held thousands of times, a health check
    /// failing without a trace id, lets its oldest go in O(1)).
    by_key: Map<u64, (u64, VecDeque<u64>)>,
}

impl<E> Default for History<E> {
    fn default() -> Self {
        History {
            entries: VecDeque::new(),
            reach: VecDeque::new(),
            first: 0,
            by_key: map(),
        }
    }
}

impl<E: Held> History<E> {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Oldest first (tests look at whole histories; verdicts read spans and keys).
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &E> {
        self.entries.iter()
    }

    pub(super) fn front(&self) -> Option<&E> {
        self.entries.front()
    }

    pub(super) fn push_back(&mut self, e: E) {
        if let Some(k) = e.key() {
            let n = self.first + self.entries.len() as u64;
            match self.by_key.entry(k) {
                Entry::Occupied(mut o) => o.get_mut().1.push_back(n),
                Entry::Vacant(v) => {
                    v.insert((n, VecDeque::new()));
                }
            }
        }
        let reach = self.reach.back().map_or(e.end(), |&r| r.max(e.end()));
        self.reach.push_back(reach);
        self.entries.push_back(e);
    }

    pub(super) fn pop_front(&mut self) -> Option<E> {
        let e = self.entries.pop_front()?;
        self.reach.pop_front();
        // A burst's room goes back once the history is a quarter of it: the engine-wide cap
        // counts entries, not the capacity a once-busy process would otherwise keep.
        let (len, cap) = (self.entries.len(), self.entries.capacity());
        if cap > SHRINK_FROM && len < cap / 4 {
            self.entries.shrink_to(len * 2);
            self.reach.shrink_to(len * 2);
            self.by_key.shrink_to(len * 2);
        }
        let n = self.first;
        self.first += 1;
        if let Some(k) = e.key()
            && let Entry::Occupied(mut o) = self.by_key.entry(k)
        {
            // The front is the oldest entry with its key too: first in its list.
            let (head, rest) = o.get_mut();
            if *head == n {
                match rest.pop_front() {
                    Some(next) => *head = next,
                    None => {
                        o.remove();
                    }
                }
            }
        }
        Some(e)
    }

    /// The entries that may have ended at or after `t` (every one that did, and some that did
    /// not: callers test their spans), oldest first.
    pub(super) fn ending_from(&self, t: u64) -> impl DoubleEndedIterator<Item = &E> {
        let i = self.reach.partition_point(|&r| r < t);
        self.entries.range(i..)
    }

    /// Places of the entries with key `k`, oldest first.
    fn numbers(&self, k: u64) -> impl DoubleEndedIterator<Item = usize> + '_ {
        self.by_key
            .get(&k)
            .into_iter()
            .flat_map(|(head, rest)| std::iter::once(head).chain(rest))
            .filter_map(|&n| place(self.first, n))
    }

    /// The entries with key `k`, oldest first (`rev()` for newest first: what a verdict looks
    /// for overlaps its recent span, and a key a caller reuses may hold thousands).
    pub(super) fn of_key(&self, k: u64) -> impl DoubleEndedIterator<Item = &E> {
        self.numbers(k).filter_map(|i| self.entries.get(i))
    }

    /// Changes the newest `at_most` entries with key `k` (never their key or end): bounded, so a
    /// key held thousands of times costs no more per update than a history of `at_most` did.
    pub(super) fn update_of_key(&mut self, k: u64, at_most: usize, mut f: impl FnMut(&mut E)) {
        let Some((head, rest)) = self.by_key.get(&k) else {
            return;
        };
        let newest_first = rest.iter().rev().chain(std::iter::once(head));
        for &n in newest_first.take(at_most) {
            if let Some(e) = place(self.first, n).and_then(|i| self.entries.get_mut(i)) {
                f(e);
            }
        }
    }
}

/// Where entry number `n` is when the front's number is `first` (None once it went).
fn place(first: u64, n: u64) -> Option<usize> {
    usize::try_from(n.checked_sub(first)?).ok()
}

impl History<InEntry> {
    /// Whether `id`'s entry is held; looked for from the newest (a verdict's own request was
    /// answered moments ago).
    pub(super) fn holds(&self, id: ExchangeId) -> bool {
        self.entries.iter().rev().any(|x| x.2 == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: u64, end: u64, trace: Option<u64>) -> InEntry {
        (id, end, ExchangeId(id), trace, false)
    }

    #[test]
    fn a_key_s_entries_follow_pushes_and_evictions() {
        let mut h = History::default();
        for (id, t) in [
            (1, Some(7)),
            (2, None),
            (3, Some(8)),
            (4, Some(7)),
            (5, Some(7)),
        ] {
            h.push_back(e(id, id + 1, t));
        }
        let ids = |h: &History<InEntry>, t| h.of_key(t).map(|x| x.2.0).collect::<Vec<_>>();
        assert_eq!(ids(&h, 7), [1, 4, 5]);
        assert_eq!(ids(&h, 8), [3]);
        assert!(ids(&h, 9).is_empty());
        assert_eq!(h.pop_front().map(|x| x.2.0), Some(1));
        assert_eq!(ids(&h, 7), [4, 5]);
        h.update_of_key(7, 1, |x| x.4 = true);
        assert_eq!(
            h.iter().filter(|x| x.4).map(|x| x.2.0).collect::<Vec<_>>(),
            [5]
        );
        h.update_of_key(7, 8, |x| x.4 = true);
        assert_eq!(h.iter().filter(|x| x.4).count(), 2);
        for _ in 0..3 {
            h.pop_front();
        }
        assert_eq!(ids(&h, 7), [5]);
        assert!(ids(&h, 8).is_empty());
        assert_eq!(h.by_key.len(), 1, "emptied keys leave the index");
        assert!(h.holds(ExchangeId(5)) && !h.holds(ExchangeId(4)));
        h.pop_front();
        assert!(h.is_empty() && h.by_key.is_empty());
        // Numbering goes on after the history emptied.
        h.push_back(e(6, 7, Some(7)));
        assert_eq!(ids(&h, 7), [6]);
    }

    /// A burst's room is given back as the history empties.
    #[test]
    fn a_history_that_empties_gives_its_room_back() {
        let mut h = History::default();
        for id in 0..8 * SHRINK_FROM as u64 {
            h.push_back(e(id, id, Some(id)));
        }
        let peak = h.entries.capacity();
        while h.len() > 100 {
            h.pop_front();
        }
        assert!(
            h.entries.capacity() < peak / 4,
            "{} of {peak}",
            h.entries.capacity()
        );
        assert!(h.reach.capacity() < peak / 4);
        let newest = 8 * SHRINK_FROM as u64 - 1;
        assert_eq!(
            h.of_key(newest).count(),
            1,
            "the index still finds what is held"
        );
        assert_eq!(h.ending_from(newest).count(), 1);
    }

    /// Answer order is not end order (a response cut off by a close ends at the close): the
    /// span lookup still returns every entry that ended at or after the time asked for.
    #[test]
    fn a_span_s_entries_are_all_found_out_of_end_order() {
        let mut h = History::default();
        for (id, end) in [(1, 10), (2, 50), (3, 20), (4, 30), (5, 60), (6, 40)] {
            h.push_back(e(id, end, None));
        }
        for t in [0, 10, 11, 25, 35, 45, 55, 60, 61] {
            let want: Vec<u64> = h.iter().filter(|x| x.1 >= t).map(|x| x.2.0).collect();
            let got: Vec<u64> = h
                .ending_from(t)
                .filter(|x| x.1 >= t)
                .map(|x| x.2.0)
                .collect();
            assert_eq!(got, want, "from {t}");
        }
        // Entries before the first that reaches `t` are skipped.
        assert_eq!(h.ending_from(51).count(), 2);
        h.pop_front();
        h.pop_front();
        let from = |t: u64| h.ending_from(t).filter(move |x| x.1 >= t).map(|x| x.2.0);
        assert_eq!(from(45).collect::<Vec<_>>(), [5]);
        assert_eq!(from(25).collect::<Vec<_>>(), [4, 5, 6]);
    }
}
