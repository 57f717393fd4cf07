//! One `Process` stream: one HTTP request through Envoy's ext_proc filter, from its
//! headers to the end of its response. [`Exchange::handle`] takes each message Envoy sends
//! and returns the answers to send back, in order; the server ([`super`]) only moves
//! messages, so this state machine is tested without a network.
//!
//! **Request.** The headers are inspected with the filter's own functions
//! (`spoofed_headers`, `inspect_headers`, `admit`). When they settle the request (not an
//! LLM API request, a guard's bypass, the hold-out, no body), the picker decides at once
//! without a fingerprint. Otherwise it waits for the body:
//!
//! - `BUFFERED`: Envoy waits for the headers answer before it sends the body, so the
//!   headers are answered at once (removing spoofed `x-cohort-*` headers) and the decision
//!   travels in the body's answer (header mutations in a body answer apply in this mode).
//! - `FULL_DUPLEX_STREAMED`: Envoy sends the body without waiting. Chunks are held until
//!   the body ends (`end_of_stream`, or trailers) or passes `body_limit_bytes`; then the
//!   headers answer (with the decision) goes first and every held chunk follows, unchanged
//!   and in order, as `streamed_response`s; later chunks are sent back as they come.
//!
//! The decision is the brain's, on the filter's fingerprint of the body, bounded by the
//! deadline: after it, the request goes by its routing key (`x-cohort-bypass:
//! batcher_timeout`). A body that cannot be fingerprinted is routed least-loaded with the
//! filter's reason. No eligible endpoint: an `ImmediateResponse` 503.
//!
//! **Response.** The response headers carry the status and the endpoint that served
//! (`x-gateway-destination-endpoint-served`): its first byte is reported under the
//! decision's ticket (moved first to the replica that served, when Envoy used a fallback),
//! and the end with the status when the response ends or the stream does. The ticket ends
//! exactly once, also when the stream is cancelled ([`Drop`]).

use super::choose::{self, Endpoints};
use super::metrics::Outcome;
use super::protocol::{self, BodyMode, Mutation};
use super::Picker;
use crate::serve::brain::pick::{Decided, SlotView};
use crate::serve::brain::BrainError;
use cohort_ext_proc_proto::ext_proc::{processing_request, ProcessingRequest, ProcessingResponse};
use cohort_ext_proc_proto::prost_types::value::Kind;
use cohort_filter::batcher::{self, AssignAnswer};
use cohort_filter::breaker;
use cohort_filter::config::Mode;
use cohort_filter::decision::{self, reason, Admission, HeadersVerdict, LearnedTable, RequestPlan};
use cohort_fingerprint::learned::{LearnedCohorts, Placement};
use cohort_fingerprint::{CODEBOOK_VERSION, SKETCH_VERSION};
use cohort_proto as pb;
use pb::request_progress::Phase as ProgressPhase;
use std::sync::Arc;
use std::time::Instant;

/// The mode the response's `x-cohort` names.
pub const MODE: &str = "picker";
/// The `x-cohort-bypass` reason of a request that is not a POST to an API path.
pub const NOT_API_REQUEST: &str = "not_api_request";
/// The `x-cohort-bypass` reason when the brain did not decide within the deadline.
pub const BATCHER_TIMEOUT: &str = "batcher_timeout";
/// The `x-cohort-bypass` reason when the proxy sends the body in a mode the picker does
/// not fingerprint in (`NONE`, `STREAMED`, `BUFFERED_PARTIAL`): decided on the headers.
pub const UNSUPPORTED_BODY_MODE: &str = "unsupported_body_mode";

/// Where the request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for the request headers.
    Headers,
    /// Headers read, waiting for the body.
    Body,
    /// The request headers are answered with the decision; body chunks pass.
    Decided,
    /// An immediate response was sent: Envoy ignores anything more.
    Refused,
}

/// A decision whose progress is reported.
#[derive(Debug, Clone)]
struct Ticket {
    ticket: u64,
    slot: usize,
    replica: String,
    since: Instant,
    first_byte: bool,
}

/// What the picker answers: a mutation, or a refusal (a 503 for this outcome).
enum Answer {
    Route(Mutation),
    Refuse(Outcome),
}

/// The state of one stream.
pub struct Exchange {
    picker: Arc<Picker>,
    stage: Stage,
    request_mode: BodyMode,
    response_mode: BodyMode,
    seen_first: bool,
    headers: Vec<(String, String)>,
    /// Spoofed reserved headers to remove.
    remove: Vec<String>,
    subset: Option<Vec<String>>,
    plan: Option<Box<RequestPlan>>,
    /// The body so far (full-duplex) or whole (buffered).
    body: Vec<u8>,
    /// Full-duplex chunks received before the decision, not yet sent back.
    held: Vec<(Vec<u8>, bool)>,
    ticket: Option<Ticket>,
    /// What the response's `x-cohort` says after the version (as the filter's).
    verdict: Option<String>,
    status: u32,
    ended: bool,
    /// Envoy has sent the request's last message (headers or body with end_of_stream, or
    /// trailers).
    request_sent: bool,
}

impl Exchange {
    pub fn new(picker: Arc<Picker>) -> Exchange {
        picker.metrics.stream_opened();
        Exchange {
            picker,
            stage: Stage::Headers,
            request_mode: BodyMode::Buffered,
            response_mode: BodyMode::Buffered,
            seen_first: false,
            headers: Vec::new(),
            remove: Vec::new(),
            subset: None,
            plan: None,
            body: Vec::new(),
            held: Vec::new(),
            ticket: None,
            verdict: None,
            status: 0,
            ended: false,
            request_sent: false,
        }
    }

    /// True once the request's part of the exchange is over: the picker has answered the
    /// decision and every message of the request (or refused it). From then on, ending
    /// the stream loses nothing of the request: Envoy goes on without the picker for the
    /// response. Before it, a stream that ends takes held body chunks with it.
    pub fn request_answered(&self) -> bool {
        match self.stage {
            Stage::Refused => true,
            Stage::Decided => self.request_sent,
            Stage::Headers | Stage::Body => false,
        }
    }

    /// True before the first message: nothing is held, and ending the stream with an
    /// error lets Envoy apply the pool's failure mode to the request.
    pub fn untouched(&self) -> bool {
        !self.seen_first
    }

    /// The answers to one message from Envoy, in the order to send them.
    pub async fn handle(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if !self.seen_first {
            self.seen_first = true;
            self.request_mode = protocol::request_body_mode(&message);
            self.response_mode = protocol::response_body_mode(&message);
        }
        use processing_request::Request;
        let principal = principal_of(&message);
        match message.request {
            Some(Request::RequestHeaders(h)) => {
                let end_of_stream = h.end_of_stream;
                self.request_sent |= end_of_stream;
                self.headers = protocol::headers_of(h.headers.as_ref());
                self.subset = protocol::subset_hint(message.metadata_context.as_ref());
                self.request_headers(end_of_stream, principal.as_deref())
                    .await
            }
            Some(Request::RequestBody(b)) => {
                // A buffered body is the whole body, whatever end_of_stream says.
                self.request_sent |= b.end_of_stream || self.request_mode == BodyMode::Buffered;
                self.request_body(b.body, b.end_of_stream).await
            }
            Some(Request::RequestTrailers(_)) => {
                self.request_sent = true;
                self.request_trailers().await
            }
            Some(Request::ResponseHeaders(h)) => {
                let headers = protocol::headers_of(h.headers.as_ref());
                self.response_headers(&message.metadata_context, &headers, h.end_of_stream);
                let set: Vec<(String, String)> = self
                    .verdict
                    .as_ref()
                    .map(|verdict| {
                        let name = self.picker.filter.headers.response.clone();
                        (name, format!("{}; {verdict}", env!("CARGO_PKG_VERSION")))
                    })
                    .into_iter()
                    .collect();
                vec![protocol::response_headers_response(&set)]
            }
            Some(Request::ResponseBody(b)) => {
                if b.end_of_stream {
                    self.end();
                }
                vec![match self.response_mode {
                    BodyMode::Duplex => protocol::streamed_chunk(b.body, b.end_of_stream, false),
                    BodyMode::Buffered | BodyMode::Other => protocol::response_body_response(),
                }]
            }
            Some(Request::ResponseTrailers(_)) => {
                self.end();
                vec![protocol::response_trailers_response()]
            }
            None => Vec::new(),
        }
    }

    /// The stream ended (Envoy closed it when the HTTP stream completed, or it was
    /// cancelled): the ticket ends with the status seen, if it has not already.
    pub fn close(&mut self) {
        self.end();
    }

    async fn request_headers(
        &mut self,
        end_of_stream: bool,
        principal: Option<&str>,
    ) -> Vec<ProcessingResponse> {
        let config = &self.picker.filter;
        self.remove = decision::spoofed_headers(config, &self.headers)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let settled: Option<(Option<&'static str>, bool)> =
            match decision::inspect_headers(config, &self.headers, principal) {
                HeadersVerdict::Ignore => Some((Some(NOT_API_REQUEST), false)),
                HeadersVerdict::Bypass(why) => Some((Some(why), false)),
                HeadersVerdict::Buffer(plan) => {
                    let admission =
                        decision::admit(config, &plan, &self.headers, None, breaker::State::Closed);
                    self.plan = Some(plan);
                    match admission {
                        Admission::Untouched(why) => Some((Some(why), true)),
                        Admission::Bypass(why) => Some((Some(why), false)),
                        Admission::Treat if end_of_stream => Some((Some(reason::NO_BODY), false)),
                        Admission::Treat => None,
                    }
                }
            };
        let settled = match settled {
            None if self.request_mode == BodyMode::Other => {
                Some((Some(UNSUPPORTED_BODY_MODE), false))
            }
            settled => settled,
        };
        let Some((why, untouched)) = settled else {
            self.stage = Stage::Body;
            return match self.request_mode {
                // Envoy sends the body only after this answer (a mode the picker does
                // not fingerprint in was settled above).
                BodyMode::Buffered | BodyMode::Other => {
                    vec![protocol::request_headers_response(&Mutation {
                        remove: self.remove.clone(),
                        ..Mutation::default()
                    })]
                }
                BodyMode::Duplex => Vec::new(),
            };
        };
        let started = Instant::now();
        let length = protocol::header(&self.headers, "content-length")
            .and_then(|l| l.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let answer = self.place(why, untouched, length);
        self.picker.metrics.decided(started.elapsed().as_secs_f64());
        match answer {
            Answer::Refuse(outcome) => {
                self.stage = Stage::Refused;
                vec![refusal(outcome)]
            }
            Answer::Route(mutation) => {
                self.stage = Stage::Decided;
                vec![protocol::request_headers_response(&mutation)]
            }
        }
    }

    async fn request_body(
        &mut self,
        chunk: Vec<u8>,
        end_of_stream: bool,
    ) -> Vec<ProcessingResponse> {
        match (self.stage, self.request_mode) {
            (Stage::Refused | Stage::Headers, _) => Vec::new(),
            (Stage::Decided, BodyMode::Buffered | BodyMode::Other) => {
                vec![protocol::request_body_response(&Mutation::default())]
            }
            (Stage::Decided, BodyMode::Duplex) => {
                vec![protocol::streamed_chunk(chunk, end_of_stream, true)]
            }
            (Stage::Body, BodyMode::Buffered | BodyMode::Other) => {
                // The whole body, whatever end_of_stream says (trailers may follow).
                self.body = chunk;
                match self.decide().await {
                    Answer::Refuse(outcome) => {
                        self.stage = Stage::Refused;
                        vec![refusal(outcome)]
                    }
                    Answer::Route(mutation) => {
                        self.stage = Stage::Decided;
                        vec![protocol::request_body_response(&mutation)]
                    }
                }
            }
            (Stage::Body, BodyMode::Duplex) => {
                self.body.extend_from_slice(&chunk);
                self.held.push((chunk, end_of_stream));
                if end_of_stream || self.body.len() > self.picker.filter.body_limit_bytes {
                    self.answer_held().await
                } else {
                    Vec::new()
                }
            }
        }
    }

    async fn request_trailers(&mut self) -> Vec<ProcessingResponse> {
        let mut out = match (self.stage, self.request_mode) {
            (Stage::Refused, _) => return Vec::new(),
            (Stage::Body, BodyMode::Duplex) => self.answer_held().await,
            _ => Vec::new(),
        };
        if self.stage != Stage::Refused {
            out.push(protocol::request_trailers_response());
        }
        out
    }

    /// Full-duplex: decides on the body so far, then the headers answer and every held
    /// chunk, in order.
    async fn answer_held(&mut self) -> Vec<ProcessingResponse> {
        match self.decide().await {
            Answer::Refuse(outcome) => {
                self.stage = Stage::Refused;
                self.held.clear();
                vec![refusal(outcome)]
            }
            Answer::Route(mutation) => {
                self.stage = Stage::Decided;
                let mut out = vec![protocol::request_headers_response(&mutation)];
                out.extend(
                    self.held
                        .drain(..)
                        .map(|(chunk, eos)| protocol::streamed_chunk(chunk, eos, true)),
                );
                out
            }
        }
    }

    /// The decision at the end of the body (or past the body limit).
    async fn decide(&mut self) -> Answer {
        let started = Instant::now();
        let answer = self.decide_body().await;
        self.picker.metrics.decided(started.elapsed().as_secs_f64());
        // The stream lives until the response ends: the body is not kept that long.
        self.body = Vec::new();
        answer
    }

    async fn decide_body(&mut self) -> Answer {
        let Some(plan) = self.plan.clone() else {
            return self.place(Some(reason::INTERNAL), false, self.body.len() as u64);
        };
        let config = &self.picker.filter;
        if self.body.len() > config.body_limit_bytes {
            return self.place(Some(reason::BODY_TOO_LARGE), false, self.body.len() as u64);
        }
        if self.body.is_empty() {
            return self.place(Some(reason::NO_BODY), false, 0);
        }
        let routed = decision::route_body_with(
            config,
            &plan,
            &self.body,
            cohort_fingerprint::IntentSketch::of_text,
            &mut SharedTable(&self.picker.learned),
        );
        let routing = match routed {
            Ok(routing) => routing,
            Err(why) => return self.place(Some(why), false, self.body.len() as u64),
        };
        let (slots, mask) = match self.eligible() {
            Ok(found) => found,
            Err(refusal) => return refusal,
        };
        let now_unix = unix_ms();
        let assign =
            batcher::assign_request(&plan, &routing.fingerprint, Mode::Assign, now_unix, true);
        let prompt = self.picker.prompt_keys(routing.fingerprint.api, &self.body);
        let decided = match self.picker.decide(assign, mask.clone(), prompt).await {
            Decision::Decided(decided) => decided,
            Decision::Failed(BrainError::NoReplicas) => return self.refuse(Outcome::Unavailable),
            Decision::Failed(BrainError::NoFingerprint) => {
                return self.place(Some(reason::INTERNAL), false, self.body.len() as u64)
            }
            Decision::TimedOut => {
                let key = routing.fingerprint.routing_key.0;
                let Some((slot, alternatives)) = choose::by_key(&slots, &mask, key) else {
                    return self.refuse(Outcome::Unavailable);
                };
                let destination =
                    choose::destination(&slots, &self.picker.endpoints, slot, &alternatives);
                self.picker.metrics.outcome(Outcome::Bypassed);
                self.picker.metrics.bypass(BATCHER_TIMEOUT);
                self.verdict = Some(format!("mode={MODE}; bypass={BATCHER_TIMEOUT}"));
                if plan.request_id.is_some() {
                    let observation = batcher::bypass_observation(
                        &plan,
                        Mode::Assign,
                        BATCHER_TIMEOUT,
                        unix_ms(),
                    );
                    self.picker.observe(observation);
                }
                let mut set = routing.headers.clone();
                set.push((config.headers.bypass.clone(), BATCHER_TIMEOUT.to_owned()));
                return Answer::Route(Mutation {
                    set,
                    remove: self.remove.clone(),
                    destination,
                });
            }
        };
        // What the filter writes for the same Assign answer (x-cohort-shard, the batcher's
        // cluster); the endpoint goes in as the destination list instead.
        let reply = pb::Message::encode_to_vec(&decided.reply);
        let outcome = batcher::assign_outcome(
            config,
            &plan,
            &routing.cluster,
            0,
            AssignAnswer {
                grpc_status: 0,
                reply: &reply,
                elapsed_us: 0,
            },
            &[],
        );
        let mut set = routing.headers.clone();
        set.extend(
            outcome
                .headers
                .into_iter()
                .filter(|(name, _)| *name != config.headers.endpoint),
        );
        let destination = choose::destination(
            &slots,
            &self.picker.endpoints,
            decided.slot,
            &decided.alternatives,
        );
        self.open_ticket(&decided);
        // The brain learns the request as from a filter's Observe: cohorts, the store.
        let observation = batcher::observation(
            &plan,
            &routing.fingerprint,
            Mode::Assign,
            Some(&decided.reply.shard),
            now_unix,
        );
        self.picker.observe(observation);
        self.picker.metrics.outcome(Outcome::Picked);
        self.verdict = Some(format!(
            "mode={MODE}; cluster={}; shard={}; sketch=v{SKETCH_VERSION}; codebook=v{CODEBOOK_VERSION}",
            outcome.cluster, decided.reply.shard
        ));
        Answer::Route(Mutation {
            set,
            remove: self.remove.clone(),
            destination,
        })
    }

    /// The request's slots and the mask of those it may go to, or the 503.
    fn eligible(&self) -> Result<(Vec<SlotView>, Vec<bool>), Answer> {
        let slots = self.picker.brain.slots(self.picker.clock.now_ms());
        let mask = choose::eligible(&slots, &self.picker.endpoints, self.subset.as_deref());
        if choose::any_usable(&slots, &mask) {
            return Ok((slots, mask));
        }
        // A subset that leaves out every ready endpoint, or a fleet with none ready.
        let outcome = if self.subset.is_some()
            && choose::any_usable(&slots, &all_eligible(&slots, &self.picker.endpoints))
        {
            Outcome::SubsetEmpty
        } else {
            Outcome::Unavailable
        };
        Err(self.refuse(outcome))
    }

    fn refuse(&self, outcome: Outcome) -> Answer {
        self.picker.metrics.outcome(outcome);
        Answer::Refuse(outcome)
    }

    /// A decision without a fingerprint (least loaded), with `why` as the bypass reason;
    /// `untouched` writes nothing but the destination (the hold-out, a disabled route).
    fn place(&mut self, why: Option<&'static str>, untouched: bool, bytes: u64) -> Answer {
        let (slots, mask) = match self.eligible() {
            Ok(found) => found,
            Err(refusal) => return refusal,
        };
        let prompt_bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        let now = self.picker.clock.now_ms();
        let decided = match self.picker.brain.place(prompt_bytes, &mask, true, now) {
            Ok(decided) => decided,
            Err(_) => return self.refuse(Outcome::Unavailable),
        };
        let destination = choose::destination(
            &slots,
            &self.picker.endpoints,
            decided.slot,
            &decided.alternatives,
        );
        self.open_ticket(&decided);
        let mut set = Vec::new();
        if let Some(why) = why {
            self.picker.metrics.bypass(why);
            self.verdict = Some(format!("mode={MODE}; bypass={why}"));
            if !untouched {
                set.push((self.picker.filter.headers.bypass.clone(), why.to_owned()));
            }
            // The batcher's audit keeps why, as from the filter's bypass report.
            if let Some(plan) = &self.plan {
                if plan.request_id.is_some() {
                    let observation =
                        batcher::bypass_observation(plan, Mode::Assign, why, unix_ms());
                    self.picker.observe(observation);
                }
            }
        }
        self.picker.metrics.outcome(Outcome::Bypassed);
        Answer::Route(Mutation {
            set,
            remove: self.remove.clone(),
            destination,
        })
    }

    fn open_ticket(&mut self, decided: &Decided) {
        if decided.reply.ticket != 0 {
            self.ticket = Some(Ticket {
                ticket: decided.reply.ticket,
                slot: decided.slot,
                replica: decided.reply.shard.clone(),
                since: Instant::now(),
                first_byte: false,
            });
        }
    }

    fn response_headers(
        &mut self,
        metadata: &Option<cohort_ext_proc_proto::core::Metadata>,
        headers: &[(String, String)],
        end_of_stream: bool,
    ) {
        self.status = protocol::status_of(headers);
        if let Some(served) = protocol::served_endpoint(metadata.as_ref(), headers) {
            self.served_by(&served);
        }
        self.first_byte();
        if end_of_stream {
            self.end();
        }
    }

    /// Moves the ticket to the replica at `served` when it is not the one decided.
    fn served_by(&mut self, served: &str) {
        let Some(ticket) = &mut self.ticket else {
            return;
        };
        let slots = self.picker.brain.slots(self.picker.clock.now_ms());
        let Some(slot) = choose::slot_of(&slots, &self.picker.endpoints, served) else {
            return;
        };
        if slot == ticket.slot {
            return;
        }
        if self.picker.brain.moved(ticket.ticket, slot) {
            if let Some(view) = slots.iter().find(|s| s.slot == slot) {
                ticket.replica = view.member.name.clone();
            }
            ticket.slot = slot;
            self.picker.metrics.reattributed();
        }
    }

    fn first_byte(&mut self) {
        let Some(ticket) = &mut self.ticket else {
            return;
        };
        if ticket.first_byte || self.ended {
            return;
        }
        ticket.first_byte = true;
        let ticket = ticket.clone();
        self.report(&ticket, ProgressPhase::FirstByte, 0);
    }

    /// Ends the ticket (once).
    fn end(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        if let Some(ticket) = self.ticket.clone() {
            self.report(&ticket, ProgressPhase::End, self.status);
        }
    }

    fn report(&self, ticket: &Ticket, phase: ProgressPhase, status: u32) {
        let elapsed_ms = u32::try_from(ticket.since.elapsed().as_millis()).unwrap_or(u32::MAX);
        let observation = batcher::progress_observation(
            ticket.ticket,
            phase,
            status,
            elapsed_ms,
            &ticket.replica,
            unix_ms(),
        );
        self.picker.observe(observation);
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.end();
        self.picker.metrics.stream_closed();
    }
}

/// The picker's learned-cohorts table, locked only for a placement (as the filter's
/// shared-data update).
struct SharedTable<'a>(&'a std::sync::Mutex<LearnedCohorts>);

impl LearnedTable for SharedTable<'_> {
    fn update(
        &mut self,
        place: &mut dyn FnMut(&mut LearnedCohorts) -> Option<Placement>,
    ) -> Option<Placement> {
        let mut table = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        place(&mut table)
    }
}

/// The 503 of a refused request.
fn refusal(outcome: Outcome) -> ProcessingResponse {
    let (details, body) = match outcome {
        Outcome::SubsetEmpty => (
            "picker_subset_empty",
            "no eligible endpoint in the subset hint\n",
        ),
        _ => ("picker_unavailable", "no ready endpoint\n"),
    };
    protocol::immediate(503, details, body)
}

/// Every slot with an endpoint (to tell an empty subset from an empty fleet).
fn all_eligible(slots: &[SlotView], endpoints: &Endpoints) -> Vec<bool> {
    choose::eligible(slots, endpoints, None)
}

/// The downstream's mTLS identity, when Envoy sends the `source.principal` attribute
/// (`request_attributes: [source.principal]`): the tenant when the tenant header is not
/// trusted, as in the filter.
fn principal_of(message: &ProcessingRequest) -> Option<String> {
    message.attributes.values().find_map(|s| {
        match s.fields.get("source.principal")?.kind.as_ref()? {
            Kind::StringValue(p) if !p.is_empty() => Some(p.clone()),
            _ => None,
        }
    })
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How the brain's decision went.
pub enum Decision {
    Decided(Decided),
    Failed(BrainError),
    /// The deadline passed first.
    TimedOut,
}
