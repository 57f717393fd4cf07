//! Prefetch in assign mode, where the front sees none of the traffic.
//!
//! In assign mode the filter asks the batcher for a replica and sends the request straight
//! to it; the front, which learns cohort sequences and warms predicted cohorts in batch
//! mode ([`super::prefetch`], [`super::warm`]), never sees the request. So the gRPC service
//! tells it of every Assign, and the same model and the same engine adapters act:
//! 1. the cohort's transition is learnt (tenant, session, `x-cohort-key`), as at a leader's
//!    admission; only requests with a session (`x-cohort-session`) warm anything (in batch
//!    mode a tenant without sessions is one sequence; here, where a busy tenant's users
//!    interleave, that sequence predicts only popularity, see [`Front::assigned`]);
//! 2. a fresh warm-up of the cohort counts as a hit, an arrival with nothing held where it
//!    goes as a miss;
//! 3. the cohorts predicted next are warmed on their owners at the request's first byte,
//!    as after a leader (the filter reports it under the Assign's ticket), so a warm-up
//!    never prefills beside the request that predicted it; without progress reports
//!    (observations off), at once, and never on the replica the request was assigned to.
//!    Either way only where the batcher's in-flight count (from the same progress
//!    reports) leaves the level's idle slots and the engine's probe shows no queue;
//! 4. the front needs a body to replay: for a cohort it has none of, the Assign reply sets
//!    `exemplar_wanted`, and the filter sends that request's body on its observation
//!    (`Observation.exemplar`, at most [`cohort_proto::EXEMPLAR_MAX_BYTES`]), once.
//!
//! Batch mode's Assigns are left alone here: those requests come through the front, which
//! does all of this itself.

use super::parse::tenant_and_context;
use super::prefetch::Exemplar;
use super::warm::{Busy, LiveFleet, WarmPlan};
use super::{lock, Front};
use cohort_batcher_core::engines::{warmup_body, FrontApi};
use cohort_fingerprint::knobs::Prefetch;
use cohort_proto as pb;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The API of a request path, as the filter matches it (a suffix, query ignored).
fn api_of(path: &str) -> Option<FrontApi> {
    cohort_fingerprint::api::api_from_path(path).map(FrontApi::of)
}

impl Front {
    /// An Assign the filter made in assign mode, with the batcher's `reply` and the
    /// request's prefetch level (after the knob policy). Returns whether the front wants
    /// the request's body as its cohort's exemplar.
    /// `resident_s` is the request's cache TTL (how long a prefix it warms counts as
    /// held); `live` is the batcher's view of the fleet.
    pub fn assigned(
        self: &Arc<Self>,
        request: &pb::RequestInfo,
        reply: &pb::AssignReply,
        level: Prefetch,
        resident_s: u32,
        live: &Arc<dyn LiveFleet>,
    ) -> bool {
        if request.mode != "assign" {
            return false;
        }
        let (Some(fp), Some(replica)) = (&request.fingerprint, self.engines.position(&reply.shard))
        else {
            return false;
        };
        let now = self.clock.now_ms();
        let cohort = fp.key;
        let session = Some(request.session.as_str()).filter(|s| !s.is_empty());
        let (tenant_hash, context) = tenant_and_context(
            Some(request.tenant.as_str()).filter(|t| !t.is_empty()),
            session,
        );
        self.prefetch.observe(tenant_hash, context, cohort, now);
        let used_warmup = self.prefetch.take_warm(cohort, now).is_some();
        let known = self
            .prefetch
            .assigned(cohort, replica, used_warmup, reply.matched_blocks > 0);
        // Only a user session's sequence predicts: without one, a tenant's "sequence" is
        // its users' requests interleaved, which predicts only what is popular, and the
        // policy already keeps popular prefixes home (docs/DECISIONS.md, "Assign mode warms
        // only for requests with a user session").
        let level = if session.is_some() {
            level
        } else {
            Prefetch::None
        };
        if level == Prefetch::None {
            return false;
        }
        let mut plan = WarmPlan {
            tenant_hash,
            cohort,
            level,
            // Assign mode's requests reach the engine unsalted: so must their warm-ups.
            salt: None,
            avoid: None,
            resident_s,
        };
        if reply.ticket != 0 {
            lock(&self.first_byte_plans).put(reply.ticket, plan);
        } else {
            plan.avoid = Some(replica);
            self.warm_predicted(&plan, Busy::Live(live));
        }
        // A body is asked for only where it can arrive (the filter reports this request,
        // so it sends observations) and be replayed (an API the front speaks).
        !known && reply.ticket != 0 && api_of(&request.path).is_some()
    }

    /// The filter reported the first byte of the request assigned under `ticket`: warm
    /// what it predicted, with each replica's requests in flight.
    pub fn first_byte(self: &Arc<Self>, ticket: u64, live: &Arc<dyn LiveFleet>) {
        let plan = lock(&self.first_byte_plans).pop(&ticket);
        if let Some(plan) = plan {
            self.warm_predicted(&plan, Busy::Live(live));
        }
    }

    /// An observation that carries the body an Assign reply asked for.
    pub fn exemplar_observed(&self, observation: &pb::Observation) {
        if observation.exemplar.is_empty()
            || observation.exemplar.len() > cohort_proto::EXEMPLAR_MAX_BYTES
        {
            return;
        }
        let Some(request) = &observation.request else {
            return;
        };
        let (Some(fp), Some(api), Some(replica)) = (
            &request.fingerprint,
            api_of(&request.path),
            self.engines.position(&observation.shard),
        ) else {
            return;
        };
        let Ok(body) = serde_json::from_slice::<Map<String, Value>>(&observation.exemplar) else {
            return;
        };
        let tenant = Some(request.tenant.as_str()).filter(|t| !t.is_empty());
        let blocks = self.warmed_blocks(api, &body, tenant);
        self.prefetch.keep(
            fp.key,
            Exemplar {
                api,
                body,
                replica,
                blocks,
            },
        );
    }

    /// The prefix blocks a warm-up of `exemplar` computes that the cohort's requests share:
    /// the warm-up body's blocks, salted as the filter salts them, but its last (where the
    /// empty turn that replaces the exemplar's conversation begins). Empty when the body
    /// does not fingerprint.
    fn warmed_blocks(
        &self,
        api: FrontApi,
        exemplar: &Map<String, Value>,
        tenant: Option<&str>,
    ) -> Vec<u64> {
        let body = serde_json::to_vec(&warmup_body(api, exemplar)).unwrap_or_default();
        let request = cohort_fingerprint::Request {
            path: Some(api.path()),
            salt: cohort_fingerprint::TenantSalt::new(&self.secret, tenant),
            ..cohort_fingerprint::Request::new(&body)
        };
        let mut blocks = cohort_fingerprint::fingerprint(&request)
            .map(|fp| fp.prefix_blocks)
            .unwrap_or_default();
        blocks.pop();
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_is_the_path_suffix_as_the_filter_matches_it() {
        assert_eq!(
            api_of("/v1/chat/completions"),
            Some(FrontApi::ChatCompletions)
        );
        assert_eq!(
            api_of("/openai/v1/chat/completions?x=1"),
            Some(FrontApi::ChatCompletions)
        );
        assert_eq!(api_of("/v1/completions/"), Some(FrontApi::Completions));
        assert_eq!(api_of("/v1/messages"), Some(FrontApi::Messages));
        assert_eq!(api_of("/v1/models"), None);
    }
}
