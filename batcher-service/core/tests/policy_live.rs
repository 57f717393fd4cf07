//! The policy on the live load (progress reports arriving): adversarial load patterns.
//! Each test drives decisions and reports by hand with injected time.

use cohort_batcher_core::policy::{ChoiceReason, Policy, PolicyConfig, RouteRequest};

fn req(blocks: &[u64], cost: u32, now_ms: u64) -> RouteRequest<'_> {
    RouteRequest {
        blocks,
        cohort: None,
        similar: None,
        resident_ms: u64::MAX,
        cost,
        now_ms,
        track: true,
        observed: &[],
    }
}

fn policy(replicas: usize) -> Policy {
    Policy::new(PolicyConfig::new(replicas, 10_000))
}

/// Turns live load on: a report under a ticket of a throwaway decision.
fn go_live(p: &mut Policy, now_ms: u64) {
    let c = p.choose(&req(&[999_999], 1, now_ms));
    p.end(c.ticket, 200, now_ms);
}

#[test]
fn without_reports_the_estimate_decides_and_tickets_still_open() {
    let mut p = policy(2);
    let c = p.choose(&req(&[1, 2], 100, 0));
    assert_ne!(c.ticket, 0);
    assert!(!p.snapshot(0).live);
    assert_eq!(p.snapshot(0).replicas[c.replica].in_flight, 1);
    p.first_byte(c.ticket, 5, 5);
    assert!(p.snapshot(5).live, "a report turns live load on");
    assert!(!p.snapshot(20_000).live, "and it lapses without reports");
}

/// Forty requests of one hot app (a 4-block system prompt, cost 5000 when cold, and one
/// block of their own), none finishing: the first that moves, and the spread.
fn hot_app(live_slack: f64, live_slack_private: f64) -> (u64, [u32; 3]) {
    let mut p = Policy::new(PolicyConfig {
        live_slack,
        live_slack_private,
        ..PolicyConfig::new(3, 10_000)
    });
    go_live(&mut p, 0);
    let mut per_replica = [0u32; 3];
    let mut first_spill = None;
    for i in 0..40u64 {
        let blocks = [1, 2, 3, 4, 100 + i];
        let c = p.choose(&req(&blocks, 5000, 1 + i));
        per_replica[c.replica] += 1;
        if c.reason == ChoiceReason::LoadSpill && first_spill.is_none() {
            first_spill = Some(i);
        }
    }
    (first_spill.expect("the hot prefix spilled"), per_replica)
}

#[test]
fn one_hot_app_spills_once_its_holder_queues_more_than_a_cold_prefill() {
    // A cold prefill costs 5016 anywhere, a cached one 1016 on the holder. Request 1 would
    // wait behind request 0's cold prefill (5016) and then run its own (1016): 6032 >
    // 1.2 × 5016 on an idle replica, so it is the first to move; from then on the prefix
    // is held twice, then three times, and the work spreads.
    let (first_spill, per_replica) = hot_app(0.0, 0.0);
    assert_eq!(first_spill, 1);
    assert!(per_replica.iter().all(|&n| n >= 8), "{per_replica:?}");
    // `live_slack` 1: the holder also takes one more cold prefill's worth of queue:
    // request 0 (5016) and requests 1-5 (1016 each) queue 10096 > 1.2 × 5016 + 5016 only
    // at request 6.
    let (first_spill, _) = hot_app(1.0, 1.0);
    assert_eq!(first_spill, 6);
    // `live_slack_private` 3: request 1's prefix came with request 0 alone (private, as a
    // conversation's history), so the holder keeps it through 3 cold prefills of queue;
    // request 2's came with two (shared, slack 0): it moves.
    let (first_spill, _) = hot_app(0.0, 3.0);
    assert_eq!(first_spill, 2);
}

#[test]
fn a_burst_on_a_quiet_fleet_stays_on_its_prefix_while_it_drains() {
    // Requests of one prefix that finish before the next arrives never leave the holder:
    // its queue is empty each time, and the cached prefill is the cheapest.
    let mut p = policy(4);
    go_live(&mut p, 0);
    let first = p.choose(&req(&[7, 8, 9, 10, 11], 5000, 1));
    p.first_byte(first.ticket, 1, 2);
    p.end(first.ticket, 200, 3);
    for t in 0..30u64 {
        let c = p.choose(&req(&[7, 8, 9, 10, 11, 500 + t], 6000, 10 + t * 10));
        assert_eq!(c.replica, first.replica, "request {t}");
        assert_eq!(c.reason, ChoiceReason::Prefix);
        p.first_byte(c.ticket, 2, 12 + t * 10);
        p.end(c.ticket, 200, 15 + t * 10);
    }
    assert_eq!(p.snapshot(400).replicas[first.replica].in_flight, 0);
}

#[test]
fn a_slow_replica_gets_less_of_unrelated_traffic() {
    // Three replicas, requests with no shared prefix. Replica 0 answers its first byte
    // only after 10 decisions; the others after 1. Its queue is visible, so it gets less.
    let mut p = policy(3);
    go_live(&mut p, 0);
    let mut open: Vec<(u64, usize, u64)> = Vec::new();
    let mut per_replica = [0u32; 3];
    for i in 0..300u64 {
        let now = 10 + i;
        open.retain(|&(ticket, replica, at)| {
            let delay = if replica == 0 { 10 } else { 1 };
            if now >= at + delay {
                p.first_byte(ticket, (now - at) as u32, now);
                p.end(ticket, 200, now);
                false
            } else {
                true
            }
        });
        let c = p.choose(&req(&[10_000 + i], 1000, now));
        per_replica[c.replica] += 1;
        open.push((c.ticket, c.replica, now));
    }
    assert!(
        per_replica[0] * 2 < per_replica[1].min(per_replica[2]),
        "slow replica 0 got {per_replica:?}"
    );
}

#[test]
fn an_unavailable_replica_gets_nothing_even_when_it_holds_the_prefix() {
    let mut p = policy(3);
    go_live(&mut p, 0);
    let holder = p.choose(&req(&[1, 2, 3], 3000, 1));
    p.end(holder.ticket, 200, 2);
    p.probe(holder.replica, false);
    for t in 0..20u64 {
        let c = p.choose(&req(&[1, 2, 3, 50 + t], 4000, 10 + t));
        assert_ne!(c.replica, holder.replica);
        p.end(c.ticket, 200, 11 + t);
    }
    assert!(!p.snapshot(40).replicas[holder.replica].available);
    // The estimate (no live load) respects it too.
    let mut q = policy(2);
    q.probe(0, false);
    for t in 0..10u64 {
        assert_eq!(q.choose(&req(&[t], 100, t)).replica, 1);
    }
    // None available: decisions go on over all of them.
    q.probe(1, false);
    let c = q.choose(&req(&[77], 100, 20));
    assert!(c.replica < 2);
}

#[test]
fn an_engine_reported_queue_counts_when_the_book_shows_less() {
    // Another batcher shard's work shows only in the engine's own queue.
    let mut p = policy(2);
    go_live(&mut p, 0);
    let a = p.choose(&req(&[5, 6, 7, 8], 4000, 1));
    p.end(a.ticket, 200, 2);
    p.report_engine_queue(a.replica, 50, 3);
    let c = p.choose(&req(&[5, 6, 7, 8, 9], 5000, 4));
    assert_ne!(
        c.replica, a.replica,
        "50 queued requests outweigh the cached prefix"
    );
    p.end(c.ticket, 200, 5);
    // The report lapses after its TTL (5 s): a fresh policy where only the holder has the
    // prefix goes back to it once the report is old.
    let mut q = policy(2);
    go_live(&mut q, 0);
    let a = q.choose(&req(&[5, 6, 7, 8], 4000, 1));
    q.end(a.ticket, 200, 2);
    q.report_engine_queue(a.replica, 50, 3);
    let keep_live = q.choose(&req(&[1], 1, 5_000)).ticket;
    q.end(keep_live, 200, 5_000);
    let e = q.choose(&req(&[5, 6, 7, 8, 11], 5000, 5_004));
    assert_eq!(e.replica, a.replica);
    assert_eq!(e.reason, ChoiceReason::Prefix);
}

#[test]
fn a_new_conversation_of_an_owned_cohort_goes_by_wait_not_to_its_owner() {
    // Mooncake's shape: conversations are bare user text of one intent cohort, sharing no
    // prefix. The cohort's owner has a little queue (well within the 1.2 bound); a new
    // conversation goes to an idle replica rather than queue there: on live load the
    // expected wait ranks before ownership (on the estimate the owner would take it).
    let mut p = policy(4);
    go_live(&mut p, 0);
    let conversation = |p: &mut Policy, blocks: &[u64], now_ms| {
        p.choose(&RouteRequest {
            blocks,
            cohort: Some(7),
            similar: None,
            resident_ms: u64::MAX,
            cost: 1000,
            now_ms,
            track: true,
            observed: &[],
        })
    };
    let first = conversation(&mut p, &[1000, 2000], 1);
    p.first_byte(first.ticket, 10, 11);
    // A small request that shares the first conversation's prefix queues on the owner.
    let small = p.choose(&req(&[1000, 2000, 5], 100, 12));
    assert_eq!(small.replica, first.replica);
    // (In the same millisecond: the book drains a queue's head at the learnt rate, and at
    // about 100 work/ms the small request's 49 would be done a millisecond later.)
    let next = conversation(&mut p, &[3000, 4000], 12);
    assert_ne!(next.replica, first.replica, "not behind the owner's queue");
    assert_eq!(next.reason, ChoiceReason::LeastLoaded);
}

#[test]
fn on_an_idle_fleet_a_new_prefix_goes_where_the_cache_has_room_not_to_its_cohort_owner() {
    // The llama preset's shape: applications with their own system prompts and user
    // turns of one intent cohort, arriving one at a time on an idle fleet (every expected
    // wait equal). Each new application's prefix goes to the replica holding the fewest
    // blocks; the cohort's owner would have taken them all and thrashed its cache.
    let mut p = policy(3);
    go_live(&mut p, 0);
    let mut replicas = Vec::new();
    for app in 0..6u64 {
        let blocks: Vec<u64> = (0..4).map(|b| 1000 * (app + 1) + b).collect();
        let c = p.choose(&RouteRequest {
            blocks: &blocks,
            cohort: Some(7),
            similar: None,
            resident_ms: u64::MAX,
            cost: 1000,
            now_ms: 10 * (app + 1),
            track: true,
            observed: &[],
        });
        // It finishes before the next one arrives: the fleet is idle again.
        p.first_byte(c.ticket, 5, 10 * (app + 1) + 5);
        p.end(c.ticket, 200, 10 * (app + 1) + 6);
        replicas.push(c.replica);
    }
    let mut per_replica = [0; 3];
    for &r in &replicas {
        per_replica[r] += 1;
    }
    assert_eq!(per_replica, [2, 2, 2], "{replicas:?}");
}

#[test]
fn only_a_prompt_some_replica_holds_more_of_prefers_a_replica() {
    let mut p = policy(3);
    go_live(&mut p, 0);
    // A trunk every replica holds (a trace-wide root), and a conversation on one of them.
    for r in 0..3 {
        p.warmed(r, &[1], 1, u64::MAX);
    }
    let conversation = p.choose(&req(&[1, 50, 51], 1000, 10));
    p.end(conversation.ticket, 200, 11);
    assert!(!p.prefix_prefers_a_replica(&[7, 8], 12), "cold");
    assert!(
        !p.prefix_prefers_a_replica(&[1, 60], 12),
        "the trunk every replica holds"
    );
    assert!(
        p.prefix_prefers_a_replica(&[1, 50, 51, 52], 12),
        "the conversation's next turn"
    );
    assert!(!p.prefix_prefers_a_replica(&[], 12), "no blocks");
}

/// A burst of two on an idle fleet: a conversation's next turn (its history on one
/// replica) and a cold prompt with a long prefill. Returns (turn, cold) replicas and the
/// turn's expected wait, deciding the cold prompt first or second.
fn burst(cold_first: bool) -> (usize, usize, bool) {
    let mut p = policy(2);
    go_live(&mut p, 0);
    // The conversation's history on one replica, a bigger prefix on the other: on an idle
    // fleet the cold prompt's tie goes to the fewest blocks held, the conversation's.
    let history = p.choose(&req(&[1, 2], 1000, 1));
    p.first_byte(history.ticket, 10, 11);
    p.end(history.ticket, 200, 12);
    let other = p.choose(&req(&[100, 101, 102, 103, 104], 1000, 13));
    assert_ne!(other.replica, history.replica);
    p.first_byte(other.ticket, 10, 23);
    p.end(other.ticket, 200, 24);
    let turn_blocks = [1, 2, 3];
    let cold_blocks = [500, 501, 502, 503, 504, 505, 506, 507];
    assert!(p.prefix_prefers_a_replica(&turn_blocks, 30));
    assert!(!p.prefix_prefers_a_replica(&cold_blocks, 30));
    let (turn, cold) = if cold_first {
        let cold = p.choose(&req(&cold_blocks, 20_000, 30));
        (p.choose(&req(&turn_blocks, 1500, 30)), cold)
    } else {
        let turn = p.choose(&req(&turn_blocks, 1500, 30));
        (turn, p.choose(&req(&cold_blocks, 20_000, 30)))
    };
    (turn.replica, cold.replica, turn.replica == history.replica)
}

#[test]
fn deciding_the_turn_with_a_home_first_keeps_the_cold_prompt_off_its_holder() {
    // Cold first: the prompt takes the conversation's replica (fewest blocks), and the
    // turn then either queues behind its 20k-token prefill or leaves its history.
    let (turn, cold, home) = burst(true);
    assert!(
        turn == cold || !home,
        "cold first: turn {turn}, cold {cold}"
    );
    // Turn first (burst order): the turn takes its holder, the prompt the other replica.
    let (turn, cold, home) = burst(false);
    assert!(home, "the turn stays on its history");
    assert_ne!(turn, cold, "the cold prompt goes elsewhere");
}
