//! Bounded tables the engine keeps its state in.
use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash},
};

pub(crate) type FastState = foldhash::fast::FixedState;
pub(crate) type Map<K, V> = HashMap<K, V, FastState>;

pub(crate) fn map<K, V>() -> Map<K, V> {
    HashMap::with_hasher(FastState::with_seed(0x5eed_c0ff_ee15_600d))
}

/// One-shot hash of a value with the engine's fixed hasher (deterministic across runs).
pub(crate) fn hash_one<T: Hash>(v: T) -> u64 {
    FastState::with_seed(0x0dd_ba11).hash_one(v)
}

/// A bounded map with approximate least-recently-used eviction: two generations; when the young
/// one fills, the old one is dropped whole. O(1), no per-entry bookkeeping, at most `cap`
/// entries. Entries read from the old generation move to the young one.
pub(crate) struct GenMap<K, V> {
    young: Map<K, V>,
    old: Map<K, V>,
    half: usize,
    /// Entries dropped by generation turnover since creation.
    pub evicted: u64,
}

impl<K: Hash + Eq + Copy, V> GenMap<K, V> {
    pub fn new(cap: usize) -> Self {
        GenMap {
            young: map(),
            old: map(),
            half: (cap / 2).max(1),
            evicted: 0,
        }
    }

    fn turn_over(&mut self) {
        if self.young.len() >= self.half {
            self.evicted += self.old.len() as u64;
            self.old = std::mem::replace(&mut self.young, map());
        }
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        self.young.get(k).or_else(|| self.old.get(k))
    }

    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        if !self.young.contains_key(k) {
            let v = self.old.remove(k)?;
            self.turn_over();
            self.young.insert(*k, v);
        }
        self.young.get_mut(k)
    }

    pub fn insert(&mut self, k: K, v: V) {
        if !self.young.contains_key(&k) {
            self.old.remove(&k);
            self.turn_over();
        }
        self.young.insert(k, v);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    pub fn get_or_insert_with(&mut self, k: K, f: impl FnOnce() -> V) -> &mut V {
        if !self.young.contains_key(&k) {
            let v = self.old.remove(&k);
            self.turn_over();
            return self.young.entry(k).or_insert_with(|| v.unwrap_or_else(f));
        }
        self.young.entry(k).or_insert_with(f)
    }
}

/// A ring of `len` time buckets indexed by epoch (time / bucket width). Writing to an epoch
/// older than the ring holds is refused; a slot reused for a newer epoch is reset first.
pub(crate) struct Ring<B> {
    epochs: Vec<u64>,
    slots: Vec<B>,
}

const EMPTY: u64 = u64::MAX;

impl<B: Default + Clone> Ring<B> {
    pub fn new(len: usize) -> Self {
        let len = len.max(1);
        Ring {
            epochs: vec![EMPTY; len],
            slots: vec![B::default(); len],
        }
    }

    pub fn at(&mut self, epoch: u64) -> Option<&mut B> {
        let len = self.slots.len() as u64;
        let i = (epoch % len) as usize;
        let held = *self.epochs.get(i)?;
        if held != EMPTY && held > epoch {
            return None; // older than the ring holds
        }
        if held != epoch {
            *self.epochs.get_mut(i)? = epoch;
            *self.slots.get_mut(i)? = B::default();
        }
        self.slots.get_mut(i)
    }

    pub fn get(&self, epoch: u64) -> Option<&B> {
        let i = (epoch % self.slots.len() as u64) as usize;
        if *self.epochs.get(i)? == epoch {
            self.slots.get(i)
        } else {
            None
        }
    }

    /// Buckets for epochs in `[from, to)` that the ring still holds.
    pub fn range(&self, from: u64, to: u64) -> impl Iterator<Item = &B> {
        (from..to).filter_map(move |e| self.get(e))
    }
}
