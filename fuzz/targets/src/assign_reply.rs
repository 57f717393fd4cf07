//! The batcher's `AssignReply` as the filter decodes it before its fields become request
//! headers (`x-cohort-shard`, `x-cohort-cluster`) and the `x-cohort` response header.
//!
//! Invariants: decoding is deterministic; an accepted reply's shard is a plain name, its
//! cluster and reason empty or plain, its endpoint empty or an `ip:port` — so every header written from them is visible ASCII
//! and cannot inject another header; the accepted fields re-encoded read back the same.

use crate::check::assert_visible_ascii;
use cohort_filter::batcher::read_assign_reply;
use cohort_proto::{is_plain_name, AssignReply, Message};

/// The fuzz target.
pub fn assign_reply(data: &[u8]) {
    let result = read_assign_reply(data);
    assert_eq!(result, read_assign_reply(data), "deterministic");
    let Ok(assignment) = result else {
        return;
    };
    assert!(is_plain_name(&assignment.shard), "{assignment:?}");
    assert_visible_ascii("x-cohort-shard", &assignment.shard);
    for (what, value) in [
        ("x-cohort-cluster", &assignment.cluster),
        ("reason", &assignment.reason),
    ] {
        if !value.is_empty() {
            assert!(is_plain_name(value), "{what}: {value:?}");
            assert_visible_ascii(what, value);
        }
    }
    if !assignment.endpoint.is_empty() {
        assert!(
            assignment.endpoint.parse::<std::net::SocketAddr>().is_ok(),
            "{assignment:?}"
        );
        assert_visible_ascii("x-gateway-destination-endpoint", &assignment.endpoint);
    }
    let response = format!(
        "mode=assign; cluster={}; shard={}",
        assignment.cluster, assignment.shard
    );
    assert_visible_ascii("x-cohort", &response.replace(' ', "_"));
    let encoded = AssignReply {
        shard: assignment.shard.clone(),
        cluster: assignment.cluster.clone(),
        matched_blocks: 0,
        reason: assignment.reason.clone(),
        ticket: assignment.ticket,
        exemplar_wanted: assignment.exemplar_wanted,
        inert_knobs: assignment
            .inert_knobs
            .iter()
            .map(|knob| knob.name().to_owned())
            .collect(),
        endpoint: assignment.endpoint.clone(),
    }
    .encode_to_vec();
    assert_eq!(read_assign_reply(&encoded), Ok(assignment));
}
