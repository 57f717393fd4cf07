//! Co-batching: which requests of one cohort share one dispatch, and when each may go.
//!
//! A *cohort* here is the routing key the filter computed (`x-cohort-key`: the tenant-salted
//! stable prefix, or the intent cohort when there is no stable prefix). Requests of a cohort
//! that arrive close together are worth sending to the same replica *in order*: the first
//! one (the leader) computes the shared prefix, the others (followers) find it cached.
//! Sending them side by side instead makes every one of them compute the prefix, which is
//! what round-robin and even consistent hashing do to a burst (an engine's slots do not
//! share a prefix that is still being computed).
//!
//! The policy, per cohort:
//! - A request with no open batch of its cohort is a **leader**. It is never held: a lone
//!   request at low load goes straight to its replica (0 ms added by the window).
//! - A batch stays open for joining for `window_ms` after its leader arrived, and — on
//!   engines whose followers wait for the leader's prefill — for as long as the leader is
//!   still computing its prompt (no first response byte yet), up to `max_hold_ms`. That is
//!   the adaptive part: the window stretches to the prefill time the engine actually needs,
//!   and collapses to nothing when nothing shares the prefix. On slot-pinned engines it does
//!   not stretch: there a leader without a first byte is usually queued behind its own
//!   cohort, and joining it would only lengthen that queue.
//! - A joiner must share enough of its prompt with the leader for the hold to pay
//!   (`min_shared`, measured on the prefix block hashes): the key that groups a cohort is
//!   the system prompt or, for bare prompts, the intent, and an intent or a short system
//!   prompt in front of a long conversation shares little. Waiting for a leader's whole
//!   prefill to save a few blocks costs more than it saves, and pinning such requests to
//!   the leader's replica piles one cohort's traffic onto one engine. A request that shares
//!   too little goes **alone**, at once, where its own routing hint says (the batcher's
//!   load-aware choice); the open batch stays open for those that do share.
//! - Joiners are **followers**, up to `max_batch` members (`max_batch_pressured` while the
//!   replica reports KV-cache pressure; `max_batch_same_slot` on slot-pinned engines, whose
//!   members run one after another rather than together). Beyond that a new batch starts
//!   with a new leader.
//! - When followers go depends on the engine ([`Release`]): with per-slot caches (llama.cpp)
//!   they go at once, pinned to the leader's slot, and the engine runs them in order; with
//!   a shared block cache (vLLM, SGLang) they are held until the leader's first byte (its
//!   prefix is then in the cache), or `max_hold_ms`, and then go together.
//!
//! This module only decides; the HTTP front holds and sends. Time is injected.

use std::collections::HashMap;

/// The batching knobs (`[batch]` in `cohort serve`'s configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchConfig {
    /// How long after a leader's arrival others may join its batch, ms.
    pub window_ms: u64,
    /// The longest a follower is held waiting for its leader's prefix, ms.
    pub max_hold_ms: u64,
    /// Members per batch (leader included).
    pub max_batch: usize,
    /// Members per batch while the replica reports KV-cache pressure.
    pub max_batch_pressured: usize,
    /// Members per batch on slot-pinned engines ([`Release::SameSlot`]), which run them in
    /// sequence: lower it to bound that chain (on a CPU llama.cpp the next batch then
    /// recomputes the prefix; docs/DECISIONS.md, "A cohort stays on its slot on llama.cpp").
    pub max_batch_same_slot: usize,
    /// The least share of a request's prompt (bytes in prefix blocks equal to the
    /// leader's, over its prompt's bytes) for it to join its cohort's batch; 0 joins
    /// whatever it shares.
    pub min_shared: f64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            window_ms: 150,
            max_hold_ms: 2_000,
            max_batch: 16,
            max_batch_pressured: 8,
            max_batch_same_slot: 16,
            min_shared: 0.5,
        }
    }
}

/// What the table needs to know about a request's prompt: the chained hashes of its
/// prefix blocks ([`cohort_fingerprint::prefix::block_hashes`]) and its length.
#[derive(Debug, Clone, Copy)]
pub struct PromptShape<'a> {
    pub blocks: &'a [u64],
    pub bytes: usize,
}

impl PromptShape<'_> {
    /// The share of this prompt's bytes in the leading blocks it has in common with
    /// `leader` (the last, partial block counts only when the prompts are identical).
    pub fn shared_with(&self, leader: &[u64]) -> f64 {
        if self.bytes == 0 {
            return 1.0;
        }
        let blocks = cohort_fingerprint::prefix::common_prefix_blocks(self.blocks, leader);
        (blocks * cohort_fingerprint::prefix::BLOCK_BYTES).min(self.bytes) as f64
            / self.bytes as f64
    }
}

/// What the table needs to know about a replica when a batch opens or grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaTraits {
    /// The replica reports KV-cache pressure.
    pub pressured: bool,
    /// How its engine lets followers reuse the leader's prefix.
    pub release: Release,
}

/// How an engine lets followers reuse their leader's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The engine caches per slot (llama.cpp): send followers at once to the leader's slot;
    /// the engine queues them behind the leader.
    SameSlot,
    /// The engine shares a block cache between concurrent requests once blocks are computed
    /// (vLLM, SGLang): hold followers until the leader's first byte.
    AfterLeaderPrefill,
}

/// A batch's identity, unique for the life of the table.
pub type BatchId = u64;

/// What the front does with a request it admitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admission {
    /// Send now; it opens `batch`.
    Lead { batch: BatchId, replica: usize },
    /// Join `batch` (send to the same replica), as member number `position` (1 = first
    /// follower).
    Follow {
        batch: BatchId,
        replica: usize,
        position: usize,
    },
    /// Send now, on its own: its cohort has an open batch, but the request shares less
    /// than `min_shared` of its prompt with that batch's leader (`shared`).
    Alone { shared: f64 },
}

#[derive(Debug)]
struct OpenBatch {
    id: BatchId,
    replica: usize,
    opened_ms: u64,
    members: usize,
    leader_prefilled: bool,
    /// The window stretches while the leader prefills (not on slot-pinned engines).
    stretches: bool,
    /// The leader's prefix block hashes, which joiners are compared with.
    leader_blocks: Vec<u64>,
}

impl OpenBatch {
    fn joinable(&self, now_ms: u64, config: &BatchConfig) -> bool {
        let age = now_ms.saturating_sub(self.opened_ms);
        age <= config.window_ms
            || (self.stretches && !self.leader_prefilled && age <= config.max_hold_ms)
    }
}

/// Open batches by cohort. One per cohort at a time; closed ones are forgotten.
#[derive(Debug, Default)]
pub struct BatchTable {
    config: BatchConfig,
    open: HashMap<u64, OpenBatch>,
    next_id: BatchId,
}

impl BatchTable {
    pub fn new(config: BatchConfig) -> BatchTable {
        BatchTable {
            config,
            open: HashMap::new(),
            next_id: 1,
        }
    }

    pub fn config(&self) -> &BatchConfig {
        &self.config
    }

    /// Admits a request of `cohort` whose prompt is `prompt`. `choose_replica` is asked
    /// only when a new batch opens (followers go where their leader went); `traits`
    /// describes a replica.
    pub fn admit(
        &mut self,
        cohort: u64,
        prompt: PromptShape<'_>,
        now_ms: u64,
        choose_replica: impl FnOnce() -> usize,
        traits: impl Fn(usize) -> ReplicaTraits,
    ) -> Admission {
        let config = self.config;
        if let Some(batch) = self.open.get_mut(&cohort) {
            let t = traits(batch.replica);
            let limit = if t.pressured {
                config.max_batch_pressured
            } else if t.release == Release::SameSlot {
                config.max_batch_same_slot
            } else {
                config.max_batch
            };
            if batch.joinable(now_ms, &config) && batch.members < limit.max(1) {
                let shared = prompt.shared_with(&batch.leader_blocks);
                if shared < config.min_shared {
                    return Admission::Alone { shared };
                }
                batch.members += 1;
                return Admission::Follow {
                    batch: batch.id,
                    replica: batch.replica,
                    position: batch.members - 1,
                };
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let replica = choose_replica();
        self.open.insert(
            cohort,
            OpenBatch {
                id,
                replica,
                opened_ms: now_ms,
                members: 1,
                leader_prefilled: false,
                stretches: traits(replica).release == Release::AfterLeaderPrefill,
                leader_blocks: prompt.blocks.to_vec(),
            },
        );
        Admission::Lead { batch: id, replica }
    }

    /// The leader of `batch` got its first response byte (or failed): its prefix is cached
    /// as far as it will be. Later joiners need not be held.
    pub fn leader_prefilled(&mut self, cohort: u64, batch: BatchId) {
        if let Some(open) = self.open.get_mut(&cohort) {
            if open.id == batch {
                open.leader_prefilled = true;
            }
        }
    }

    /// Forgets batches no one can join any more (call now and then).
    pub fn expire(&mut self, now_ms: u64) {
        let config = self.config;
        self.open.retain(|_, b| b.joinable(now_ms, &config));
    }

    /// Batches currently open for joining.
    pub fn open_batches(&self) -> usize {
        self.open.len()
    }
}

/// Which slot of a replica a batch is pinned to, for engines that cache per slot.
///
/// A slot keeps the prefix of the last prompt it ran. A batch goes to the slot that last
/// ran its cohort if there is one (its prefix is still there), however long its queue,
/// else to the slot with the fewest requests in flight, preferring the one used longest
/// ago (its prefix is the least likely to be wanted again). A queued cohort does not spill
/// onto an idle slot: on a CPU llama.cpp the slots share the same threads, so the idle slot
/// adds a prefill, not capacity (docs/DECISIONS.md, "A cohort stays on its slot on
/// llama.cpp").
#[derive(Debug, Clone)]
pub struct SlotTable {
    slots: Vec<Vec<SlotState>>,
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotState {
    cohort: Option<u64>,
    in_flight: u32,
    last_used_ms: u64,
}

impl SlotTable {
    /// `slots[r]` is replica `r`'s slot count (at least 1 each).
    pub fn new(slots: &[usize]) -> SlotTable {
        SlotTable {
            slots: slots
                .iter()
                .map(|&n| vec![SlotState::default(); n.max(1)])
                .collect(),
        }
    }

    /// Sets `replica`'s slot count once the engine reports it (llama.cpp's `/props`).
    /// Slots beyond the new count are forgotten; requests on them finish harmlessly.
    pub fn resize(&mut self, replica: usize, slots: usize) {
        if let Some(r) = self.slots.get_mut(replica) {
            r.resize(slots.max(1), SlotState::default());
        }
    }

    /// Slots of `replica`.
    pub fn slots(&self, replica: usize) -> usize {
        self.slots.get(replica).map_or(0, Vec::len)
    }

    /// Picks a slot of `replica` for a new batch of `cohort` and marks it as the cohort's.
    pub fn pick(&mut self, replica: usize, cohort: u64, now_ms: u64) -> usize {
        let Some(slots) = self.slots.get_mut(replica) else {
            return 0;
        };
        let slot = slots
            .iter()
            .position(|s| s.cohort == Some(cohort))
            .unwrap_or_else(|| {
                (0..slots.len())
                    .min_by_key(|&i| (slots[i].in_flight, slots[i].last_used_ms))
                    .unwrap_or(0)
            });
        slots[slot].cohort = Some(cohort);
        slots[slot].last_used_ms = now_ms;
        slot
    }

    /// The replica restarted or went away: its slots hold nothing any more (requests in
    /// flight keep being counted until they end).
    pub fn forget(&mut self, replica: usize) {
        if let Some(r) = self.slots.get_mut(replica) {
            r.iter_mut().for_each(|s| s.cohort = None);
        }
    }

    /// A request was sent to (`replica`, `slot`).
    pub fn started(&mut self, replica: usize, slot: usize) {
        if let Some(s) = self.slots.get_mut(replica).and_then(|r| r.get_mut(slot)) {
            s.in_flight += 1;
        }
    }

    /// A request on (`replica`, `slot`) finished.
    pub fn finished(&mut self, replica: usize, slot: usize, now_ms: u64) {
        if let Some(s) = self.slots.get_mut(replica).and_then(|r| r.get_mut(slot)) {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.last_used_ms = now_ms;
        }
    }

    /// Requests in flight on `replica`, all slots.
    pub fn in_flight(&self, replica: usize) -> u32 {
        self.slots
            .get(replica)
            .map_or(0, |r| r.iter().map(|s| s.in_flight).sum())
    }

    /// Slots of `replica` with nothing in flight.
    pub fn idle_slots(&self, replica: usize) -> usize {
        self.slots
            .get(replica)
            .map_or(0, |r| r.iter().filter(|s| s.in_flight == 0).count())
    }

    /// Whether `cohort`'s prefix was last run on a slot of `replica`.
    pub fn holds(&self, replica: usize, cohort: u64) -> bool {
        self.slots
            .get(replica)
            .is_some_and(|r| r.iter().any(|s| s.cohort == Some(cohort)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_fingerprint::prefix::BLOCK_BYTES;

    const SHARED: ReplicaTraits = ReplicaTraits {
        pressured: false,
        release: Release::AfterLeaderPrefill,
    };
    const PRESSURED: ReplicaTraits = ReplicaTraits {
        pressured: true,
        release: Release::AfterLeaderPrefill,
    };
    const SLOTS: ReplicaTraits = ReplicaTraits {
        pressured: false,
        release: Release::SameSlot,
    };

    /// A prompt of three full blocks: what every member of a cohort sends below, unless
    /// a test says otherwise.
    const SAME: PromptShape<'static> = PromptShape {
        blocks: &[11, 12, 13],
        bytes: 3 * BLOCK_BYTES,
    };

    fn table() -> BatchTable {
        BatchTable::new(BatchConfig {
            window_ms: 150,
            max_hold_ms: 1_000,
            max_batch: 3,
            max_batch_pressured: 2,
            max_batch_same_slot: 2,
            min_shared: 0.5,
        })
    }

    #[test]
    fn a_lone_request_leads_and_is_not_held() {
        let mut t = table();
        let a = t.admit(7, SAME, 0, || 2, |_| SHARED);
        assert_eq!(
            a,
            Admission::Lead {
                batch: 1,
                replica: 2
            }
        );
        // 1 req/s: each one is alone in its window and leads again.
        t.leader_prefilled(7, 1);
        let b = t.admit(7, SAME, 1_000, || 0, |_| SHARED);
        assert!(matches!(b, Admission::Lead { replica: 0, .. }));
    }

    #[test]
    fn joiners_follow_to_the_leaders_replica_up_to_max_batch() {
        let mut t = table();
        t.admit(7, SAME, 0, || 1, |_| SHARED);
        let f1 = t.admit(
            7,
            SAME,
            10,
            || panic!("followers reuse the replica"),
            |_| SHARED,
        );
        assert_eq!(
            f1,
            Admission::Follow {
                batch: 1,
                replica: 1,
                position: 1
            }
        );
        let f2 = t.admit(7, SAME, 20, || 0, |_| SHARED);
        assert!(matches!(f2, Admission::Follow { position: 2, .. }));
        // The batch is full (3): the next one leads a new batch.
        let l2 = t.admit(7, SAME, 30, || 0, |_| SHARED);
        assert!(matches!(
            l2,
            Admission::Lead {
                batch: 2,
                replica: 0
            }
        ));
        // Other cohorts are independent.
        assert!(matches!(
            t.admit(8, SAME, 30, || 2, |_| SHARED),
            Admission::Lead { .. }
        ));
    }

    #[test]
    fn the_window_stretches_while_the_leader_computes_its_prompt() {
        let mut t = table();
        t.admit(7, SAME, 0, || 0, |_| SHARED);
        // Past the 150 ms window, but the leader has not produced a byte yet.
        assert!(matches!(
            t.admit(7, SAME, 600, || 1, |_| SHARED),
            Admission::Follow { .. }
        ));
        t.leader_prefilled(7, 1);
        assert!(matches!(
            t.admit(7, SAME, 700, || 1, |_| SHARED),
            Admission::Lead { .. }
        ));
        // And never beyond max_hold_ms.
        let mut t = table();
        t.admit(7, SAME, 0, || 0, |_| SHARED);
        assert!(matches!(
            t.admit(7, SAME, 1_001, || 1, |_| SHARED),
            Admission::Lead { .. }
        ));
    }

    #[test]
    fn slot_pinned_engines_neither_stretch_nor_chain_long() {
        let mut t = table();
        t.admit(7, SAME, 0, || 0, |_| SLOTS);
        assert!(matches!(
            t.admit(7, SAME, 100, || 0, |_| SLOTS),
            Admission::Follow { .. }
        ));
        // Full at 2 on a slot-pinned engine.
        assert!(matches!(
            t.admit(7, SAME, 110, || 0, |_| SLOTS),
            Admission::Lead { batch: 2, .. }
        ));
        // Past the window with no first byte: a new batch (no stretch).
        assert!(matches!(
            t.admit(7, SAME, 300, || 0, |_| SLOTS),
            Admission::Lead { batch: 3, .. }
        ));
    }

    #[test]
    fn a_joiner_that_shares_too_little_goes_alone_and_leaves_the_batch_open() {
        let mut t = table();
        t.admit(7, SAME, 0, || 1, |_| SHARED);
        // One common block of four (a short system prompt before a long conversation).
        let long = PromptShape {
            blocks: &[11, 21, 22, 23],
            bytes: 4 * BLOCK_BYTES,
        };
        match t.admit(
            7,
            long,
            10,
            || panic!("alone uses its own hint"),
            |_| SHARED,
        ) {
            Admission::Alone { shared } => assert_eq!(shared, 0.25),
            other => panic!("{other:?}"),
        }
        // Two of three blocks and a partial fourth: 512 of 700 bytes shared, it joins.
        let close = PromptShape {
            blocks: &[11, 12, 31],
            bytes: 2 * BLOCK_BYTES + 188,
        };
        assert!(matches!(
            t.admit(7, close, 20, || 0, |_| SHARED),
            Admission::Follow {
                batch: 1,
                position: 1,
                ..
            }
        ));
        // The knob at 0 joins whatever is shared, as before it existed.
        let mut all = BatchTable::new(BatchConfig {
            min_shared: 0.0,
            ..*table().config()
        });
        all.admit(7, SAME, 0, || 1, |_| SHARED);
        assert!(matches!(
            all.admit(7, long, 10, || 0, |_| SHARED),
            Admission::Follow { .. }
        ));
    }

    #[test]
    fn shares_are_measured_in_bytes_of_common_blocks() {
        let a = PromptShape {
            blocks: &[1, 2, 3],
            bytes: 600,
        };
        assert_eq!(a.shared_with(&[1, 2, 3]), 1.0, "identical prompts");
        assert_eq!(a.shared_with(&[1, 2, 4]), 512.0 / 600.0);
        assert_eq!(a.shared_with(&[9]), 0.0);
        let empty = PromptShape {
            blocks: &[],
            bytes: 0,
        };
        assert_eq!(
            empty.shared_with(&[1]),
            1.0,
            "an empty prompt has nothing to lose"
        );
    }

    #[test]
    fn pressure_halves_the_batch() {
        let mut t = table();
        t.admit(7, SAME, 0, || 0, |_| PRESSURED);
        assert!(matches!(
            t.admit(7, SAME, 1, || 0, |_| PRESSURED),
            Admission::Follow { .. }
        ));
        assert!(matches!(
            t.admit(7, SAME, 2, || 0, |_| PRESSURED),
            Admission::Lead { .. }
        ));
    }

    #[test]
    fn expire_forgets_closed_batches_only() {
        let mut t = table();
        t.admit(1, SAME, 0, || 0, |_| SHARED);
        t.admit(2, SAME, 0, || 0, |_| SHARED);
        t.leader_prefilled(1, 1);
        t.expire(200);
        assert_eq!(t.open_batches(), 1, "cohort 2's leader is still computing");
        t.expire(1_001);
        assert_eq!(t.open_batches(), 0);
    }

    #[test]
    fn slots_follow_their_cohort_and_spread_new_ones() {
        let mut s = SlotTable::new(&[2, 3]);
        let a = s.pick(0, 100, 0);
        s.started(0, a);
        let b = s.pick(0, 200, 1);
        assert_ne!(a, b, "a busy slot is not given to a new cohort");
        s.started(0, b);
        assert_eq!(s.pick(0, 100, 2), a, "a cohort returns to its slot");
        assert_eq!(s.in_flight(0), 2);
        assert_eq!(s.idle_slots(0), 0);
        s.finished(0, a, 3);
        s.finished(0, b, 4);
        assert_eq!(s.idle_slots(0), 2);
        assert!(s.holds(0, 200));
        // A third cohort takes the slot used longest ago.
        assert_eq!(s.pick(0, 300, 5), a);
        assert!(!s.holds(0, 100));
        assert!(!s.holds(1, 100));
        // A cohort stays on its slot, queued or not; a replica that went away holds nothing.
        let mut q = SlotTable::new(&[2]);
        let held = q.pick(0, 9, 0);
        q.started(0, held);
        q.started(0, held);
        assert_eq!(q.pick(0, 9, 1), held);
        q.forget(0);
        assert!(!q.holds(0, 9));
        s.resize(1, 1);
        assert_eq!(s.slots(1), 1);
        assert_eq!(s.pick(1, 5, 6), 0);
        assert_eq!(s.pick(9, 5, 6), 0, "an unknown replica does not panic");
    }
}
