//! The picker end to end over gRPC: an in-process tonic server on 127.0.0.1:0 and
//! Envoy's side played by a tonic client, driving whole `Process` streams.

use super::protocol::{self, DESTINATION, LB_NAMESPACE};
use super::{serve, Picker};
use crate::clock::Clock;
use crate::config::{DiscoverySection, ServeConfig};
use crate::discovery::Member;
use crate::fleet::EngineEvents;
use crate::serve::brain::Brain;
use cohort_ext_proc_proto::core::{HeaderMap, HeaderValue, Metadata};
use cohort_ext_proc_proto::ext_proc::external_processor_client::ExternalProcessorClient;
use cohort_ext_proc_proto::ext_proc::{
    body_mutation, processing_request, processing_response, HttpBody, HttpHeaders, HttpTrailers,
    ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use cohort_ext_proc_proto::mode::processing_mode::BodySendMode;
use cohort_ext_proc_proto::prost_types::value::Kind;
use cohort_ext_proc_proto::prost_types::Struct;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"system","content":"You are the bank's support assistant."},{"role":"user","content":"where is my new card"}]}"#;

/// A running picker over `replicas` discovered replicas (`r{i}` at `10.0.0.{i}:8000`, all
/// probed up), with its brain and its stop switch.
struct Harness {
    brain: Arc<Brain>,
    picker: Arc<Picker>,
    client: ExternalProcessorClient<tonic::transport::Channel>,
    channel: tonic::transport::Channel,
    stop: watch::Sender<bool>,
}

fn endpoint(i: usize) -> String {
    format!("10.0.0.{i}:8000")
}

async fn harness_with(replicas: usize, change: impl FnOnce(&mut Picker)) -> Harness {
    harness_configured(replicas, |_| {}, change).await
}

/// A harness whose `cohort serve` configuration `configure` changes first.
async fn harness_configured(
    replicas: usize,
    configure: impl FnOnce(&mut ServeConfig),
    change: impl FnOnce(&mut Picker),
) -> Harness {
    let mut config = ServeConfig {
        discovery: DiscoverySection {
            dns: Some("engines.test".into()),
            ..Default::default()
        },
        ..ServeConfig::default()
    };
    configure(&mut config);
    let clock = Clock::start();
    let brain = Arc::new(Brain::new(&config, clock));
    let members: Vec<Member> = (0..replicas)
        .map(|i| Member {
            name: format!("r{i}"),
            endpoint: endpoint(i),
        })
        .collect();
    for (slot, _) in brain.set_replicas(&members) {
        brain.engine_up(slot);
    }
    let mut picker = Picker::new(&config, Arc::clone(&brain), clock).unwrap();
    change(&mut picker);
    let picker = Arc::new(picker);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let _tasks = serve(
        listener,
        Arc::clone(&picker),
        stop_rx,
        Arc::new(AtomicBool::new(false)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Harness {
        brain,
        picker,
        client: ExternalProcessorClient::new(channel.clone()),
        channel,
        stop,
    }
}

async fn harness(replicas: usize) -> Harness {
    harness_with(replicas, |_| {}).await
}

/// One open `Process` stream.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
}

impl Harness {
    async fn open(&mut self) -> Stream {
        let (tx, rx) = mpsc::channel(64);
        let rx = self
            .client
            .process(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Stream { tx, rx }
    }

    /// Requests in flight on each replica, from the brain's status.
    fn in_flight(&self) -> u32 {
        use crate::front::LiveFleet;
        self.brain.in_flight().iter().sum()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl Stream {
    async fn send(&self, request: ProcessingRequest) {
        self.tx.send(request).await.unwrap();
    }

    async fn recv(&mut self) -> ProcessingResponse {
        tokio::time::timeout(Duration::from_secs(5), self.rx.message())
            .await
            .expect("an answer within 5 s")
            .unwrap()
            .expect("the stream is open")
    }

    /// Nothing more arrives for a short while.
    async fn quiet(&mut self) {
        let more = tokio::time::timeout(Duration::from_millis(100), self.rx.message()).await;
        assert!(more.is_err(), "unexpected answer: {more:?}");
    }
}

fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: k.to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn post_headers(
    extra: &[(&str, &str)],
    end_of_stream: bool,
    mode: BodySendMode,
) -> ProcessingRequest {
    let mut pairs = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "llm.test"),
        ("content-type", "application/json"),
    ];
    pairs.extend_from_slice(extra);
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(&pairs)),
            end_of_stream,
            ..Default::default()
        })),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: mode as i32,
            response_body_mode: BodySendMode::None as i32,
            send_body_without_waiting_for_header_response: false,
        }),
        ..Default::default()
    }
}

fn with_metadata(mut request: ProcessingRequest, metadata: Metadata) -> ProcessingRequest {
    request.metadata_context = Some(metadata);
    request
}

fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestTrailers(
            HttpTrailers::default(),
        )),
        ..Default::default()
    }
}

fn response_headers(status: &str, served: Option<&str>, end_of_stream: bool) -> ProcessingRequest {
    let mut metadata = Metadata::default();
    if let Some(served) = served {
        metadata.filter_metadata.insert(
            LB_NAMESPACE.into(),
            Struct {
                fields: [(
                    protocol::SERVED_KEY.into(),
                    cohort_ext_proc_proto::prost_types::Value {
                        kind: Some(Kind::StringValue(served.into())),
                    },
                )]
                .into(),
            },
        );
    }
    ProcessingRequest {
        request: Some(processing_request::Request::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(&[(":status", status)])),
            end_of_stream,
            ..Default::default()
        })),
        metadata_context: Some(metadata),
        ..Default::default()
    }
}

/// The headers a response sets (name → value), the headers it removes, and the
/// destination in its `envoy.lb` metadata.
struct Written {
    set: Vec<(String, String)>,
    removed: Vec<String>,
    metadata: Option<String>,
}

impl Written {
    fn get(&self, name: &str) -> Option<&str> {
        self.set
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn destination(&self) -> &str {
        let header = self.get(DESTINATION).expect("a destination header");
        assert_eq!(
            self.metadata.as_deref(),
            Some(header),
            "header and metadata agree"
        );
        header
    }
}

fn written(response: &ProcessingResponse) -> Written {
    use processing_response::Response;
    let common = match &response.response {
        Some(Response::RequestHeaders(h)) => h.response.clone(),
        Some(Response::RequestBody(b)) => b.response.clone(),
        other => panic!("not a request headers or body answer: {other:?}"),
    }
    .unwrap_or_default();
    let mutation = common.header_mutation.unwrap_or_default();
    let metadata = response.dynamic_metadata.as_ref().and_then(|m| {
        let Some(Kind::StructValue(lb)) = &m.fields.get(LB_NAMESPACE)?.kind else {
            return None;
        };
        match &lb.fields.get(DESTINATION)?.kind {
            Some(Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        }
    });
    Written {
        set: mutation
            .set_headers
            .iter()
            .filter_map(|o| o.header.as_ref())
            .map(|h| {
                (
                    h.key.clone(),
                    String::from_utf8(h.raw_value.clone()).unwrap(),
                )
            })
            .collect(),
        removed: mutation.remove_headers,
        metadata,
    }
}

fn is_headers_answer(response: &ProcessingResponse) -> bool {
    matches!(
        response.response,
        Some(processing_response::Response::RequestHeaders(_))
    )
}

/// A full-duplex body answer's chunk and end flag.
fn streamed(response: &ProcessingResponse) -> (Vec<u8>, bool) {
    let Some(processing_response::Response::RequestBody(b)) = &response.response else {
        panic!("not a body answer: {response:?}");
    };
    let mutation = b
        .response
        .as_ref()
        .and_then(|c| c.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref());
    match mutation {
        Some(body_mutation::Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not a streamed response: {other:?}"),
    }
}

fn immediate_status(response: &ProcessingResponse) -> i32 {
    match &response.response {
        Some(processing_response::Response::ImmediateResponse(i)) => {
            i.status.as_ref().map_or(0, |s| s.code)
        }
        other => panic!("not an immediate response: {other:?}"),
    }
}

fn endpoints_of(list: &str) -> Vec<&str> {
    list.split(',').collect()
}

#[tokio::test]
async fn buffered_headers_then_body_answers_the_endpoint_and_the_filters_headers() {
    let mut h = harness(3).await;
    let mut s = h.open().await;
    s.send(post_headers(
        &[("x-cohort-key", "spoofed"), ("x-request-id", "req-1")],
        false,
        BodySendMode::Buffered,
    ))
    .await;
    // Envoy waits for this answer before it sends a buffered body.
    let first = written(&s.recv().await);
    assert_eq!(first.removed, ["x-cohort-key"]);
    assert!(first.get(DESTINATION).is_none());
    s.send(body(CHAT.as_bytes(), true)).await;
    let answer = written(&s.recv().await);
    let list = endpoints_of(answer.destination())
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>();
    assert_eq!(list.len(), 3, "primary and two fallbacks: {list:?}");
    assert!(list.iter().all(|e| e.starts_with("10.0.0.")));
    let shard = answer.get("x-cohort-shard").unwrap();
    assert_eq!(endpoint(shard[1..].parse().unwrap()), list[0]);
    for name in [
        "x-cohort-key",
        "x-cohort-prefix",
        "x-cohort-fp",
        "x-cohort-cluster",
    ] {
        assert!(answer.get(name).is_some(), "{name} written");
    }
    assert!(answer.get("x-cohort-bypass").is_none());
    assert_eq!(h.in_flight(), 1);
    s.send(response_headers("200", None, false)).await;
    let Some(processing_response::Response::ResponseHeaders(r)) = s.recv().await.response else {
        panic!("a response headers answer")
    };
    let x_cohort = r
        .response
        .and_then(|c| c.header_mutation)
        .and_then(|m| m.set_headers.into_iter().next())
        .and_then(|o| o.header)
        .map(|h| String::from_utf8(h.raw_value).unwrap())
        .unwrap();
    assert!(
        x_cohort.contains("mode=picker; cluster=") && x_cohort.contains(&format!("shard={shard}")),
        "{x_cohort}"
    );
    drop(s.tx);
    // Envoy closes the stream when the HTTP stream completes: the ticket ends.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.in_flight(), 0);
    // The audit has the request, as assign mode's.
    let record = h.brain.audit().get("", "req-1").expect("audited");
    assert_eq!(record.replica, shard);
    assert_eq!(record.status, Some(200));
}

#[tokio::test]
async fn full_duplex_holds_the_body_then_answers_headers_and_echoes_every_chunk_in_order() {
    let mut h = harness(3).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
        .await;
    let bytes = CHAT.as_bytes();
    let chunks: Vec<&[u8]> = bytes.chunks(17).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        s.send(body(chunk, i + 1 == chunks.len())).await;
    }
    let headers = s.recv().await;
    assert!(is_headers_answer(&headers), "headers first: {headers:?}");
    let answer = written(&headers);
    assert_eq!(endpoints_of(answer.destination()).len(), 3);
    assert!(answer.get("x-cohort-key").is_some());
    let mut echoed = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let (back, eos) = streamed(&s.recv().await);
        assert_eq!(back, *chunk, "chunk {i} unchanged");
        assert_eq!(eos, i + 1 == chunks.len());
        echoed.extend(back);
    }
    assert_eq!(echoed, bytes);
    s.quiet().await;
}

#[tokio::test]
async fn stopping_mid_body_answers_the_request_before_the_stream_ends() {
    // The picker stops while a full-duplex body is half sent: the stream stays until the
    // body's end, the decision and every chunk go back, then it ends. A stream that has
    // received nothing ends with UNAVAILABLE (Envoy applies the pool's failure mode).
    let mut h = harness(3).await;
    let mut s = h.open().await;
    let mut idle = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
        .await;
    let bytes = CHAT.as_bytes();
    let (first, rest) = bytes.split_at(bytes.len() / 2);
    s.send(body(first, false)).await;
    s.quiet().await;
    h.stop.send(true).unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), idle.rx.message())
        .await
        .expect("the idle stream ends");
    assert_eq!(
        refused.unwrap_err().code(),
        tonic::Code::Unavailable,
        "nothing received: UNAVAILABLE"
    );
    s.send(body(rest, true)).await;
    let headers = s.recv().await;
    assert!(is_headers_answer(&headers), "headers first: {headers:?}");
    assert_eq!(endpoints_of(written(&headers).destination()).len(), 3);
    let mut echoed = streamed(&s.recv().await).0;
    echoed.extend(streamed(&s.recv().await).0);
    assert_eq!(echoed, bytes, "every chunk back, in order");
    let end = tokio::time::timeout(Duration::from_secs(5), s.rx.message())
        .await
        .expect("the stream ends once the request is answered");
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert_eq!(h.in_flight(), 0, "its ticket ended with the stream");
}

#[tokio::test]
async fn a_body_mode_the_picker_does_not_fingerprint_in_is_decided_on_the_headers() {
    // STREAMED: Envoy waits for the headers answer, then sends chunks one answer each.
    let mut h = harness(3).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::Streamed))
        .await;
    let headers = s.recv().await;
    assert!(is_headers_answer(&headers), "{headers:?}");
    let answer = written(&headers);
    assert_eq!(endpoints_of(answer.destination()).len(), 3);
    assert_eq!(answer.get("x-cohort-bypass"), Some("unsupported_body_mode"));
    s.send(body(CHAT.as_bytes(), true)).await;
    let chunk = s.recv().await;
    assert!(
        written(&chunk).set.is_empty(),
        "the chunk passes: {chunk:?}"
    );
    s.quiet().await;
}

#[tokio::test]
async fn full_duplex_with_trailers_decides_at_the_trailers() {
    let mut h = harness(2).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
        .await;
    let (a, b) = CHAT.as_bytes().split_at(40);
    s.send(body(a, false)).await;
    s.send(body(b, false)).await;
    s.quiet().await;
    s.send(trailers()).await;
    assert!(is_headers_answer(&s.recv().await));
    assert_eq!(streamed(&s.recv().await), (a.to_vec(), false));
    assert_eq!(streamed(&s.recv().await), (b.to_vec(), false));
    assert!(matches!(
        s.recv().await.response,
        Some(processing_response::Response::RequestTrailers(_))
    ));
}

#[tokio::test]
async fn an_over_size_body_is_answered_when_the_limit_passes_and_streams_on() {
    let mut h = harness_with(2, |p| p.filter.body_limit_bytes = 64).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
        .await;
    let big = vec![b'x'; 50];
    s.send(body(&big, false)).await;
    s.quiet().await;
    s.send(body(&big, false)).await;
    let answer = written(&s.recv().await);
    assert_eq!(answer.get("x-cohort-bypass"), Some("body_too_large"));
    assert!(answer.get("x-cohort-key").is_none());
    assert_eq!(endpoints_of(answer.destination()).len(), 2);
    assert_eq!(streamed(&s.recv().await), (big.clone(), false));
    assert_eq!(streamed(&s.recv().await), (big.clone(), false));
    // Later chunks pass as they come.
    s.send(body(b"tail", true)).await;
    assert_eq!(streamed(&s.recv().await), (b"tail".to_vec(), true));
    // A content-length over the limit is answered at the headers.
    let mut s = h.open().await;
    s.send(post_headers(
        &[("content-length", "100000")],
        false,
        BodySendMode::FullDuplexStreamed,
    ))
    .await;
    let answer = written(&s.recv().await);
    assert_eq!(answer.get("x-cohort-bypass"), Some("body_too_large"));
    s.send(body(b"abc", true)).await;
    assert_eq!(streamed(&s.recv().await), (b"abc".to_vec(), true));
}

#[tokio::test]
async fn a_body_that_is_not_json_is_bypassed_with_the_body_intact() {
    let mut h = harness(2).await;
    for (sent, why) in [
        (&b"{not json"[..], "invalid_json"),
        (b"[1,2]", "unknown_shape"),
        (br#"{"model":7,"messages":[]}"#, "malformed_request"),
        (br#"{"model":"m","input_ids":[1,2]}"#, "malformed_request"),
    ] {
        let mut s = h.open().await;
        s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
            .await;
        s.send(body(sent, true)).await;
        let answer = written(&s.recv().await);
        assert_eq!(answer.get("x-cohort-bypass"), Some(why), "{sent:?}");
        assert_eq!(endpoints_of(answer.destination()).len(), 2);
        assert_eq!(streamed(&s.recv().await), (sent.to_vec(), true));
    }
    // Buffered: the same reason, in the body's answer; the body is not touched.
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::Buffered))
        .await;
    s.recv().await;
    s.send(body(b"{not json", true)).await;
    let response = s.recv().await;
    let answer = written(&response);
    assert_eq!(answer.get("x-cohort-bypass"), Some("invalid_json"));
    let Some(processing_response::Response::RequestBody(b)) = &response.response else {
        panic!()
    };
    assert!(b.response.as_ref().unwrap().body_mutation.is_none());
}

#[tokio::test]
async fn requests_without_a_body_or_off_the_api_are_routed_at_their_headers() {
    let mut h = harness(2).await;
    // A POST to an API path with no body.
    let mut s = h.open().await;
    s.send(post_headers(&[], true, BodySendMode::Buffered))
        .await;
    let answer = written(&s.recv().await);
    assert_eq!(answer.get("x-cohort-bypass"), Some("no_body"));
    assert_eq!(endpoints_of(answer.destination()).len(), 2);
    // A GET elsewhere.
    let mut s = h.open().await;
    let mut get = post_headers(&[], true, BodySendMode::Buffered);
    if let Some(processing_request::Request::RequestHeaders(hh)) = &mut get.request {
        hh.headers = Some(header_map(&[(":method", "GET"), (":path", "/v1/models")]));
    }
    s.send(get).await;
    let answer = written(&s.recv().await);
    assert_eq!(answer.get("x-cohort-bypass"), Some("not_api_request"));
    assert!(!answer.destination().is_empty());
    // Each holds a ticket until its stream ends.
    assert_eq!(h.in_flight(), 2);
}

#[tokio::test]
async fn the_subset_hint_is_honoured_and_an_empty_or_foreign_one_gets_503() {
    let mut h = harness(4).await;
    for _ in 0..10 {
        let mut s = h.open().await;
        let subset = protocol::subset_metadata(&["10.0.0.1:8000", "10.0.0.3:8000"]);
        s.send(with_metadata(
            post_headers(&[], false, BodySendMode::FullDuplexStreamed),
            subset,
        ))
        .await;
        s.send(body(CHAT.as_bytes(), true)).await;
        let answer = written(&s.recv().await);
        let list = endpoints_of(answer.destination());
        assert_eq!(list.len(), 2, "only the subset: {list:?}");
        assert!(list
            .iter()
            .all(|e| ["10.0.0.1:8000", "10.0.0.3:8000"].contains(e)));
    }
    for subset in [vec![], vec!["10.9.9.9:8000"]] {
        let mut s = h.open().await;
        s.send(with_metadata(
            post_headers(&[], false, BodySendMode::FullDuplexStreamed),
            protocol::subset_metadata(&subset),
        ))
        .await;
        s.send(body(CHAT.as_bytes(), true)).await;
        assert_eq!(immediate_status(&s.recv().await), 503, "{subset:?}");
        s.quiet().await;
    }
    // Also at the headers (no body).
    let mut s = h.open().await;
    s.send(with_metadata(
        post_headers(&[], true, BodySendMode::Buffered),
        protocol::subset_metadata(&[]),
    ))
    .await;
    assert_eq!(immediate_status(&s.recv().await), 503);
    let page = crate::metrics::render_one({
        let metrics = Arc::clone(&h.picker.metrics);
        move |scrape: &mut crate::metrics::Scrape<'_>| metrics.write_metrics(scrape)
    });
    assert!(
        page.contains("cohort_picker_requests_total{outcome=\"subset_empty\"} 3"),
        "{page}"
    );
    assert!(page.contains("cohort_picker_requests_total{outcome=\"picked\"} 10"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.in_flight(), 0, "every stream closed, refused or not");
}

#[tokio::test]
async fn no_ready_replica_gets_503() {
    let mut h = harness(0).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::Buffered))
        .await;
    s.recv().await;
    s.send(body(CHAT.as_bytes(), true)).await;
    assert_eq!(immediate_status(&s.recv().await), 503);
    // A replica whose probe has not answered yet is not ready either.
    let mut h = harness(0).await;
    h.brain.set_replicas(&[Member {
        name: "new".into(),
        endpoint: endpoint(7),
    }]);
    let mut s = h.open().await;
    s.send(post_headers(&[], true, BodySendMode::Buffered))
        .await;
    assert_eq!(immediate_status(&s.recv().await), 503);
}

#[tokio::test]
async fn the_fingerprint_is_the_filters() {
    use cohort_filter::config::FilterConfig;
    use cohort_filter::decision;
    let mut h = harness(3).await;
    let extra = [
        ("x-cohort-tenant", "acme"),
        ("x-cohort-semantic-mode", "topic"),
    ];
    {
        let mut s = h.open().await;
        s.send(post_headers(
            &extra,
            false,
            BodySendMode::FullDuplexStreamed,
        ))
        .await;
        s.send(body(CHAT.as_bytes(), true)).await;
        let answer = written(&s.recv().await);
        let config = FilterConfig::default();
        let mut pairs: Vec<(String, String)> = vec![
            (":method".into(), "POST".into()),
            (":path".into(), "/v1/chat/completions".into()),
            (":authority".into(), "llm.test".into()),
            ("content-type".into(), "application/json".into()),
        ];
        pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let decision::HeadersVerdict::Buffer(plan) =
            decision::inspect_headers(&config, &pairs, None)
        else {
            panic!()
        };
        let routing = decision::route_body(&config, &plan, CHAT.as_bytes()).unwrap();
        for (name, value) in &routing.headers {
            if name == "x-cohort-cluster" && answer.get("x-cohort-shard").is_some() {
                // The brain may name its own cohort (as in assign mode).
                continue;
            }
            assert_eq!(answer.get(name), Some(value.as_str()), "{name}");
        }
        // The client's tenant header is not trusted by default: removed upstream.
        assert!(answer.removed.contains(&"x-cohort-tenant".to_owned()));
    }
}

#[tokio::test]
async fn a_cancelled_stream_ends_its_ticket_exactly_once() {
    let mut h = harness(2).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::Buffered))
        .await;
    s.recv().await;
    s.send(body(CHAT.as_bytes(), true)).await;
    s.recv().await;
    assert_eq!(h.in_flight(), 1);
    // The client goes away mid-request (no response yet).
    drop(s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.in_flight(), 0);
    assert_eq!(h.picker.metrics.streams_open(), 0);
    // A stream whose response ended, then closed, reports one end only.
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::Buffered))
        .await;
    s.recv().await;
    s.send(body(CHAT.as_bytes(), true)).await;
    s.recv().await;
    s.send(response_headers("200", None, true)).await;
    s.recv().await;
    drop(s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.in_flight(), 0);
    let page = crate::metrics::render_one({
        let brain = Arc::clone(&h.brain);
        move |scrape: &mut crate::metrics::Scrape<'_>| brain.write_metrics(scrape, 0)
    });
    // Two requests, two ends, no report under an unknown ticket.
    assert!(
        page.contains("cohort_progress_reports_total{phase=\"end\"} 2.0"),
        "{page}"
    );
    assert!(
        page.contains("cohort_progress_reports_total{phase=\"unknown\"} 0.0"),
        "{page}"
    );
    assert_eq!(h.picker.metrics.streams_open(), 0);
}

#[tokio::test]
async fn a_response_served_by_a_fallback_moves_the_load_there() {
    let mut h = harness(3).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::Buffered))
        .await;
    s.recv().await;
    s.send(body(CHAT.as_bytes(), true)).await;
    let answer = written(&s.recv().await);
    let list: Vec<String> = endpoints_of(answer.destination())
        .iter()
        .map(|e| e.to_string())
        .collect();
    let before = h.brain.in_flight();
    let slot_of = |e: &str| {
        e.trim_start_matches("10.0.0.")
            .trim_end_matches(":8000")
            .parse::<usize>()
            .unwrap()
    };
    assert_eq!(before[slot_of(&list[0])], 1);
    s.send(response_headers("200", Some(&list[1]), false)).await;
    s.recv().await;
    use crate::front::LiveFleet;
    let after = h.brain.in_flight();
    assert_eq!(after[slot_of(&list[0])], 0);
    assert_eq!(after[slot_of(&list[1])], 1);
    drop(s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test]
async fn a_slow_brain_is_answered_by_key_after_the_deadline() {
    // `[picker] assign_deadline_ms` against a brain that takes 200 ms: 20 ms routes by
    // key, 2000 ms waits for the decision.
    async fn answer(deadline_ms: u64) -> (Written, Harness) {
        let mut h = harness_configured(
            3,
            |config| config.picker.assign_deadline_ms = deadline_ms,
            |p| p.slow_decisions = Duration::from_millis(200),
        )
        .await;
        let mut s = h.open().await;
        s.send(post_headers(&[], false, BodySendMode::Buffered))
            .await;
        s.recv().await;
        s.send(body(CHAT.as_bytes(), true)).await;
        (written(&s.recv().await), h)
    }
    let (answer_late, h) = answer(20).await;
    assert_eq!(answer_late.get("x-cohort-bypass"), Some("batcher_timeout"));
    assert!(answer_late.get("x-cohort-key").is_some());
    assert_eq!(endpoints_of(answer_late.destination()).len(), 3);
    // The late decision's ticket is closed when it comes: nothing stays in flight.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(h.in_flight(), 0);
    let (answer_waited, _h) = answer(2000).await;
    assert_eq!(
        answer_waited.get("x-cohort-bypass"),
        None,
        "decided in time"
    );
    assert!(answer_waited.get("x-cohort-shard").is_some());
}

#[tokio::test]
async fn health_serves_liveness_always_and_readiness_with_a_ready_replica() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    async fn check(h: &Harness, service: &str) -> ServingStatus {
        let mut client = HealthClient::new(h.channel.clone());
        for _ in 0..50 {
            if let Ok(reply) = client
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
            {
                return reply.into_inner().status();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{service} never answered")
    }
    let h = harness(1).await;
    for service in ["", "liveness", "readiness", cohort_ext_proc_proto::SERVICE] {
        assert_eq!(
            check(&h, service).await,
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let h = harness(0).await;
    assert_eq!(check(&h, "liveness").await, ServingStatus::Serving);
    for service in ["readiness", cohort_ext_proc_proto::SERVICE] {
        assert_eq!(
            check(&h, service).await,
            ServingStatus::NotServing,
            "{service:?}"
        );
    }
}

#[tokio::test]
async fn a_missing_model_is_fingerprinted_like_any_other() {
    let mut h = harness(2).await;
    let mut s = h.open().await;
    s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
        .await;
    s.send(body(
        br#"{"messages":[{"role":"user","content":"hi"}]}"#,
        true,
    ))
    .await;
    let answer = written(&s.recv().await);
    assert!(answer.get("x-cohort-bypass").is_none());
    assert!(answer.get("x-cohort-key").is_some());
}

#[tokio::test]
async fn learned_cohorts_are_kept_across_requests_as_in_one_envoy() {
    let mut h = harness_with(2, |p| p.filter.learned_cohorts = Some(Default::default())).await;
    let mut keys = Vec::new();
    for text in [
        "where is my new card",
        "my card has not arrived yet",
        "when will my card get here",
    ] {
        let mut s = h.open().await;
        s.send(post_headers(&[], false, BodySendMode::FullDuplexStreamed))
            .await;
        let sent =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]});
        s.send(body(sent.to_string().as_bytes(), true)).await;
        keys.push(
            written(&s.recv().await)
                .get("x-cohort-key")
                .unwrap()
                .to_owned(),
        );
    }
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one learned cohort: {keys:?}"
    );
}
