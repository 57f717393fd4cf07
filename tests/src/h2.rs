//! A minimal HTTP/2 cleartext client (prior knowledge, no upgrade), so tests can send the
//! requests they send over HTTP/1.1 with [`crate::client`] over HTTP/2 too: header values
//! as raw bytes (duplicates and non-UTF-8 kept), the body as given DATA pieces with pauses
//! between them (a slow client), optional trailers. One connection per request, on its own
//! single-threaded runtime that ends with the call; every exchange is bounded by a timeout.

use crate::client::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Longest one exchange may take before the call fails.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// One HTTP/2 request.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    /// Path and query (the authority is `cohort.test`, the scheme `http`).
    pub path: String,
    /// Names lowercase; values as bytes; duplicates are sent as separate fields.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body as DATA pieces (none: the headers end the stream).
    pub pieces: Vec<Vec<u8>>,
    /// Pause between two pieces.
    pub pause: Duration,
    /// Trailers after the body (empty: none).
    pub trailers: Vec<(String, Vec<u8>)>,
}

/// Sends `request` on a new h2c connection and reads the whole response.
pub fn send(port: u16, request: Request) -> io::Result<Response> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(port, request))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "h2 exchange timed out"))?
    })
}

fn header_map(fields: &[(String, Vec<u8>)]) -> io::Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for (name, value) in fields {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(io::Error::other)?;
        map.append(
            name,
            HeaderValue::from_bytes(value).map_err(io::Error::other)?,
        );
    }
    Ok(map)
}

async fn exchange(port: u16, request: Request) -> io::Result<Response> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
    let driver = tokio::spawn(connection);
    let body = Pieces {
        pieces: request.pieces.into_iter().map(Bytes::from).collect(),
        trailers: Some(header_map(&request.trailers)?).filter(|t| !t.is_empty()),
        pause: request.pause,
        sleep: None,
    };
    let mut http_request = hyper::Request::builder()
        .method(request.method.as_str())
        .uri(format!("http://cohort.test{}", request.path))
        .body(body)
        .map_err(io::Error::other)?;
    *http_request.headers_mut() = header_map(&request.headers)?;
    let response = sender
        .send_request(http_request)
        .await
        .map_err(io::Error::other)?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes()
        .to_vec();
    // The connection task ends once its last sender is gone.
    drop(sender);
    let _ = driver.await;
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// A request body of fixed pieces, paced, then trailers.
struct Pieces {
    pieces: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    pause: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(sleep) = &mut this.sleep {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleep = None;
        }
        if let Some(piece) = this.pieces.pop_front() {
            if !this.pieces.is_empty() && !this.pause.is_zero() {
                this.sleep = Some(Box::pin(tokio::time::sleep(this.pause)));
            }
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty() && self.trailers.is_none()
    }
}
