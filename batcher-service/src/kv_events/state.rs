//! What the batcher knows of one replica's KV events stream, for the inspector and
//! `/metrics`: when it last delivered, and a snapshot of its health, completeness,
//! residency size and counters ([`View`]).
//!
//! The crate's subscriber applies messages without telling the caller of each one (it
//! reports only outcomes that ask or change something), so the time of the last message is
//! learnt from the stream's counters: every payload that arrives moves one of them
//! (applied, duplicate, malformed, a replay asked for, a frame that was not a message).
//! [`Activity`] is sampled every tick; the lag it gives is exact to a tick, except for
//! live payloads held while a replay runs, which count when the replay ends (at most
//! `replay_timeout_ms` later). Pure: time is passed in, in the batcher's milliseconds.

use cohort_kv_events::replica::{Counters, ReplicaEvents};
use cohort_kv_events::subscriber::FrameCounters;
use serde::Serialize;

/// Payloads (and non-message frames) a stream has delivered so far, by its counters.
pub fn messages(counters: &Counters, frames: &FrameCounters) -> u64 {
    counters.applied
        + counters.duplicates
        + counters.malformed
        + counters.replays
        + frames.bad_live_frames
        + frames.bad_replay_frames
}

/// When a stream last delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// Messages counted at the last sample.
    seen: u64,
    /// When the count last moved, or when the stream was first followed.
    last_ms: u64,
    /// Whether any message has arrived.
    any: bool,
}

impl Activity {
    /// A stream followed from `now_ms`, silent so far.
    pub fn new(now_ms: u64) -> Activity {
        Activity {
            seen: 0,
            last_ms: now_ms,
            any: false,
        }
    }

    /// The stream has delivered `seen` messages by `now_ms`.
    pub fn observe(&mut self, seen: u64, now_ms: u64) {
        if seen != self.seen {
            self.seen = seen;
            self.last_ms = self.last_ms.max(now_ms);
            self.any = true;
        }
    }

    /// Milliseconds since the last message (since the stream was followed, if none yet).
    pub fn lag_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.last_ms)
    }

    pub fn any(&self) -> bool {
        self.any
    }
}

/// The counters shown and exported, per stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub applied: u64,
    pub duplicates: u64,
    pub replays: u64,
    pub restarts: u64,
    pub gaps_lost: u64,
    pub malformed: u64,
    pub unknown_events: u64,
    /// Frames that were not a KV events message or a replay reply.
    pub bad_frames: u64,
    /// Stored blocks skipped, by why (the residency does not hold them).
    pub skipped_block_size: u64,
    pub skipped_medium: u64,
    pub skipped_orphan: u64,
    pub skipped_sliding_window: u64,
    pub skipped_token_count: u64,
}

/// One stream at one moment: what `/ui/api/state` carries in a replica's `kv_events`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    /// `healthy`, or `degraded (silent, …)`.
    pub health: String,
    /// Whether the stream can stand for the engine's cache; decisions fall back to the
    /// modelled residency otherwise (and, until the router tokenizes prompts, always).
    pub healthy: bool,
    /// Whether the residency covers the stream since the engine started or last cleared
    /// its cache (`false` after a lost gap: it may miss blocks, never claims extra ones).
    pub complete: bool,
    /// Whether a replay is in flight.
    pub replaying: bool,
    /// Blocks the engine holds in its main tier, by its events.
    pub blocks_held: usize,
    /// Seconds since the last message (since the stream was followed, when none has
    /// arrived), to a tenth.
    pub lag_s: f64,
    /// Whether any message has arrived.
    pub messages_seen: bool,
    pub totals: Totals,
}

impl View {
    /// The snapshot of `replica` with its frame counters and activity, at `now_ms`.
    pub fn of(
        replica: &ReplicaEvents,
        frames: &FrameCounters,
        activity: &Activity,
        now_ms: u64,
    ) -> View {
        let c = replica.counters();
        let health = replica.health();
        View {
            health: health.to_string(),
            healthy: health.is_healthy(),
            complete: replica.complete(),
            replaying: replica.replaying(),
            blocks_held: replica.residency().len(),
            lag_s: (activity.lag_ms(now_ms) / 100) as f64 / 10.0,
            messages_seen: activity.any(),
            totals: Totals {
                applied: c.applied,
                duplicates: c.duplicates,
                replays: c.replays,
                restarts: c.restarts,
                gaps_lost: c.gaps_lost,
                malformed: c.malformed,
                unknown_events: c.unknown_events,
                bad_frames: frames.bad_live_frames + frames.bad_replay_frames,
                skipped_block_size: c.blocks.wrong_block_size,
                skipped_medium: c.blocks.other_medium,
                skipped_orphan: c.blocks.orphans,
                skipped_sliding_window: c.blocks.sliding_group,
                skipped_token_count: c.blocks.wrong_token_count,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_kv_events::replica::ReplicaConfig;
    use std::time::{Duration, Instant};

    #[test]
    fn activity_moves_only_when_the_count_does() {
        let mut a = Activity::new(1_000);
        assert!(!a.any());
        assert_eq!(a.lag_ms(3_500), 2_500, "silent since it was followed");
        a.observe(0, 3_500);
        assert!(!a.any());
        a.observe(2, 4_000);
        assert!(a.any());
        assert_eq!(a.lag_ms(4_000), 0);
        a.observe(2, 9_000);
        assert_eq!(a.lag_ms(9_000), 5_000, "no new message");
        a.observe(3, 9_100);
        assert_eq!(a.lag_ms(9_300), 200);
        // A sample from before the last one never moves time back.
        a.observe(4, 8_000);
        assert_eq!(a.lag_ms(9_300), 200);
    }

    #[test]
    fn the_view_reads_health_blocks_lag_and_counters() {
        let start = Instant::now();
        let mut replica = ReplicaEvents::new(&ReplicaConfig::new(16), start);
        let frames = FrameCounters {
            bad_live_frames: 1,
            ..FrameCounters::default()
        };
        let mut activity = Activity::new(0);
        let v = View::of(&replica, &frames, &activity, 1_260);
        assert_eq!(
            (v.health.as_str(), v.healthy, v.complete, v.blocks_held),
            ("healthy", true, true, 0)
        );
        assert_eq!((v.lag_s, v.messages_seen), (1.2, false));
        // A payload that does not decode: counted, degraded, the residency incomplete.
        replica.on_live(0, vec![0xc1], start);
        activity.observe(messages(replica.counters(), &frames), 1_300);
        let v = View::of(&replica, &frames, &activity, 1_300);
        assert_eq!(v.health, "degraded (malformed)");
        assert!(!v.healthy && !v.complete && v.messages_seen);
        assert_eq!((v.totals.malformed, v.totals.gaps_lost), (1, 1));
        assert_eq!(v.totals.bad_frames, 1);
        assert_eq!(messages(replica.counters(), &frames), 2);
        // Time passes with no message: silent too.
        replica.tick(start + Duration::from_secs(61));
        let v = View::of(&replica, &frames, &activity, 61_300);
        assert_eq!(v.health, "degraded (malformed, silent)");
        assert_eq!(v.lag_s, 60.0);
    }
}
