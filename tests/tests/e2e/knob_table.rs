//! The knob × mode table of docs/CONTRACT.md ("Knobs by mode"), walked cell by cell
//! through real Envoy with the real filter, one Envoy per mode.
//!
//! An **acts** cell must change something a test can see: two values of the knob give two
//! different routing headers at the upstream (`x-cohort-key`, `x-cohort-cluster`,
//! `x-cohort-fp`), or two different fields in the `Assign` request the batcher acts on
//! (its knobs, its session), or reach the batch front; and the response names no ignored
//! knob. An **ignored** cell must show in the response's `x-cohort-ignored` and in its
//! stat, `cohort_knob_ignored_<knob>_<mode>_total`.
//!
//! The batcher of the walk is a recording gRPC server of the `cohort.v1` contract that
//! answers every `Assign` with `replica-0`, as a batcher that knows the replicas' URLs
//! (and so has its front) does: what the batcher does with the fields (warm-ups,
//! residency, the predictor) is tested against real `cohort serve` in `assign_prefetch`,
//! `batcher_assign` and `batch_knobs`; this walk checks what the filter hands it and what
//! the caller is told. A real `cohort serve` that knows the replicas by name only has no
//! front, so it cannot warm or predict: it says so in its reply, and the caller is told
//! that the prefetch level and the session did nothing
//! (`a_batcher_without_the_replicas_urls_says_prefetch_and_session_do_nothing`).

use cohort_proto as pb;
use cohort_tests::client::Connection;
use cohort_tests::config::{self, set_endpoints, set_filter};
use cohort_tests::envoy::Envoy;
use cohort_tests::stack::{Replicas, Stack};
use cohort_tests::upstream::{Received, Upstream};
use pb::batcher_server::{Batcher, BatcherServer};
use serde_json::json;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status, Streaming};

const CHAT: &str = "/v1/chat/completions";

/// A `cohort.v1.Batcher` that records every `Assign` and answers `replica-0`.
#[derive(Default, Clone)]
struct Recorder {
    assigns: Arc<Mutex<Vec<pb::AssignRequest>>>,
}

#[tonic::async_trait]
impl Batcher for Recorder {
    async fn assign(
        &self,
        request: Request<pb::AssignRequest>,
    ) -> Result<Response<pb::AssignReply>, Status> {
        self.assigns.lock().unwrap().push(request.into_inner());
        Ok(Response::new(pb::AssignReply {
            shard: "replica-0".into(),
            reason: "least_loaded".into(),
            ..Default::default()
        }))
    }

    async fn observe(
        &self,
        request: Request<Streaming<pb::ObservationBatch>>,
    ) -> Result<Response<pb::ObserveSummary>, Status> {
        let mut stream = request.into_inner();
        let mut received = 0;
        while let Ok(Some(batch)) = stream.message().await {
            received += batch.observations.len() as u64;
        }
        Ok(Response::new(pb::ObserveSummary { received }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        Ok(Response::new(pb::StatusReply::default()))
    }
}

/// The recording batcher on a free port; stops when dropped.
struct FakeBatcher {
    port: u16,
    recorder: Recorder,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeBatcher {
    fn start() -> FakeBatcher {
        let recorder = Recorder::default();
        let port = cohort_tests::free_port();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let service = BatcherServer::new(recorder.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_shutdown(([127, 0, 0, 1], port).into(), async {
                        let _ = stop.await;
                    })
                    .await;
            });
        });
        let listening = cohort_tests::eventually(std::time::Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(listening, "the fake batcher never listened on {port}");
        FakeBatcher {
            port,
            recorder,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    fn last_assign(&self) -> Option<pb::AssignRequest> {
        self.recorder.assigns.lock().unwrap().last().cloned()
    }

    fn assigns(&self) -> usize {
        self.recorder.assigns.lock().unwrap().len()
    }
}

impl Drop for FakeBatcher {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The knobs, as the walk sends them: header, two values that must differ in effect.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Knob {
    Prefetch,
    BatchThreshold,
    CacheTtl,
    SemanticMode,
    RoutingKey,
    OriginalQuery,
    Session,
}

const KNOBS: [Knob; 7] = [
    Knob::Prefetch,
    Knob::BatchThreshold,
    Knob::CacheTtl,
    Knob::SemanticMode,
    Knob::RoutingKey,
    Knob::OriginalQuery,
    Knob::Session,
];

impl Knob {
    fn header(self) -> &'static str {
        match self {
            Knob::Prefetch => "x-cohort-prefetch",
            Knob::BatchThreshold => "x-cohort-batch-threshold",
            Knob::CacheTtl => "x-cohort-cache-ttl",
            Knob::SemanticMode => "x-cohort-semantic-mode",
            Knob::RoutingKey => "x-cohort-routing-key",
            Knob::OriginalQuery => "x-original-query",
            Knob::Session => "x-cohort-session",
        }
    }

    /// The name in `x-cohort-ignored`, and in its stat (with `_` for `-`).
    fn name(self) -> &'static str {
        match self {
            Knob::Prefetch => "prefetch",
            Knob::BatchThreshold => "batch-threshold",
            Knob::CacheTtl => "cache-ttl",
            Knob::SemanticMode => "semantic-mode",
            Knob::RoutingKey => "routing-key",
            Knob::OriginalQuery => "original-query",
            Knob::Session => "session",
        }
    }

    fn values(self) -> [&'static str; 2] {
        match self {
            Knob::Prefetch => ["high", "none"],
            Knob::BatchThreshold => ["0.1", "0.9"],
            Knob::CacheTtl => ["300", "1800"],
            Knob::SemanticMode => ["intent", "topic"],
            Knob::RoutingKey => ["rules-a", "rules-b"],
            Knob::OriginalQuery => [
                "how do I get a refund for my order",
                "what will the weather be in Paris tomorrow",
            ],
            Knob::Session => ["session-a", "session-b"],
        }
    }
}

/// What a cell says (docs/CONTRACT.md, "Knobs by mode").
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cell {
    Acts,
    /// Acts with a session, ignored without one.
    ActsWithSession,
    Ignored,
}

/// The table, as the contract states it: (affinity, assign, batch) per knob.
fn table(knob: Knob) -> [Cell; 3] {
    use Cell::*;
    match knob {
        Knob::Prefetch => [Ignored, ActsWithSession, Acts],
        Knob::CacheTtl | Knob::Session => [Ignored, Acts, Acts],
        _ => [Acts, Acts, Acts],
    }
}

/// One mode's Envoy, where its requests land, and its batcher.
struct Mode {
    name: &'static str,
    column: usize,
    envoy: Envoy,
    /// Where routed requests arrive (the replica, or batch mode's front).
    landing: Upstream,
    batcher: Option<FakeBatcher>,
    _others: Vec<Upstream>,
}

/// What one request did.
struct Seen {
    ignored: Option<String>,
    cohort: String,
    upstream: Received,
    assign: Option<pb::AssignRequest>,
}

impl Mode {
    fn affinity() -> Mode {
        let landing = Upstream::start("replica-0");
        let mut yaml = config::load("affinity");
        set_endpoints(&mut yaml, "engines", &[landing.port]);
        set_filter(&mut yaml, r#"{"mode": "affinity"}"#);
        Mode {
            name: "affinity",
            column: 0,
            envoy: Envoy::start(&yaml),
            landing,
            batcher: None,
            _others: Vec::new(),
        }
    }

    /// A generous Assign deadline: a late answer would route the request as in affinity
    /// mode, which is another column of the table.
    const PLUGIN_ASSIGN: &'static str = r#"{"mode": "assign", "assign_deadline_ms": 2000, "batcher_clusters": ["cohort-batcher-0"]}"#;
    const PLUGIN_BATCH: &'static str = r#"{"mode": "batch", "assign_deadline_ms": 2000, "batcher_clusters": ["cohort-batcher-0"]}"#;

    fn assign() -> Mode {
        let batcher = FakeBatcher::start();
        let replicas: Vec<Upstream> = (0..3)
            .map(|i| Upstream::start(&format!("replica-{i}")))
            .collect();
        let ports: Vec<u16> = replicas.iter().map(|u| u.port).collect();
        let yaml = Envoy::assign_config(&[batcher.port], &ports, Mode::PLUGIN_ASSIGN);
        let mut replicas = replicas.into_iter();
        let landing = replicas.next().unwrap();
        Mode {
            name: "assign",
            column: 1,
            envoy: Envoy::start(&yaml),
            landing,
            batcher: Some(batcher),
            _others: replicas.collect(),
        }
    }

    fn batch() -> Mode {
        let batcher = FakeBatcher::start();
        let front = Upstream::start("front");
        let replicas: Vec<Upstream> = (0..3)
            .map(|i| Upstream::start(&format!("replica-{i}")))
            .collect();
        let ports: Vec<u16> = replicas.iter().map(|u| u.port).collect();
        let yaml = Envoy::batch_config(batcher.port, front.port, &ports, Mode::PLUGIN_BATCH);
        let envoy = Envoy::start(&yaml);
        envoy.wait_front_healthy(ports.len());
        Mode {
            name: "batch",
            column: 2,
            envoy,
            landing: front,
            batcher: Some(batcher),
            _others: replicas,
        }
    }

    /// Sends a bare prompt with `headers` and a walk id; returns what came of it.
    fn send(&self, connection: &mut Connection, id: usize, headers: &[(&str, &str)]) -> Seen {
        let id = id.to_string();
        let mut all = headers.to_vec();
        all.push(("x-walk-id", &id));
        let body = serde_json::to_vec(&json!({"model": "m", "messages": [
            {"role": "user", "content": "can you help me cancel the order I placed yesterday"}
        ]}))
        .unwrap();
        // Batch mode's front cluster fails over to the replicas when the front's
        // connection fails (a lower priority, istio/envoy/batch.yaml): a request Envoy
        // moved there says so (`x-upstream`) and is sent again; the knob is judged on
        // what the front received.
        let mut attempts = 0;
        let (response, assigns_before, upstream) = loop {
            attempts += 1;
            let assigns_before = self.batcher.as_ref().map_or(0, FakeBatcher::assigns);
            let response = connection.post_json(CHAT, &all, &body).unwrap();
            assert_eq!(response.status, 200, "{}: {}", self.name, response.text());
            let landed = self
                .landing
                .received()
                .into_iter()
                .rev()
                .find(|r| r.header("x-walk-id") == Some(id.as_str()));
            let answered_by = response.header("x-upstream").unwrap_or("").to_owned();
            match landed {
                Some(upstream) => break (response, assigns_before, upstream),
                None if attempts < 3 && answered_by != self.landing.name => {
                    eprintln!(
                        "{}: request {id} failed over to {answered_by:?}; sent again",
                        self.name
                    );
                }
                None => panic!(
                    "{}: request {id} did not reach {} (answered by {answered_by:?})",
                    self.name, self.landing.name
                ),
            }
        };
        let cohort = response.header("x-cohort").unwrap_or("").to_owned();
        assert!(
            cohort.contains(&format!("mode={}", self.name)) && !cohort.contains("fallback"),
            "{}: routed in its own mode: {cohort}",
            self.name
        );
        let assign = self.batcher.as_ref().map(|b| {
            assert_eq!(b.assigns(), assigns_before + 1, "{}: one Assign", self.name);
            b.last_assign().unwrap()
        });
        Seen {
            ignored: response.header("x-cohort-ignored").map(str::to_owned),
            cohort,
            upstream,
            assign,
        }
    }

    fn ignored_stat(&self, knob: Knob) -> u64 {
        self.envoy.stat(&format!(
            "wasmcustom.cohort_knob_ignored_{}_{}_total",
            knob.name().replace('-', "_"),
            self.name
        ))
    }
}

/// What an acting knob changes, as the walk observes it.
fn effect(knob: Knob, seen: &Seen) -> String {
    let header = |name: &str| seen.upstream.header(name).unwrap_or("").to_owned();
    let assign = seen.assign.as_ref();
    let info = assign.and_then(|a| a.request.as_ref());
    let knobs = info.and_then(|i| i.knobs);
    match knob {
        Knob::Prefetch => format!(
            "assign prefetch {:?}; at the upstream {:?}",
            knobs.map(|k| k.prefetch),
            header("x-cohort-prefetch")
        ),
        Knob::CacheTtl => format!("assign cache_ttl_s {:?}", knobs.map(|k| k.cache_ttl_s)),
        Knob::Session => format!("assign session {:?}", info.map(|i| i.session.clone())),
        Knob::BatchThreshold => format!(
            "cluster {} (assign threshold {:?})",
            header("x-cohort-cluster"),
            knobs.map(|k| k.batch_threshold)
        ),
        Knob::SemanticMode => format!(
            "cluster {} fp {}",
            header("x-cohort-cluster"),
            header("x-cohort-fp")
        ),
        Knob::RoutingKey => format!("key {}", header("x-cohort-key")),
        Knob::OriginalQuery => format!("fp {}", header("x-cohort-fp")),
    }
}

fn names(ignored: &Option<String>) -> Vec<String> {
    ignored
        .as_deref()
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Walks one mode's column.
fn walk(mode: &Mode) {
    let mut connection = Connection::new(mode.envoy.listen_port);
    let mut id = 0;
    let mut send = |headers: &[(&str, &str)]| {
        id += 1;
        mode.send(&mut connection, id, headers)
    };
    // Without any knob, nothing is said.
    let plain = send(&[]);
    assert_eq!(plain.ignored, None, "{}: {}", mode.name, plain.cohort);
    for knob in KNOBS {
        let cell = table(knob)[mode.column];
        let [a, b] = knob.values();
        // With a session, unless the knob is the session: ActsWithSession cells act then.
        let with_session = |value: &'static str| -> Vec<(&'static str, &'static str)> {
            let mut headers = vec![(knob.header(), value)];
            if cell == Cell::ActsWithSession {
                headers.push(("x-cohort-session", "session-walk"));
            }
            headers
        };
        match cell {
            Cell::Acts | Cell::ActsWithSession => {
                let (seen_a, seen_b) = (send(&with_session(a)), send(&with_session(b)));
                for seen in [&seen_a, &seen_b] {
                    assert!(
                        !names(&seen.ignored).contains(&knob.name().to_owned()),
                        "{} × {}: acts, but the response says ignored ({:?})",
                        knob.name(),
                        mode.name,
                        seen.ignored
                    );
                }
                let (ea, eb) = (effect(knob, &seen_a), effect(knob, &seen_b));
                println!(
                    "{} × {}: acts: {a:?} → {ea}; {b:?} → {eb}",
                    knob.name(),
                    mode.name
                );
                assert_ne!(
                    ea,
                    eb,
                    "{} × {}: no observable effect",
                    knob.name(),
                    mode.name
                );
            }
            Cell::Ignored => {}
        }
        if matches!(cell, Cell::Ignored | Cell::ActsWithSession) {
            let before = mode.ignored_stat(knob);
            let seen = send(&[(knob.header(), a)]);
            println!(
                "{} × {}: ignored{}: x-cohort-ignored {:?}",
                knob.name(),
                mode.name,
                if cell == Cell::ActsWithSession {
                    " without a session"
                } else {
                    ""
                },
                seen.ignored
            );
            assert_eq!(
                names(&seen.ignored),
                [knob.name()],
                "{} × {}: {}",
                knob.name(),
                mode.name,
                seen.cohort
            );
            assert_eq!(
                mode.ignored_stat(knob),
                before + 1,
                "{} × {}: the stat",
                knob.name(),
                mode.name
            );
        }
    }
}

#[test]
fn every_knob_in_every_mode_acts_or_says_it_did_not() {
    for mode in [Mode::affinity(), Mode::assign(), Mode::batch()] {
        walk(&mode);
    }
}

#[test]
fn affinity_mode_names_every_ignored_knob_of_a_request() {
    let mode = Mode::affinity();
    let mut connection = Connection::new(mode.envoy.listen_port);
    let seen = mode.send(
        &mut connection,
        1,
        &[
            ("x-cohort-prefetch", "high"),
            ("x-cohort-cache-ttl", "1800"),
            ("x-cohort-batch-threshold", "0.7"),
        ],
    );
    assert_eq!(seen.ignored.as_deref(), Some("prefetch,cache-ttl"));
    // A malformed value is still the caller's setting: named, and counted as invalid.
    let seen = mode.send(&mut connection, 2, &[("x-cohort-cache-ttl", "soon")]);
    assert_eq!(seen.ignored.as_deref(), Some("cache-ttl"));
    assert_eq!(mode.ignored_stat(Knob::CacheTtl), 2);
    assert_eq!(mode.ignored_stat(Knob::Prefetch), 1);
    assert_eq!(
        mode.envoy
            .stat("wasmcustom.cohort_invalid_knob_cache_ttl_total"),
        1
    );
}

#[test]
fn a_batcher_without_the_replicas_urls_says_prefetch_and_session_do_nothing() {
    let headers = [
        ("x-cohort-prefetch", "high"),
        ("x-cohort-session", "session-a"),
        ("x-cohort-cache-ttl", "1800"),
    ];
    let body = serde_json::to_vec(&json!({"model": "m", "messages": [
        {"role": "user", "content": "can you help me cancel the order I placed yesterday"}
    ]}))
    .unwrap();
    // By name only (the shipped assign overlay's COHORT_REPLICAS): no front.
    let names = Stack::assign().start();
    let response = cohort_tests::client::post_json(names.port(), CHAT, &headers, &body);
    let cohort = response.header("x-cohort").unwrap_or("").to_owned();
    assert!(cohort.contains("mode=assign"), "{cohort}");
    assert_eq!(
        response.header("x-cohort-ignored"),
        Some("prefetch,session"),
        "{cohort}"
    );
    for knob in ["prefetch", "session"] {
        let stat = format!("wasmcustom.cohort_knob_ignored_{knob}_assign_total");
        assert_eq!(names.envoy.stat(&stat), 1, "{stat}");
    }
    drop(names);
    // With the replicas' URLs the batcher has its front: both act.
    let urls = Stack::assign().replicas(Replicas::Urls).start();
    let response = cohort_tests::client::post_json(urls.port(), CHAT, &headers, &body);
    let cohort = response.header("x-cohort").unwrap_or("").to_owned();
    assert!(cohort.contains("mode=assign"), "{cohort}");
    assert_eq!(response.header("x-cohort-ignored"), None, "{cohort}");
}
