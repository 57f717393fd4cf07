//! The sequence state machine, driven with numbers: in order, gaps replayed in order,
//! repeats skipped, restarts, and gaps that cannot be replayed.

use cohort_kv_events::stream::{ResetReason, SequenceConfig, Sequencer, Step, END_OF_REPLAY};
use std::time::{Duration, Instant};

type S = Step<u64>;

fn apply(seq: u64) -> S {
    Step::Apply { seq, payload: seq }
}

fn sequencer() -> Sequencer<u64> {
    Sequencer::new(SequenceConfig::default())
}

/// Feeds live numbers 0..n.
fn live_run(s: &mut Sequencer<u64>, range: std::ops::Range<u64>, now: Instant) -> Vec<S> {
    range.flat_map(|seq| s.on_live(seq, seq, now)).collect()
}

#[test]
fn numbers_in_order_are_applied() {
    let now = Instant::now();
    let mut s = sequencer();
    assert_eq!(
        live_run(&mut s, 0..3, now),
        vec![apply(0), apply(1), apply(2)]
    );
    assert_eq!(s.next(), Some(3));
    assert!(s.complete());
}

#[test]
fn a_gap_asks_for_a_replay_from_the_first_missing_number_and_applies_it_in_order() {
    let now = Instant::now();
    let mut s = sequencer();
    live_run(&mut s, 0..3, now);
    // 3 and 4 are lost on the live stream; 5 arrives.
    assert_eq!(s.on_live(5, 5, now), vec![Step::Replay { from: 3 }]);
    assert!(s.replaying());
    // 6 arrives while the replay is in flight: held.
    assert!(s.on_live(6, 6, now).is_empty());
    // The replay sends everything from 3 on, including 5 (already held).
    let mut steps = Vec::new();
    for seq in [3, 4, 5] {
        steps.extend(s.on_replay(seq, seq));
    }
    steps.extend(s.on_replay(END_OF_REPLAY, 0));
    assert_eq!(
        steps,
        vec![
            apply(3),
            apply(4),
            apply(5),
            Step::Duplicate { seq: 5 },
            apply(6),
        ]
    );
    assert!(!s.replaying());
    assert_eq!(s.on_live(7, 7, now), vec![apply(7)]);
    assert!(s.complete());
}

#[test]
fn a_replay_that_starts_after_the_gap_loses_it_and_resyncs() {
    let now = Instant::now();
    let mut s = sequencer();
    live_run(&mut s, 0..3, now);
    assert_eq!(s.on_live(20, 20, now), vec![Step::Replay { from: 3 }]);
    // The publisher's buffer starts at 15: 3..15 are gone.
    let mut steps = s.on_replay(15, 15);
    for seq in 16..20 {
        steps.extend(s.on_replay(seq, seq));
    }
    steps.extend(s.on_replay(END_OF_REPLAY, 0));
    let mut expected = vec![
        Step::Reset(ResetReason::GapLost {
            from: 3,
            to: Some(15),
        }),
        apply(15),
    ];
    expected.extend((16..=20).map(apply));
    assert_eq!(steps, expected);
    assert!(!s.complete());
}

#[test]
fn an_empty_replay_loses_the_gap_and_resumes_from_the_held_payloads() {
    let now = Instant::now();
    let mut s = sequencer();
    live_run(&mut s, 0..2, now);
    assert_eq!(s.on_live(9, 9, now), vec![Step::Replay { from: 2 }]);
    s.on_live(10, 10, now);
    assert_eq!(
        s.on_replay(END_OF_REPLAY, 0),
        vec![
            Step::Reset(ResetReason::GapLost {
                from: 2,
                to: Some(9)
            }),
            apply(9),
            apply(10),
        ]
    );
}

#[test]
fn a_replay_that_times_out_or_cannot_be_asked_loses_the_gap() {
    let now = Instant::now();
    let config = SequenceConfig::default();
    let mut s = sequencer();
    live_run(&mut s, 0..2, now);
    s.on_live(4, 4, now);
    assert!(s.tick(now + config.replay_timeout / 2).is_empty());
    assert_eq!(
        s.tick(now + config.replay_timeout + Duration::from_millis(1)),
        vec![
            Step::Reset(ResetReason::GapLost {
                from: 2,
                to: Some(4)
            }),
            apply(4),
        ]
    );
    // A late reply is a duplicate, the end marker nothing.
    assert_eq!(s.on_replay(2, 2), vec![Step::Duplicate { seq: 2 }]);
    assert!(s.on_replay(END_OF_REPLAY, 0).is_empty());
    // No replay socket at all.
    s.on_live(7, 7, now);
    assert_eq!(
        s.replay_unavailable(),
        vec![
            Step::Reset(ResetReason::GapLost {
                from: 5,
                to: Some(7)
            }),
            apply(7),
        ]
    );
}

#[test]
fn too_many_held_payloads_give_the_replay_up() {
    let now = Instant::now();
    let mut s = Sequencer::new(SequenceConfig {
        max_held: 3,
        ..SequenceConfig::default()
    });
    s.on_live(0, 0, now);
    assert_eq!(s.on_live(2, 2, now), vec![Step::Replay { from: 1 }]);
    assert!(s.on_live(3, 3, now).is_empty());
    assert!(s.on_live(4, 4, now).is_empty());
    assert_eq!(
        s.on_live(5, 5, now),
        vec![
            Step::Reset(ResetReason::GapLost {
                from: 1,
                to: Some(2)
            }),
            apply(2),
            apply(3),
            apply(4),
            apply(5),
        ]
    );
}

#[test]
fn a_number_back_to_zero_is_a_restart() {
    let now = Instant::now();
    let mut s = sequencer();
    live_run(&mut s, 0..5, now);
    assert_eq!(
        s.on_live(0, 0, now),
        vec![Step::Reset(ResetReason::Restart), apply(0)]
    );
    assert_eq!(s.on_live(1, 1, now), vec![apply(1)]);
    // A restart in the middle of a replay abandons it.
    s.on_live(4, 4, now);
    assert!(s.replaying());
    assert_eq!(
        s.on_live(0, 0, now),
        vec![Step::Reset(ResetReason::Restart), apply(0)]
    );
    assert!(!s.replaying());
}

#[test]
fn a_number_far_below_is_a_restart_whose_start_is_replayed() {
    let now = Instant::now();
    let mut s = sequencer();
    live_run(&mut s, 0..100, now);
    // The new stream's 0..3 were missed.
    assert_eq!(
        s.on_live(3, 3, now),
        vec![Step::Reset(ResetReason::Restart), Step::Replay { from: 0 }]
    );
    let mut steps = Vec::new();
    for seq in 0..4 {
        steps.extend(s.on_replay(seq, seq));
    }
    steps.extend(s.on_replay(END_OF_REPLAY, 0));
    assert_eq!(
        steps,
        vec![
            apply(0),
            apply(1),
            apply(2),
            apply(3),
            Step::Duplicate { seq: 3 }
        ]
    );
    assert!(s.complete());
}

#[test]
fn a_number_just_below_is_a_repeat() {
    let now = Instant::now();
    let mut s = sequencer();
    live_run(&mut s, 0..10, now);
    assert_eq!(s.on_live(8, 8, now), vec![Step::Duplicate { seq: 8 }]);
    assert_eq!(s.on_live(10, 10, now), vec![apply(10)]);
}

#[test]
fn a_late_join_replays_from_zero() {
    let now = Instant::now();
    let mut s = sequencer();
    assert_eq!(s.on_live(42, 42, now), vec![Step::Replay { from: 0 }]);
    let mut steps = Vec::new();
    for seq in 0..=42 {
        steps.extend(s.on_replay(seq, seq));
    }
    steps.extend(s.on_replay(END_OF_REPLAY, 0));
    assert_eq!(steps.len(), 44);
    assert_eq!(steps[43], Step::Duplicate { seq: 42 });
    assert!(s.complete(), "the replay reached back to 0");
}
