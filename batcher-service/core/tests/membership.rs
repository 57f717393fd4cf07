//! The policy's replica set changing at runtime (engine discovery): a replica that joins
//! is held out until its first probe answers, one that leaves is never chosen again and
//! its state is gone, replicas that stay keep theirs.

use cohort_batcher_core::policy::burst_order::Precedence;
use cohort_batcher_core::policy::{Policy, PolicyConfig, RouteRequest};

fn req(blocks: &[u64], now_ms: u64) -> RouteRequest<'_> {
    RouteRequest {
        blocks,
        cohort: None,
        similar: None,
        resident_ms: u64::MAX,
        cost: 400,
        now_ms,
        track: true,
        observed: &[],
    }
}

fn policy(replicas: usize) -> Policy {
    Policy::new(PolicyConfig {
        balance: f64::INFINITY,
        ..PolicyConfig::new(replicas, 1000)
    })
}

#[test]
fn a_joined_replica_is_chosen_only_after_its_first_probe() {
    let mut p = policy(1);
    let slot = p.join();
    assert_eq!(slot, 1);
    assert_eq!(p.replicas(), 2);
    for t in 0..50 {
        assert_eq!(p.choose(&req(&[t, t + 1000], t)).replica, 0, "unprobed");
    }
    // The only proven replica down: still not the unprobed one.
    p.probe(0, false);
    assert_eq!(p.choose(&req(&[7777], 60)).replica, 0);
    p.probe(0, true);
    p.probe(slot, true);
    let used: Vec<usize> = (100..200)
        .map(|t| p.choose(&req(&[t * 7919], t)).replica)
        .collect();
    assert!(
        used.contains(&slot),
        "the probed replica takes cold prompts"
    );
}

#[test]
fn a_left_replica_is_never_chosen_and_its_state_is_dropped() {
    let mut p = policy(3);
    let hot = [11u64, 12, 13];
    let home = p.choose(&req(&hot, 0));
    assert!(p.holds(home.replica, &hot, 1));
    p.leave(home.replica);
    assert!(!p.present(home.replica));
    assert!(!p.holds(home.replica, &hot, 1));
    // Its open ticket is gone: a late report is ignored.
    assert!(p.end(home.ticket, 200, 2).is_none());
    for t in 10..200 {
        let c = p.choose(&req(&[t * 31, t], t));
        assert_ne!(c.replica, home.replica);
    }
    let snap = p.snapshot(200);
    assert!(!snap.replicas[home.replica].present);
    assert_eq!(snap.replicas[home.replica].assigned, 0);
    assert_eq!(snap.replicas[home.replica].in_flight, 0);
    // Leaving twice, or an unknown slot, changes nothing.
    p.leave(home.replica);
    p.leave(99);
    assert_eq!(p.replicas(), 3);
}

#[test]
fn replicas_that_stay_keep_their_prefixes_and_a_vacant_slot_is_reused() {
    let mut p = policy(3);
    let a = [1u64, 2, 3];
    let b = [900u64, 901, 902];
    let ra = p.choose(&req(&a, 0)).replica;
    let mut rb = p.choose(&req(&b, 1)).replica;
    for t in 2..20 {
        if rb != ra {
            break;
        }
        rb = p.choose(&req(&[b[0] + t, b[1]], t)).replica;
    }
    let gone = (0..3).find(|&r| r != ra).unwrap_or(0);
    p.leave(gone);
    let kept = if gone == ra { None } else { Some(ra) };
    if let Some(kept) = kept {
        assert!(
            p.holds(kept, &a, 30),
            "a replica that stays keeps its prefix"
        );
        assert_eq!(p.choose(&req(&a, 31)).replica, kept);
    }
    let slot = p.join();
    assert_eq!(slot, gone, "the lowest vacant slot is reused");
    assert!(!p.holds(slot, &a, 32) && !p.holds(slot, &b, 32));
    assert!(p.present(slot));
    assert_eq!(p.replicas(), 3);
}

#[test]
fn with_no_replica_left_nothing_is_choosable_and_choosing_does_not_panic() {
    let mut p = policy(2);
    assert!(p.choosable(0));
    p.leave(0);
    p.leave(1);
    assert!(!p.choosable(0));
    let _ = p.choose(&req(&[1], 0));
    let slot = p.join();
    assert!(!p.choosable(1), "joined, not yet probed");
    p.probe(slot, true);
    assert!(p.choosable(1));
    assert_eq!(p.choose(&req(&[5], 2)).replica, slot);
}

#[test]
fn a_slot_nobody_holds_does_not_make_a_shared_prefix_look_like_a_home() {
    let mut p = policy(3);
    let trunk = [77u64, 78];
    // Every replica holds the trunk (warmed), then one leaves.
    for r in 0..3 {
        p.warmed(r, &trunk, 0, 1_000_000);
    }
    assert_eq!(p.precedence(&trunk, 1), Precedence::Anywhere);
    p.leave(1);
    assert_eq!(p.precedence(&trunk, 2), Precedence::Anywhere);
    let slot = p.join();
    assert_eq!(
        p.precedence(&trunk, 3),
        Precedence::Home,
        "the newcomer holds none of it"
    );
    assert_eq!(slot, 1);
}

#[test]
fn a_choice_among_some_slots_stays_among_them_and_ranks_the_rest() {
    let mut p = policy(4);
    let hot = [21u64, 22, 23];
    // The prefix lands on some replica; a choice that may not use it goes elsewhere.
    let home = p.choose(&req(&hot, 0)).replica;
    let mut allowed = vec![true; 4];
    allowed[home] = false;
    for t in 1..40 {
        let choice = p.choose_among(&req(&hot, t), &allowed);
        assert_ne!(choice.replica, home);
        let alternatives = p.alternatives(choice.replica, Some(&allowed));
        assert_eq!(alternatives.len(), 2);
        assert!(!alternatives.contains(&home) && !alternatives.contains(&choice.replica));
        p.end(choice.ticket, 200, t);
    }
    // Unrestricted, every other replica is an alternative.
    let choice = p.choose(&req(&[77], 50));
    let alternatives = p.alternatives(choice.replica, None);
    assert_eq!(alternatives.len(), 3);
    assert!(!alternatives.contains(&choice.replica));
    // Usability per slot: a failed probe takes one out.
    p.probe(1, false);
    assert_eq!(p.usable(60), [true, false, true, true]);
}

#[test]
fn a_moved_ticket_moves_its_load() {
    let mut p = policy(2);
    let choice = p.choose(&req(&[31], 0));
    let other = 1 - choice.replica;
    assert!(p.moved(choice.ticket, other, 1));
    let in_flight = p.in_flight();
    assert_eq!((in_flight[choice.replica], in_flight[other]), (0, 1));
    assert!(!p.moved(choice.ticket, 9, 1), "no such slot");
    assert!(p.end(choice.ticket, 200, 2).is_some());
    assert_eq!(p.in_flight(), [0, 0]);
}
