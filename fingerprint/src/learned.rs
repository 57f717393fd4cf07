//! Learned cohorts: the filter groups one tenant's bare prompts by the traffic it sees,
//! with no batcher.
//!
//! The shipped codebook ([`crate::sketch::codebook`]) is one partition of sketch space,
//! fitted on general prompts. Its cell borders cut through a tenant's intents: at the
//! default level, 20 paraphrases of each of five Banking77 intents fall into 16 cells, one
//! intent into as many as 8 (docs/SKETCH.md, "Cohort codebook"). A clustering that only has to separate what the
//! tenant sends groups much better: the batcher's online clustering put at least 80% of each
//! of five intents into one cohort where the codebook put 20%. This module is that
//! clustering, small enough to live in Envoy's shared data (one table per Envoy, shared by
//! its worker threads).
//!
//! # The rule (leader clustering with a short mean)
//! A table of *leaders*, each: a scope, a cohort code and the sum of its first members'
//! unit vectors (kept as a quantised direction and a length). For a request's intent sketch:
//! 1. among the leaders of the request's [`scope`] (tenant salt, semantic mode and anchor
//!    words, what [`crate::IntentSketch::cohort`] keeps apart, and the batch threshold),
//!    take the nearest by cosine to the leader's sum (ties: the older leader);
//! 2. if its cosine is at least the batch threshold (`x-cohort-batch-threshold`, 0.1–0.9, a
//!    similarity bound as in the batcher's clustering: higher gives smaller, purer cohorts),
//!    the request gets that leader's code. While the leader has fewer than
//!    [`MEAN_MEMBERS`] members, the request's unit vector is added to its sum, so the
//!    leader moves from its first member towards the intent's middle; then it is frozen;
//! 3. otherwise the request starts a leader whose code is its own codebook code
//!    ([`crate::IntentSketch::cohort`]), so ids stay in the codebook's space and two Envoys
//!    that start an intent's leader from prompts of one cell agree on its id.
//!
//! A frozen leader is never written again, so the table changes only when a leader starts
//! or takes one of its first members: on traffic of a few intents the filter soon only
//! reads it (a tenant whose prompts rarely meet keeps starting leaders, each a write).
//! Measured on Banking77's first five intents, 20 prompts each, interleaved
//! (`fingerprint/tests/cohort_grouping.rs`): at the default threshold (0.5) every intent
//! has at least 80% of its prompts in one cohort, exactly the bar; at 0.4 and 0.6
//! the least share is 0.60 and 0.40. A prototype of the rule (docs/SKETCH.md) gave the same
//! 0.80 with a mean over 16 or all members, and 0.55 with a fixed leader.
//!
//! # Capacity and eviction
//! The table holds at most [`Capacity::per_scope`] leaders of one scope and
//! [`Capacity::total`] over all. A new leader beyond either evicts the oldest leader that
//! never took a second member (an outlier), or else the oldest: of its own scope first, so
//! one tenant's varied prompts evict its own leaders, then of the whole table.
//!
//! # What it does not promise
//! The clustering depends on arrival order and is per Envoy: two Envoys (or an Envoy
//! restarted) can start different leaders for one intent. Their ids agree where the leaders'
//! first prompts share a codebook cell, and otherwise differ. With several ingress Envoys,
//! an intent may so meet on up to one replica per Envoy; the batcher's online clustering
//! (assign mode) is the fleet-wide one.
//!
//! # Format
//! Little-endian: magic `CLC2`, then per leader ([`ENTRY_BYTES`], 52): u64 scope, u32
//! code, u16 members, u16 reserved, f32 length of the members' sum, 32 × i8 direction of
//! the sum (quantised to L2 norm 127). The filter scans the bytes in place: nothing is
//! decoded on the read path. Bytes of another format read as an empty table. Everything is
//! integer arithmetic or IEEE-exact, so every platform agrees.

use crate::sketch::codebook::NO_INTENT;
use crate::{IntentSketch, SemanticMode, Sketch, TenantSalt, SKETCH_DIMS};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Members whose unit vectors make a leader's mean; later members only read it.
pub const MEAN_MEMBERS: u16 = 4;
/// Default number of leaders one table holds.
pub const DEFAULT_CAPACITY: usize = 128;
/// Default number of leaders of one scope.
pub const DEFAULT_PER_SCOPE: usize = 32;
/// Largest capacity a configuration may ask for (about 200 KB of shared data).
pub const MAX_CAPACITY: usize = 4096;
/// Threshold used when the given one is not a number.
const DEFAULT_THRESHOLD: f32 = 0.5;
/// L2 norm a mean direction is quantised to (every component then fits in an i8).
const UNIT_NORM: f64 = 127.0;

const MAGIC: &[u8; 4] = b"CLC2";
/// Bytes of one leader: u64 scope, u32 code, u16 members, u16 reserved (0), f32 length of
/// the members' sum, 32 × i8 direction of that sum (norm [`UNIT_NORM`]).
pub const ENTRY_BYTES: usize = 20 + SKETCH_DIMS;
const SCOPE: std::ops::Range<usize> = 0..8;
const CODE: std::ops::Range<usize> = 8..12;
const MEMBERS: std::ops::Range<usize> = 12..14;
const LENGTH: std::ops::Range<usize> = 16..20;
const MEAN: std::ops::Range<usize> = 20..ENTRY_BYTES;
/// Separates scopes from the other hashes seeded by the tenant salt.
const SCOPE_DOMAIN: u64 = 0x6c65_6172_6e65_6421;

/// The scope of a request's intent: leaders of different tenants, semantic modes, anchor
/// words or batch thresholds are never joined (a leader's code is a codebook code at the
/// level its threshold picks, and its threshold is its join bound).
pub fn scope(salt: TenantSalt, intent: &IntentSketch, threshold: f32) -> u64 {
    let mode = match intent.mode {
        SemanticMode::Intent => 0u8,
        SemanticMode::Topic => 1,
        SemanticMode::Hybrid => 2,
    };
    let mut input = [0u8; 13];
    input[0] = mode;
    input[1..9].copy_from_slice(&intent.anchor.to_le_bytes());
    input[9..].copy_from_slice(&threshold.to_bits().to_le_bytes());
    xxh3_64_with_seed(&input, salt.0 ^ SCOPE_DOMAIN)
}

/// How many leaders a table keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Leaders over all scopes.
    pub total: usize,
    /// Leaders of one scope (one tenant, mode, anchors and threshold), so that one tenant's
    /// varied prompts evict only its own leaders.
    pub per_scope: usize,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            total: DEFAULT_CAPACITY,
            per_scope: DEFAULT_PER_SCOPE,
        }
    }
}

/// Where a sketch went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The cohort code the request takes (not salted: [`TenantSalt::cohort`] of it is the id).
    pub code: u32,
    /// The request started a leader.
    pub started: bool,
    /// The table changed and must be written back.
    pub changed: bool,
}

/// A table of leaders (see the module doc), kept as its bytes: the filter reads it from
/// shared data and scans it in place, with no decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnedCohorts {
    /// [`MAGIC`], then whole entries.
    bytes: Vec<u8>,
}

impl Default for LearnedCohorts {
    fn default() -> Self {
        LearnedCohorts {
            bytes: MAGIC.to_vec(),
        }
    }
}

/// `v` scaled to [`UNIT_NORM`] and rounded, or None for a zero vector.
fn direction(v: &[f64; SKETCH_DIMS]) -> Option<([i8; SKETCH_DIMS], f64)> {
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    (norm > 0.0).then(|| {
        let mean =
            std::array::from_fn(|i| (v[i] * UNIT_NORM / norm).round().clamp(-127.0, 127.0) as i8);
        (mean, norm)
    })
}

impl LearnedCohorts {
    /// Reads a table's bytes ([`LearnedCohorts::as_bytes`]); anything else (empty, another
    /// format, a torn write) is an empty table.
    pub fn from_bytes(bytes: Vec<u8>) -> LearnedCohorts {
        let valid = bytes.starts_with(MAGIC) && (bytes.len() - MAGIC.len()) % ENTRY_BYTES == 0;
        if valid {
            LearnedCohorts { bytes }
        } else {
            LearnedCohorts::default()
        }
    }

    /// The table's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Leaders in the table.
    pub fn len(&self) -> usize {
        (self.bytes.len() - MAGIC.len()) / ENTRY_BYTES
    }

    /// Whether the table holds no leader.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entry(&self, i: usize) -> &[u8] {
        let at = MAGIC.len() + i * ENTRY_BYTES;
        &self.bytes[at..at + ENTRY_BYTES]
    }

    fn entry_mut(&mut self, i: usize) -> &mut [u8] {
        let at = MAGIC.len() + i * ENTRY_BYTES;
        &mut self.bytes[at..at + ENTRY_BYTES]
    }

    /// The codes of the leaders, oldest first.
    #[cfg(test)]
    fn codes(&self) -> Vec<u32> {
        (0..self.len()).map(|i| code_of(self.entry(i))).collect()
    }

    /// Places a sketch of `scope` at `threshold` (module doc, "The rule"); `own_code` gives
    /// the request's own codebook code, asked only when it starts a leader. None for the
    /// zero sketch (no intent text), which neither joins nor starts a leader, and when
    /// `own_code` is [`NO_INTENT`].
    pub fn place(
        &mut self,
        scope: u64,
        sketch: &Sketch,
        threshold: f32,
        capacity: Capacity,
        own_code: impl FnOnce() -> u32,
    ) -> Option<Placement> {
        let query: [f64; SKETCH_DIMS] = std::array::from_fn(|i| f64::from(sketch.0[i]));
        let (unit, query_norm) = direction(&query)?;
        let threshold = if threshold.is_finite() {
            f64::from(threshold.clamp(-1.0, 1.0))
        } else {
            f64::from(DEFAULT_THRESHOLD)
        };
        // The nearest leader of the scope by cosine (the query's own norm is common to all,
        // so the rank is the dot product over the leader's norm); ties keep the older.
        let scope_bytes = scope.to_le_bytes();
        let mut best: Option<(usize, f64)> = None;
        for (i, entry) in self.bytes[MAGIC.len()..]
            .chunks_exact(ENTRY_BYTES)
            .enumerate()
        {
            if scope_of(entry) != scope_bytes {
                continue;
            }
            let (mut dot, mut norm) = (0i32, 0i32);
            for (q, m) in sketch.0.iter().zip(&entry[MEAN]) {
                let (q, m) = (i32::from(*q), i32::from(*m as i8));
                dot += q * m;
                norm += m * m;
            }
            if norm == 0 {
                continue;
            }
            let rank = f64::from(dot) / f64::from(norm).sqrt();
            if best.is_none_or(|(_, b)| rank > b) {
                best = Some((i, rank));
            }
        }
        if let Some((i, rank)) = best {
            if rank / query_norm >= threshold {
                return Some(self.join(i, &unit));
            }
        }
        let code = own_code();
        if code == NO_INTENT {
            return None;
        }
        let mut entry = [0u8; ENTRY_BYTES];
        entry[SCOPE].copy_from_slice(&scope_bytes);
        entry[CODE].copy_from_slice(&code.to_le_bytes());
        entry[MEMBERS].copy_from_slice(&1u16.to_le_bytes());
        entry[LENGTH].copy_from_slice(&(UNIT_NORM as f32).to_le_bytes());
        for (b, x) in entry[MEAN].iter_mut().zip(unit) {
            *b = x as u8;
        }
        self.bytes.extend_from_slice(&entry);
        // Over the scope's share: the scope's oldest outlier (a leader that never took a
        // second member) goes, or else its oldest; then the same over the whole table.
        let per_scope = capacity.per_scope.max(1);
        let in_scope: Vec<usize> = (0..self.len())
            .filter(|&i| scope_of(self.entry(i)) == scope_bytes)
            .collect();
        if in_scope.len() > per_scope {
            let older = &in_scope[..in_scope.len() - 1];
            let victim = older
                .iter()
                .copied()
                .find(|&i| members_of(self.entry(i)) == 1)
                .unwrap_or(older[0]);
            self.remove(victim);
        }
        while self.len() > capacity.total.max(1) {
            let newest = self.len() - 1;
            let victim = (0..newest)
                .find(|&i| members_of(self.entry(i)) == 1)
                .unwrap_or(0);
            self.remove(victim);
        }
        Some(Placement {
            code,
            started: true,
            changed: true,
        })
    }

    fn remove(&mut self, i: usize) {
        let at = MAGIC.len() + i * ENTRY_BYTES;
        self.bytes.drain(at..at + ENTRY_BYTES);
    }

    /// The request joins leader `i`; while the leader is young, the request's direction
    /// `unit` is added to the members' sum it keeps (as a direction and a length).
    fn join(&mut self, i: usize, unit: &[i8; SKETCH_DIMS]) -> Placement {
        let entry = self.entry_mut(i);
        let code = code_of(entry);
        let members = members_of(entry);
        let changed = members < MEAN_MEMBERS;
        if changed {
            let length = f64::from(f32::from_le_bytes(
                entry[LENGTH].try_into().unwrap_or_default(),
            ));
            let mean = &entry[MEAN];
            let sum: [f64; SKETCH_DIMS] = std::array::from_fn(|k| {
                f64::from(mean[k] as i8) * length / UNIT_NORM + f64::from(unit[k])
            });
            if let Some((direction, norm)) = direction(&sum) {
                for (b, x) in entry[MEAN].iter_mut().zip(direction) {
                    *b = x as u8;
                }
                entry[LENGTH].copy_from_slice(&(norm as f32).to_le_bytes());
            }
            entry[MEMBERS].copy_from_slice(&(members + 1).to_le_bytes());
        }
        Placement {
            code,
            started: false,
            changed,
        }
    }
}

fn code_of(entry: &[u8]) -> u32 {
    u32::from_le_bytes(entry[CODE].try_into().unwrap_or_default())
}

fn members_of(entry: &[u8]) -> u16 {
    u16::from_le_bytes(entry[MEMBERS].try_into().unwrap_or_default())
}

fn scope_of(entry: &[u8]) -> [u8; 8] {
    entry[SCOPE].try_into().unwrap_or_default()
}
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sketch(values: &[i8]) -> Sketch {
        let mut s = [0i8; SKETCH_DIMS];
        s[..values.len()].copy_from_slice(values);
        Sketch(s)
    }

    fn capacity(total: usize, per_scope: usize) -> Capacity {
        Capacity { total, per_scope }
    }

    fn place(table: &mut LearnedCohorts, scope: u64, s: &Sketch, code: u32) -> Placement {
        table
            .place(scope, s, 0.5, capacity(8, 8), || code)
            .expect("a direction")
    }

    #[test]
    fn a_near_sketch_joins_the_leader_and_takes_its_code() {
        let mut table = LearnedCohorts::default();
        let first = place(&mut table, 1, &sketch(&[100, 10]), 7);
        assert_eq!((first.code, first.started, first.changed), (7, true, true));
        // Cosine 0.95 with the leader: joins, whatever its own code would be.
        let near = place(&mut table, 1, &sketch(&[90, 40]), 9);
        assert_eq!((near.code, near.started, near.changed), (7, false, true));
        // Orthogonal: a leader of its own.
        let far = place(&mut table, 1, &sketch(&[0, 0, 100]), 11);
        assert_eq!((far.code, far.started), (11, true));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn scopes_never_share_a_leader() {
        let mut table = LearnedCohorts::default();
        let s = sketch(&[100, 10]);
        place(&mut table, 1, &s, 7);
        let other = place(&mut table, 2, &s, 7);
        assert!(other.started, "another scope starts its own leader");
        let salt = |t: &str| TenantSalt::new(b"", Some(t));
        let intent = IntentSketch::of_text("refund my order", SemanticMode::Intent);
        let topic = IntentSketch::of_text("refund my order", SemanticMode::Topic);
        let anchored = IntentSketch::of_text("refund my 【order】", SemanticMode::Intent);
        let scopes = [
            scope(salt("a"), &intent, 0.5),
            scope(salt("b"), &intent, 0.5),
            scope(salt("a"), &topic, 0.5),
            scope(salt("a"), &anchored, 0.5),
            scope(salt("a"), &intent, 0.6),
        ];
        for (i, a) in scopes.iter().enumerate() {
            for b in &scopes[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn the_threshold_is_a_similarity_bound() {
        // Cosine of the two is 0.6: they join at 0.5, not at 0.7.
        let a = sketch(&[100, 0]);
        let b = sketch(&[60, 80]);
        for (threshold, joined) in [(0.5, true), (0.7, false)] {
            let mut table = LearnedCohorts::default();
            table.place(1, &a, threshold, capacity(8, 8), || 1).unwrap();
            let placed = table.place(1, &b, threshold, capacity(8, 8), || 2).unwrap();
            assert_eq!(!placed.started, joined, "threshold {threshold}");
        }
    }

    #[test]
    fn a_leader_takes_a_short_mean_then_only_reads() {
        let mut table = LearnedCohorts::default();
        place(&mut table, 1, &sketch(&[100, 10]), 7);
        for _ in 1..MEAN_MEMBERS {
            assert!(place(&mut table, 1, &sketch(&[90, 30]), 9).changed);
        }
        let before = table.clone();
        let placed = place(&mut table, 1, &sketch(&[90, 30]), 9);
        assert_eq!((placed.code, placed.changed), (7, false));
        assert_eq!(table, before, "a frozen leader is not written");
    }

    #[test]
    fn the_zero_sketch_has_no_cohort() {
        let mut table = LearnedCohorts::default();
        let zero = Sketch([0; SKETCH_DIMS]);
        assert_eq!(table.place(1, &zero, 0.5, capacity(8, 8), || 1), None);
        let no_intent = table.place(1, &sketch(&[1]), 0.5, capacity(8, 8), || NO_INTENT);
        assert_eq!(no_intent, None);
        assert!(table.is_empty());
    }

    fn axis(i: usize) -> Sketch {
        let mut s = [0i8; SKETCH_DIMS];
        s[i] = 100;
        Sketch(s)
    }

    #[test]
    fn outliers_are_evicted_before_leaders_with_members() {
        let mut table = LearnedCohorts::default();
        let room = capacity(3, 3);
        // Leader 10 takes a member; leaders 11 and 12 stay alone.
        table.place(1, &axis(0), 0.5, room, || 10).unwrap();
        table.place(1, &axis(0), 0.5, room, || 10).unwrap();
        table.place(1, &axis(1), 0.5, room, || 11).unwrap();
        table.place(1, &axis(2), 0.5, room, || 12).unwrap();
        // A fourth leader evicts the oldest outlier (11), not the older leader 10.
        table.place(1, &axis(3), 0.5, room, || 13).unwrap();
        assert_eq!(table.codes(), [10, 12, 13]);
    }

    #[test]
    fn a_scope_over_its_share_evicts_its_own_leaders() {
        let mut table = LearnedCohorts::default();
        let room = capacity(8, 2);
        table.place(2, &axis(0), 0.5, room, || 20).unwrap();
        for (i, code) in [10, 11, 12, 13].into_iter().enumerate() {
            table.place(1, &axis(i + 1), 0.5, room, || code).unwrap();
        }
        // Scope 1 keeps its two newest; scope 2's older outlier stays.
        assert_eq!(table.codes(), [20, 12, 13]);
    }

    #[test]
    fn the_table_round_trips_and_foreign_bytes_are_empty() {
        let mut table = LearnedCohorts::default();
        place(&mut table, 1, &sketch(&[100, 10]), 7);
        place(&mut table, 2, &sketch(&[-5, 100, -128]), 8);
        assert_eq!(LearnedCohorts::from_bytes(table.as_bytes().to_vec()), table);
        assert_eq!(table.len(), 2);
        assert!(LearnedCohorts::from_bytes(Vec::new()).is_empty());
        assert!(LearnedCohorts::from_bytes(b"{\"state\":\"closed\"}".to_vec()).is_empty());
        let mut torn = table.as_bytes().to_vec();
        torn.pop();
        assert!(LearnedCohorts::from_bytes(torn).is_empty());
    }

    proptest! {
        #[test]
        fn any_bytes_read_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut table = LearnedCohorts::from_bytes(bytes.clone());
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let mut framed_table = LearnedCohorts::from_bytes(framed);
            for t in [&mut table, &mut framed_table] {
                for scope in [1, 0] {
                    t.place(scope, &sketch(&[3, -4]), 0.5, capacity(4, 4), || 1);
                }
                prop_assert_eq!(LearnedCohorts::from_bytes(t.as_bytes().to_vec()), t.clone());
            }
        }

        #[test]
        fn foreign_leaders_in_the_requests_scope_are_joined_without_panic(
            entries in proptest::collection::vec(
                (proptest::array::uniform32(any::<i8>()), any::<u16>(), any::<u32>(), any::<u32>()),
                1..8,
            ),
            query in proptest::array::uniform32(any::<i8>()),
            threshold in -1.5f32..1.5,
        ) {
            // Entries in the request's scope with any direction, member count, code and
            // length bits (NaN, infinities, negatives included): the join path runs on them.
            let mut bytes = MAGIC.to_vec();
            for (mean, members, code, length) in &entries {
                bytes.extend_from_slice(&7u64.to_le_bytes());
                bytes.extend_from_slice(&code.to_le_bytes());
                bytes.extend_from_slice(&(members % 6).to_le_bytes());
                bytes.extend_from_slice(&0u16.to_le_bytes());
                bytes.extend_from_slice(&length.to_le_bytes());
                bytes.extend(mean.iter().map(|&x| x as u8));
            }
            let mut table = LearnedCohorts::from_bytes(bytes);
            prop_assert_eq!(table.len(), entries.len());
            for _ in 0..MEAN_MEMBERS + 1 {
                table.place(7, &Sketch(query), threshold, capacity(8, 8), || 1);
            }
            prop_assert_eq!(LearnedCohorts::from_bytes(table.as_bytes().to_vec()), table.clone());
        }

        #[test]
        fn the_table_never_exceeds_its_capacity(
            sketches in proptest::collection::vec(proptest::array::uniform32(any::<i8>()), 1..60),
            total in 1usize..10,
            per_scope in 1usize..10,
        ) {
            let mut table = LearnedCohorts::default();
            for (i, s) in sketches.iter().enumerate() {
                table.place(i as u64 % 3, &Sketch(*s), 0.5, capacity(total, per_scope), || i as u32);
                prop_assert!(table.len() <= total);
                for scope in 0..3u64 {
                    let in_scope = (0..table.len())
                        .filter(|&j| scope_of(table.entry(j)) == scope.to_le_bytes())
                        .count();
                    prop_assert!(in_scope <= per_scope);
                }
            }
        }
    }
}
