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
    body_mutation, processing_request, processing_response, HttpBody, HttpHeaders,
    HttpTrailers, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
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
    let config = ServeConfig {
        discovery: DiscoverySection {
            dns: Some("engines.test".into()),
            ..Default::default()
        },
        ..ServeConfig::default()
    };
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

fn post_headers(extra: &[(&str, &str)], end_of_stream: bool, mode: BodySendMode) -> ProcessingRequest {
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
        assert_eq!(self.metadata.as_deref(), Some(header), "header and metadata agree");
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
    let list = endpoints_of(answer.destination()).iter().map(|e| e.to_string()).collect::<Vec<_>>();
    assert_eq!(list.len(), 3, "primary and two fallbacks: {list:?}");
    assert!(list.iter().all(|e| e.starts_with("10.0.0.")));
    let shard = answer.get("x-cohort-shard").unwrap();
    assert_eq!(endpoint(shard[1..].parse().unwrap()), list[0]);
    for name in ["x-cohort-key", "x-cohort-prefix", "x-cohort-fp", "x-cohort-cluster"] {
        assert!(answer.get(name).is_some(), "{name} written");
    }
    assert!(answer.get("x-cohort-bypass").is_none());
    assert_eq!(h.in_flight(), 1);
    s.send(response_headers("200", None, false)).await;
    assert!(matches!(
        s.recv().await.response,
        Some(processing_response::Response::ResponseHeaders(_))
    ));
    drop(s.tx);
    // Envoy closes the stream when the HTTP stream completes: the ticket ends.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.in_flight(), 0);
    // The audit has the request, as assign mode's.
    let record = h.brain.audit().get("", "req-1").expect("audited");
    assert_eq!(record.replica, shard);
    assert_eq!(record.status, Some(200));
}
