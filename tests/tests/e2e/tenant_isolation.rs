//! Tenant isolation in batch mode, end to end: real Envoy with the real filter
//! (`istio/envoy/batch.yaml`), a real `cohort serve` with its HTTP front, and recording
//! upstreams as vLLM replicas (the adapter that sets `cache_salt`).
//!
//! The tenant comes from the mesh. In the standalone config the filter trusts the tenant
//! header (`trust_tenant_header`, as behind an authenticating filter), so the test sets it
//! the way the mesh would. Two tenants send the *same* prompt, interleaved, inside one
//! batching window:
//!
//! - their `x-cohort-key` and `x-cohort-cluster` differ (salted per tenant), and stay the
//!   same within a tenant;
//! - the engine sees a different `cache_salt` per tenant (a keyed hash, not the name), so
//!   one tenant cannot hit the other's prefix cache;
//! - each tenant's first request leads its own batch, and its later requests follow that
//!   leader, never the other tenant's (`x-cohort-batch: role;replica=`), although the other
//!   tenant's batch of the same prompt was open at the time;
//! - out-of-range knobs are clamped, counted in Envoy's stats, and the request still served.
//!
//! The same holds when the operator renames the tenant header: the filter's
//! `tenant_header` and `cohort serve`'s `tenant_header` name it the same (docs/CONTRACT.md).
//!
//! The filter's headers are read from a mirror of the front's route (the front does not
//! pass `x-cohort-*` on to engines).

use cohort_tests::client::{post_json, Response};
use cohort_tests::config::mirror_route;
use cohort_tests::eventually;
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::upstream::{Received, Upstream};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const SECRET: &str = "tenant-isolation-secret";
const TENANTS: [&str; 2] = ["tenant-a", "tenant-b"];

/// The stack with the tenant carried in `tenant_header` (filter and batcher configured
/// alike), its front's route mirrored to `tap`.
fn stack(tenant_header: &str, tap: u16) -> Stack {
    Stack::batch()
        .replicas(Replicas::Adapter("vllm"))
        // A long joining window, so every request of the test arrives while both tenants'
        // batches are open even on a slow machine: sharing a batch is then possible, and
        // only isolation prevents it.
        .serve_toml(&format!(
            "tenant_header = \"{tenant_header}\"\n[batch]\nwindow_ms = 10000\nmax_hold_ms = 10000\n"
        ))
        .batcher_args(&["--salt-secret", SECRET])
        // A generous Assign deadline: a request whose Assign times out skips batching.
        .filter(json!({
            "assign_deadline_ms": 2000,
            "trust_tenant_header": true,
            "tenant_header": tenant_header,
            "salt_secret": SECRET,
        }))
        .envoy_config(move |config, _| mirror_route(config, "batch-front-0", "tap", tap))
        .start()
}

/// The one prompt both tenants send.
fn body() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are the support assistant of Example Bank."},
            {"role": "user", "content": "How do I reset my card PIN?"},
        ],
        "max_tokens": 8,
    }))
    .unwrap()
}

/// What one request looked like at each hop.
struct Seen {
    tenant: &'static str,
    response: Response,
    /// The request as the front's route received it (the mirror).
    at_front: Received,
    /// The request as the engine received it.
    at_engine: Received,
}

impl Seen {
    fn role_and_replica(&self) -> (&str, &str) {
        self.response
            .header("x-cohort-batch")
            .and_then(|tag| tag.split_once(";replica="))
            .unwrap_or_else(|| panic!("{}: not answered by the batch front", self.tenant))
    }

    fn front_header(&self, name: &str) -> &str {
        self.at_front
            .header(name)
            .unwrap_or_else(|| panic!("{}: no {name} on the way to the front", self.tenant))
    }

    fn cache_salt(&self) -> String {
        let body: Value = serde_json::from_slice(&self.at_engine.body).unwrap();
        body["cache_salt"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no cache_salt at the engine", self.tenant))
            .to_owned()
    }
}

/// Waits until `count` requests carrying `x-test-id` arrived at `upstreams`.
fn by_test_id(upstreams: &[&Upstream], count: usize) -> BTreeMap<String, Received> {
    let mut found = BTreeMap::new();
    let arrived = eventually(Duration::from_secs(20), || {
        found = upstreams
            .iter()
            .flat_map(|u| u.received())
            .filter_map(|r| Some((r.header("x-test-id")?.to_owned(), r)))
            .collect();
        found.len() >= count
    });
    assert!(arrived, "only {} of {count} requests arrived", found.len());
    found
}

fn is_hex(value: &str, digits: usize) -> bool {
    value.len() == digits && value.bytes().all(|b| b.is_ascii_hexdigit())
}

#[test]
fn two_tenants_with_one_prompt_get_their_own_keys_cohorts_salts_and_batches() {
    isolated_under("x-cohort-tenant");
}

#[test]
fn a_renamed_tenant_header_isolates_tenants_the_same() {
    isolated_under("x-org-id");
}

fn isolated_under(tenant_header: &str) {
    // One at a time: the batches go through the front only while Envoy connects to it
    // within its 250 ms connect timeout, which a loaded machine can miss.
    let _alone = cohort_tests::one_at_a_time();
    let tap = Upstream::start("tap");
    let stack = stack(tenant_header, tap.port);
    let body = body();
    // Interleaved: a0 b0 a1 b1 a2 b2. The third pair carries out-of-range knobs.
    let mut sent = Vec::new();
    for round in 0..3 {
        for tenant in TENANTS {
            let id = format!("{tenant}-{round}");
            // No warm-ups: the engines then see only the test's own requests.
            let mut headers = vec![
                (tenant_header, tenant),
                ("x-test-id", id.as_str()),
                ("x-cohort-prefetch", "none"),
            ];
            if round == 2 {
                headers.push(("x-cohort-batch-threshold", "7"));
                headers.push(("x-cohort-cache-ttl", "99999999999999999999"));
            }
            let response = post_json(stack.port(), CHAT, &headers, &body);
            assert_eq!(response.status, 200, "{id}: {}", response.text());
            sent.push((tenant, id, response));
        }
    }
    for (_, id, response) in &sent {
        assert!(
            response.header("x-cohort-batch").is_some(),
            "{id} did not go through the batch front"
        );
    }
    let at_front = by_test_id(&[&tap], sent.len());
    let engines: Vec<&Upstream> = stack.upstreams().collect();
    let at_engine = by_test_id(&engines, sent.len());
    let seen: Vec<Seen> = sent
        .into_iter()
        .map(|(tenant, id, response)| Seen {
            tenant,
            response,
            at_front: at_front[&id].clone(),
            at_engine: at_engine[&id].clone(),
        })
        .collect();
    let of = |tenant: &'static str| seen.iter().filter(move |s| s.tenant == tenant);

    // The tenant the filter handed on is the one the mesh established.
    for s in &seen {
        assert_eq!(s.front_header(tenant_header), s.tenant);
        assert_eq!(s.front_header("x-cohort-batch"), "0");
        assert!(
            s.at_engine
                .headers
                .iter()
                .all(|(n, _)| !n.starts_with("x-cohort-") && n != tenant_header),
            "the front passes no x-cohort-* header, nor the tenant's, to the engine: {:?}",
            s.at_engine.headers
        );
    }

    // Keys: one per tenant, different between tenants.
    let keys: Vec<BTreeSet<&str>> = TENANTS
        .iter()
        .map(|t| of(t).map(|s| s.front_header("x-cohort-key")).collect())
        .collect();
    for (tenant, set) in TENANTS.iter().zip(&keys) {
        assert_eq!(set.len(), 1, "{tenant}: one prompt, one key: {set:?}");
        assert!(set.iter().all(|k| is_hex(k, 16)), "{set:?}");
    }
    assert!(
        keys[0].is_disjoint(&keys[1]),
        "tenants share a key: {keys:?}"
    );

    // Cohort ids: never shared between tenants.
    let clusters: Vec<BTreeSet<&str>> = TENANTS
        .iter()
        .map(|t| of(t).map(|s| s.front_header("x-cohort-cluster")).collect())
        .collect();
    for s in &seen {
        let cluster = s.front_header("x-cohort-cluster");
        assert!(is_hex(cluster, 8), "{cluster}");
        let response = s.response.header("x-cohort").unwrap_or_default();
        assert!(
            response.contains(&format!("cluster={cluster}")),
            "{}: the response names the cohort it was routed in: {response}",
            s.tenant
        );
    }
    assert!(
        clusters[0].is_disjoint(&clusters[1]),
        "tenants share a cohort id: {clusters:?}"
    );

    // Engine cache salts: one per tenant, different, and not the tenant's name.
    let salts: Vec<BTreeSet<String>> = TENANTS
        .iter()
        .map(|t| of(t).map(Seen::cache_salt).collect())
        .collect();
    for (tenant, set) in TENANTS.iter().zip(&salts) {
        assert_eq!(set.len(), 1, "{tenant}: {set:?}");
        let salt = set.first().unwrap();
        assert!(is_hex(salt, 64) && !salt.contains("tenant"), "{salt}");
    }
    assert!(
        salts[0].is_disjoint(&salts[1]),
        "tenants share a cache salt"
    );

    // Batches: each tenant's first request leads; the rest follow their own tenant's
    // leader on its replica. Had the tenants shared a batch key, tenant-b's first request
    // would have joined tenant-a's open batch of the same prompt as a follower.
    for tenant in TENANTS {
        let members: Vec<(&str, &str)> = of(tenant).map(Seen::role_and_replica).collect();
        assert_eq!(members[0].0, "leader", "{tenant}: {members:?}");
        let leader_replica = members[0].1;
        for (role, replica) in &members[1..] {
            assert_eq!(*role, "follower", "{tenant}: {members:?}");
            assert_eq!(*replica, leader_replica, "{tenant}: {members:?}");
        }
        for s in of(tenant) {
            assert_eq!(
                s.response.header("x-upstream"),
                Some(s.role_and_replica().1),
                "the engine that answered is the replica named"
            );
        }
    }

    // Knobs out of range: clamped and counted, the request served like the others.
    let stat = |name: &str| stack.envoy.stat(&format!("wasmcustom.{name}"));
    assert_eq!(stat("cohort_invalid_knob_batch_threshold_total"), 2);
    assert_eq!(stat("cohort_invalid_knob_cache_ttl_total"), 2);
    assert_eq!(stat("cohort_invalid_knob_total"), 4);
    assert_eq!(stat("cohort_fingerprinted_total"), 6);
}
