//! The tables of the configuration file, one struct each, with their defaults: the
//! engine replicas (`[[replicas]]`), batch mode's front (`[batch]`), prefetch
//! (`[prefetch]`), LoRA adapters (`[[lora]]`), the replica policy (`[policy]`), the
//! fingerprint store (`[store]`), the endpoint picker (`[picker]`) and the engines' KV cache
//! events (`[kv_events]`). What each field means is on the field; the file's overall shape
//! is in [`super`].

use axum::http::Uri;
use cohort_batcher_core::engines::EngineKind;
use cohort_gpu_store::StoreKind;
use serde::Deserialize;
use std::net::SocketAddr;

/// One engine replica as the batcher routes to it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    /// The `x-cohort-shard` value routes match on; 1–64 of `[A-Za-z0-9._-]`.
    pub name: String,
    /// Base URL of the engine (`http://host:port`), for batch mode's front and the probes.
    #[serde(default)]
    pub url: Option<EngineUrl>,
    /// The engine adapter (see `cohort_batcher_core::engines`); `llamacpp` by default.
    #[serde(default)]
    pub engine: EngineKind,
    /// Slots (llama.cpp `-np`); `None` = ask the engine.
    #[serde(default)]
    pub slots: Option<usize>,
    /// Where the engine publishes its KV cache events (vLLM's `--kv-events-config`
    /// `endpoint`, with the engine's host in place of `*`); `None`: not followed.
    #[serde(default)]
    pub kv_events: Option<EventsEndpoint>,
    /// The engine's KV events replay socket (vLLM's `replay_endpoint`); without one, a
    /// gap in the stream is lost instead of replayed.
    #[serde(default)]
    pub kv_events_replay: Option<EventsEndpoint>,
}

impl Replica {
    pub fn named(name: &str) -> Replica {
        Replica {
            name: name.to_owned(),
            url: None,
            engine: EngineKind::default(),
            slots: None,
            kv_events: None,
            kv_events_replay: None,
        }
    }

    /// Parses a `--replica` value (see the flag): `name`, `name=url` or
    /// `name=engine+url`.
    pub(super) fn from_flag(spec: &str) -> Result<Replica, String> {
        let Some((name, target)) = spec.split_once('=') else {
            return Ok(Replica::named(spec));
        };
        let mut replica = Replica::named(name);
        let url = match target.split_once('+') {
            Some((engine, url)) => {
                replica.engine = EngineKind::parse(engine).map_err(|e| e.to_string())?;
                url
            }
            None => target,
        };
        replica.url = Some(EngineUrl::try_from(url.to_owned())?);
        Ok(replica)
    }
}

/// An engine's base URL, checked when read: `http://host:port` (a path is ignored).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct EngineUrl(Uri);

impl EngineUrl {
    pub fn uri(&self) -> &Uri {
        &self.0
    }
}

impl TryFrom<String> for EngineUrl {
    type Error = String;
    fn try_from(url: String) -> Result<EngineUrl, String> {
        url.parse::<Uri>()
            .ok()
            .filter(|u| u.scheme_str() == Some("http") && u.authority().is_some())
            .map(EngineUrl)
            .ok_or_else(|| format!("url {url:?} is not http://host:port"))
    }
}

/// A ZeroMQ endpoint the batcher connects to, checked when read: `tcp://host:port`, the
/// host an IP address (IPv6 in brackets) or a DNS name, the port 1–65535. `*` is refused:
/// it is the engine's bind address, not one to connect to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct EventsEndpoint(String);

impl EventsEndpoint {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for EventsEndpoint {
    type Error = String;
    fn try_from(endpoint: String) -> Result<EventsEndpoint, String> {
        let bad = |why: &str| format!("endpoint {endpoint:?} is not tcp://host:port ({why})");
        let rest = endpoint
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("only tcp:// is supported"))?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err(bad("the port must be 1-65535"));
        }
        let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            v6.parse::<std::net::Ipv6Addr>().is_ok()
        } else {
            host.parse::<std::net::Ipv4Addr>().is_ok()
                || (!host.is_empty()
                    && host.len() <= 253
                    && host.split('.').all(|label| {
                        !label.is_empty()
                            && label
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    }))
        };
        if host == "*" {
            return Err(bad(
                "`*` is the engine's bind address: name the engine's host",
            ));
        }
        if !host_ok {
            return Err(bad("the host must be an IP address or a DNS name"));
        }
        Ok(EventsEndpoint(endpoint))
    }
}

/// `[kv_events]`: how the engines' KV cache event streams are read (docs/KV-EVENTS.md),
/// for every replica with a `kv_events` endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsSection {
    /// The engines' block size in tokens (vLLM's `--block-size`: 16 on GPU by default,
    /// 128 on CPU). Stores of another size are skipped and degrade the stream.
    pub block_size: u32,
    /// The cache tier that counts (`medium`): `GPU` is vLLM's own cache on any device;
    /// offloaded tiers report their own.
    pub main_medium: String,
    /// The topic prefix subscribed to (vLLM's `topic`; empty: every message).
    pub topic: String,
    /// A stream with no message for longer than this is unhealthy, s. vLLM publishes only
    /// when its cache changes: longer than an idle replica's quiet spells.
    pub silence_s: u64,
    /// Well-formed payloads (or stores of the right size) in a row that clear a problem.
    pub recover_after: u32,
    /// A sequence number at most this far below the next expected one is a repeat;
    /// further below, the engine restarted.
    pub duplicate_window: u64,
    /// How long a replay may take before its gap counts as lost, ms.
    pub replay_timeout_ms: u64,
    /// Live messages held while a replay runs before its gap counts as lost.
    pub max_held: usize,
    /// The engines' events port, for every `[[replicas]]` with a `url` and no `kv_events`
    /// of its own: `tcp://<the url's host>:<port>` (vLLM's `endpoint` port). Unset: only
    /// replicas that name an endpoint are followed.
    pub port: Option<u16>,
    /// The replay port beside `port` (vLLM's `replay_endpoint` port).
    pub replay_port: Option<u16>,
    /// How the batcher turns a request into the engine's token ids, to ask each healthy
    /// stream how much of the prompt its engine holds (docs/KV-EVENTS.md, "Exact residency
    /// in decisions"). Only where the batcher sees the request's body: the endpoint picker.
    pub prompt_tokens: PromptTokensKind,
    /// The model's folder for `prompt_tokens = "model"`: `tokenizer.json`,
    /// `tokenizer_config.json`, and the chat template (its `chat_template`, else
    /// `chat_template.jinja`).
    pub model_dir: Option<std::path::PathBuf>,
    /// Rendered prompt bytes tokenized per request: a longer prompt is keyed by its
    /// beginning (a model's tokenizer costs about a microsecond per token).
    pub max_prompt_bytes: usize,
    /// The longest the blocks sent to a replica count there over what its events say, ms:
    /// the time its engine may take to prefill them and publish the stores. A replica with
    /// enough first-byte reports uses its own time to first byte instead, when shorter.
    pub pending_ms: u64,
}

/// `[kv_events] prompt_tokens`: how request bodies become the engine's token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptTokensKind {
    /// None: decisions use the modelled residency; the streams still clear it on an
    /// engine's cache reset or restart, and show in the inspector.
    #[default]
    None,
    /// `cohort engine-sim`'s template and tokenizer (simulated replicas).
    EngineSim,
    /// The model's own tokenizer and chat template, from `model_dir`.
    Model,
}

impl Default for KvEventsSection {
    fn default() -> Self {
        let replica = cohort_kv_events::replica::ReplicaConfig::new(16);
        KvEventsSection {
            block_size: replica.block_size,
            main_medium: replica.main_medium,
            topic: String::new(),
            silence_s: replica.health.silence.as_secs(),
            recover_after: replica.health.recover_after,
            duplicate_window: replica.sequence.duplicate_window,
            replay_timeout_ms: replica.sequence.replay_timeout.as_millis() as u64,
            max_held: replica.sequence.max_held,
            port: None,
            replay_port: None,
            prompt_tokens: PromptTokensKind::None,
            model_dir: None,
            max_prompt_bytes: 32_768,
            pending_ms: 5_000,
        }
    }
}

impl KvEventsSection {
    /// One replica stream's settings, as the `cohort-kv-events` crate takes them.
    pub fn replica_config(&self) -> cohort_kv_events::replica::ReplicaConfig {
        use cohort_kv_events::health::HealthConfig;
        use cohort_kv_events::stream::SequenceConfig;
        use std::time::Duration;
        cohort_kv_events::replica::ReplicaConfig {
            block_size: self.block_size,
            main_medium: self.main_medium.clone(),
            sequence: SequenceConfig {
                duplicate_window: self.duplicate_window,
                replay_timeout: Duration::from_millis(self.replay_timeout_ms),
                max_held: self.max_held,
            },
            health: HealthConfig {
                silence: Duration::from_secs(self.silence_s),
                recover_after: self.recover_after,
            },
        }
    }
}

/// `[batch]`: batch mode's HTTP front.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchSection {
    /// Where the front listens (OpenAI and Anthropic APIs).
    pub listen: SocketAddr,
    /// How long after a leader others may join its batch, ms.
    pub window_ms: u64,
    /// The longest a follower is held for its leader's prefix, ms.
    pub max_hold_ms: u64,
    /// Members per batch.
    pub max_batch: usize,
    /// Members per batch while the replica's KV cache is above `kv_pressure`.
    pub max_batch_pressured: usize,
    /// Members per batch on slot-pinned engines (llama.cpp), which run them in sequence.
    pub max_batch_same_slot: usize,
    /// The least share of its prompt a request must have in common with its batch's
    /// leader (prefix blocks) to join it and be held; below, it goes on alone (0–1).
    pub min_shared: f64,
    /// KV-cache usage (0–1, from engine metrics) that counts as memory pressure.
    pub kv_pressure: f64,
    /// Followers held at once, all cohorts; beyond, requests are sent on directly.
    pub max_held: usize,
    /// Largest request body the front reads, bytes.
    pub max_body_bytes: usize,
    /// Seconds between engine health and metrics scrapes.
    pub scrape_interval_s: u64,
}

impl Default for BatchSection {
    fn default() -> Self {
        let core = cohort_batcher_core::batch::BatchConfig::default();
        BatchSection {
            listen: ([0, 0, 0, 0], 8000).into(),
            window_ms: core.window_ms,
            max_hold_ms: core.max_hold_ms,
            max_batch: core.max_batch,
            max_batch_pressured: core.max_batch_pressured,
            max_batch_same_slot: core.max_batch_same_slot,
            min_shared: core.min_shared,
            kv_pressure: 0.9,
            max_held: 1024,
            max_body_bytes: cohort_fingerprint::DEFAULT_MAX_BODY_BYTES,
            scrape_interval_s: 1,
        }
    }
}

/// `[prefetch]`: warm-ups of predicted cohorts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefetchSection {
    /// Predictions further away than this are ignored, ms.
    pub horizon_ms: u64,
    /// Half-life of learned transitions, ms.
    pub half_life_ms: u64,
}

impl Default for PrefetchSection {
    fn default() -> Self {
        let core = cohort_batcher_core::predict::PredictConfig::default();
        PrefetchSection {
            horizon_ms: core.horizon_ms,
            half_life_ms: core.half_life_ms,
        }
    }
}

/// `[discovery]`: engine replicas learnt from DNS (a Kubernetes headless Service) instead
/// of a static list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoverySection {
    /// The Service's DNS name (`llm-engine-pods.llm.svc.cluster.local`); unset: no
    /// discovery.
    pub dns: Option<String>,
    /// The Service's named port: replicas come from the SRV records
    /// `_<port_name>._tcp.<dns>` (each pod's stable name and port). Empty: A records of
    /// `dns` only, on `port`, each replica named by its address.
    pub port_name: String,
    /// The engines' port when `port_name` is empty (A records carry no port).
    pub port: u16,
    /// The DNS server asked (`10.96.0.10:53`); unset: the first `nameserver` of
    /// `/etc/resolv.conf`, on port 53.
    pub resolver: Option<SocketAddr>,
    /// Seconds between two resolutions.
    pub interval_s: u64,
    /// The engine adapter of every discovered replica (its health path).
    pub engine: EngineKind,
}

impl Default for DiscoverySection {
    fn default() -> Self {
        DiscoverySection {
            dns: None,
            port_name: "http".into(),
            port: 8000,
            resolver: None,
            interval_s: 5,
            engine: EngineKind::default(),
        }
    }
}

/// `[picker]`: the Gateway API Inference Extension endpoint picker (Envoy ext_proc).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PickerSection {
    /// Where the picker's gRPC server listens (`envoy.service.ext_proc.v3.ExternalProcessor`
    /// and `grpc.health.v1.Health`); unset: no picker.
    pub listen: Option<SocketAddr>,
    /// A JSON file in the wasm filter's plugin-configuration schema: the picker
    /// fingerprints with the filter's code under it (body limit, API paths, tenant header,
    /// salt secret, header names, knob policy). Unset: the filter's defaults.
    pub filter_config: Option<std::path::PathBuf>,
    /// How long a decision may take before the picker answers with a fallback endpoint
    /// (`x-cohort-bypass: batcher_timeout`), ms; as the filter's `assign_deadline_ms`.
    pub assign_deadline_ms: u64,
}

impl Default for PickerSection {
    fn default() -> Self {
        PickerSection {
            listen: None,
            filter_config: None,
            assign_deadline_ms: 25,
        }
    }
}

impl PickerSection {
    /// The filter configuration the picker fingerprints under: the file's, parsed and
    /// checked by the filter's own code, or the filter's defaults. The error names the
    /// field and says why.
    pub fn filter_config_parsed(&self) -> Result<cohort_filter::config::FilterConfig, String> {
        let Some(path) = &self.filter_config else {
            return Ok(cohort_filter::config::FilterConfig::default());
        };
        let bytes = std::fs::read(path)
            .map_err(|e| format!("filter_config: cannot read {}: {e}", path.display()))?;
        cohort_filter::config::FilterConfig::parse(&bytes)
            .map_err(|e| format!("filter_config {}: {e}", path.display()))
    }
}

/// `[[lora]]`: an adapter some cohorts need.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSection {
    /// The adapter's name (requests ask for it as their `model`).
    pub name: String,
    /// Where the engine loads it from.
    pub path: String,
    /// Cohorts (`x-cohort-key` values) that use it whatever their `model`.
    #[serde(default)]
    pub cohorts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicySection {
    /// Balance bound: a replica is eligible while under `balance` × the mean load.
    pub balance: f64,
    /// Work (tokens) a replica may carry above `balance` × the mean before it stops taking
    /// its prefixes: without it a quiet fleet (a few requests in the load window) would
    /// spread every request, since one request alone puts a replica far above the mean.
    pub balance_slack_tokens: f64,
    /// Half-life of the assigned-work load estimate, ms (for one batcher; each of `S`
    /// shards sees 1/S of the decisions, so its half-life is `S` times this).
    pub load_half_life_ms: u64,
    /// Live load (assign mode with progress reports): how many of its own cold prefills
    /// longer than on the cheapest replica a request may wait on the replica holding more
    /// of its prefix. 1 (default): it leaves when the wait it saves exceeds about twice
    /// the prefill it adds; 0: the expected time to first token within `balance` decides
    /// alone; higher keeps prefixes in fewer caches at the cost of waiting.
    pub live_slack: f64,
    /// `live_slack` for a private prefix: one a single earlier request sent to its holder,
    /// as a conversation's history (3 by default). Moving it relocates the history and
    /// relieves nothing lasting, so it stays home through more queue than a shared one.
    pub live_slack_private: f64,
    /// Decide a burst's requests that have a home first: an Assign whose prefix every
    /// replica holds alike (a cold prompt) yields to the Assigns that arrived with it, so
    /// a conversation's next turn takes its holder before a cold prompt of the same burst
    /// picks a replica (default on).
    pub burst_order: bool,
    /// Each replica's prefix-cache capacity in filter blocks (256 bytes of canonical
    /// prompt ≈ 64 tokens each). The default, 16,384 blocks, is about 1 M tokens of KV.
    pub kv_blocks_per_replica: usize,
}

impl Default for PolicySection {
    fn default() -> Self {
        let policy = cohort_batcher_core::policy::PolicyConfig::default();
        PolicySection {
            balance: policy.balance,
            balance_slack_tokens: 4096.0,
            load_half_life_ms: policy.load_half_life_ms,
            live_slack: policy.live_slack,
            live_slack_private: policy.live_slack_private,
            burst_order: true,
            kv_blocks_per_replica: 16_384,
        }
    }
}

/// How the neighbour search finds a request's nearest past fingerprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NeighbourSearch {
    /// The recent members of the request's nearest cohorts, re-ranked exactly.
    Recent,
    /// Every live fingerprint of the tenant (a full top-k scan of the store).
    Exact,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// Fingerprints kept (least recently used evicted beyond).
    pub max_entries: usize,
    /// Independent locks the store is split into.
    pub shards: usize,
    /// Cohorts idle this long expire.
    pub cohort_idle_s: u32,
    /// Recent fingerprints kept per cohort for the neighbour search (where similar requests
    /// went); 0 turns the neighbour search off, in either mode (see
    /// `cohort_batcher_core::neighbours`).
    pub neighbours_per_cohort: usize,
    /// How the neighbour search finds the nearest past fingerprints: `recent` re-ranks the
    /// nearest cohorts' recent members (bounded work, the default), `exact` scans every
    /// fingerprint of the tenant (on the GPU with `backend = "gpu"`).
    pub neighbour_search: NeighbourSearch,
    /// Where the fingerprints live: `cpu` or `gpu` (see docs/GPU-STORE.md).
    pub backend: StoreKind,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            max_entries: 1_000_000,
            shards: 16,
            cohort_idle_s: 900,
            neighbours_per_cohort: cohort_batcher_core::neighbours::DEFAULT_PER_COHORT,
            neighbour_search: NeighbourSearch::Recent,
            backend: StoreKind::Cpu,
        }
    }
}
