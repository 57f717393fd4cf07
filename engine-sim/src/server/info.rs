//! The endpoints that cost no simulated time: health, model and server info (the shapes
//! sglang-router and vLLM clients read), `/tokenize` and `/detokenize`, the render endpoints
//! vllm-router's cache_aware policy calls per request (it needs `token_ids`; without them it
//! falls back to `/tokenize` with the whole body), `/metrics`, `/sim/stats`, and
//! `/reset_prefix_cache` (vLLM's development endpoint, which the live benchmarks call
//! between contenders).

use super::respond::{error, json};
use super::ReplicaCtx;
use crate::events::Event;
use crate::render::parse_any;
use crate::tokenizer;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;

type Ctx = State<Arc<ReplicaCtx>>;

pub async fn health() -> StatusCode {
    StatusCode::OK
}

pub async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such endpoint on cohort engine-sim",
    )
}

pub async fn models(State(ctx): Ctx) -> Response {
    let c = &ctx.config;
    json(
        StatusCode::OK,
        &json!({"object": "list", "data": [{
            "id": c.model, "object": "model", "created": 0, "owned_by": "cohort-engine-sim",
            "root": c.model, "parent": null, "max_model_len": c.max_model_len,
        }]}),
    )
}

pub async fn model_info(State(ctx): Ctx) -> Response {
    let c = &ctx.config;
    json(
        StatusCode::OK,
        &json!({
            "model_path": c.model, "tokenizer_path": c.model, "served_model_name": c.model,
            "is_generation": true, "max_model_len": c.max_model_len,
        }),
    )
}

pub async fn server_info(State(ctx): Ctx) -> Response {
    let c = &ctx.config;
    json(
        StatusCode::OK,
        &json!({
            "engine": "cohort-engine-sim",
            "version": env!("CARGO_PKG_VERSION"),
            "replica": ctx.index,
            "replicas": c.replicas,
            "model_path": c.model,
            "served_model_name": c.model,
            "context_length": c.max_model_len,
            "max_running_requests": c.slots,
            "max_total_num_tokens": c.kv_blocks * c.block_tokens,
            "kv_blocks": c.kv_blocks,
            "block_tokens": c.block_tokens,
            "page_size": c.block_tokens,
            "time_scale": c.time_scale,
            "cost": c.cost,
            "calibration": c.calibration,
            "kv_events": ctx.events.as_ref().map(|e| e.info()),
        }),
    )
}

/// `POST /reset_prefix_cache`: drops this replica's whole prefix cache, publishing
/// `AllBlocksCleared` with KV events on. Unlike vLLM, which refuses while requests run,
/// it always succeeds: a running request's blocks enter the emptied cache when its prefill
/// ends.
pub async fn reset_prefix_cache(State(ctx): Ctx) -> Response {
    {
        let mut state = ctx.lock();
        state.reset_cache();
        if let Some(events) = &ctx.events {
            events.publish(&[Event::AllCleared]);
        }
    }
    json(StatusCode::OK, &json!({"success": true}))
}

/// `/tokenize` (vLLM's `{count, max_model_len, tokens}`) or a render endpoint (`{model,
/// prompt, token_ids}`), for a completions (`prompt`) or chat (`messages`) body.
fn tokenize_or_render(ctx: &ReplicaCtx, body: &[u8], render: bool) -> Response {
    let request = match parse_any(body) {
        Ok(r) => r,
        Err(e) => {
            ctx.lock().count_rejected();
            return error(StatusCode::BAD_REQUEST, &e.to_string());
        }
    };
    let tokens = tokenizer::tokenize(&request.prompt);
    if render {
        ctx.lock().count_render();
        json(
            StatusCode::OK,
            &json!({"model": ctx.config.model, "prompt": request.prompt, "token_ids": tokens}),
        )
    } else {
        ctx.lock().count_tokenize();
        json(
            StatusCode::OK,
            &json!({"count": tokens.len(), "max_model_len": ctx.config.max_model_len, "tokens": tokens}),
        )
    }
}

pub async fn tokenize(State(ctx): Ctx, body: Bytes) -> Response {
    tokenize_or_render(&ctx, &body, false)
}

/// Both render endpoints: the rendered prompt and its token ids.
pub async fn render(State(ctx): Ctx, body: Bytes) -> Response {
    tokenize_or_render(&ctx, &body, true)
}

/// `/detokenize`: ids are hashes, so the text cannot come back; each token becomes a 4-byte
/// placeholder `" tok"` (the right length, which is all a client can check).
pub async fn detokenize(State(ctx): Ctx, body: Bytes) -> Response {
    let tokens = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("tokens")?.as_array().map(Vec::len));
    match tokens {
        Some(n) => json(StatusCode::OK, &json!({"prompt": " tok".repeat(n)})),
        None => {
            ctx.lock().count_rejected();
            error(
                StatusCode::BAD_REQUEST,
                "`tokens` must be an array of token ids",
            )
        }
    }
}

pub async fn metrics(State(ctx): Ctx) -> Response {
    let page = {
        let state = ctx.lock();
        crate::metrics::page(&state, ctx.index, &ctx.config.model, ctx.now_ms())
    };
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        page,
    )
        .into_response()
}

/// `/sim/stats`: this replica's index and every replica's counters, in replica order.
pub async fn stats(State(ctx): Ctx) -> Response {
    let replicas: Vec<Value> = ctx
        .all
        .get()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            let state = r.lock();
            let mut v = serde_json::to_value(state.stats(r.now_ms())).unwrap_or(Value::Null);
            if let Value::Object(o) = &mut v {
                o.insert("index".to_owned(), json!(r.index));
                o.insert("running".to_owned(), json!(state.running()));
                o.insert("waiting".to_owned(), json!(state.waiting()));
                o.insert("kv_blocks_used".to_owned(), json!(state.cache().len()));
            }
            v
        })
        .collect();
    json(
        StatusCode::OK,
        &json!({"replica": ctx.index, "replicas": replicas}),
    )
}
