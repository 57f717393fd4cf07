//! Per-replica figures for the inspector's Replicas panel that the policy does not keep:
//! each replica's recent Assign decisions (for its share of them), its recent times to
//! first byte as the filter reports them, and its last engine probe.
//!
//! The policy keeps what decisions need (load, in-flight tickets, prefix blocks, health);
//! these figures are only shown, so they live beside it, bounded in memory and time:
//! - Assigns: a count per second over the last [`SHARE_WINDOW_S`] seconds
//!   ([`RollingCount`]), so a replica's share is of the last minute, not of all time;
//! - time to first byte: the last [`TTFT_SAMPLES`] reports, none older than
//!   [`TTFT_WINDOW_MS`] ([`TtftWindow`]), with nearest-rank quantiles ([`quantile`]);
//! - the last probe: when, and whether the replica answered.
//!
//! Keyed by policy slot, like the policy: a slot that changes hands (engine discovery)
//! starts empty ([`ReplicaStats::reset`]). Pure: time is passed in.

use std::collections::VecDeque;

/// The window of the Assign share, s.
pub const SHARE_WINDOW_S: u64 = 60;
/// First-byte reports kept per replica.
pub const TTFT_SAMPLES: usize = 512;
/// The oldest first-byte report counted, ms.
pub const TTFT_WINDOW_MS: u64 = 300_000;

/// Events counted per second over the last [`SHARE_WINDOW_S`] seconds.
#[derive(Debug, Clone)]
pub struct RollingCount {
    /// Bucket `s % SHARE_WINDOW_S` holds (second `s`, its count).
    buckets: [(u64, u64); SHARE_WINDOW_S as usize],
}

impl Default for RollingCount {
    fn default() -> Self {
        RollingCount {
            buckets: [(0, 0); SHARE_WINDOW_S as usize],
        }
    }
}

impl RollingCount {
    /// One event at `now_ms`.
    pub fn add(&mut self, now_ms: u64) {
        let second = now_ms / 1000;
        let bucket = &mut self.buckets[(second % SHARE_WINDOW_S) as usize];
        if bucket.0 != second {
            *bucket = (second, 0);
        }
        bucket.1 += 1;
    }

    /// Events in the [`SHARE_WINDOW_S`] seconds up to `now_ms` (the current second
    /// included).
    pub fn count(&self, now_ms: u64) -> u64 {
        let second = now_ms / 1000;
        self.buckets
            .iter()
            .filter(|&&(s, _)| s <= second && s + SHARE_WINDOW_S > second)
            .map(|&(_, n)| n)
            .sum()
    }
}

/// The `q` quantile (0–1) of `sorted` by nearest rank: the smallest value with at least
/// `q` of the values at or below it. `None` when empty.
pub fn quantile(sorted: &[u32], q: f64) -> Option<u32> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// p50 and p95 of a replica's recent times to first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantiles {
    pub p50_ms: u32,
    pub p95_ms: u32,
    /// Reports they were computed from.
    pub samples: usize,
}

/// A replica's recent times to first byte: at most [`TTFT_SAMPLES`], none older than
/// [`TTFT_WINDOW_MS`] when read.
#[derive(Debug, Clone, Default)]
pub struct TtftWindow {
    /// (when reported, ms; time to first byte, ms), oldest first.
    samples: VecDeque<(u64, u32)>,
}

impl TtftWindow {
    /// A first byte `ttft_ms` after its decision, reported at `now_ms`.
    pub fn record(&mut self, ttft_ms: u32, now_ms: u64) {
        while self.samples.len() >= TTFT_SAMPLES
            || self
                .samples
                .front()
                .is_some_and(|&(at, _)| at + TTFT_WINDOW_MS <= now_ms)
        {
            self.samples.pop_front();
        }
        self.samples.push_back((now_ms, ttft_ms));
    }

    /// p50 and p95 of the reports of the last [`TTFT_WINDOW_MS`] up to `now_ms`; `None`
    /// when there are none.
    pub fn quantiles(&self, now_ms: u64) -> Option<Quantiles> {
        let mut recent: Vec<u32> = self
            .samples
            .iter()
            .filter(|&&(at, _)| at + TTFT_WINDOW_MS > now_ms)
            .map(|&(_, ttft)| ttft)
            .collect();
        recent.sort_unstable();
        Some(Quantiles {
            p50_ms: quantile(&recent, 0.5)?,
            p95_ms: quantile(&recent, 0.95)?,
            samples: recent.len(),
        })
    }
}

/// A replica's last engine probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub at_ms: u64,
    /// Whether it answered (an HTTP status below 500 on its health path).
    pub up: bool,
}

#[derive(Debug, Clone, Default)]
struct SlotStats {
    assigns: RollingCount,
    ttft: TtftWindow,
    probe: Option<Probe>,
}

/// What [`ReplicaStats::figures`] reads of one slot at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Assign decisions for it in the last [`SHARE_WINDOW_S`].
    pub assigns: u64,
    pub ttft: Option<Quantiles>,
    pub probe: Option<Probe>,
}

/// The figures of every policy slot.
#[derive(Debug, Default)]
pub struct ReplicaStats {
    slots: Vec<SlotStats>,
}

impl ReplicaStats {
    fn slot(&mut self, slot: usize) -> &mut SlotStats {
        if slot >= self.slots.len() {
            self.slots.resize_with(slot + 1, SlotStats::default);
        }
        &mut self.slots[slot]
    }

    /// An Assign decision chose `slot` at `now_ms`.
    pub fn assigned(&mut self, slot: usize, now_ms: u64) {
        self.slot(slot).assigns.add(now_ms);
    }

    /// A request decided for `slot` reported its first byte `ttft_ms` after the decision.
    pub fn first_byte(&mut self, slot: usize, ttft_ms: u32, now_ms: u64) {
        self.slot(slot).ttft.record(ttft_ms, now_ms);
    }

    /// `slot`'s replica was probed at `now_ms`.
    pub fn probed(&mut self, slot: usize, up: bool, now_ms: u64) {
        self.slot(slot).probe = Some(Probe { at_ms: now_ms, up });
    }

    /// `slot` changes hands: what was known of it is forgotten.
    pub fn reset(&mut self, slot: usize) {
        if let Some(stats) = self.slots.get_mut(slot) {
            *stats = SlotStats::default();
        }
    }

    /// `slot`'s figures at `now_ms` (empty for a slot never seen).
    pub fn figures(&self, slot: usize, now_ms: u64) -> Figures {
        match self.slots.get(slot) {
            Some(s) => Figures {
                assigns: s.assigns.count(now_ms),
                ttft: s.ttft.quantiles(now_ms),
                probe: s.probe,
            },
            None => Figures {
                assigns: 0,
                ttft: None,
                probe: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rolling_count_forgets_seconds_older_than_its_window() {
        let mut c = RollingCount::default();
        assert_eq!(c.count(0), 0);
        c.add(0);
        c.add(999);
        c.add(30_500);
        assert_eq!(c.count(30_500), 3);
        // Second 0 leaves the window at 60 s, second 30 at 90 s.
        assert_eq!(c.count(59_999), 3);
        assert_eq!(c.count(60_000), 1);
        assert_eq!(c.count(89_999), 1);
        assert_eq!(c.count(90_000), 0);
        // A bucket reused a minute later starts from zero.
        c.add(60_100);
        assert_eq!(c.count(60_100), 2);
        // A reading from before its events counts none of them.
        assert_eq!(c.count(29_000), 0);
    }

    #[test]
    fn quantiles_are_by_nearest_rank() {
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[7], 0.5), Some(7));
        assert_eq!(quantile(&[7], 0.95), Some(7));
        let hundred: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&hundred, 0.5), Some(50));
        assert_eq!(quantile(&hundred, 0.95), Some(95));
        assert_eq!(quantile(&hundred, 0.0), Some(1));
        assert_eq!(quantile(&hundred, 1.0), Some(100));
        assert_eq!(quantile(&[1, 2, 3, 4], 0.5), Some(2));
        assert_eq!(quantile(&[1, 2, 3, 4], 0.95), Some(4));
    }

    #[test]
    fn the_ttft_window_keeps_the_latest_samples_within_its_age() {
        let mut w = TtftWindow::default();
        assert_eq!(w.quantiles(0), None);
        // 20 fast first bytes, then one slow one: p95 of 21 is the 20th, still fast.
        for i in 0..20 {
            w.record(10 + i, 1_000);
        }
        w.record(900, 2_000);
        let q = w.quantiles(2_000).unwrap();
        assert_eq!((q.p50_ms, q.p95_ms, q.samples), (20, 29, 21));
        // Two more slow ones: now the 95th percentile is slow.
        w.record(800, 3_000);
        w.record(700, 3_000);
        let q = w.quantiles(3_000).unwrap();
        assert_eq!((q.p50_ms, q.p95_ms, q.samples), (21, 800, 23));
        // Five minutes on, the first twenty have aged out.
        let q = w.quantiles(1_000 + TTFT_WINDOW_MS).unwrap();
        assert_eq!((q.p50_ms, q.p95_ms, q.samples), (800, 900, 3));
        assert_eq!(w.quantiles(3_000 + TTFT_WINDOW_MS), None);
        // Bounded: only the last TTFT_SAMPLES count.
        let mut w = TtftWindow::default();
        for i in 0..(TTFT_SAMPLES as u32 + 100) {
            w.record(i, 5_000);
        }
        let q = w.quantiles(5_000).unwrap();
        assert_eq!(q.samples, TTFT_SAMPLES);
        assert_eq!(q.p50_ms, 100 + TTFT_SAMPLES as u32 / 2 - 1);
        assert!(w.samples.len() <= TTFT_SAMPLES);
    }

    #[test]
    fn figures_are_per_slot_and_a_reset_slot_starts_empty() {
        let mut s = ReplicaStats::default();
        let empty = Figures {
            assigns: 0,
            ttft: None,
            probe: None,
        };
        assert_eq!(s.figures(3, 0), empty);
        s.assigned(0, 1_000);
        s.assigned(0, 1_500);
        s.assigned(2, 1_500);
        s.first_byte(2, 42, 1_600);
        s.probed(2, false, 1_700);
        assert_eq!(s.figures(0, 2_000).assigns, 2);
        assert_eq!(s.figures(1, 2_000), empty);
        let two = s.figures(2, 2_000);
        assert_eq!(two.assigns, 1);
        assert_eq!(two.ttft.map(|q| q.p50_ms), Some(42));
        assert_eq!(
            two.probe,
            Some(Probe {
                at_ms: 1_700,
                up: false
            })
        );
        s.probed(2, true, 1_800);
        assert_eq!(s.figures(2, 2_000).probe.map(|p| p.up), Some(true));
        s.reset(2);
        assert_eq!(s.figures(2, 2_000), empty);
        s.reset(9);
        assert_eq!(s.figures(0, 2_000).assigns, 2);
    }
}
