//! Response helpers: JSON answers, OpenAI-style errors, and a streaming body fed by a
//! channel (the decode task sends SSE chunks; a dropped receiver tells it the client left).

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

pub fn json(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

/// An OpenAI-shaped error body.
pub fn error(status: StatusCode, message: &str) -> Response {
    let kind = if status == StatusCode::BAD_REQUEST {
        "invalid_request_error"
    } else {
        "not_found_error"
    };
    json(
        status,
        &json!({"error": {"message": message, "type": kind, "code": status.as_u16()}}),
    )
}

/// A body whose frames come from `rx`; it ends when every sender is dropped.
pub struct ChannelBody(pub mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A streaming SSE response over `rx`.
pub fn sse(rx: mpsc::Receiver<Bytes>) -> Response {
    let mut response = Response::new(Body::new(ChannelBody(rx)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// One SSE event carrying `value`.
pub fn sse_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}
