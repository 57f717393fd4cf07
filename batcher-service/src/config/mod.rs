//! `cohort serve` configuration: a TOML file, overridden by flags, overridden by nothing
//! else (each flag also reads a `COHORT_*` environment variable, clap's usual precedence:
//! flag, then environment, then the file, then the default).
//!
//! ```toml
//! grpc_listen = "0.0.0.0:50051"   # Assign / Observe / Status (the filter's batcher cluster)
//! http_listen = "0.0.0.0:9464"    # /metrics, /healthz, /readyz
//! shard_index = 0                 # this batcher's shard (a StatefulSet ordinal)
//! shard_count = 1                 # batcher shards the filters are configured with
//! tenant_header = "x-cohort-tenant"  # as the filter's tenant_header
//! salt_secret = "…"               # as the filter's salt_secret (or COHORT_SALT_SECRET)
//!
//! [[replicas]]                    # engine replicas, by the name the routes match on
//! name = "replica-0"              # the x-cohort-shard value
//! url = "http://10.0.0.5:8000"    # batch mode: where the front sends this replica's work
//! engine = "llamacpp"             # llamacpp | vllm | sglang | tgi | openai | anthropic
//! slots = 4                       # llama.cpp slots (-np); read from /props when omitted
//! kv_events = "tcp://10.0.0.5:5557"         # vLLM's KV events (docs/KV-EVENTS.md); unset: none
//! kv_events_replay = "tcp://10.0.0.5:5558"  # its replay socket; unset: gaps are lost
//!
//! [kv_events]                     # how those streams are read
//! block_size = 16                 # vLLM's --block-size (16 on GPU, 128 on CPU)
//! main_medium = "GPU"             # the cache tier that counts
//! topic = ""                      # vLLM's topic
//! silence_s = 60                  # no message for this long: the stream is unhealthy
//! recover_after = 8               # good payloads in a row that clear a problem
//! duplicate_window = 16           # a repeat within this many numbers; further back: a restart
//! replay_timeout_ms = 2000        # a replay taking longer loses its gap
//! max_held = 10000                # live messages held during a replay before it gives up
//! port = 5557                     # replicas with a url and no kv_events: tcp://<url host>:5557
//! replay_port = 5558              # and their replay socket
//! prompt_tokens = "model"         # none | engine-sim | model: request → engine tokens (the picker)
//! model_dir = "/models/gemma-3-270m"  # tokenizer.json, tokenizer_config.json, chat template
//! max_prompt_bytes = 32768        # rendered prompt bytes tokenized; a longer one is keyed by its start
//! pending_ms = 5000               # at most this long, blocks sent count over a replica's events
//!
//! [batch]                         # batch mode's HTTP front (on when replicas have urls)
//! listen = "0.0.0.0:8000"
//! window_ms = 150
//! max_batch = 16
//! min_shared = 0.5                # joins a batch only sharing ≥ half its prompt with the leader
//!
//! [discovery]                     # replicas from DNS instead of [[replicas]] (assign mode)
//! dns = "llm-engine-pods.llm.svc.cluster.local"   # the engines' headless Service
//! port_name = "http"              # SRV _http._tcp.<dns>: pod names and ports ("": A only)
//! port = 8000                     # the engines' port when port_name = ""
//! resolver = "10.96.0.10:53"      # default: the first nameserver of /etc/resolv.conf
//! interval_s = 5                  # seconds between resolutions
//! engine = "vllm"                 # the discovered engines' adapter (health path)
//!
//! [prefetch]
//! horizon_ms = 3200
//!
//! [picker]                        # Gateway API Inference Extension endpoint picker (ext_proc)
//! listen = "0.0.0.0:9002"         # unset: no picker
//! filter_config = "/etc/cohort/filter.json"  # the wasm filter's plugin config (JSON); default: its defaults
//! assign_deadline_ms = 25         # decision deadline; then a fallback endpoint
//!
//! [knobs.global]                  # operator defaults and bounds of the client knobs,
//! prefetch = "medium"             # as the filter's `knobs` (docs/CONTRACT.md, "Knob policy")
//! max_prefetch = "high"
//! [[knobs.routes]]
//! authority = "support.example.com"
//! [knobs.routes.knobs]
//! batch_threshold_range = [0.6, 0.9]
//! [knobs.tenants.acme]
//! max_prefetch = "none"
//!
//! [[lora]]                        # requests for model `name` (or of these cohorts) need it
//! name = "sql-lora"
//! path = "/adapters/sql-lora"
//! cohorts = ["3f2a9c0d1e4b5a67"]  # x-cohort-key values
//!
//! [policy]
//! balance = 1.2                   # a replica takes work while under 1.2 × the mean load
//! live_slack = 1.0                # (live load) extra wait on a prefix holder, in cold prefills
//! live_slack_private = 3.0        # the same for a private prefix (a conversation's history)
//! burst_order = true              # a burst's requests with a home are decided before its cold ones
//! kv_blocks_per_replica = 16384   # each replica's prefix cache, in filter blocks (256 B)
//!
//! [headers]                       # as the filter's `headers` (docs/CONTRACT.md)
//! session = "x-cohort-session"
//!
//! audit_max_records = 65536      # per-request audit records kept (0: off)
//!
//! [cost]                          # the effective-cost model (cohort_effective_cost)
//! base = 1.0                      # cost of one prompt token computed from scratch
//! miss_penalty = 0.5              # extra cost of a request with no prefix cached
//!
//! [store]
//! max_entries = 1000000
//! neighbours_per_cohort = 16      # recent fingerprints per cohort the Assign re-ranks (0: off)
//! neighbour_search = "recent"     # recent | exact (scan every fingerprint of the tenant)
//! backend = "cpu"                 # cpu | gpu (falls back to cpu, with one warning, when
//!                                 # built without the `cuda` feature or no GPU is usable)
//! ```
//!
//! Replicas come from `[[replicas]]` (or `--replica`), fixed for the process's life, or
//! from `[discovery]` (or `--discovery-dns`), re-resolved every `interval_s`
//! ([`crate::discovery`]); one or the other. The batch front needs the static list.
//!
//! This module is a leaf of the binary: `serve`, the batch front and the engine probes
//! read it, and it reads none of them.

mod args;
mod sections;
mod validate;

pub use args::ServeArgs;
pub use sections::{
    BatchSection, DiscoverySection, EventsEndpoint, KvEventsSection, LoraSection, NeighbourSearch,
    PickerSection, PolicySection, PrefetchSection, PromptTokensKind, Replica, StoreSection,
};
pub use validate::ConfigError;

use cohort_fingerprint::headers::HeaderNames;
use cohort_fingerprint::knobs::policy::KnobPolicy;
use cohort_score::cost::CostModel;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The whole configuration after merging.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub shard_index: u32,
    pub shard_count: u32,
    pub replicas: Vec<Replica>,
    pub policy: PolicySection,
    pub store: StoreSection,
    pub batch: BatchSection,
    pub prefetch: PrefetchSection,
    /// Operator defaults and bounds of the client knobs: the front reads `x-cohort-prefetch`
    /// within them, and the brain narrows the knob values a filter sends.
    pub knobs: KnobPolicy,
    pub lora: Vec<LoraSection>,
    /// Engine discovery from DNS (instead of `replicas`).
    pub discovery: DiscoverySection,
    /// The Gateway API Inference Extension endpoint picker (off unless `listen` is set).
    pub picker: PickerSection,
    /// How the replicas' KV cache event streams (`[[replicas]] kv_events`) are read.
    pub kv_events: KvEventsSection,
    /// Deployment secret keying the engine cache salts of batch mode (vLLM `cache_salt`)
    /// and the front's own fingerprints; set it (`COHORT_SALT_SECRET`) to the filter's
    /// `salt_secret`, so salts cannot be guessed from tenant names.
    pub salt_secret: String,
    /// The header carrying the tenant, as the filter's `tenant_header` names it.
    pub tenant_header: String,
    /// The header contract (docs/CONTRACT.md), as the filter's `headers` names them.
    pub headers: HeaderNames,
    /// The inspector's browser build (a directory holding `pkg/`); default: `../ui` next
    /// to the binary (`.cohort/ui` for `.cohort/bin/cohort`).
    pub ui_assets: Option<PathBuf>,
    /// Seconds to let in-flight calls finish after SIGTERM before exiting.
    pub drain_s: u64,
    /// Per-request audit records kept, most recent first (0: no audit); a few hundred
    /// bytes each.
    pub audit_max_records: usize,
    /// The effective-cost model's coefficients (`cohort_effective_cost`).
    pub cost: CostModel,
    /// Milliseconds after SIGTERM during which everything keeps serving while health
    /// checks answer 503 and front answers close their connections, so proxies move away
    /// before the listeners close.
    pub drain_delay_ms: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            grpc_listen: ([0, 0, 0, 0], 50051).into(),
            http_listen: ([0, 0, 0, 0], 9464).into(),
            shard_index: 0,
            shard_count: 1,
            replicas: Vec::new(),
            policy: PolicySection::default(),
            store: StoreSection::default(),
            batch: BatchSection::default(),
            prefetch: PrefetchSection::default(),
            knobs: KnobPolicy::default(),
            lora: Vec::new(),
            discovery: DiscoverySection::default(),
            picker: PickerSection::default(),
            kv_events: KvEventsSection::default(),
            ui_assets: None,
            salt_secret: String::new(),
            tenant_header: cohort_fingerprint::headers::TENANT.into(),
            headers: HeaderNames::default(),
            audit_max_records: 65_536,
            cost: CostModel::default(),
            drain_s: 10,
            drain_delay_ms: 4000,
        }
    }
}

/// The StatefulSet ordinal at the end of a hostname (`cohort-batcher-2` → 2).
fn ordinal(hostname: &str) -> Option<u32> {
    let (_, digits) = hostname.trim().rsplit_once('-')?;
    digits.parse().ok()
}

impl ServeConfig {
    /// Reads the file (if any), applies the flags and checks the result.
    pub fn load(args: &ServeArgs, hostname: Option<&str>) -> Result<ServeConfig, ConfigError> {
        let mut config = match &args.config {
            Some(path) => Self::from_file(path)?,
            None => ServeConfig::default(),
        };
        if let Some(addr) = args.grpc_listen {
            config.grpc_listen = addr;
        }
        if let Some(addr) = args.http_listen {
            config.http_listen = addr;
        }
        if let Some(secret) = &args.salt_secret {
            config.salt_secret = secret.clone();
        }
        if let Some(dir) = &args.ui_assets {
            config.ui_assets = Some(dir.clone());
        }
        if let Some(addr) = args.front_listen {
            config.batch.listen = addr;
        }
        if let Some(count) = args.shard_count {
            config.shard_count = count;
        }
        match (args.shard_index, hostname.and_then(ordinal)) {
            (Some(index), _) => config.shard_index = index,
            (None, Some(index)) if config.shard_count > 1 => config.shard_index = index,
            _ => {}
        }
        if !args.replicas.is_empty() {
            config.replicas = args
                .replicas
                .iter()
                .map(|spec| {
                    Replica::from_flag(spec.trim()).map_err(|problem| ConfigError::ReplicaTarget {
                        name: spec.split('=').next().unwrap_or(spec).to_owned(),
                        problem,
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(dns) = &args.discovery_dns {
            config.discovery.dns = Some(dns.clone()).filter(|d| !d.is_empty());
        }
        if let Some(name) = &args.discovery_port_name {
            config.discovery.port_name = name.clone();
        }
        if let Some(port) = args.discovery_port {
            config.discovery.port = port;
        }
        if let Some(resolver) = args.discovery_resolver {
            config.discovery.resolver = Some(resolver);
        }
        if let Some(interval) = args.discovery_interval_s {
            config.discovery.interval_s = interval;
        }
        if let Some(engine) = args.discovery_engine {
            config.discovery.engine = engine;
        }
        if let Some(addr) = args.picker_listen {
            config.picker.listen = Some(addr);
        }
        if let Some(path) = &args.picker_filter_config {
            config.picker.filter_config = Some(path.clone());
        }
        if let Some(balance) = args.balance {
            config.policy.balance = balance;
        }
        if let Some(slack) = args.live_slack {
            config.policy.live_slack = slack;
        }
        if let Some(slack) = args.live_slack_private {
            config.policy.live_slack_private = slack;
        }
        if let Some(order) = args.burst_order {
            config.policy.burst_order = order;
        }
        if let Some(store) = args.store {
            config.store.backend = store;
        }
        if let Some(delay) = args.drain_delay_ms {
            config.drain_delay_ms = delay;
        }
        if let Some(records) = args.audit_max_records {
            config.audit_max_records = records;
        }
        config.derive_kv_events_endpoints();
        config.validate()?;
        Ok(config)
    }

    /// `[kv_events] port`: every replica with a url and no events endpoint of its own
    /// gets `tcp://<its url's host>:<port>` (and the replay port beside it).
    fn derive_kv_events_endpoints(&mut self) {
        let Some(port) = self.kv_events.port else {
            return;
        };
        let replay_port = self.kv_events.replay_port;
        for replica in &mut self.replicas {
            if replica.kv_events.is_some() {
                continue;
            }
            let Some(host) = replica.url.as_ref().and_then(|u| u.uri().host()) else {
                continue;
            };
            let events = EventsEndpoint::try_from(format!("tcp://{host}:{port}")).ok();
            let replay = replay_port
                .and_then(|replay| EventsEndpoint::try_from(format!("tcp://{host}:{replay}")).ok());
            if events.is_some() {
                replica.kv_events = events;
                replica.kv_events_replay = replay;
            }
        }
    }

    fn from_file(path: &Path) -> Result<ServeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    /// The inspector's asset directory: as configured, else `../ui` beside the binary
    /// when it exists.
    pub fn ui_assets_dir(&self) -> Option<PathBuf> {
        self.ui_assets.clone().or_else(|| {
            let exe = std::env::current_exe().ok()?;
            let dir = exe.parent()?.parent()?.join("ui");
            dir.is_dir().then_some(dir)
        })
    }

    /// Whether batch mode's front runs (static replicas, every one with a url).
    pub fn front_enabled(&self) -> bool {
        !self.replicas.is_empty() && self.replicas.iter().all(|r| r.url.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_batcher_core::engines::EngineKind;
    use cohort_gpu_store::StoreKind;

    fn args(replicas: &[&str]) -> ServeArgs {
        ServeArgs {
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            ..ServeArgs::default()
        }
    }

    #[test]
    fn discovery_replaces_the_static_list_and_is_checked() {
        let mut a = args(&[]);
        a.discovery_dns = Some("llm-engine-pods.llm.svc.cluster.local".into());
        a.discovery_resolver = Some("10.96.0.10:53".parse().unwrap());
        a.discovery_interval_s = Some(2);
        a.discovery_engine = Some(EngineKind::Vllm);
        let config = ServeConfig::load(&a, None).unwrap();
        assert!(config.replicas.is_empty());
        assert!(!config.front_enabled(), "the front needs the static list");
        let d = &config.discovery;
        assert_eq!(d.port_name, "http");
        assert_eq!(
            (d.interval_s, d.port, d.engine),
            (2, 8000, EngineKind::Vllm)
        );
        assert_eq!(d.resolver, Some("10.96.0.10:53".parse().unwrap()));
        assert_eq!(ServeConfig::default().discovery.interval_s, 5);

        let refused = |change: &dyn Fn(&mut ServeArgs)| {
            let mut b = a.clone();
            change(&mut b);
            ServeConfig::load(&b, None).unwrap_err().to_string()
        };
        assert!(refused(&|b| b.replicas = vec!["r0".into()]).contains("not both"));
        assert!(refused(&|b| b.discovery_interval_s = Some(0)).contains("interval_s"));
        assert!(refused(&|b| b.discovery_dns = Some("bad name..x".into())).contains("DNS name"));
        assert!(refused(&|b| b.discovery_port_name = Some("HTTP".into())).contains("port_name"));
        assert!(refused(&|b| {
            b.discovery_port_name = Some(String::new());
            b.discovery_port = Some(0);
        })
        .contains("port"));
        // An empty name turns discovery off: then a replica list is needed.
        assert!(refused(&|b| b.discovery_dns = Some(String::new())).contains("no engine replicas"));
    }

    #[test]
    fn flags_override_the_file() {
        let dir = std::env::temp_dir().join(format!("cohort-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        std::fs::write(
            &path,
            "grpc_listen = \"127.0.0.1:7000\"\nshard_count = 2\ndrain_delay_ms = 500\naudit_max_records = 10\n[cost]\nmiss_penalty = 2.0\n[[replicas]]\nname = \"a\"\n[policy]\nbalance = 1.5\nkv_blocks_per_replica = 10\nburst_order = false\n",
        )
        .unwrap();
        let mut a = args(&[]);
        a.config = Some(path.clone());
        let config = ServeConfig::load(&a, Some("cohort-batcher-1")).unwrap();
        assert_eq!(config.grpc_listen.port(), 7000);
        assert_eq!(config.policy.kv_blocks_per_replica, 10);
        assert_eq!(config.policy.balance, 1.5);
        assert!(!config.policy.burst_order);
        assert!(ServeConfig::default().policy.burst_order);
        assert_eq!(config.shard_index, 1, "from the StatefulSet ordinal");
        assert_eq!(config.drain_delay_ms, 500);
        assert_eq!(config.audit_max_records, 10);
        assert_eq!(config.cost.miss_penalty, 2.0);
        assert_eq!(config.cost.base, 1.0);
        assert_eq!(ServeConfig::default().drain_delay_ms, 4000);
        assert_eq!(ServeConfig::default().audit_max_records, 65_536);
        a.replicas = vec!["x".into(), "y".into()];
        a.grpc_listen = Some("127.0.0.1:7001".parse().unwrap());
        a.shard_index = Some(0);
        a.drain_delay_ms = Some(250);
        a.audit_max_records = Some(0);
        a.burst_order = Some(true);
        let config = ServeConfig::load(&a, Some("cohort-batcher-1")).unwrap();
        assert!(config.policy.burst_order);
        assert_eq!(config.drain_delay_ms, 250);
        assert_eq!(config.audit_max_records, 0);
        assert_eq!(config.grpc_listen.port(), 7001);
        assert_eq!(config.replicas.len(), 2);
        assert_eq!(config.shard_index, 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_configurations_say_why() {
        let err = |a: ServeArgs| ServeConfig::load(&a, None).unwrap_err().to_string();
        assert!(err(args(&[])).contains("no engine replicas"));
        assert!(err(args(&["a", "a"])).contains("unique"));
        assert!(err(args(&["bad name"])).contains("replica name"));
        let mut a = args(&["a"]);
        a.shard_index = Some(2);
        assert!(err(a).contains("shard_index 2"));
        let mut a = args(&["a"]);
        a.balance = Some(0.5);
        assert!(err(a).contains("balance"));
        let mut a = args(&["a"]);
        a.config = Some("/nonexistent/cohort.toml".into());
        assert!(err(a).contains("cannot read"));
        assert!(err(args(&["a=http://h:1", "b"])).contains("missing: b"));
        assert!(err(args(&["a=triton+http://h:1"])).contains("unknown engine"));
        assert!(err(args(&["a=ftp://h"])).contains("not http://host:port"));
        let dir = std::env::temp_dir().join(format!("cohort-config-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        // Each malformed value is refused at start with its field named, never defaulted.
        for (file, field) in [
            ("[policy]\nlive_slack = -1.0\n", "policy.live_slack"),
            (
                "[policy]\nlive_slack_private = inf\n",
                "policy.live_slack_private",
            ),
            ("[store]\nbackend = \"tpu\"\n", "backend"),
            ("[cost]\nmiss_penalty = -1.0\n", "cost.miss_penalty"),
            ("[cost]\nbase = nan\n", "cost.base"),
            ("[knobs.global]\nprefetch = \"hgh\"\n", "prefetch"),
            (
                "[knobs.tenants.a]\nbatch_threshold_range = [0.9, 0.2]\n",
                "knobs.tenants.a.batch_threshold_range",
            ),
            ("[batch]\nmin_shared = 1.5\n", "min_shared"),
            ("tenant_header = \"X-Org\"\n", "tenant_header"),
            ("[headers]\nsession = \"x-cohort-key\"\n", "session"),
        ] {
            std::fs::write(&path, file).unwrap();
            let mut a = args(&["a"]);
            a.config = Some(path.clone());
            let message = err(a);
            assert!(message.contains(field), "{file:?}: {message}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_shipped_cohort_toml_loads_and_the_pools_runs_the_picker() {
        // The files the overlays mount (istio/<overlay>/cohort.toml), through the loader
        // `cohort serve --config` uses: an unknown or misspelt key fails here.
        let istio = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../istio");
        let load = |overlay: &str| {
            let mut a = args(&[]);
            a.config = Some(istio.join(overlay).join("cohort.toml"));
            ServeConfig::load(&a, Some("cohort-batcher-0"))
                .unwrap_or_else(|e| panic!("istio/{overlay}/cohort.toml: {e}"))
        };
        for overlay in ["batcher", "batch"] {
            assert_eq!(load(overlay).picker.listen, None, "{overlay}: no picker");
        }
        let pool = load("inference-pool");
        assert_eq!(pool.picker.listen, Some("0.0.0.0:9002".parse().unwrap()));
        assert_eq!(
            pool.discovery.dns.as_deref(),
            Some("llm-engine-pool.llm.svc.cluster.local")
        );
        assert!(pool.picker.filter_config_parsed().is_ok());
    }

    #[test]
    fn the_picker_section_reads_flags_and_checks_its_filter_config() {
        let dir = std::env::temp_dir().join(format!("cohort-config-picker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        let filter = dir.join("filter.json");
        std::fs::write(
            &filter,
            r#"{"body_limit_bytes": 4096, "tenant_header": "x-org"}"#,
        )
        .unwrap();
        std::fs::write(
            &path,
            format!(
                "[[replicas]]\nname = \"a\"\n[picker]\nlisten = \"127.0.0.1:9002\"\n\
                 filter_config = {:?}\nassign_deadline_ms = 40\n",
                filter.display().to_string()
            ),
        )
        .unwrap();
        let mut a = args(&[]);
        a.config = Some(path.clone());
        let config = ServeConfig::load(&a, None).unwrap();
        assert_eq!(
            config.picker.listen,
            Some("127.0.0.1:9002".parse().unwrap())
        );
        assert_eq!(config.picker.assign_deadline_ms, 40);
        let parsed = config.picker.filter_config_parsed().unwrap();
        assert_eq!(
            (parsed.body_limit_bytes, parsed.tenant_header.as_str()),
            (4096, "x-org")
        );
        assert_eq!(ServeConfig::default().picker, PickerSection::default());
        assert_eq!(
            ServeConfig::default().picker.listen,
            None,
            "off unless asked"
        );
        a.picker_listen = Some("127.0.0.1:9012".parse().unwrap());
        a.picker_filter_config = Some(dir.join("missing.json"));
        let message = ServeConfig::load(&a, None).unwrap_err().to_string();
        assert!(message.contains("picker.filter_config"), "{message}");
        std::fs::write(&filter, r#"{"body_limit_bytes": 0}"#).unwrap();
        a.picker_filter_config = Some(filter.clone());
        let message = ServeConfig::load(&a, None).unwrap_err().to_string();
        assert!(message.contains("body_limit_bytes"), "{message}");
        std::fs::write(&filter, "{}").unwrap();
        let config = ServeConfig::load(&a, None).unwrap();
        assert_eq!(
            config.picker.listen,
            Some("127.0.0.1:9012".parse().unwrap())
        );
        for (file, field) in [
            ("[picker]\nassign_deadline_ms = 0\n", "assign_deadline_ms"),
            ("[picker]\nlisten = \"nowhere\"\n", "listen"),
            ("[picker]\nlisen = \"127.0.0.1:1\"\n", "lisen"),
        ] {
            std::fs::write(&path, format!("[[replicas]]\nname = \"a\"\n{file}")).unwrap();
            let mut b = args(&[]);
            b.config = Some(path.clone());
            let message = ServeConfig::load(&b, None).unwrap_err().to_string();
            assert!(message.contains(field), "{file:?}: {message}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn kv_events_endpoints_and_settings_are_read_and_checked() {
        let dir = std::env::temp_dir().join(format!("cohort-config-kv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let mut a = args(&[]);
            a.config = Some(path.clone());
            ServeConfig::load(&a, None)
        };
        let config = load(
            "[[replicas]]\nname = \"a\"\nkv_events = \"tcp://10.0.0.5:5557\"\n\
             kv_events_replay = \"tcp://[::1]:5558\"\n\
             [[replicas]]\nname = \"b\"\nkv_events = \"tcp://vllm-0.llm.svc:5557\"\n\
             [[replicas]]\nname = \"c\"\n\
             [kv_events]\nblock_size = 128\nmain_medium = \"CPU\"\ntopic = \"kv\"\nsilence_s = 5\n\
             recover_after = 2\nduplicate_window = 4\nreplay_timeout_ms = 300\nmax_held = 50\n",
        )
        .unwrap();
        let endpoint = |i: usize| config.replicas[i].kv_events.as_ref().map(|e| e.as_str());
        let replay = |i: usize| {
            config.replicas[i]
                .kv_events_replay
                .as_ref()
                .map(|e| e.as_str())
        };
        assert_eq!(
            (endpoint(0), replay(0)),
            (Some("tcp://10.0.0.5:5557"), Some("tcp://[::1]:5558"))
        );
        assert_eq!(
            (endpoint(1), replay(1)),
            (Some("tcp://vllm-0.llm.svc:5557"), None)
        );
        assert_eq!((endpoint(2), replay(2)), (None, None));
        let r = config.kv_events.replica_config();
        assert_eq!((r.block_size, r.main_medium.as_str()), (128, "CPU"));
        assert_eq!(config.kv_events.topic, "kv");
        assert_eq!((r.health.silence.as_secs(), r.health.recover_after), (5, 2));
        assert_eq!(r.sequence.duplicate_window, 4);
        assert_eq!(r.sequence.replay_timeout.as_millis(), 300);
        assert_eq!(r.sequence.max_held, 50);

        // Each bad value is refused with the field or the endpoint named.
        let replica = |line: &str| format!("[[replicas]]\nname = \"a\"\n{line}\n");
        for (file, expected) in [
            (replica("kv_events = \"tcp://*:5557\""), "bind address"),
            (replica("kv_events = \"ipc:///tmp/kv\""), "only tcp://"),
            (replica("kv_events = \"tcp://10.0.0.5\""), "no port"),
            (replica("kv_events = \"tcp://10.0.0.5:0\""), "1-65535"),
            (
                replica("kv_events = \"tcp://bad host:5557\""),
                "IP address or a DNS name",
            ),
            (
                replica("kv_events = \"tcp://[zz]:5557\""),
                "IP address or a DNS name",
            ),
            (
                replica("kv_events_replay = \"tcp://10.0.0.5:5558\""),
                "replica a: kv_events_replay needs kv_events",
            ),
            (
                replica("[kv_events]\nblock_size = 0"),
                "kv_events.block_size",
            ),
            (replica("[kv_events]\nsilence_s = 0"), "kv_events.silence_s"),
            (
                replica("[kv_events]\nrecover_after = 0"),
                "kv_events.recover_after",
            ),
            (
                replica("[kv_events]\nreplay_timeout_ms = 0"),
                "kv_events.replay_timeout_ms",
            ),
            (replica("[kv_events]\nmax_held = 0"), "kv_events.max_held"),
            (
                replica("[kv_events]\nmain_medium = \"\""),
                "kv_events.main_medium",
            ),
            (replica("[kv_events]\nblocksize = 16"), "blocksize"),
            (
                replica("[kv_events]\nreplay_port = 5558"),
                "replay_port needs port",
            ),
            (replica("[kv_events]\nport = 0"), "ports must be 1-65535"),
            (
                replica("[kv_events]\nmax_prompt_bytes = 0"),
                "kv_events.max_prompt_bytes",
            ),
            (
                replica("[kv_events]\nprompt_tokens = \"model\""),
                "needs model_dir",
            ),
            (
                replica("[kv_events]\nmodel_dir = \"/models/m\""),
                "model_dir is read only with prompt_tokens",
            ),
            (
                replica("[kv_events]\nprompt_tokens = \"tiktoken\""),
                "prompt_tokens",
            ),
        ] {
            let message = load(&file).unwrap_err().to_string();
            assert!(message.contains(expected), "{file:?}: {message}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn kv_events_port_derives_each_url_replicas_endpoints() {
        let dir =
            std::env::temp_dir().join(format!("cohort-config-kv-port-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        std::fs::write(
            &path,
            "[[replicas]]\nname = \"a\"\nurl = \"http://10.0.0.5:8000\"\n\
             [[replicas]]\nname = \"b\"\nurl = \"http://vllm-1.llm.svc:8000\"\n\
             kv_events = \"tcp://10.9.9.9:7000\"\n\
             [[replicas]]\nname = \"c\"\nurl = \"http://[fd00::7]:8000\"\n\
             [kv_events]\nport = 5557\nreplay_port = 5558\nprompt_tokens = \"engine-sim\"\npending_ms = 900\n\
             max_prompt_bytes = 4096\n",
        )
        .unwrap();
        let mut a = args(&[]);
        a.config = Some(path);
        let config = ServeConfig::load(&a, None).unwrap();
        let endpoints: Vec<(Option<&str>, Option<&str>)> = config
            .replicas
            .iter()
            .map(|r| {
                (
                    r.kv_events.as_ref().map(|e| e.as_str()),
                    r.kv_events_replay.as_ref().map(|e| e.as_str()),
                )
            })
            .collect();
        assert_eq!(
            endpoints,
            vec![
                (Some("tcp://10.0.0.5:5557"), Some("tcp://10.0.0.5:5558")),
                // Its own endpoint stands (and it named no replay socket).
                (Some("tcp://10.9.9.9:7000"), None),
                (Some("tcp://[fd00::7]:5557"), Some("tcp://[fd00::7]:5558")),
            ]
        );
        assert_eq!(config.kv_events.prompt_tokens, PromptTokensKind::EngineSim);
        assert_eq!(config.kv_events.pending_ms, 900);
        assert_eq!(config.kv_events.max_prompt_bytes, 4096);
        // Without `port`, nothing is derived.
        let plain = ServeConfig::load(&args(&["a=http://10.0.0.5:8000"]), None).unwrap();
        assert!(plain.replicas[0].kv_events.is_none());
        assert_eq!(plain.kv_events.prompt_tokens, PromptTokensKind::None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn store_flag_picks_the_backend() {
        let config = ServeConfig::load(&args(&["a"]), None).unwrap();
        assert_eq!(config.store.backend, StoreKind::Cpu);
        let mut a = args(&["a"]);
        a.store = Some(StoreKind::Gpu);
        let config = ServeConfig::load(&a, None).unwrap();
        assert_eq!(config.store.backend, StoreKind::Gpu);
    }

    #[test]
    fn replica_flags_carry_engine_and_url() {
        let config = ServeConfig::load(
            &args(&["r0=http://127.0.0.1:8081", "r1=vllm+http://10.0.0.2:8000"]),
            None,
        )
        .unwrap();
        assert!(config.front_enabled());
        assert_eq!(config.replicas[0].engine, EngineKind::LlamaCpp);
        assert_eq!(
            config.replicas[0].url.as_ref().map(|u| u.uri().to_string()),
            Some("http://127.0.0.1:8081/".to_owned())
        );
        assert_eq!(config.replicas[1].engine, EngineKind::Vllm);
        assert!(!ServeConfig::load(&args(&["r0"]), None)
            .unwrap()
            .front_enabled());
    }
}
