//! Bad input and spoofed headers through real Envoy (the pinned wheel, logging at its
//! default `info` level) running the real filter, over HTTP/1.1 and HTTP/2 (h2c, prior
//! knowledge), to recording upstreams behind `istio/envoy/header-routes.yaml` with extra
//! "trap" routes: a route per reserved header that sends a request still carrying a
//! client's value of it to a cluster that must never see a request.
//!
//! For every request of every class: the client gets the upstream's 200, exactly one
//! upstream of the expected cluster received it exactly once with the body byte for byte,
//! `x-cohort-bypass` is the expected reason (or absent), the response's `x-cohort` says the
//! same, and exactly the expected `cohort_*` counters moved in Envoy's admin stats. At the
//! end Envoy's log holds no prompt text (a canary string in every prompt) and no panic.
//! The same table runs in assign mode (`istio/envoy/assign.yaml`, a real `cohort serve`
//! answering Assign over gRPC), where the batcher's log is read for prompt text too.
//!
//! Spoofing: every reserved header and the tenant header, once and duplicated, over both
//! protocols, on fingerprinted, bypassed and non-API requests: no upstream sees a client's
//! value, the fingerprinted request keeps its honest key, and no trap route is taken (a
//! control header the filter leaves alone proves the trap routes work).
//!
//! Needs `scripts/setup` (Envoy) and `scripts/build-wasm` (the filter).

use cohort_tests::client::{self, Response};
use cohort_tests::config::{self, set_endpoints};
use cohort_tests::h2;
use cohort_tests::stack::Stack;
use cohort_tests::upstream::{Received, Upstream};
use serde_json::json;
use serde_yaml::Value as Yaml;
use std::collections::BTreeMap;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
/// In every prompt: Envoy's log must never contain it.
const CANARY: &str = "canary-7f3a-prompt-text";
/// Every spoofed header value contains this; trap routes match it.
const SPOOF: &str = "spoofed";
/// A header the filter does not touch, with a trap route too: proves the traps work.
const TRAP_CONTROL: &str = "x-trap-control";
/// The filter's default body limit.
const BODY_LIMIT: usize = 1024 * 1024;
/// The system prompt of the application with a dedicated route.
const DEDICATED_APP: &str = "You are the billing assistant of Example Corp.";

/// Headers only the filter may write (`HeaderNames::reserved` with the default names).
const RESERVED: [&str; 9] = [
    "x-cohort-key",
    "x-cohort-prefix",
    "x-cohort-fp",
    "x-cohort-fp-version",
    "x-cohort-cluster",
    "x-cohort-shard",
    "x-gateway-destination-endpoint",
    "x-cohort-batch",
    "x-cohort-bypass",
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Proto {
    Http1,
    Http2,
}

/// How the body travels.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// `content-length`, the body in one go.
    Length,
    /// No length up front: HTTP/1.1 chunks (HTTP/2 DATA frames) of this many bytes.
    Chunked(usize),
    /// Chunked, then request trailers.
    Trailers,
    /// `content-length`, the body in this many pieces with a pause between them.
    Slow(usize, Duration),
    /// Neither a body nor a length.
    Headless,
}

/// What the filter should do with the request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Fingerprinted,
    Bypass(&'static str),
    /// Not an LLM API request: nothing written, nothing counted.
    Untouched,
}

/// One named class of input.
struct Class {
    name: String,
    method: &'static str,
    path: &'static str,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    framing: Framing,
    outcome: Outcome,
    invalid_knobs: Vec<&'static str>,
    dedicated: bool,
}

impl Class {
    /// A JSON POST to the chat path with `content-length`.
    fn new(name: &str, body: Vec<u8>, outcome: Outcome) -> Class {
        Class {
            name: name.to_owned(),
            method: "POST",
            path: CHAT,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body,
            framing: Framing::Length,
            outcome,
            invalid_knobs: vec![],
            dedicated: false,
        }
    }

    fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Class {
        self.headers
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    fn without_header(mut self, name: &str) -> Class {
        self.headers.retain(|(n, _)| n != name);
        self
    }

    fn framing(mut self, framing: Framing) -> Class {
        self.framing = framing;
        self
    }

    fn at(mut self, method: &'static str, path: &'static str) -> Class {
        self.method = method;
        self.path = path;
        self
    }

    fn knobs(mut self, knobs: &[&'static str]) -> Class {
        self.invalid_knobs = knobs.to_vec();
        self
    }

    fn dedicated(mut self) -> Class {
        self.dedicated = true;
        self
    }
}

fn chat_with(system: Option<&str>, user: &str) -> Vec<u8> {
    let mut messages = vec![];
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": format!("{user} {CANARY}")}));
    serde_json::to_vec(&json!({"model": "gemma-3-270m", "messages": messages})).unwrap()
}

fn chat(user: &str) -> Vec<u8> {
    chat_with(None, user)
}

/// A chat body of exactly `size` bytes.
fn chat_of_size(size: usize) -> Vec<u8> {
    let empty = chat("");
    let filler = "x".repeat(size - empty.len());
    let body = chat(&filler);
    assert_eq!(body.len(), size);
    body
}

/// `data` as a gzip member with one stored (uncompressed) deflate block per 64 KiB.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let blocks: Vec<&[u8]> = data.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    out.extend_from_slice(&(!crc).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The classes of bad (and borderline) input, each sent over both protocols.
fn classes() -> Vec<Class> {
    use Outcome::{Bypass, Fingerprinted, Untouched};
    let valid = chat("please cancel my order 42");
    let mut invalid_utf8 = br#"{"model":"m","messages":[{"role":"user","content":"caf"#.to_vec();
    invalid_utf8.extend_from_slice(&[0xC3, 0x28, 0xFF]);
    invalid_utf8.extend_from_slice(format!(" {CANARY}\"}}]}}").as_bytes());
    let mut bom = vec![0xEF, 0xBB, 0xBF];
    bom.extend_from_slice(&valid);
    let deep = format!(
        r#"{{"model":"m","messages":{}{}, "note":"{CANARY}"}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let big_array = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{CANARY}"}}],"logit_bias_ids":[{}]}}"#,
        vec!["7"; 100_000].join(",")
    );
    let token_ids = format!(
        r#"{{"model":"m","prompt":[{}],"user":"{CANARY}"}}"#,
        (0..100_000)
            .map(|i| (i % 30_000).to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let many_messages = {
        let mut messages: Vec<serde_json::Value> = (0..30_000)
            .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": "m"}))
            .collect();
        messages.push(json!({"role": "user", "content": CANARY}));
        serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap()
    };
    let padding = "p".repeat(9 * 1024);
    vec![
        Class::new("control: a plain chat request", valid.clone(), Fingerprinted),
        Class::new(
            "control: the application with a dedicated route",
            chat_with(Some(DEDICATED_APP), "where is my invoice?"),
            Fingerprinted,
        )
        .dedicated(),
        Class::new(
            "malformed JSON",
            format!(r#"{{"model": "m", "messages": [{{"role":"user","content":"{CANARY}""#)
                .into_bytes(),
            Bypass("invalid_json"),
        ),
        Class::new(
            "truncated JSON (half a valid body)",
            valid[..valid.len() / 2].to_vec(),
            Bypass("invalid_json"),
        ),
        Class::new(
            "trailing bytes after the JSON",
            [valid.as_slice(), b"}{"].concat(),
            Bypass("invalid_json"),
        ),
        Class::new("empty body, content-length 0", vec![], Bypass("no_body")),
        Class::new("no body and no length", vec![], Bypass("no_body")).framing(Framing::Headless),
        Class::new(
            "whitespace-only body",
            b" \r\n\t ".to_vec(),
            Bypass("invalid_json"),
        ),
        Class::new("JSON null", b"null".to_vec(), Bypass("unknown_shape")),
        Class::new(
            "top-level array",
            format!(r#"[{{"role":"user","content":"{CANARY}"}}]"#).into_bytes(),
            Bypass("unknown_shape"),
        ),
        Class::new(
            "no messages field",
            format!(r#"{{"model":"m","input_ids":[1,2,3],"note":"{CANARY}"}}"#).into_bytes(),
            Bypass("malformed_request"),
        ),
        Class::new(
            "wrong type: messages is a string",
            format!(r#"{{"model":"m","messages":"{CANARY}"}}"#).into_bytes(),
            Bypass("malformed_request"),
        ),
        Class::new(
            "wrong type: content is a number",
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":42}}],"u":"{CANARY}"}}"#)
                .into_bytes(),
            Bypass("malformed_request"),
        ),
        Class::new(
            "wrong type: model is an object",
            format!(r#"{{"model":{{"a":1}},"messages":[{{"role":"user","content":"{CANARY}"}}]}}"#)
                .into_bytes(),
            Bypass("malformed_request"),
        ),
        Class::new(
            "empty messages",
            format!(r#"{{"model":"m","messages":[],"u":"{CANARY}"}}"#).into_bytes(),
            Bypass("empty_prompt"),
        ),
        Class::new("missing content-type", valid.clone(), Fingerprinted)
            .without_header("content-type"),
        Class::new("wrong content-type (text/plain)", valid.clone(), Fingerprinted)
            .without_header("content-type")
            .header("content-type", "text/plain; charset=latin1"),
        Class::new("duplicate content-type headers", valid.clone(), Fingerprinted)
            .header("content-type", "text/html"),
        Class::new(
            "gzip-encoded body",
            gzip(&valid),
            Bypass("content_encoded"),
        )
        .header("content-encoding", "gzip"),
        Class::new(
            "br content-encoding",
            b"\x0b\x02\x80binary".to_vec(),
            Bypass("content_encoded"),
        )
        .header("content-encoding", "br"),
        Class::new("content-encoding: identity", valid.clone(), Fingerprinted)
            .header("content-encoding", "identity"),
        Class::new(
            "chunked in 7-byte pieces",
            chat("refund order 77"),
            Fingerprinted,
        )
        .framing(Framing::Chunked(7)),
        Class::new(
            "chunked with trailers",
            chat("refund order 78"),
            Fingerprinted,
        )
        .framing(Framing::Trailers),
        Class::new(
            "slow body: 4 pieces 300 ms apart",
            chat("refund order 79"),
            Fingerprinted,
        )
        .framing(Framing::Slow(4, Duration::from_millis(300))),
        Class::new(
            "Expect: 100-continue",
            chat("refund order 80"),
            Fingerprinted,
        )
        .header("expect", "100-continue"),
        Class::new(
            "headers over 8 KiB",
            valid.clone(),
            Bypass("headers_too_large"),
        )
        .header("x-padding", &padding),
        Class::new(
            "body at the limit exactly",
            chat_of_size(BODY_LIMIT),
            Fingerprinted,
        ),
        Class::new(
            "body one byte over the limit (content-length)",
            chat_of_size(BODY_LIMIT + 1),
            Bypass("body_too_large"),
        ),
        Class::new(
            "10 MB body with content-length",
            chat(&"lorem ipsum ".repeat(10 * 1024 * 1024 / 12)),
            Bypass("body_too_large"),
        ),
        Class::new(
            "3 MB chunked body",
            chat(&"dolor sit amet ".repeat(3 * 1024 * 1024 / 15)),
            Bypass("body_too_large"),
        )
        .framing(Framing::Chunked(64 * 1024)),
        Class::new("invalid UTF-8 in a string", invalid_utf8, Bypass("invalid_json")),
        Class::new("UTF-8 BOM before the JSON", bom, Bypass("invalid_json")),
        Class::new(
            "raw NUL bytes in a string",
            format!("{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"a\0b {CANARY}\"}}]}}")
                .into_bytes(),
            Bypass("invalid_json"),
        ),
        Class::new(
            "escaped NULs (\\u0000)",
            chat("cancel\u{0}my\u{0}order"),
            Fingerprinted,
        ),
        Class::new(
            "lone surrogate escape",
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"a\ud800b {CANARY}"}}]}}"#)
                .into_bytes(),
            Bypass("invalid_json"),
        ),
        Class::new(
            "number 1e999",
            format!(r#"{{"model":"m","temperature":1e999,"messages":[{{"role":"user","content":"{CANARY}"}}]}}"#)
                .into_bytes(),
            Bypass("invalid_json"),
        ),
        Class::new(
            "duplicate JSON keys",
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"first"}}],"messages":[{{"role":"user","content":"second {CANARY}"}}]}}"#)
                .into_bytes(),
            Fingerprinted,
        ),
        Class::new("nesting 10,000 deep", deep.into_bytes(), Bypass("invalid_json")),
        Class::new(
            "100,000-element array",
            big_array.into_bytes(),
            Fingerprinted,
        ),
        Class::new(
            "completions prompt of 100,000 token ids",
            token_ids.into_bytes(),
            Fingerprinted,
        )
        .at("POST", "/v1/completions"),
        Class::new("30,000 messages", many_messages, Fingerprinted),
        Class::new(
            "emoji flood (50,000 emoji)",
            chat(&"🔥🚀🙏👩‍👩‍👧‍👦🏳️‍🌈".repeat(10_000)),
            Fingerprinted,
        ),
        Class::new(
            "zero-width and bidi-override characters",
            chat("can\u{200B}cel \u{202E}my order\u{202C}\u{FEFF} \u{2066}42\u{2069}\u{200D}"),
            Fingerprinted,
        ),
        Class::new(
            "a 1 MB single token",
            chat(&"a".repeat(1_000_000)),
            Fingerprinted,
        ),
        Class::new("negative knob values", valid.clone(), Fingerprinted)
            .header("x-cohort-cache-ttl", "-5")
            .header("x-cohort-batch-threshold", "-1")
            .knobs(&["batch_threshold", "cache_ttl"]),
        Class::new("NaN knob values", valid.clone(), Fingerprinted)
            .header("x-cohort-batch-threshold", "NaN")
            .header("x-cohort-cache-ttl", "NaN")
            .knobs(&["batch_threshold", "cache_ttl"]),
        Class::new("empty knob values", valid.clone(), Fingerprinted)
            .header("x-cohort-prefetch", "")
            .header("x-cohort-cache-ttl", "")
            .knobs(&["prefetch", "cache_ttl"]),
        Class::new("huge knob values", valid.clone(), Fingerprinted)
            .header("x-cohort-cache-ttl", "99999999999999999999999999")
            .header("x-cohort-batch-threshold", "1e308")
            .knobs(&["batch_threshold", "cache_ttl"]),
        Class::new("unknown knob words", valid.clone(), Fingerprinted)
            .header("x-cohort-prefetch", "turbo")
            .header("x-cohort-semantic-mode", "🙂")
            .knobs(&["prefetch", "semantic_mode"]),
        Class::new("a knob value that is not UTF-8", valid.clone(), Fingerprinted)
            .header("x-cohort-semantic-mode", [0xFF, 0xFE, b'x'])
            .knobs(&["semantic_mode"]),
        Class::new(
            "another header value that is not UTF-8",
            valid.clone(),
            Fingerprinted,
        )
        .header("x-app-note", [b'c', b'a', b'f', 0xE9]),
        Class::new("duplicate knob headers", valid.clone(), Fingerprinted)
            .header("x-cohort-prefetch", "bogus")
            .header("x-cohort-prefetch", "high")
            .knobs(&["prefetch"]),
        Class::new("prompt text in x-original-query", valid.clone(), Fingerprinted)
            .header("x-original-query", format!("cancel my order {CANARY}")),
        Class::new("a query string on the path", valid.clone(), Fingerprinted)
            .at("POST", "/v1/chat/completions?stream=false&x=%00"),
        Class::new("an API path under a prefix", valid.clone(), Fingerprinted)
            .at("POST", "/openai/v1/chat/completions"),
        Class::new(
            "Anthropic messages",
            format!(r#"{{"model":"m","max_tokens":5,"system":"be brief","messages":[{{"role":"user","content":[{{"type":"text","text":"{CANARY}"}}]}}]}}"#)
                .into_bytes(),
            Fingerprinted,
        )
        .at("POST", "/v1/messages"),
        Class::new(
            "responses API, input a string",
            format!(r#"{{"model":"m","input":"{CANARY}"}}"#).into_bytes(),
            Fingerprinted,
        )
        .at("POST", "/v1/responses"),
        Class::new("a dot-segment path", valid.clone(), Fingerprinted)
            .at("POST", "/v1/../v1/chat/completions"),
        (0..60).fold(
            Class::new("60 extra headers", valid.clone(), Fingerprinted),
            |class, i| class.header(&format!("x-extra-{i}"), format!("value {i}")),
        ),
        Class::new("GET on the chat path", vec![], Untouched)
            .at("GET", CHAT)
            .framing(Framing::Headless),
        Class::new(
            "invalid JSON to a path the filter ignores",
            format!("{{not json {CANARY}").into_bytes(),
            Untouched,
        )
        .at("POST", "/v1/embeddings"),
    ]
}

/// `header-routes.yaml` with the dedicated route on [`DEDICATED_APP`]'s prefix, and a
/// first route per name in `trapped` that sends a request whose header still holds a
/// spoofed value to the `trap` cluster. Envoy logs at `info`, its default level.
fn header_routes(plugin: &str, trapped: &[&str]) -> Stack {
    let app = chat_with(Some(DEDICATED_APP), "hello");
    let request = cohort_fingerprint::Request::new(&app);
    let prefix = cohort_fingerprint::fingerprint(&request)
        .unwrap()
        .stable_prefix;
    let mut trapped: Vec<String> = trapped.iter().map(|t| t.to_string()).collect();
    trapped.push(TRAP_CONTROL.to_owned());
    Stack::plain("header-routes")
        .upstreams_named(&["dedicated", "general-0", "general-1", "trap"])
        .filter(serde_json::from_str(plugin).unwrap())
        .envoy_log("info")
        .envoy_config(move |config, ports| {
            set_endpoints(config, "dedicated", &[ports[0]]);
            set_endpoints(config, "general", &[ports[1], ports[2]]);
            config::replace_string(
                config,
                "REPLACE_WITH_STABLE_PREFIX",
                &format!("{prefix:016x}"),
            );
            let trapped: Vec<&str> = trapped.iter().map(String::as_str).collect();
            add_trap(config, &trapped, ports[3]);
        })
        .start()
}

/// `assign.yaml` with one real batcher (`cohort serve`, default log level) and three
/// replicas; Envoy logs at `info`.
fn assign() -> Stack {
    Stack::assign()
        // A deadline generous for a loaded machine: the test is about bad input, not speed.
        .filter(json!({"assign_deadline_ms": 500}))
        .envoy_log("info")
        .start()
}

/// What these tests ask of a stack.
trait Proxy {
    fn trap(&self) -> &Upstream;
    fn expected_upstream(&self, class: &Class) -> &'static str;
    fn counters(&self) -> BTreeMap<String, i64>;
}

impl Proxy for Stack {
    fn trap(&self) -> &Upstream {
        self.upstream_named("trap")
    }

    /// The name prefix of the upstreams `class` may reach.
    fn expected_upstream(&self, class: &Class) -> &'static str {
        if !self.batchers.is_empty() {
            "replica-"
        } else if class.dedicated {
            "dedicated"
        } else {
            "general-"
        }
    }

    /// Every `cohort_*` counter in Envoy's admin stats but the per-group response stats
    /// (counted at the end of the stream, after the client has its answer; the
    /// response_stats tests check them).
    fn counters(&self) -> BTreeMap<String, i64> {
        self.envoy
            .admin("/stats?filter=^wasmcustom\\.cohort_")
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                let name = name.strip_prefix("wasmcustom.")?;
                if name.contains("=.=") {
                    return None;
                }
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    }
}

/// Inserts, before the file's routes, one route per header in `names` matching a value
/// that contains [`SPOOF`], to a new cluster `trap` on `port`.
fn add_trap(config: &mut Yaml, names: &[&str], port: u16) {
    let routes = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"];
    let existing = routes.as_sequence().unwrap().clone();
    let mut all: Vec<Yaml> = names
        .iter()
        .map(|name| {
            serde_yaml::from_str(&format!(
                "{{name: trap-{name}, match: {{prefix: /, headers: [{{name: {name}, string_match: {{contains: {SPOOF}}}}}]}}, route: {{cluster: trap, timeout: 300s}}}}"
            ))
            .unwrap()
        })
        .collect();
    all.extend(existing);
    *routes = Yaml::Sequence(all);
    let clusters = config["static_resources"]["clusters"]
        .as_sequence_mut()
        .unwrap();
    let mut trap = clusters
        .iter()
        .find(|c| c["name"].as_str() == Some("dedicated"))
        .unwrap()
        .clone();
    trap["name"] = Yaml::from("trap");
    trap["load_assignment"]["cluster_name"] = Yaml::from("trap");
    clusters.push(trap);
    set_endpoints(config, "trap", &[port]);
}

/// Sends `class` over `proto`, tagged `x-test-id: id`.
fn send(port: u16, class: &Class, proto: Proto, id: usize) -> std::io::Result<Response> {
    let body = &class.body;
    match proto {
        Proto::Http1 => {
            let mut head = format!(
                "{} {} HTTP/1.1\r\nhost: cohort.test\r\nconnection: close\r\nx-test-id: {id}\r\n",
                class.method, class.path
            )
            .into_bytes();
            for (name, value) in &class.headers {
                head.extend_from_slice(format!("{name}: ").as_bytes());
                head.extend_from_slice(value);
                head.extend_from_slice(b"\r\n");
            }
            let length = format!("content-length: {}\r\n\r\n", body.len()).into_bytes();
            let chunked = |size: usize, trailers: &[u8]| {
                let mut raw = b"transfer-encoding: chunked\r\n\r\n".to_vec();
                for chunk in body.chunks(size) {
                    raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    raw.extend_from_slice(chunk);
                    raw.extend_from_slice(b"\r\n");
                }
                raw.extend_from_slice(b"0\r\n");
                raw.extend_from_slice(trailers);
                raw.extend_from_slice(b"\r\n");
                raw
            };
            let (rest, pieces, pause): (Vec<u8>, Vec<&[u8]>, Duration) = match class.framing {
                Framing::Length => (length, vec![body], Duration::ZERO),
                Framing::Chunked(size) => (chunked(size, b""), vec![], Duration::ZERO),
                Framing::Trailers => (
                    chunked(64 * 1024, b"x-checksum: abc\r\n"),
                    vec![],
                    Duration::ZERO,
                ),
                Framing::Slow(n, pause) => {
                    (length, body.chunks(body.len().div_ceil(n)).collect(), pause)
                }
                Framing::Headless => (b"\r\n".to_vec(), vec![], Duration::ZERO),
            };
            head.extend_from_slice(&rest);
            let mut all: Vec<&[u8]> = vec![&head];
            all.extend(pieces);
            client::send_paced(port, &all, pause)
        }
        Proto::Http2 => {
            let mut headers = vec![("x-test-id".to_owned(), id.to_string().into_bytes())];
            headers.extend(class.headers.iter().cloned());
            let length = (
                "content-length".to_owned(),
                body.len().to_string().into_bytes(),
            );
            let mut request = h2::Request {
                method: class.method.to_owned(),
                path: class.path.to_owned(),
                ..h2::Request::default()
            };
            match class.framing {
                Framing::Length => {
                    headers.push(length);
                    request.pieces = vec![body.clone()]
                        .into_iter()
                        .filter(|b| !b.is_empty())
                        .collect();
                }
                Framing::Chunked(size) => {
                    request.pieces = body.chunks(size).map(<[u8]>::to_vec).collect();
                }
                Framing::Trailers => {
                    request.pieces = vec![body.clone()];
                    request.trailers = vec![("x-checksum".into(), b"abc".to_vec())];
                }
                Framing::Slow(n, pause) => {
                    headers.push(length);
                    request.pieces = body
                        .chunks(body.len().div_ceil(n))
                        .map(<[u8]>::to_vec)
                        .collect();
                    request.pause = pause;
                }
                Framing::Headless => {}
            }
            request.headers = headers;
            h2::send(port, request)
        }
    }
}

/// What one request must change in the counters.
fn expected_counters(
    outcome: Outcome,
    invalid_knobs: &[&str],
    spoofed: usize,
) -> BTreeMap<String, i64> {
    let mut want = BTreeMap::new();
    let mut add = |name: String, n: i64| *want.entry(name).or_insert(0) += n;
    match outcome {
        Outcome::Fingerprinted => {
            add("cohort_requests_total".into(), 1);
            add("cohort_fingerprinted_total".into(), 1);
        }
        Outcome::Bypass(reason) => {
            add("cohort_requests_total".into(), 1);
            add("cohort_bypass_total".into(), 1);
            add(format!("cohort_bypass_{reason}_total"), 1);
        }
        Outcome::Untouched => {}
    }
    for knob in invalid_knobs {
        add("cohort_invalid_knob_total".into(), 1);
        add(format!("cohort_invalid_knob_{knob}_total"), 1);
    }
    if spoofed > 0 {
        add("cohort_spoofed_header_removed_total".into(), spoofed as i64);
    }
    want
}

/// Sends `class` once over `proto` and checks everything; returns what the upstream got.
fn check(
    stack: &Stack,
    class: &Class,
    proto: Proto,
    id: usize,
    spoofed: usize,
) -> Result<Received, String> {
    let before = stack.counters();
    let response =
        send(stack.envoy.listen_port, class, proto, id).map_err(|e| format!("no response: {e}"))?;
    let after = stack.counters();
    if response.status != 200 || response.header("x-upstream").is_none() {
        return Err(format!(
            "status {} (x-upstream {:?}): {}",
            response.status,
            response.header("x-upstream"),
            response.text().chars().take(200).collect::<String>()
        ));
    }
    let tag = id.to_string();
    let mut got: Vec<(String, Received)> = stack
        .upstreams()
        .flat_map(|u| {
            u.received()
                .into_iter()
                .filter(|r| r.header("x-test-id") == Some(tag.as_str()))
                .map(|r| (u.name.clone(), r))
        })
        .collect();
    if got.len() != 1 {
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        return Err(format!("received {} times, by {names:?}", got.len()));
    }
    let (upstream, received) = got.pop().unwrap();
    let expected = stack.expected_upstream(class);
    if !upstream.starts_with(expected) {
        return Err(format!("reached {upstream}, expected {expected}*"));
    }
    if received.body != class.body {
        return Err(format!(
            "upstream received {} bytes, sent {}",
            received.body.len(),
            class.body.len()
        ));
    }
    let bypass = received.header("x-cohort-bypass");
    let summary = response.header("x-cohort");
    match class.outcome {
        Outcome::Bypass(reason) => {
            if bypass != Some(reason) {
                return Err(format!("x-cohort-bypass {bypass:?}, expected {reason}"));
            }
            if !summary.is_some_and(|s| s.ends_with(&format!("bypass={reason}"))) {
                return Err(format!("response x-cohort {summary:?}"));
            }
        }
        Outcome::Fingerprinted => {
            if bypass.is_some() || received.header("x-cohort-key").map(str::len) != Some(16) {
                return Err(format!(
                    "not fingerprinted: bypass {bypass:?}, key {:?}",
                    received.header("x-cohort-key")
                ));
            }
            if received.header("x-cohort-fp-version") != Some("2")
                || !summary.is_some_and(|s| s.contains("; cluster="))
            {
                return Err(format!("response x-cohort {summary:?}"));
            }
        }
        Outcome::Untouched => {
            if let Some((name, _)) = received
                .headers
                .iter()
                .find(|(n, _)| n.starts_with("x-cohort"))
            {
                return Err(format!("untouched request carries {name}"));
            }
            if summary.is_some() {
                return Err(format!("response x-cohort {summary:?}"));
            }
        }
    }
    let want = expected_counters(class.outcome, &class.invalid_knobs, spoofed);
    let mut moved: BTreeMap<String, i64> = after
        .iter()
        .filter(|(name, _)| name.ends_with("_total"))
        .map(|(name, value)| (name.clone(), value - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, delta)| *delta != 0)
        .collect();
    // Observations and progress reports are sent on a timer: not this request's to count.
    // Knobs a mode does not act on are named and counted per mode: knob_table's subject.
    moved.retain(|name, _| {
        !name.starts_with("cohort_observe_")
            && !name.starts_with("cohort_progress_")
            && !name.starts_with("cohort_knob_ignored_")
    });
    // Assign mode: one Assign outcome (answered, timed out or failed) per fingerprinted request.
    let assigned: i64 = ["ok", "timeout", "error"]
        .iter()
        .filter_map(|o| moved.remove(&format!("cohort_assign_{o}_total")))
        .sum();
    let assigns = i64::from(!stack.batchers.is_empty() && class.outcome == Outcome::Fingerprinted);
    if moved != want || assigned != assigns {
        return Err(format!(
            "counters moved {moved:?} and {assigned} Assign outcomes, expected {want:?} and {assigns}"
        ));
    }
    Ok(received)
}

/// Envoy's log at `info` must hold no prompt text and no panic, and be a real log; so
/// must the batcher's at its default level, if there is one.
fn check_log(stack: &Stack) {
    let log = stack.envoy.log();
    assert!(
        log.contains("cohort: configured"),
        "the log is not at info level:\n{log}"
    );
    assert!(!log.contains(CANARY), "prompt text in Envoy's log:\n{log}");
    assert!(!log.contains("panicked"), "the filter panicked:\n{log}");
    if let Some(batcher) = stack.batchers.first() {
        let log = batcher.log();
        assert!(log.contains("INFO"), "the batcher's log is empty:\n{log}");
        assert!(
            !log.contains(CANARY),
            "prompt text in the batcher's log:\n{log}"
        );
    }
}

/// Every class over both protocols; panics listing every failure.
fn send_every_class(stack: &Stack) {
    let classes = classes();
    let mut failures = Vec::new();
    let mut requests = 0;
    for (i, class) in classes.iter().enumerate() {
        for proto in [Proto::Http1, Proto::Http2] {
            requests += 1;
            if let Err(why) = check(
                stack,
                class,
                proto,
                i * 2 + (proto == Proto::Http2) as usize,
                0,
            ) {
                failures.push(format!("{} over {proto:?}: {why}", class.name));
            }
        }
    }
    println!(
        "{} classes, {requests} requests, {} failed",
        classes.len(),
        failures.len()
    );
    assert!(classes.len() >= 35);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    check_log(stack);
}

#[test]
fn bad_inputs_over_http1_and_http2_reach_the_upstream_unchanged() {
    // One at a time: hundreds of requests through Envoy logging at `info` load the machine.
    let _alone = cohort_tests::one_at_a_time();
    let stack = header_routes("{}", &RESERVED);
    send_every_class(&stack);
    assert_eq!(stack.trap().count(), 0);
}

#[test]
fn bad_inputs_in_assign_mode_with_a_real_batcher() {
    // One at a time: hundreds of requests through Envoy logging at `info` load the machine.
    let _alone = cohort_tests::one_at_a_time();
    let stack = assign();
    send_every_class(&stack);
    let assigned = stack.envoy.stat("wasmcustom.cohort_assign_ok_total");
    println!("assign mode: {assigned} requests placed by the batcher");
    assert!(assigned > 0, "the batcher answered no Assign call");
}

/// `x-cohort-key` → `X-Cohort-Key`.
fn mixed_case(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// Sends every spoofable header, once and twice, on four kinds of request over both
/// protocols; none may reach an upstream or change the route.
fn spoof_everything(stack: &Stack, spoofable: &[&str]) -> usize {
    let kinds = [
        Class::new(
            "fingerprinted",
            chat_with(Some(DEDICATED_APP), "where is my invoice?"),
            Outcome::Fingerprinted,
        )
        .dedicated(),
        Class::new(
            "bypassed at the headers",
            gzip(&chat("refund")),
            Outcome::Bypass("content_encoded"),
        )
        .header("content-encoding", "gzip"),
        Class::new(
            "bypassed at the body",
            b"{not json".to_vec(),
            Outcome::Bypass("invalid_json"),
        ),
        Class::new("not an API request", vec![], Outcome::Untouched)
            .at("GET", "/v1/models")
            .framing(Framing::Headless),
    ];
    // The control: a client header the filter leaves alone does choose the trap route.
    let control = client::request(
        stack.envoy.listen_port,
        "GET",
        "/v1/models",
        &[(TRAP_CONTROL, SPOOF)],
        b"",
    )
    .unwrap();
    assert_eq!(control.header("x-upstream"), Some("trap"));
    // The honest key of the fingerprinted kind, per protocol.
    let mut honest = BTreeMap::new();
    let mut id = 1_000_000;
    for proto in [Proto::Http1, Proto::Http2] {
        id += 1;
        let got = check(stack, &kinds[0], proto, id, 0).unwrap();
        honest.insert(
            format!("{proto:?}"),
            got.header("x-cohort-key").unwrap().to_owned(),
        );
    }
    let mut failures = Vec::new();
    let mut requests = 0;
    // Each header alone, all together, and all together in mixed case (`X-Cohort-Key`).
    let mut sets: Vec<Vec<String>> = spoofable.iter().map(|h| vec![h.to_string()]).collect();
    sets.push(spoofable.iter().map(|h| h.to_string()).collect());
    sets.push(spoofable.iter().map(|h| mixed_case(h)).collect());
    for set in &sets {
        for copies in [1, 2] {
            for kind in &kinds {
                let mut class = Class::new(&kind.name, kind.body.clone(), kind.outcome)
                    .at(kind.method, kind.path)
                    .framing(kind.framing);
                class.headers = kind.headers.clone();
                class.dedicated = kind.dedicated;
                for name in set {
                    for copy in 0..copies {
                        class = class.header(name, format!("{SPOOF}-{copy}-0000000000000000"));
                    }
                }
                for proto in [Proto::Http1, Proto::Http2] {
                    id += 1;
                    requests += 1;
                    let name = format!("{set:?} x{copies} on {} over {proto:?}", kind.name);
                    match check(stack, &class, proto, id, set.len()) {
                        Err(why) => failures.push(format!("{name}: {why}")),
                        Ok(got) => {
                            if let Some((n, v)) =
                                got.headers.iter().find(|(_, v)| v.contains(SPOOF))
                            {
                                failures.push(format!("{name}: upstream got {n}: {v}"));
                            }
                            if kind.outcome == Outcome::Fingerprinted
                                && got.header("x-cohort-key")
                                    != honest.get(&format!("{proto:?}")).map(String::as_str)
                            {
                                failures.push(format!(
                                    "{name}: key {:?} is not the honest key",
                                    got.header("x-cohort-key")
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(stack.trap().count(), 1, "a spoofed header chose the route");
    requests
}

#[test]
fn spoofed_reserved_and_tenant_headers_never_take_effect() {
    // One at a time: hundreds of requests through Envoy logging at `info` load the machine.
    let _alone = cohort_tests::one_at_a_time();
    // Default configuration: the tenant header is x-cohort-tenant, not trusted.
    let mut spoofable = RESERVED.to_vec();
    spoofable.push("x-cohort-tenant");
    let stack = header_routes("{}", &spoofable);
    let requests = spoof_everything(&stack, &spoofable);
    println!(
        "default tenant header: {} headers, {requests} spoofed requests",
        spoofable.len()
    );
    check_log(&stack);
    drop(stack);

    // A configured tenant header is reserved in its place.
    let spoofable = ["x-acme-tenant", "x-cohort-key", "x-cohort-shard"];
    let stack = header_routes(r#"{"tenant_header": "x-acme-tenant"}"#, &spoofable);
    let requests = spoof_everything(&stack, &spoofable);
    println!(
        "configured tenant header: {} headers, {requests} spoofed requests",
        spoofable.len()
    );
    check_log(&stack);
}
