//! Upstream HTTP servers that record every request they receive (HTTP/1.1 and h2c), so a
//! test can check what reached the upstream byte for byte and which upstream it was.
//! Each answers 200 with `{"upstream": NAME, "bytes": BODY_LEN}` and `x-upstream: NAME`.
//! For long load runs, [`Upstream::counting`] keeps only each request's numeric id (one
//! header) instead of the whole request, so memory stays small over minutes. A test can
//! make a replica slow ([`Upstream::set_delay`]: the answer waits) or failing
//! ([`Upstream::set_status`]: the answer carries that status) while it runs, or make it
//! stream server-sent events ([`Upstream::set_sse`]) whose last event waits for the test.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    /// `HTTP/1.1` or `HTTP/2.0`, as the request arrived.
    pub version: String,
    pub path: String,
    /// Names lowercase, in arrival order, duplicates kept.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When its headers arrived.
    pub at: std::time::Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::header_value(&self.headers, name)
    }
}

/// What an upstream keeps of each request.
enum Log {
    /// Everything ([`Received`]).
    Full(Mutex<Vec<Received>>),
    /// The value of one header, parsed as a number; requests without it only counted.
    Ids {
        header: String,
        ids: Mutex<Vec<u64>>,
        others: AtomicUsize,
    },
}

/// How the upstream answers, changeable while it runs.
#[derive(Default)]
struct Behaviour {
    delay_ms: AtomicU64,
    /// 0: 200.
    status: AtomicU16,
    /// Answer with these server-sent events instead of the JSON reply.
    sse: Mutex<Option<Sse>>,
}

/// A streamed answer: every event but the last at once, the last once the gate opens.
#[derive(Clone)]
struct Sse {
    events: Vec<Bytes>,
    gate: Arc<tokio::sync::Semaphore>,
}

/// Releases the last event of [`Upstream::set_sse`]'s streams, one stream per call.
#[derive(Clone)]
pub struct SseGate(Arc<tokio::sync::Semaphore>);

impl SseGate {
    /// Lets one waiting (or the next) stream send its last event and end.
    pub fn release(&self) {
        self.0.add_permits(1);
    }
}

/// A response body fed by the answering task, frame by frame as they are sent.
pub struct Streamed(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|piece| piece.map(|bytes| Ok(Frame::data(bytes))))
    }
}

impl Streamed {
    /// A body of one piece.
    fn whole(bytes: Bytes) -> Streamed {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        sender.try_send(bytes).expect("room for one piece");
        Streamed(receiver)
    }
}

/// A recording upstream on a free loopback port; stops when dropped.
pub struct Upstream {
    pub name: String,
    pub port: u16,
    received: Arc<Log>,
    behaviour: Arc<Behaviour>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub fn start(name: &str) -> Upstream {
        Upstream::spawn(name, Log::Full(Mutex::new(Vec::new())))
    }

    /// An upstream that keeps only the numeric value of header `header` of each request
    /// (see [`Upstream::ids`]) and counts the requests without it.
    pub fn counting(name: &str, header: &str) -> Upstream {
        Upstream::spawn(
            name,
            Log::Ids {
                header: header.to_owned(),
                ids: Mutex::new(Vec::new()),
                others: AtomicUsize::new(0),
            },
        )
    }

    /// A recording upstream on `addr` (another loopback address, so that DNS can name
    /// engines on one port by address).
    pub fn start_at(name: &str, addr: std::net::SocketAddr) -> std::io::Result<Upstream> {
        let listener = std::net::TcpListener::bind(addr)?;
        Ok(Upstream::serve(
            name,
            Log::Full(Mutex::new(Vec::new())),
            listener,
            addr.port(),
        ))
    }

    fn spawn(name: &str, log: Log) -> Upstream {
        // A port from the harness's range (never the kernel's ephemeral range): taken by
        // the time it binds, another is tried.
        let (listener, port) = crate::with_port_retries("upstream", |_| {
            let port = crate::free_port();
            std::net::TcpListener::bind(("127.0.0.1", port))
                .map(|listener| (listener, port))
                .map_err(|e| e.to_string())
        });
        Upstream::serve(name, log, listener, port)
    }

    fn serve(name: &str, log: Log, listener: std::net::TcpListener, port: u16) -> Upstream {
        listener.set_nonblocking(true).unwrap();
        let received = Arc::new(log);
        let behaviour = Arc::new(Behaviour::default());
        let (shutdown, mut stop) = tokio::sync::oneshot::channel::<()>();
        let (log, upstream_name) = (Arc::clone(&received), name.to_owned());
        let how = Arc::clone(&behaviour);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stop => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let _ = stream.set_nodelay(true);
                            let (log, name) = (Arc::clone(&log), upstream_name.clone());
                            let how = Arc::clone(&how);
                            tokio::spawn(async move {
                                let service = service_fn(move |request| {
                                    answer_after(request, Arc::clone(&log), name.clone(), Arc::clone(&how))
                                });
                                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            });
                        }
                    }
                }
            });
        });
        Upstream {
            name: name.to_owned(),
            port,
            received,
            behaviour,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// Answers wait this long from now on (a slow replica).
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.behaviour
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Answers carry this status from now on (200 again with `200`).
    pub fn set_status(&self, status: u16) {
        self.behaviour.status.store(status, Ordering::SeqCst);
    }

    /// Answers to `POST`s are these server-sent events from now on (`text/event-stream`,
    /// each event given whole, e.g. `data: {...}\n\n`): all but the last at once, the last
    /// when the returned gate is released (once per stream), so a test can see the first
    /// events arrive while the upstream still holds the stream open. Other methods (the
    /// batcher's health and metrics probes) are answered as before.
    pub fn set_sse(&self, events: &[&str]) -> SseGate {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *self.behaviour.sse.lock().unwrap() = Some(Sse {
            events: events
                .iter()
                .map(|e| Bytes::copy_from_slice(e.as_bytes()))
                .collect(),
            gate: Arc::clone(&gate),
        });
        SseGate(gate)
    }

    /// Everything received so far (empty for a [`Upstream::counting`] one).
    pub fn received(&self) -> Vec<Received> {
        match &*self.received {
            Log::Full(all) => all.lock().unwrap().clone(),
            Log::Ids { .. } => Vec::new(),
        }
    }

    /// Requests received so far.
    pub fn count(&self) -> usize {
        match &*self.received {
            Log::Full(all) => all.lock().unwrap().len(),
            Log::Ids { ids, others, .. } => {
                ids.lock().unwrap().len() + others.load(Ordering::Relaxed)
            }
        }
    }

    /// A counting upstream's ids, in arrival order (duplicates kept).
    pub fn ids(&self) -> Vec<u64> {
        match &*self.received {
            Log::Full(_) => Vec::new(),
            Log::Ids { ids, .. } => ids.lock().unwrap().clone(),
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Records the request, then answers as the behaviour says.
async fn answer_after(
    request: Request<Incoming>,
    log: Arc<Log>,
    name: String,
    how: Arc<Behaviour>,
) -> Result<Response<Streamed>, Infallible> {
    let delay = how.delay_ms.load(Ordering::SeqCst);
    let status = how.status.load(Ordering::SeqCst);
    let sse = match request.method() {
        &hyper::Method::POST => how.sse.lock().unwrap().clone(),
        _ => None,
    };
    let mut response = record(request, log, name.clone()).await?;
    if let Some(sse) = sse {
        response = stream_events(&name, sse);
    }
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    if status != 0 {
        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    }
    Ok(response)
}

async fn record(
    request: Request<Incoming>,
    log: Arc<Log>,
    name: String,
) -> Result<Response<Streamed>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let bytes = body.len();
    let all = match &*log {
        Log::Full(all) => all,
        Log::Ids {
            header,
            ids,
            others,
        } => {
            let id = parts
                .headers
                .get(header.as_str())
                .and_then(|v| v.to_str().ok()?.parse().ok());
            match id {
                Some(id) => ids.lock().unwrap().push(id),
                None => {
                    others.fetch_add(1, Ordering::Relaxed);
                }
            }
            return Ok(answer(&name, bytes));
        }
    };
    all.lock().unwrap().push(Received {
        at: std::time::Instant::now(),
        method: parts.method.to_string(),
        version: format!("{:?}", parts.version),
        path: parts.uri.to_string(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
    });
    Ok(answer(&name, bytes))
}

fn answer(name: &str, bytes: usize) -> Response<Streamed> {
    let reply = serde_json::json!({"upstream": name, "bytes": bytes}).to_string();
    Response::builder()
        .header("content-type", "application/json")
        .header("x-upstream", name)
        .body(Streamed::whole(Bytes::from(reply)))
        .unwrap()
}

/// A `text/event-stream` answer: the events but the last sent at once, the last after the
/// gate lets it through.
fn stream_events(name: &str, sse: Sse) -> Response<Streamed> {
    let (sender, receiver) = tokio::sync::mpsc::channel(sse.events.len().max(1));
    tokio::spawn(async move {
        let Some((last, first)) = sse.events.split_last() else {
            return;
        };
        for event in first {
            if sender.send(event.clone()).await.is_err() {
                return;
            }
        }
        if let Ok(permit) = sse.gate.acquire().await {
            permit.forget();
            let _ = sender.send(last.clone()).await;
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .header("x-upstream", name)
        .body(Streamed(receiver))
        .unwrap()
}
