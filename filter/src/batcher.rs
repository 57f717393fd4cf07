//! What the filter says to the batcher and how it reads the answers, as pure functions:
//! the `cohort.v1` messages built from a fingerprint (`Assign` requests, observations,
//! progress reports and bypass audits), the batcher shard that owns a request, what an
//! `Assign` answer becomes ([`assign_outcome`]: the headers to write, the cohort and replica
//! to name, the fallback and counter on a timeout or an error, the progress ticket and the
//! exemplar), and the per-VM outbox of observations.
//!
//! The proxy-wasm calls (`dispatch_grpc_call`, `open_grpc_stream`, …) live in `http.rs` and
//! `root.rs`; everything they decide on is here and tested natively.
//!
//! **Shards.** Batchers share no state: `batcher_clusters` lists one Envoy cluster per
//! batcher shard, and a request's prefix picks its shard, for `Assign` and `Observe` alike:
//! `jump_hash(shard_key(blocks, SHARD_KEY_DEPTH))`, the chained block hash at 4 KiB. Every
//! turn of a conversation shares its first 4 KiB, so one shard sees the whole conversation;
//! different conversations spread over the shards (see `cohort_fingerprint::shard`).
//!
//! **Outbox.** Observations are fire-and-forget. HTTP contexts push them into a bounded
//! queue per shard; the root context drains the queues every tick into one long-lived
//! `Observe` stream per shard, in batches. When a stream closes, it is reopened after an
//! exponential backoff (100 ms doubling to 5 s); while it is away the queue holds up to
//! [`OUTBOX_QUEUE_LIMIT`] observations and drops the rest, counted, so requests never wait.

use crate::config::{FilterConfig, Mode};
use crate::decision::RequestPlan;
use crate::knob_effect::Knob;
use cohort_fingerprint::knobs::Prefetch as KnobPrefetch;
use cohort_fingerprint::shard::{jump_hash, shard_key, SHARD_KEY_DEPTH};
use cohort_fingerprint::sketch::{SemanticMode as CoreMode, SKETCH_VERSION};
use cohort_fingerprint::Fingerprint;
use cohort_proto as pb;
use pb::is_plain_name;
use std::collections::VecDeque;

/// Observations held per shard while its stream is away.
pub const OUTBOX_QUEUE_LIMIT: usize = 4096;
/// Observations per `ObservationBatch` message.
pub const OUTBOX_BATCH_LIMIT: usize = 256;
const BACKOFF_START_MS: u64 = 100;
const BACKOFF_MAX_MS: u64 = 5_000;
/// A stream that lived this long before closing was healthy: the next retry starts fast.
const HEALTHY_STREAM_MS: u64 = 1_000;

/// Index into `batcher_clusters` of the shard that owns this request, if any are configured.
pub fn shard_index(config: &FilterConfig, fingerprint: &Fingerprint) -> Option<usize> {
    let shards = config.batcher_clusters.len();
    if shards == 0 {
        return None;
    }
    let key = shard_key(&fingerprint.prefix_blocks, SHARD_KEY_DEPTH);
    Some(jump_hash(key, shards as u32) as usize)
}

fn proto_fingerprint(fp: &Fingerprint) -> pb::Fingerprint {
    let sketch = if fp.intent.sketch.is_zero() {
        Vec::new()
    } else {
        fp.intent.sketch.0.iter().map(|&v| v as u8).collect()
    };
    pb::Fingerprint {
        key: fp.routing_key.0,
        prefix: fp.stable_prefix,
        blocks: fp.prefix_blocks.clone(),
        sketch,
        sketch_version: SKETCH_VERSION,
        semantic_mode: match fp.semantic_mode {
            CoreMode::Intent => pb::SemanticMode::Intent,
            CoreMode::Topic => pb::SemanticMode::Topic,
            CoreMode::Hybrid => pb::SemanticMode::Hybrid,
        } as i32,
        prompt_bytes: u32::try_from(fp.prompt_bytes).unwrap_or(u32::MAX),
        block_bytes: cohort_fingerprint::prefix::BLOCK_BYTES as u32,
    }
}

fn proto_knobs(plan: &RequestPlan) -> pb::Knobs {
    let knobs = &plan.knobs.knobs;
    pb::Knobs {
        batch_threshold: knobs.batch_threshold,
        cache_ttl_s: knobs.cache_ttl_s,
        prefetch: match knobs.prefetch {
            KnobPrefetch::None => pb::Prefetch::None,
            KnobPrefetch::Low => pb::Prefetch::Low,
            KnobPrefetch::Medium => pb::Prefetch::Medium,
            KnobPrefetch::High => pb::Prefetch::High,
        } as i32,
    }
}

/// What Assign and Observe both say about a request.
fn request_info(plan: &RequestPlan, fp: &Fingerprint) -> pb::RequestInfo {
    pb::RequestInfo {
        fingerprint: Some(proto_fingerprint(fp)),
        knobs: Some(proto_knobs(plan)),
        tenant: plan.tenant.clone().unwrap_or_default(),
        session: plan.session.clone().unwrap_or_default(),
        path: plan.path.clone(),
        model: fp.model.clone(),
        request_id: plan.request_id.clone().unwrap_or_default(),
        mode: String::new(),
        authority: plan.authority.clone(),
    }
}

/// The `Assign` request for a fingerprinted request.
/// The Assign call for a fingerprinted request; `reports_progress` when the filter will
/// report its first byte and end (assign mode with observations on).
pub fn assign_request(
    plan: &RequestPlan,
    fp: &Fingerprint,
    mode: Mode,
    now_ms: u64,
    reports_progress: bool,
) -> pb::AssignRequest {
    let mut request = request_info(plan, fp);
    request.mode = mode.as_str().to_owned();
    pb::AssignRequest {
        request: Some(request),
        sent_unix_ms: now_ms,
        reports_progress,
    }
}

/// The observation of a request as it was routed (`shard` when the batcher assigned one).
pub fn observation(
    plan: &RequestPlan,
    fp: &Fingerprint,
    mode: Mode,
    shard: Option<&str>,
    now_ms: u64,
) -> pb::Observation {
    pb::Observation {
        request: Some(request_info(plan, fp)),
        observed_unix_ms: now_ms,
        shard: shard.unwrap_or_default().to_owned(),
        mode: mode.as_str().to_owned(),
        progress: None,
        bypass: String::new(),
        exemplar: Vec::new(),
    }
}

/// A request the filter passed through, for the batcher's audit: who, where, and why.
pub fn bypass_observation(
    plan: &RequestPlan,
    mode: Mode,
    reason: &str,
    now_ms: u64,
) -> pb::Observation {
    pb::Observation {
        request: Some(pb::RequestInfo {
            tenant: plan.tenant.clone().unwrap_or_default(),
            path: plan.path.clone(),
            request_id: plan.request_id.clone().unwrap_or_default(),
            mode: mode.as_str().to_owned(),
            ..Default::default()
        }),
        observed_unix_ms: now_ms,
        mode: mode.as_str().to_owned(),
        bypass: reason.to_owned(),
        ..Default::default()
    }
}

/// The batcher shard that keeps a bypassed request's audit record: jump hash of its
/// request id (it has no fingerprint to pick a shard by).
pub fn bypass_shard(config: &FilterConfig, request_id: &str) -> Option<usize> {
    let n = config.batcher_clusters.len();
    (n > 0).then(|| jump_hash(xxhash_rust::xxh3::xxh3_64(request_id.as_bytes()), n as u32) as usize)
}

/// An assigned request's progress (first byte or end), reported under the batcher's
/// `ticket` so it can count exactly what each replica has in flight.
pub fn progress_observation(
    ticket: u64,
    phase: pb::request_progress::Phase,
    status: u32,
    elapsed_ms: u32,
    shard: &str,
    now_ms: u64,
) -> pb::Observation {
    pb::Observation {
        request: None,
        observed_unix_ms: now_ms,
        shard: shard.to_owned(),
        mode: Mode::Assign.as_str().to_owned(),
        progress: Some(pb::RequestProgress {
            ticket,
            phase: phase as i32,
            status,
            elapsed_ms,
        }),
        bypass: String::new(),
        exemplar: Vec::new(),
    }
}

/// An `AssignReply` the filter will not put into headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("the reply is not a cohort.v1.AssignReply")]
    Undecodable,
    #[error("the reply's shard {0:?} is not a plain replica name")]
    BadShard(String),
    #[error("the reply's cluster {0:?} is not a plain cohort id")]
    BadCluster(String),
    #[error("the reply's endpoint {0:?} is not an ip:port")]
    BadEndpoint(String),
}

/// The batcher's decision, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub shard: String,
    /// The replica's `ip:port` (empty when the batcher knows none).
    pub endpoint: String,
    /// Empty when the batcher put the request in no cohort (then the filter's stays).
    pub cluster: String,
    pub reason: String,
    /// The decision's id for progress reports (0: the batcher wants none).
    pub ticket: u64,
    /// The batcher wants the body as its cohort's warm-up exemplar (assign mode).
    pub exemplar_wanted: bool,
    /// Knobs the batcher cannot act on where it runs (names it sent that the filter does
    /// not know are dropped).
    pub inert_knobs: Vec<Knob>,
}

/// Decodes and checks an `AssignReply`.
pub fn read_assign_reply(bytes: &[u8]) -> Result<Assignment, ReplyError> {
    use prost::Message;
    let reply = pb::AssignReply::decode(bytes).map_err(|_| ReplyError::Undecodable)?;
    if !is_plain_name(&reply.shard) {
        return Err(ReplyError::BadShard(reply.shard));
    }
    if !reply.cluster.is_empty() && !is_plain_name(&reply.cluster) {
        return Err(ReplyError::BadCluster(reply.cluster));
    }
    if !reply.endpoint.is_empty() && reply.endpoint.parse::<std::net::SocketAddr>().is_err() {
        return Err(ReplyError::BadEndpoint(reply.endpoint));
    }
    let reason = if is_plain_name(&reply.reason) {
        reply.reason
    } else {
        String::new()
    };
    Ok(Assignment {
        shard: reply.shard,
        endpoint: reply.endpoint,
        cluster: reply.cluster,
        reason,
        ticket: reply.ticket,
        exemplar_wanted: reply.exemplar_wanted,
        inert_knobs: reply
            .inert_knobs
            .iter()
            .filter_map(|name| Knob::from_name(name))
            .collect(),
    })
}

/// gRPC status DEADLINE_EXCEEDED, which Envoy reports when the Assign deadline passes.
pub const GRPC_DEADLINE_EXCEEDED: u32 = 4;

/// How an `Assign` call ended, as the host reported it.
#[derive(Debug, Clone, Copy)]
pub struct AssignAnswer<'a> {
    /// The call's gRPC status (0: OK).
    pub grpc_status: u32,
    /// The reply's bytes; read only when `grpc_status` is 0.
    pub reply: &'a [u8],
    /// From dispatching the call to its answer.
    pub elapsed_us: u64,
}

/// Why an assigned request stayed routed by key (affinity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignFallback {
    /// Envoy's deadline passed, or the call failed only after most of it.
    Timeout,
    /// The call failed, or its reply was unusable.
    Error,
}

impl AssignFallback {
    /// The name in the response header (`fallback=…`).
    pub fn as_str(self) -> &'static str {
        match self {
            AssignFallback::Timeout => "timeout",
            AssignFallback::Error => "error",
        }
    }
}

/// The `cohort_assign_*` counter an answer bumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignCounter {
    Ok,
    Timeout,
    Error,
}

/// What an `Assign` answer does to its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignOutcome {
    /// Request headers to write, in order, before routing again; empty on a fallback.
    pub headers: Vec<(String, String)>,
    /// The cohort for the response header: the batcher's when it named one, else the key's.
    pub cluster: String,
    /// The replica the batcher assigned; `None` on a fallback.
    pub shard: Option<String>,
    /// Why the request stays routed by key; `None` when it was assigned.
    pub fallback: Option<AssignFallback>,
    /// The ticket to report the request's progress under (observations on, and the
    /// batcher asked for progress).
    pub progress_ticket: Option<u64>,
    /// Whether the kept body goes to the batcher as its cohort's exemplar.
    pub send_exemplar: bool,
    /// Knobs the batcher said it cannot act on (empty on a fallback).
    pub inert_knobs: Vec<Knob>,
}

impl AssignOutcome {
    /// A request left routed by key (cohort `key_cluster`) for `why`.
    pub fn fell_back(key_cluster: &str, why: AssignFallback) -> AssignOutcome {
        AssignOutcome {
            headers: Vec::new(),
            cluster: key_cluster.to_owned(),
            shard: None,
            fallback: Some(why),
            progress_ticket: None,
            send_exemplar: false,
            inert_knobs: Vec::new(),
        }
    }

    /// The counter this outcome bumps.
    pub fn counter(&self) -> AssignCounter {
        match self.fallback {
            None => AssignCounter::Ok,
            Some(AssignFallback::Timeout) => AssignCounter::Timeout,
            Some(AssignFallback::Error) => AssignCounter::Error,
        }
    }
}

/// Decides what an `Assign` answer becomes: the headers to write and the outcome to record.
///
/// `key_cluster` is the cohort the request was routed by before it asked; `shard_index` is
/// its batcher shard; `kept_body` is the body kept for a possible exemplar (empty where it
/// cannot become one).
///
/// A failed call is a timeout when Envoy says DEADLINE_EXCEEDED or when it took three
/// quarters of the deadline or more (Envoy arms its timers from the event loop's cached
/// time, so a busy loop fires them a few milliseconds early; a batcher that is down fails
/// within a millisecond); any other failure, and a reply that is undecodable or names a
/// replica or cohort that is not a plain name, is an error. An assigned request gets
/// `x-cohort-shard`, and in assign mode the endpoint header when the batcher named the
/// replica's `ip:port`; in batch mode also the batch header (its batcher shard index), the
/// prefetch header when a knob policy set the level, and the tenant header; and the cluster
/// header when the batcher put it in a cohort.
pub fn assign_outcome(
    config: &FilterConfig,
    plan: &RequestPlan,
    key_cluster: &str,
    shard_index: usize,
    answer: AssignAnswer<'_>,
    kept_body: &[u8],
) -> AssignOutcome {
    let fallback = |why| AssignOutcome::fell_back(key_cluster, why);
    if answer.grpc_status != 0 {
        let deadline_us = config.assign_deadline_ms.saturating_mul(1000);
        let took_the_deadline =
            answer.elapsed_us.saturating_mul(4) >= deadline_us.saturating_mul(3);
        // Envoy reports its own Assign timeout as DEADLINE_EXCEEDED; any other failure
        // that took the whole deadline is a timeout too (a frozen or overloaded batcher).
        if answer.grpc_status == GRPC_DEADLINE_EXCEEDED || took_the_deadline {
            return fallback(AssignFallback::Timeout);
        }
        log::debug!(
            "cohort: Assign failed with grpc status {}",
            answer.grpc_status
        );
        return fallback(AssignFallback::Error);
    }
    let assignment = match read_assign_reply(answer.reply) {
        Ok(assignment) => assignment,
        Err(e) => {
            log::debug!("cohort: {e}");
            return fallback(AssignFallback::Error);
        }
    };
    let mut headers = vec![(config.headers.shard.clone(), assignment.shard.clone())];
    if config.mode == Mode::Assign && !assignment.endpoint.is_empty() {
        headers.push((config.headers.endpoint.clone(), assignment.endpoint.clone()));
    }
    if config.mode == Mode::Batch {
        headers.push((config.headers.batch.clone(), shard_index.to_string()));
        // With a knob policy, the front warms predicted cohorts at the level it let this
        // request have, not at whatever the client sent (without one, the front applies
        // its own `[knobs]` to the client's header).
        if config.has_knob_policy() {
            headers.push((
                config.headers.prefetch.clone(),
                plan.knobs.knobs.prefetch.as_str().to_owned(),
            ));
        }
        // The front salts engine caches per tenant (vLLM `cache_salt`): hand it the tenant
        // the mesh established (a client's value was removed).
        if let Some(tenant) = &plan.tenant {
            headers.push((config.tenant_header.clone(), tenant.clone()));
        }
    }
    let cluster = if assignment.cluster.is_empty() {
        key_cluster.to_owned()
    } else {
        headers.push((config.headers.cluster.clone(), assignment.cluster.clone()));
        assignment.cluster
    };
    AssignOutcome {
        headers,
        cluster,
        progress_ticket: (config.observe && assignment.ticket != 0).then_some(assignment.ticket),
        send_exemplar: assignment.exemplar_wanted && !kept_body.is_empty(),
        inert_knobs: assignment.inert_knobs,
        shard: Some(assignment.shard),
        fallback: None,
    }
}

/// Whether a shard's `Observe` stream is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Closed { retry_at_ms: u64, backoff_ms: u64 },
    Open { token: u32, opened_at_ms: u64 },
}

/// The queue and stream state of one batcher shard.
#[derive(Debug)]
struct ShardOutbox {
    pending: VecDeque<pb::Observation>,
    /// Dropped since the last batch that went out (reported in that batch).
    dropped_unreported: u64,
    stream: Stream,
}

/// What the root context should do for a shard on this tick.
#[derive(Debug, PartialEq)]
pub enum Flush {
    /// Nothing to send, or waiting out a backoff.
    Idle,
    /// Open a stream to this shard, then call [`Outbox::opened`] or [`Outbox::closed`].
    Open,
    /// Send these batches on the open stream `token`.
    Send {
        token: u32,
        batches: Vec<pb::ObservationBatch>,
    },
}

/// The per-VM observation outbox (see the module doc).
#[derive(Debug)]
pub struct Outbox {
    shards: Vec<ShardOutbox>,
}

impl Outbox {
    pub fn new(shards: usize) -> Outbox {
        Outbox {
            shards: (0..shards)
                .map(|_| ShardOutbox {
                    pending: VecDeque::new(),
                    dropped_unreported: 0,
                    stream: Stream::Closed {
                        retry_at_ms: 0,
                        backoff_ms: BACKOFF_START_MS,
                    },
                })
                .collect(),
        }
    }

    /// Queues an observation; false (and counted in the next batch) when the queue is full.
    pub fn push(&mut self, shard: usize, observation: pb::Observation) -> bool {
        let Some(outbox) = self.shards.get_mut(shard) else {
            return false;
        };
        if outbox.pending.len() >= OUTBOX_QUEUE_LIMIT {
            outbox.dropped_unreported += 1;
            return false;
        }
        outbox.pending.push_back(observation);
        true
    }

    /// Observations waiting for a shard.
    pub fn pending(&self, shard: usize) -> usize {
        self.shards.get(shard).map_or(0, |s| s.pending.len())
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Decides this tick's work for a shard; taking batches removes them from the queue.
    pub fn flush(&mut self, shard: usize, now_ms: u64) -> Flush {
        let Some(outbox) = self.shards.get_mut(shard) else {
            return Flush::Idle;
        };
        if outbox.pending.is_empty() {
            return Flush::Idle;
        }
        match outbox.stream {
            Stream::Closed { retry_at_ms, .. } if now_ms >= retry_at_ms => Flush::Open,
            Stream::Closed { .. } => Flush::Idle,
            Stream::Open { token, .. } => {
                let mut batches = Vec::new();
                while !outbox.pending.is_empty() {
                    let take = outbox.pending.len().min(OUTBOX_BATCH_LIMIT);
                    batches.push(pb::ObservationBatch {
                        observations: outbox.pending.drain(..take).collect(),
                        dropped: std::mem::take(&mut outbox.dropped_unreported),
                    });
                }
                Flush::Send { token, batches }
            }
        }
    }

    /// The stream to `shard` was opened as `token`.
    pub fn opened(&mut self, shard: usize, token: u32, now_ms: u64) {
        if let Some(outbox) = self.shards.get_mut(shard) {
            outbox.stream = Stream::Open {
                token,
                opened_at_ms: now_ms,
            };
        }
    }

    /// The stream with `token` closed (or could not be opened for `shard` when `token` is
    /// `None`); returns its shard. Schedules the next attempt.
    pub fn closed(&mut self, shard_or_token: Closed, now_ms: u64) -> Option<usize> {
        let index = match shard_or_token {
            Closed::Shard(shard) => shard,
            Closed::Token(token) => self
                .shards
                .iter()
                .position(|s| matches!(s.stream, Stream::Open { token: t, .. } if t == token))?,
        };
        let outbox = self.shards.get_mut(index)?;
        let backoff_ms = match outbox.stream {
            Stream::Open { opened_at_ms, .. }
                if now_ms.saturating_sub(opened_at_ms) >= HEALTHY_STREAM_MS =>
            {
                BACKOFF_START_MS
            }
            Stream::Open { .. } => BACKOFF_START_MS * 2,
            Stream::Closed { backoff_ms, .. } => (backoff_ms * 2).min(BACKOFF_MAX_MS),
        };
        outbox.stream = Stream::Closed {
            retry_at_ms: now_ms + backoff_ms,
            backoff_ms,
        };
        Some(index)
    }

    /// A batch could not be sent: count its observations as dropped.
    pub fn lost(&mut self, shard: usize, observations: u64) {
        if let Some(outbox) = self.shards.get_mut(shard) {
            outbox.dropped_unreported += observations;
        }
    }
}

/// Which stream closed: known by shard (an open that failed) or by stream token.
#[derive(Debug, Clone, Copy)]
pub enum Closed {
    Shard(usize),
    Token(u32),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{inspect_headers, route_body, HeadersVerdict};

    fn fingerprinted(config: &FilterConfig, body: &str) -> (RequestPlan, Fingerprint) {
        let headers: Vec<(String, String)> = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("x-cohort-session", "s-1"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        let HeadersVerdict::Buffer(plan) = inspect_headers(config, &headers, Some("tenant-a"))
        else {
            panic!("not buffered")
        };
        let routing = route_body(config, &plan, body.as_bytes()).unwrap();
        (*plan, routing.fingerprint)
    }

    const BODY: &str = r#"{"model":"m","messages":[{"role":"system","content":"You are a bank."},{"role":"user","content":"How do I reset my PIN?"}]}"#;

    #[test]
    fn assign_request_carries_the_fingerprint() {
        let config = FilterConfig::default();
        let (plan, fp) = fingerprinted(&config, BODY);
        let assign = assign_request(&plan, &fp, Mode::Assign, 1234, true);
        assert_eq!(assign.sent_unix_ms, 1234);
        assert!(assign.reports_progress);
        assert!(!assign_request(&plan, &fp, Mode::Assign, 1234, false).reports_progress);
        let request = assign.request.unwrap();
        let wire = request.fingerprint.as_ref().unwrap();
        assert_eq!(wire.key, fp.routing_key.0);
        assert_eq!(wire.blocks, fp.prefix_blocks);
        assert_eq!(wire.sketch.len(), 32);
        assert_eq!(wire.sketch_version, SKETCH_VERSION);
        assert_eq!(request.tenant, "tenant-a");
        assert_eq!(request.session, "s-1");
        assert_eq!(request.model, "m");
        let knobs = request.knobs.unwrap();
        assert_eq!(knobs.cache_ttl_s, 600);
        assert_eq!(knobs.prefetch, pb::Prefetch::Medium as i32);
    }

    #[test]
    fn a_request_without_intent_text_sends_no_sketch() {
        let config = FilterConfig::default();
        let (plan, fp) = fingerprinted(
            &config,
            r#"{"model":"m","messages":[{"role":"system","content":"You are a bank."}]}"#,
        );
        let observation = observation(&plan, &fp, Mode::Affinity, None, 1);
        assert!(observation
            .request
            .unwrap()
            .fingerprint
            .unwrap()
            .sketch
            .is_empty());
        assert_eq!(observation.mode, "affinity");
    }

    #[test]
    fn shards_split_keys_and_agree_with_jump_hash() {
        let mut config = FilterConfig::default();
        assert!(config.batcher_clusters.is_empty(), "no batcher by default");
        let (_, fp) = fingerprinted(&config, BODY);
        assert_eq!(shard_index(&config, &fp), None);
        config.batcher_clusters = vec!["a".into()];
        assert_eq!(shard_index(&config, &fp), Some(0));
        config.batcher_clusters = vec!["a".into(), "b".into(), "c".into()];
        let index = shard_index(&config, &fp).unwrap();
        let key = shard_key(&fp.prefix_blocks, SHARD_KEY_DEPTH);
        assert_eq!(index as u32, jump_hash(key, 3));
    }

    #[test]
    fn replies_are_checked_before_they_become_headers() {
        use prost::Message;
        let encode = |shard: &str, cluster: &str| {
            pb::AssignReply {
                shard: shard.into(),
                cluster: cluster.into(),
                matched_blocks: 3,
                reason: "prefix".into(),
                ticket: 77,
                exemplar_wanted: true,
                inert_knobs: vec!["session".into(), "no-such-knob".into()],
                endpoint: "10.0.0.7:8000".into(),
            }
            .encode_to_vec()
        };
        let ok = read_assign_reply(&encode("replica-1", "0000002a")).unwrap();
        assert_eq!(ok.ticket, 77, "the ticket comes back for progress reports");
        assert_eq!(
            ok.inert_knobs,
            [Knob::Session],
            "unknown knob names are dropped"
        );
        assert_eq!(ok.shard, "replica-1");
        assert_eq!(ok.cluster, "0000002a");
        assert_eq!(ok.reason, "prefix");
        assert_eq!(ok.endpoint, "10.0.0.7:8000");
        assert!(ok.exemplar_wanted);
        for endpoint in [
            "10.0.0.7",
            "pod-0:8000",
            "10.0.0.7:8000\r\nx-evil: 1",
            "[::1]:99999",
        ] {
            let bad = pb::AssignReply {
                shard: "r1".into(),
                endpoint: endpoint.into(),
                ..Default::default()
            }
            .encode_to_vec();
            assert_eq!(
                read_assign_reply(&bad),
                Err(ReplyError::BadEndpoint(endpoint.into()))
            );
        }
        assert!(matches!(
            read_assign_reply(&encode("", "x")),
            Err(ReplyError::BadShard(_))
        ));
        assert!(matches!(
            read_assign_reply(&encode("r1\r\nx-evil: 1", "")),
            Err(ReplyError::BadShard(_))
        ));
        assert!(matches!(
            read_assign_reply(&encode("r1", "a b")),
            Err(ReplyError::BadCluster(_))
        ));
        assert_eq!(
            read_assign_reply(&[0xff, 0xff, 0xff]),
            Err(ReplyError::Undecodable)
        );
    }

    #[test]
    fn progress_reports_name_the_ticket_and_the_replica() {
        let o = progress_observation(9, pb::request_progress::Phase::End, 503, 120, "r2", 5);
        assert!(o.request.is_none());
        assert_eq!(o.shard, "r2");
        let p = o.progress.unwrap();
        assert_eq!((p.ticket, p.status, p.elapsed_ms), (9, 503, 120));
        assert_eq!(p.phase(), pb::request_progress::Phase::End);
    }

    const KEY_CLUSTER: &str = "key-cohort";

    fn parsed(json: &str) -> FilterConfig {
        FilterConfig::parse(json.as_bytes()).unwrap()
    }

    fn assign_config() -> FilterConfig {
        parsed(r#"{"mode":"assign","batcher_clusters":["b0","b1"]}"#)
    }

    fn batch_config() -> FilterConfig {
        parsed(r#"{"mode":"batch","batcher_clusters":["b0","b1"]}"#)
    }

    fn reply(shard: &str, cluster: &str, ticket: u64, exemplar_wanted: bool) -> Vec<u8> {
        prost::Message::encode_to_vec(&pb::AssignReply {
            shard: shard.into(),
            cluster: cluster.into(),
            matched_blocks: 3,
            reason: "prefix".into(),
            ticket,
            exemplar_wanted,
            inert_knobs: Vec::new(),
            endpoint: String::new(),
        })
    }

    fn answered(reply: &[u8]) -> AssignAnswer<'_> {
        AssignAnswer {
            grpc_status: 0,
            reply,
            elapsed_us: 1_000,
        }
    }

    fn failed(grpc_status: u32, elapsed_us: u64) -> AssignAnswer<'static> {
        AssignAnswer {
            grpc_status,
            reply: &[],
            elapsed_us,
        }
    }

    /// The outcome of `answer` for BODY's plan under `config`, at batcher shard 1.
    fn outcome(config: &FilterConfig, answer: AssignAnswer<'_>) -> AssignOutcome {
        let (plan, _) = fingerprinted(config, BODY);
        assign_outcome(config, &plan, KEY_CLUSTER, 1, answer, BODY.as_bytes())
    }

    fn header<'a>(outcome: &'a AssignOutcome, name: &str) -> Option<&'a str> {
        outcome
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A fallback: routed by key, nothing written, nothing reported.
    fn assert_fell_back(outcome: &AssignOutcome, why: AssignFallback) {
        assert_eq!(outcome.fallback, Some(why), "{outcome:?}");
        assert!(outcome.headers.is_empty(), "{outcome:?}");
        assert_eq!(outcome.shard, None);
        assert_eq!(outcome.cluster, KEY_CLUSTER);
        assert_eq!(outcome.progress_ticket, None);
        assert!(!outcome.send_exemplar);
    }

    #[test]
    fn deadline_exceeded_and_slow_failures_are_timeouts() {
        let config = assign_config();
        assert_eq!(config.assign_deadline_ms, 25);
        let timeout = outcome(&config, failed(GRPC_DEADLINE_EXCEEDED, 1_000));
        assert_fell_back(&timeout, AssignFallback::Timeout);
        assert_eq!(timeout.counter(), AssignCounter::Timeout);
        assert_eq!(AssignFallback::Timeout.as_str(), "timeout");
        // UNAVAILABLE after three quarters of the 25 ms deadline counts as the deadline.
        let slow = outcome(&config, failed(14, 18_750));
        assert_fell_back(&slow, AssignFallback::Timeout);
        assert_eq!(slow.counter(), AssignCounter::Timeout);
    }

    #[test]
    fn assign_mode_writes_the_replica_endpoint_for_override_host() {
        let with_endpoint = prost::Message::encode_to_vec(&pb::AssignReply {
            shard: "llm-engine-2".into(),
            endpoint: "10.1.2.3:8000".into(),
            ..Default::default()
        });
        let config = assign_config();
        let o = outcome(&config, answered(&with_endpoint));
        assert_eq!(header(&o, "x-cohort-shard"), Some("llm-engine-2"));
        assert_eq!(
            header(&o, "x-gateway-destination-endpoint"),
            Some("10.1.2.3:8000")
        );
        let renamed =
            parsed(r#"{"mode":"assign","batcher_clusters":["b0"],"headers":{"endpoint":"x-pod"}}"#);
        let o = outcome(&renamed, answered(&with_endpoint));
        assert_eq!(header(&o, "x-pod"), Some("10.1.2.3:8000"));
        // No endpoint in the reply (an older batcher): no header, the shard still routes.
        let o = outcome(&config, answered(&reply("r1", "", 0, false)));
        assert_eq!(header(&o, "x-gateway-destination-endpoint"), None);
        assert_eq!(header(&o, "x-cohort-shard"), Some("r1"));
        // Batch mode routes to the batcher's front, never to an engine endpoint.
        let o = outcome(&batch_config(), answered(&with_endpoint));
        assert_eq!(header(&o, "x-gateway-destination-endpoint"), None);
    }

    #[test]
    fn fast_failures_are_errors() {
        let config = assign_config();
        for elapsed_us in [0, 1_000, 18_749] {
            let failed = outcome(&config, failed(14, elapsed_us));
            assert_fell_back(&failed, AssignFallback::Error);
            assert_eq!(failed.counter(), AssignCounter::Error);
        }
        assert_eq!(AssignFallback::Error.as_str(), "error");
    }

    #[test]
    fn a_slow_answer_that_succeeded_is_used() {
        let config = assign_config();
        let bytes = reply("replica-1", "", 0, false);
        let late = AssignAnswer {
            elapsed_us: 30_000,
            ..answered(&bytes)
        };
        let assigned = outcome(&config, late);
        assert_eq!(assigned.fallback, None);
        assert_eq!(assigned.shard.as_deref(), Some("replica-1"));
    }

    #[test]
    fn an_undecodable_reply_is_an_error() {
        let config = assign_config();
        let garbled = outcome(&config, answered(&[0xff, 0xff, 0xff]));
        assert_fell_back(&garbled, AssignFallback::Error);
        assert_eq!(garbled.counter(), AssignCounter::Error);
    }

    #[test]
    fn a_reply_naming_an_unknown_replica_is_an_error() {
        let config = assign_config();
        for shard in ["a b", "../x", "", "r1\r\nx-evil: 1"] {
            let bytes = reply(shard, "0000002a", 7, true);
            let unknown = outcome(&config, answered(&bytes));
            assert_fell_back(&unknown, AssignFallback::Error);
            assert_eq!(unknown.counter(), AssignCounter::Error);
        }
    }

    #[test]
    fn a_reply_naming_a_bad_cohort_is_an_error() {
        let config = batch_config();
        let bytes = reply("replica-1", "a b", 7, true);
        let bad = outcome(&config, answered(&bytes));
        assert_fell_back(&bad, AssignFallback::Error);
        assert_eq!(bad.counter(), AssignCounter::Error);
    }

    #[test]
    fn an_assigned_request_names_its_replica_and_cohort() {
        let config = assign_config();
        let names = &config.headers;
        let bytes = reply("replica-1", "0000002a", 0, false);
        let assigned = outcome(&config, answered(&bytes));
        assert_eq!(
            assigned.headers,
            vec![
                (names.shard.clone(), "replica-1".to_owned()),
                (names.cluster.clone(), "0000002a".to_owned()),
            ],
            "no batch, prefetch or tenant header in assign mode"
        );
        assert_eq!(assigned.cluster, "0000002a");
        assert_eq!(assigned.shard.as_deref(), Some("replica-1"));
        assert_eq!(assigned.fallback, None);
        assert_eq!(assigned.counter(), AssignCounter::Ok);
        // No cohort from the batcher: the key's stays, and no cluster header is written.
        let bytes = reply("replica-1", "", 0, false);
        let uncohorted = outcome(&config, answered(&bytes));
        assert_eq!(
            uncohorted.headers,
            vec![(names.shard.clone(), "replica-1".to_owned())]
        );
        assert_eq!(uncohorted.cluster, KEY_CLUSTER);
        assert_eq!(uncohorted.counter(), AssignCounter::Ok);
    }

    #[test]
    fn batch_mode_marks_the_batcher_shard_index() {
        let config = batch_config();
        let (plan, _) = fingerprinted(&config, BODY);
        let bytes = reply("replica-1", "0000002a", 0, false);
        for index in [0, 1] {
            let assigned =
                assign_outcome(&config, &plan, KEY_CLUSTER, index, answered(&bytes), b"");
            let names = &config.headers;
            assert_eq!(
                assigned.headers,
                vec![
                    (names.shard.clone(), "replica-1".to_owned()),
                    (names.batch.clone(), index.to_string()),
                    (config.tenant_header.clone(), "tenant-a".to_owned()),
                    (names.cluster.clone(), "0000002a".to_owned()),
                ],
                "without a knob policy, no prefetch header"
            );
        }
    }

    #[test]
    fn batch_mode_names_the_prefetch_level_only_with_a_knob_policy() {
        let knobs = r#""knobs":{"global":{"prefetch":"low"}}"#;
        let config = parsed(&format!(
            r#"{{"mode":"batch","batcher_clusters":["b0","b1"],{knobs}}}"#
        ));
        assert!(config.has_knob_policy());
        let bytes = reply("replica-1", "0000002a", 0, false);
        let assigned = outcome(&config, answered(&bytes));
        let names: Vec<&str> = assigned.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                config.headers.shard.as_str(),
                config.headers.batch.as_str(),
                config.headers.prefetch.as_str(),
                config.tenant_header.as_str(),
                config.headers.cluster.as_str(),
            ]
        );
        assert_eq!(header(&assigned, &config.headers.prefetch), Some("low"));
        // Assign mode never writes it, policy or not.
        let assign = parsed(&format!(
            r#"{{"mode":"assign","batcher_clusters":["b0","b1"],{knobs}}}"#
        ));
        let assigned = outcome(&assign, answered(&bytes));
        assert_eq!(header(&assigned, &assign.headers.prefetch), None);
        assert_eq!(header(&assigned, &assign.headers.batch), None);
    }

    #[test]
    fn batch_mode_hands_the_front_the_tenant() {
        let config = batch_config();
        let bytes = reply("replica-1", "", 0, false);
        let (mut plan, _) = fingerprinted(&config, BODY);
        let with = assign_outcome(&config, &plan, KEY_CLUSTER, 0, answered(&bytes), b"");
        assert_eq!(header(&with, &config.tenant_header), Some("tenant-a"));
        plan.tenant = None;
        let without = assign_outcome(&config, &plan, KEY_CLUSTER, 0, answered(&bytes), b"");
        assert_eq!(header(&without, &config.tenant_header), None);
        assert_eq!(header(&without, &config.headers.batch), Some("0"));
        let assign = assign_config();
        let (plan, _) = fingerprinted(&assign, BODY);
        let assigned = assign_outcome(&assign, &plan, KEY_CLUSTER, 0, answered(&bytes), b"");
        assert_eq!(header(&assigned, &assign.tenant_header), None);
    }

    #[test]
    fn progress_is_reported_only_when_observing_and_the_batcher_asked() {
        let observing = assign_config();
        assert!(observing.observe);
        let mut quiet = assign_config();
        quiet.observe = false;
        let ticketed = reply("replica-1", "", 77, false);
        let unticketed = reply("replica-1", "", 0, false);
        let ticket =
            |config: &FilterConfig, bytes: &[u8]| outcome(config, answered(bytes)).progress_ticket;
        assert_eq!(ticket(&observing, &ticketed), Some(77));
        assert_eq!(ticket(&quiet, &ticketed), None);
        assert_eq!(ticket(&observing, &unticketed), None);
    }

    #[test]
    fn the_exemplar_goes_only_when_wanted_and_kept() {
        let config = assign_config();
        let (plan, _) = fingerprinted(&config, BODY);
        let send = |wanted: bool, kept: &[u8]| {
            let bytes = reply("replica-1", "", 5, wanted);
            assign_outcome(&config, &plan, KEY_CLUSTER, 0, answered(&bytes), kept).send_exemplar
        };
        assert!(send(true, BODY.as_bytes()));
        assert!(!send(true, b""), "a body not kept cannot be sent");
        assert!(!send(false, BODY.as_bytes()));
        let timeout = assign_outcome(
            &config,
            &plan,
            KEY_CLUSTER,
            0,
            failed(GRPC_DEADLINE_EXCEEDED, 0),
            BODY.as_bytes(),
        );
        assert!(!timeout.send_exemplar);
    }

    fn obs(n: u64) -> pb::Observation {
        pb::Observation {
            observed_unix_ms: n,
            ..Default::default()
        }
    }

    #[test]
    fn outbox_opens_sends_in_batches_and_reports_drops() {
        let mut outbox = Outbox::new(2);
        assert_eq!(outbox.flush(0, 0), Flush::Idle, "nothing queued");
        for n in 0..(OUTBOX_QUEUE_LIMIT as u64 + 10) {
            outbox.push(0, obs(n));
        }
        assert_eq!(outbox.pending(0), OUTBOX_QUEUE_LIMIT);
        assert_eq!(outbox.flush(0, 0), Flush::Open);
        outbox.opened(0, 7, 0);
        let Flush::Send { token, batches } = outbox.flush(0, 5) else {
            panic!("expected batches")
        };
        assert_eq!(token, 7);
        assert_eq!(
            batches.len(),
            OUTBOX_QUEUE_LIMIT.div_ceil(OUTBOX_BATCH_LIMIT)
        );
        assert_eq!(batches[0].dropped, 10, "drops ride on the next batch");
        assert_eq!(batches[1].dropped, 0);
        let sent: usize = batches.iter().map(|b| b.observations.len()).sum();
        assert_eq!(sent, OUTBOX_QUEUE_LIMIT);
        assert_eq!(batches[0].observations[0].observed_unix_ms, 0, "in order");
        assert_eq!(outbox.pending(1), 0);
        assert_eq!(outbox.flush(0, 6), Flush::Idle);
    }

    #[test]
    fn outbox_backs_off_while_the_batcher_is_away() {
        let mut outbox = Outbox::new(1);
        outbox.push(0, obs(1));
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            assert_eq!(outbox.flush(0, now), Flush::Open);
            outbox.closed(Closed::Shard(0), now);
            let mut wait = 0;
            while outbox.flush(0, now + wait) == Flush::Idle {
                wait += 10;
            }
            waits.push(wait);
            now += wait;
        }
        assert_eq!(waits[0], 200);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*waits.last().unwrap(), BACKOFF_MAX_MS);
        // A stream that was healthy for a while retries fast after it closes.
        outbox.opened(0, 3, now);
        assert_eq!(outbox.closed(Closed::Token(3), now + 5_000), Some(0));
        assert_eq!(outbox.flush(0, now + 5_000 + BACKOFF_START_MS), Flush::Open);
        assert_eq!(outbox.closed(Closed::Token(99), now), None, "unknown token");
        assert!(!outbox.push(5, obs(1)), "unknown shard");
    }
}
