//! HTTP to the engines: one pooled HTTP/1.1 client, request building, and the response
//! body relay that tells the front when the first byte and the end go by.
//!
//! The relay is how the front learns that a leader's prefix is computed (its first
//! response byte) and when a slot is free again (the body ended or the caller went away).
//! When a caller disconnects, axum drops the relay, which drops the engine response, which
//! closes that one engine connection: the engine cancels that request only.

use axum::http::{header, HeaderMap, HeaderName, Method, Request, Response, Uri};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum UpstreamError {
    #[error("cannot build the engine request: {0}")]
    Request(#[from] axum::http::Error),
    #[error("engine unreachable: {0}")]
    Connect(#[from] hyper_util::client::legacy::Error),
    #[error("engine took longer than {0:?}")]
    Timeout(Duration),
    #[error("engine body: {0}")]
    Body(#[from] hyper::Error),
}

/// The pooled client (keep-alive, TCP_NODELAY, 2 s connect timeout).
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Request headers not forwarded: hop-by-hop ones, those the client recomputes, and the
/// layer's own (`x-cohort-*`, already acted on).
fn forwarded(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "expect"
    ) && !name.as_str().starts_with("x-cohort-")
}

impl Upstream {
    pub fn new() -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Upstream {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
        }
    }

    /// Sends `body` to `base` + `path` with the caller's headers (filtered).
    pub async fn send(
        &self,
        method: Method,
        base: &Uri,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri = Uri::builder()
            .scheme("http")
            .authority(base.authority().map(|a| a.as_str()).unwrap_or_default())
            .path_and_query(path)
            .build()?;
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            if forwarded(name) {
                request = request.header(name, value);
            }
        }
        if !headers.contains_key(header::CONTENT_TYPE) {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        Ok(self.client.request(request.body(Full::new(body))?).await?)
    }

    /// A small GET or POST whose whole body is wanted (health, metrics, LoRA calls).
    pub async fn call(
        &self,
        method: Method,
        base: &Uri,
        path: &str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<(u16, Bytes), UpstreamError> {
        let fetch = async {
            let response = self
                .send(
                    method,
                    base,
                    path,
                    &HeaderMap::new(),
                    body.unwrap_or_default(),
                )
                .await?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await?.to_bytes();
            Ok((status, bytes))
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| UpstreamError::Timeout(timeout))?
    }
}

/// An engine response body on its way to the caller. `on_first` runs at the first data
/// frame (or at the end if there is none); `on_end` runs exactly once when the relay is
/// dropped: body finished, engine error, or caller gone.
pub struct Relay {
    inner: Incoming,
    on_first: Option<Box<dyn FnOnce() + Send + Sync>>,
    on_end: Option<Box<dyn FnOnce(bool) + Send + Sync>>,
    finished: bool,
}

impl Relay {
    pub fn new(
        inner: Incoming,
        on_first: Box<dyn FnOnce() + Send + Sync>,
        on_end: Box<dyn FnOnce(bool) + Send + Sync>,
    ) -> Relay {
        Relay {
            inner,
            on_first: Some(on_first),
            on_end: Some(on_end),
            finished: false,
        }
    }

    fn first(&mut self) {
        if let Some(f) = self.on_first.take() {
            f();
        }
    }
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => self.first(),
            Poll::Ready(None) => {
                self.finished = true;
                self.first();
            }
            Poll::Ready(Some(Err(_))) => self.first(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.first();
        if let Some(f) = self.on_end.take() {
            f(self.finished);
        }
    }
}
