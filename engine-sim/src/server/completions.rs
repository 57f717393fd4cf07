//! `POST /v1/chat/completions` and `POST /v1/completions`: where simulated time passes.
//!
//! A request is parsed and tokenized, waits (FIFO) for one of the replica's slots, is
//! admitted (cache lookup, prefill scheduled on the replica's one prefill lane), sleeps until
//! its prefill ends (its first token), then sleeps one decode step per further token. The
//! output is `max_tokens` tokens of `" tok"`; `finish_reason` is `"length"`.
//!
//! With KV events on, the cache change of each prefill is published as one batch when the
//! prefill ends, which is when its blocks enter the cache.
//!
//! Headers (on every completion): `x-sim-replica` (index), `x-sim-queue-ms` (receipt →
//! prefill start: slot wait + prefill-lane wait), `x-sim-ttft-ms` (receipt → first token),
//! `x-sim-cached-tokens`, `x-sim-prompt-tokens`, and `x-sim-engine-ms`: receipt → last token
//! for a non-streamed answer; a streamed answer's headers leave with its first token, so there
//! it equals the TTFT, and the final SSE chunk's `sim.engine_ms` carries the full time. Both
//! answers carry a `sim` object with these numbers next to `usage`.

use super::respond::{error, json, sse, sse_event};
use super::ReplicaCtx;
use crate::cache::block_hashes;
use crate::events::events_for;
use crate::render::{parse, Api, SimRequest};
use crate::tokenizer::tokenize;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::{sleep_until, Instant};

/// The text of one output token (4 bytes: one simulator token).
const TOKEN_TEXT: &str = " tok";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub async fn chat(State(ctx): State<Arc<ReplicaCtx>>, body: bytes::Bytes) -> Response {
    handle(ctx, Api::Chat, &body).await
}

pub async fn completions(State(ctx): State<Arc<ReplicaCtx>>, body: bytes::Bytes) -> Response {
    handle(ctx, Api::Completions, &body).await
}

/// A request's place on the replica: waiting, then running. Dropping it (done, or the client
/// went away) updates the counts and then frees the slot.
struct Seat {
    ctx: Arc<ReplicaCtx>,
    permit: Option<OwnedSemaphorePermit>,
    completed: bool,
}

impl Seat {
    fn wait(ctx: &Arc<ReplicaCtx>) -> Seat {
        ctx.lock().enqueue();
        Seat {
            ctx: Arc::clone(ctx),
            permit: None,
            completed: false,
        }
    }

    fn start(&mut self, permit: OwnedSemaphorePermit) {
        self.ctx.lock().start(self.ctx.now_ms());
        self.permit = Some(permit);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut state = self.ctx.lock();
        if self.permit.is_some() {
            state.finish(self.ctx.now_ms(), self.completed);
        } else {
            state.abandon();
        }
        // The permit is released after this, with the counts already updated.
    }
}

/// The numbers a response reports about itself.
#[derive(Clone, Copy)]
struct Timing {
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: u64,
    queue_ms: f64,
    ttft_ms: f64,
}

impl Timing {
    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens as u64 + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn sim(&self, replica: usize, engine_ms: f64) -> Value {
        json!({
            "replica": replica, "queue_ms": self.queue_ms, "ttft_ms": self.ttft_ms,
            "engine_ms": engine_ms, "cached_tokens": self.cached_tokens,
        })
    }
}

async fn handle(ctx: Arc<ReplicaCtx>, api: Api, body: &[u8]) -> Response {
    let received = Instant::now();
    let request = match parse(api, body) {
        Ok(r) => r,
        Err(e) => return reject(&ctx, &e.to_string()),
    };
    let tokens = tokenize(&request.prompt);
    if tokens.is_empty() {
        return reject(&ctx, "the prompt is empty");
    }
    let limit = ctx.config.max_model_len as u64;
    if tokens.len() as u64 + request.max_tokens > limit {
        return reject(
            &ctx,
            &format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({} in the messages, {} in the completion).",
                tokens.len() as u64 + request.max_tokens,
                tokens.len(),
                request.max_tokens
            ),
        );
    }
    let hashes = block_hashes(
        &tokens,
        ctx.config.block_tokens,
        request.cache_salt.as_deref(),
    );
    let mut seat = Seat::wait(&ctx);
    let Ok(permit) = Arc::clone(&ctx.slots).acquire_owned().await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the replica is shutting down",
        );
    };
    seat.start(permit);
    let admission = ctx.lock().admit(&hashes, tokens.len(), ctx.now_ms());
    sleep_until(ctx.instant_at(admission.prefill_end_ms)).await;
    let first_token = Instant::now();
    let ttft_ms = ms_between(received, first_token);
    {
        let mut state = ctx.lock();
        let change = state.prefill_done(&hashes, ttft_ms);
        if let Some(events) = &ctx.events {
            // Under the lock: batches are numbered in the order the cache changed.
            let block_tokens = ctx.config.block_tokens;
            let salt = request.cache_salt.as_deref();
            events.publish(&events_for(&change, &hashes, &tokens, block_tokens, salt));
        }
        state.token();
    }
    let timing = Timing {
        prompt_tokens: tokens.len(),
        cached_tokens: admission.cached_tokens,
        completion_tokens: request.max_tokens,
        queue_ms: (admission.prefill_start_ms - ctx.ms_at(received)).max(0.0),
        ttft_ms,
    };
    let decoder = Decoder {
        deadline: first_token,
    };
    if request.stream {
        stream(ctx, request, seat, decoder, timing, received)
    } else {
        whole(ctx, request, seat, decoder, timing, received).await
    }
}

fn reject(ctx: &ReplicaCtx, message: &str) -> Response {
    ctx.lock().count_rejected();
    error(StatusCode::BAD_REQUEST, message)
}

fn ms_between(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Paces decode steps on absolute deadlines, so timer granularity does not accumulate.
struct Decoder {
    deadline: Instant,
}

impl Decoder {
    async fn step(&mut self, ctx: &ReplicaCtx) {
        let ms = ctx.lock().decode_token_ms();
        self.deadline += Duration::from_secs_f64(ms / 1000.0);
        sleep_until(self.deadline).await;
        ctx.lock().token();
    }
}

fn id(api: Api) -> String {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    match api {
        Api::Chat => format!("chatcmpl-sim-{n}"),
        Api::Completions => format!("cmpl-sim-{n}"),
    }
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn headers(response: &mut Response, replica: usize, timing: &Timing, engine_ms: f64) {
    let headers = response.headers_mut();
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    };
    put("x-sim-replica", replica.to_string());
    put("x-sim-queue-ms", format!("{:.3}", timing.queue_ms));
    put("x-sim-ttft-ms", format!("{:.3}", timing.ttft_ms));
    put("x-sim-engine-ms", format!("{engine_ms:.3}"));
    put("x-sim-cached-tokens", timing.cached_tokens.to_string());
    put("x-sim-prompt-tokens", timing.prompt_tokens.to_string());
}

async fn whole(
    ctx: Arc<ReplicaCtx>,
    request: SimRequest,
    mut seat: Seat,
    mut decoder: Decoder,
    timing: Timing,
    received: Instant,
) -> Response {
    for _ in 1..request.max_tokens {
        decoder.step(&ctx).await;
    }
    seat.completed = true;
    drop(seat);
    let engine_ms = ms_between(received, Instant::now());
    let text = TOKEN_TEXT.repeat(request.max_tokens as usize);
    let model = &ctx.config.model;
    let body = match request.api {
        Api::Chat => json!({
            "id": id(Api::Chat), "object": "chat.completion", "created": created(), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length", "logprobs": null}],
            "usage": timing.usage(), "sim": timing.sim(ctx.index, engine_ms),
        }),
        Api::Completions => json!({
            "id": id(Api::Completions), "object": "text_completion", "created": created(),
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": null}],
            "usage": timing.usage(), "sim": timing.sim(ctx.index, engine_ms),
        }),
    };
    let mut response = json(StatusCode::OK, &body);
    headers(&mut response, ctx.index, &timing, engine_ms);
    response
}

/// The SSE chunk for output token `i` (0-based) of `n`.
fn token_chunk(api: Api, id: &str, created: u64, model: &str, i: u64, n: u64) -> Value {
    let finish = if i + 1 == n {
        json!("length")
    } else {
        Value::Null
    };
    match api {
        Api::Chat => {
            let delta = if i == 0 {
                json!({"role": "assistant", "content": TOKEN_TEXT})
            } else {
                json!({"content": TOKEN_TEXT})
            };
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        }
        Api::Completions => {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": TOKEN_TEXT, "finish_reason": finish}]})
        }
    }
}

fn stream(
    ctx: Arc<ReplicaCtx>,
    request: SimRequest,
    mut seat: Seat,
    mut decoder: Decoder,
    timing: Timing,
    received: Instant,
) -> Response {
    let (tx, rx) = mpsc::channel(16);
    let api = request.api;
    let n = request.max_tokens;
    let id = id(api);
    let created = created();
    let replica = ctx.index;
    let task_ctx = Arc::clone(&ctx);
    tokio::spawn(async move {
        let ctx = task_ctx;
        let model = ctx.config.model.clone();
        let first = sse_event(&token_chunk(api, &id, created, &model, 0, n));
        if tx.send(first).await.is_err() {
            return;
        }
        for i in 1..n {
            decoder.step(&ctx).await;
            let chunk = sse_event(&token_chunk(api, &id, created, &model, i, n));
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        seat.completed = true;
        drop(seat);
        let engine_ms = ms_between(received, Instant::now());
        let object = match api {
            Api::Chat => "chat.completion.chunk",
            Api::Completions => "text_completion",
        };
        let last = json!({"id": id, "object": object, "created": created, "model": model,
                          "choices": [], "usage": timing.usage(),
                          "sim": timing.sim(replica, engine_ms)});
        let _ = tx.send(sse_event(&last)).await;
        let _ = tx
            .send(bytes::Bytes::from_static(b"data: [DONE]\n\n"))
            .await;
    });
    let mut response = sse(rx);
    headers(&mut response, replica, &timing, timing.ttft_ms);
    response
}
