//! What the endpoint picker (`serve/picker/`) asks of the brain besides assign mode's
//! decision: the replica set with each slot's usability, the decision restricted to the
//! slots that have an endpoint (and are in the proxy's subset hint), the alternatives the
//! proxy tries when the chosen replica refuses, a decision for a request without a
//! fingerprint (a bypass: load only), and moving a ticket to the replica that served it.
//!
//! The picker sees the request's body, so its decisions also match the prompt's block
//! keys against what the engines publish they hold (`observed`).
//!
//! Assign mode's own path ([`Brain::assign`]) is unchanged: it decides over every slot and
//! computes no alternatives.

use super::{lock, read, Brain, BrainError, Member, BYTES_PER_TOKEN};
use cohort_batcher_core::policy::{Policy, RouteRequest};
use cohort_prompt_tokens::PromptKeys;
use cohort_proto as pb;
use std::sync::atomic::Ordering;

/// A decision with where it went: the reply, the chosen slot, and the other slots the
/// decision could use in its order of preference (empty for assign mode).
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub reply: pb::AssignReply,
    pub slot: usize,
    pub alternatives: Vec<usize>,
}

/// One held slot of the replica set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    pub slot: usize,
    pub member: Member,
    /// Whether a decision now may choose it (see `Policy::usable`).
    pub usable: bool,
}

/// Whether any slot `among` marks is usable at `now_ms`.
pub(super) fn any_usable_among(policy: &Policy, among: &[bool], now_ms: u64) -> bool {
    policy
        .usable(now_ms)
        .iter()
        .zip(among)
        .any(|(&usable, &allowed)| usable && allowed)
}

impl Brain {
    /// The held slots, in slot order, with whether a decision now may choose each.
    pub fn slots(&self, now_ms: u64) -> Vec<SlotView> {
        let usable = lock(&self.policy).usable(now_ms);
        read(&self.members)
            .held()
            .map(|(slot, member)| SlotView {
                slot,
                member: member.clone(),
                usable: usable.get(slot).copied().unwrap_or(false),
            })
            .collect()
    }

    /// Assign mode's decision ([`Brain::assign_in_burst_order`]: burst order, prefix
    /// residency, cohorts, live load, health) restricted to the slots `among` marks, with
    /// the decision's alternatives. `NoReplicas` when none of them is usable.
    pub async fn pick(
        &self,
        assign: &pb::AssignRequest,
        among: &[bool],
        prompt: Option<&PromptKeys>,
    ) -> Result<Decided, BrainError> {
        if self.defers(assign, self.clock.now_ms()) {
            self.counters.burst_yields.fetch_add(1, Ordering::Relaxed);
            for _ in 0..cohort_batcher_core::policy::burst_order::DEFERRALS {
                tokio::task::yield_now().await;
            }
        }
        self.decide(assign, self.clock.now_ms(), Some(among), prompt)
    }

    /// A decision for a request without a fingerprint (the picker bypassed it) among the
    /// slots `among` marks: no prefix, no cohort, so the load model alone chooses (the
    /// least loaded). The request counts as `prompt_bytes` of work there and, with
    /// `track`, gets a ticket for its progress. Not an Assign: no audit record, no
    /// `cohort_assigns_total`.
    pub fn place(
        &self,
        prompt_bytes: u32,
        among: &[bool],
        track: bool,
        now_ms: u64,
    ) -> Result<Decided, BrainError> {
        let mut policy = lock(&self.policy);
        if !any_usable_among(&policy, among, now_ms) {
            return Err(BrainError::NoReplicas);
        }
        let choice = policy.choose_among(
            &RouteRequest {
                blocks: &[],
                cohort: None,
                similar: None,
                resident_ms: 0,
                cost: prompt_bytes / BYTES_PER_TOKEN,
                now_ms,
                track,
                observed: &[],
            },
            among,
        );
        let alternatives = policy.alternatives(choice.replica, Some(among));
        let member = read(&self.members)
            .get(choice.replica)
            .cloned()
            .ok_or(BrainError::NoReplicas)?;
        Ok(Decided {
            reply: pb::AssignReply {
                shard: member.name,
                endpoint: member.endpoint,
                reason: choice.reason.as_str().to_owned(),
                ticket: choice.ticket,
                ..Default::default()
            },
            slot: choice.replica,
            alternatives,
        })
    }

    /// `ticket`'s request was served by the replica at `slot`, not the one decided
    /// (the proxy used a fallback): its in-flight load moves there.
    pub fn moved(&self, ticket: u64, slot: usize) -> bool {
        lock(&self.policy).moved(ticket, slot, self.clock.now_ms())
    }
}
