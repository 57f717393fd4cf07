//! `cohort serve` configuration: a TOML file, overridden by flags, overridden by nothing
//! else (each flag also reads a `COHORT_*` environment variable, clap's usual precedence:
//! flag, then environment, then the file, then the default).
//!
//! ```toml
//! grpc_listen = "0.0.0.0:50051"   # Assign / Observe / Status (the filter's batcher cluster)
//! http_listen = "0.0.0.0:9464"    # /metrics, /healthz, /readyz
//! shard_index = 0                 # this batcher's shard (a StatefulSet ordinal)
//! shard_count = 1                 # batcher shards the filters are configured with
//!
//! [[replicas]]                    # engine replicas, by the name the routes match on
//! name = "replica-0"              # the x-cohort-shard value
//! url = "http://10.0.0.5:8000"    # batch mode: where the front sends this replica's work
//! engine = "llamacpp"             # llamacpp | vllm | sglang | tgi | openai | anthropic
//! slots = 4                       # llama.cpp slots (-np); read from /props when omitted
//!
//! [batch]                         # batch mode's HTTP front (on when replicas have urls)
//! listen = "0.0.0.0:8000"
//! window_ms = 150
//! max_batch = 16
//!
//! [prefetch]
//! horizon_ms = 3200
//! default_level = "medium"        # when a request has no x-cohort-prefetch
//!
//! [[lora]]                        # requests for model `name` (or of these cohorts) need it
//! name = "sql-lora"
//! path = "/adapters/sql-lora"
//! cohorts = ["3f2a9c0d1e4b5a67"]  # x-cohort-key values
//!
//! [policy]
//! balance = 1.2                   # a replica takes work while under 1.2 × the mean load
//! kv_blocks_per_replica = 16384   # each replica's prefix cache, in filter blocks (256 B)
//!
//! [store]
//! max_entries = 1000000
//! backend = "cpu"                 # cpu | gpu (falls back to cpu, with one warning, when
//!                                 # built without the `cuda` feature or no GPU is usable)
//! ```
//!
//! Replicas are static for now. A Kubernetes source would fill the same `Vec<Replica>`
//! from the Endpoints (EndpointSlices) of a Service and update the policy when they change;
//! the policy already keys everything by replica index, so only a resize hook is missing.

use cohort_gpu_store::StoreKind;
use cohort_proto::is_plain_name;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// One engine replica as the batcher routes to it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    /// The `x-cohort-shard` value routes match on; 1–64 of `[A-Za-z0-9._-]`.
    pub name: String,
    /// Base URL of the engine (`http://host:port`), for batch mode's front.
    #[serde(default)]
    pub url: Option<String>,
    /// The engine adapter (see `cohort_batcher_core::engines`).
    #[serde(default = "default_engine")]
    pub engine: String,
    /// Slots (llama.cpp `-np`); `None` = ask the engine.
    #[serde(default)]
    pub slots: Option<usize>,
}

fn default_engine() -> String {
    "llamacpp".to_owned()
}

impl Replica {
    pub fn named(name: &str) -> Replica {
        Replica {
            name: name.to_owned(),
            url: None,
            engine: default_engine(),
            slots: None,
        }
    }
}

impl Replica {
    /// Parses a `--replica` value (see the flag).
    fn from_flag(spec: &str) -> Replica {
        let Some((name, target)) = spec.split_once('=') else {
            return Replica::named(spec);
        };
        let mut replica = Replica::named(name);
        match target.split_once('+') {
            Some((engine, url)) => {
                replica.engine = engine.to_owned();
                replica.url = Some(url.to_owned());
            }
            None => replica.url = Some(target.to_owned()),
        }
        replica
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
    /// Level when a request has no `x-cohort-prefetch`: high, medium, low or none.
    pub default_level: String,
}

impl Default for PrefetchSection {
    fn default() -> Self {
        let core = cohort_batcher_core::predict::PredictConfig::default();
        PrefetchSection {
            horizon_ms: core.horizon_ms,
            half_life_ms: core.half_life_ms,
            default_level: "medium".to_owned(),
        }
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
            kv_blocks_per_replica: 16_384,
        }
    }
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
    /// Where the fingerprints live: `cpu` or `gpu` (see docs/GPU-STORE.md).
    pub backend: String,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            max_entries: 1_000_000,
            shards: 16,
            cohort_idle_s: 900,
            backend: "cpu".to_owned(),
        }
    }
}

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
    pub lora: Vec<LoraSection>,
    /// Deployment secret keying the engine cache salts of batch mode (vLLM `cache_salt`);
    /// set it (`COHORT_SALT_SECRET`) so salts cannot be guessed from tenant names.
    pub salt_secret: String,
    /// The inspector's browser build (a directory holding `pkg/`); default: `../ui` next
    /// to the binary (`.cohort/ui` for `.cohort/bin/cohort`).
    pub ui_assets: Option<PathBuf>,
    /// Seconds to let in-flight calls finish after SIGTERM before exiting.
    pub drain_s: u64,
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
            lora: Vec::new(),
            ui_assets: None,
            salt_secret: String::new(),
            drain_s: 10,
            drain_delay_ms: 4000,
        }
    }
}

/// Flags (and their environment variables) that override the file.
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "COHORT_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (Assign, Observe, Status).
    #[arg(long, env = "COHORT_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// HTTP listen address (/metrics, /healthz, /readyz).
    #[arg(long, env = "COHORT_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Deployment secret keying engine cache salts (as the filter's `salt_secret`).
    #[arg(long, env = "COHORT_SALT_SECRET", hide_env_values = true)]
    pub salt_secret: Option<String>,
    /// The inspector's browser build (a directory holding `pkg/`).
    #[arg(long, env = "COHORT_UI_ASSETS")]
    pub ui_assets: Option<PathBuf>,
    /// Batch mode's front listen address (OpenAI / Anthropic APIs).
    #[arg(long, env = "COHORT_FRONT_LISTEN")]
    pub front_listen: Option<SocketAddr>,
    /// This batcher's shard index; defaults to the ordinal at the end of the pod's
    /// hostname (`cohort-batcher-2` → 2) when the hostname has one.
    #[arg(long, env = "COHORT_SHARD_INDEX")]
    pub shard_index: Option<u32>,
    /// Number of batcher shards.
    #[arg(long, env = "COHORT_SHARD_COUNT")]
    pub shard_count: Option<u32>,
    /// Engine replicas (repeat, or comma-separated in the environment): `NAME`, or
    /// `NAME=URL` for batch mode's front (engine llamacpp), or `NAME=ENGINE+URL`
    /// (`replica-0=vllm+http://10.0.0.5:8000`). Replaces the file's list.
    #[arg(long = "replica", env = "COHORT_REPLICAS", value_delimiter = ',')]
    pub replicas: Vec<String>,
    /// Balance bound (see the policy).
    #[arg(long, env = "COHORT_BALANCE")]
    pub balance: Option<f64>,
    /// Fingerprint store: `cpu` or `gpu` (gpu falls back to cpu with one warning when the
    /// binary lacks the `cuda` feature or no GPU is usable).
    #[arg(long, env = "COHORT_STORE")]
    pub store: Option<String>,
    /// Milliseconds to keep serving after SIGTERM while health checks answer 503.
    #[arg(long, env = "COHORT_DRAIN_DELAY_MS")]
    pub drain_delay_ms: Option<u64>,
}

/// Why the configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid cohort serve configuration: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("no engine replicas configured (a [[replicas]] table or --replica)")]
    NoReplicas,
    #[error("replica name {0:?} must be 1-64 of [A-Za-z0-9._-] and unique")]
    ReplicaName(String),
    #[error("shard_index {index} is not below shard_count {count}")]
    Shard { index: u32, count: u32 },
    #[error("policy.balance must be at least 1.0, got {0}")]
    Balance(f64),
    #[error("policy.balance_slack_tokens must be a finite number ≥ 0, got {0}")]
    Slack(f64),
    #[error("replica {name}: {problem}")]
    ReplicaTarget { name: String, problem: String },
    #[error("batch mode needs a url for every replica or for none (missing: {0})")]
    MixedUrls(String),
    #[error("batch: {0}")]
    Batch(String),
    #[error("prefetch.default_level must be high, medium, low or none, got {0:?}")]
    PrefetchLevel(String),
    #[error("lora {0:?}: name must be 1-64 of [A-Za-z0-9._-] and path non-empty")]
    Lora(String),
    #[error("store.backend: {0}")]
    StoreBackend(String),
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
                .map(|spec| Replica::from_flag(spec.trim()))
                .collect();
        }
        if let Some(balance) = args.balance {
            config.policy.balance = balance;
        }
        if let Some(store) = &args.store {
            config.store.backend = store.clone();
        }
        if let Some(delay) = args.drain_delay_ms {
            config.drain_delay_ms = delay;
        }
        config.validate()?;
        Ok(config)
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

    fn validate(&self) -> Result<(), ConfigError> {
        if self.replicas.is_empty() {
            return Err(ConfigError::NoReplicas);
        }
        for (i, replica) in self.replicas.iter().enumerate() {
            let duplicate = self.replicas[..i].iter().any(|r| r.name == replica.name);
            if !is_plain_name(&replica.name) || duplicate {
                return Err(ConfigError::ReplicaName(replica.name.clone()));
            }
        }
        if self.shard_count == 0 || self.shard_index >= self.shard_count {
            return Err(ConfigError::Shard {
                index: self.shard_index,
                count: self.shard_count,
            });
        }
        if self.policy.balance.is_nan() || self.policy.balance < 1.0 {
            return Err(ConfigError::Balance(self.policy.balance));
        }
        let slack = self.policy.balance_slack_tokens;
        if !slack.is_finite() || slack < 0.0 {
            return Err(ConfigError::Slack(slack));
        }
        self.store_kind()?;
        self.validate_front()
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

    /// The fingerprint store asked for.
    pub fn store_kind(&self) -> Result<StoreKind, ConfigError> {
        self.store
            .backend
            .parse()
            .map_err(ConfigError::StoreBackend)
    }

    /// Whether batch mode's front runs (every replica has a url).
    pub fn front_enabled(&self) -> bool {
        self.replicas.iter().all(|r| r.url.is_some())
    }

    fn validate_front(&self) -> Result<(), ConfigError> {
        let with_url = self.replicas.iter().filter(|r| r.url.is_some()).count();
        if with_url != 0 && with_url != self.replicas.len() {
            let missing: Vec<_> = self
                .replicas
                .iter()
                .filter(|r| r.url.is_none())
                .map(|r| r.name.as_str())
                .collect();
            return Err(ConfigError::MixedUrls(missing.join(", ")));
        }
        for replica in &self.replicas {
            let problem = |problem: String| ConfigError::ReplicaTarget {
                name: replica.name.clone(),
                problem,
            };
            cohort_batcher_core::engines::EngineKind::parse(&replica.engine)
                .map_err(|e| problem(e.to_string()))?;
            if let Some(url) = &replica.url {
                url.parse::<axum::http::Uri>()
                    .ok()
                    .filter(|u| u.scheme_str() == Some("http") && u.authority().is_some())
                    .ok_or_else(|| problem(format!("url {url:?} is not http://host:port")))?;
            }
            if replica.slots == Some(0) {
                return Err(problem("slots must be at least 1".to_owned()));
            }
        }
        let b = &self.batch;
        if b.max_batch == 0 || b.max_batch_pressured == 0 || b.max_batch_pressured > b.max_batch {
            return Err(ConfigError::Batch(format!(
                "need 1 ≤ max_batch_pressured ({}) ≤ max_batch ({})",
                b.max_batch_pressured, b.max_batch
            )));
        }
        if b.max_batch_same_slot == 0 {
            return Err(ConfigError::Batch(
                "max_batch_same_slot must be at least 1".to_owned(),
            ));
        }
        if !(0.0..=1.0).contains(&b.kv_pressure) {
            return Err(ConfigError::Batch(format!(
                "kv_pressure must be within 0–1, got {}",
                b.kv_pressure
            )));
        }
        if b.max_hold_ms < b.window_ms || b.scrape_interval_s == 0 {
            return Err(ConfigError::Batch(
                "need max_hold_ms ≥ window_ms and scrape_interval_s ≥ 1".to_owned(),
            ));
        }
        if crate::front::prefetch_level(&self.prefetch.default_level).is_none() {
            return Err(ConfigError::PrefetchLevel(
                self.prefetch.default_level.clone(),
            ));
        }
        for lora in &self.lora {
            if !is_plain_name(&lora.name) || lora.path.is_empty() {
                return Err(ConfigError::Lora(lora.name.clone()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(replicas: &[&str]) -> ServeArgs {
        ServeArgs {
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            ..ServeArgs::default()
        }
    }

    #[test]
    fn flags_override_the_file() {
        let dir = std::env::temp_dir().join(format!("cohort-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        std::fs::write(
            &path,
            "grpc_listen = \"127.0.0.1:7000\"\nshard_count = 2\ndrain_delay_ms = 500\n[[replicas]]\nname = \"a\"\n[policy]\nbalance = 1.5\nkv_blocks_per_replica = 10\n",
        )
        .unwrap();
        let mut a = args(&[]);
        a.config = Some(path.clone());
        let config = ServeConfig::load(&a, Some("cohort-batcher-1")).unwrap();
        assert_eq!(config.grpc_listen.port(), 7000);
        assert_eq!(config.policy.kv_blocks_per_replica, 10);
        assert_eq!(config.policy.balance, 1.5);
        assert_eq!(config.shard_index, 1, "from the StatefulSet ordinal");
        assert_eq!(config.drain_delay_ms, 500);
        assert_eq!(ServeConfig::default().drain_delay_ms, 4000);
        a.replicas = vec!["x".into(), "y".into()];
        a.grpc_listen = Some("127.0.0.1:7001".parse().unwrap());
        a.shard_index = Some(0);
        a.drain_delay_ms = Some(250);
        let config = ServeConfig::load(&a, Some("cohort-batcher-1")).unwrap();
        assert_eq!(config.drain_delay_ms, 250);
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
        let mut a = args(&["a"]);
        a.store = Some("tpu".into());
        assert!(err(a).contains("unknown store `tpu`"));
    }

    #[test]
    fn store_flag_picks_the_backend() {
        let config = ServeConfig::load(&args(&["a"]), None).unwrap();
        assert_eq!(config.store_kind().unwrap(), StoreKind::Cpu);
        let mut a = args(&["a"]);
        a.store = Some("gpu".into());
        let config = ServeConfig::load(&a, None).unwrap();
        assert_eq!(config.store_kind().unwrap(), StoreKind::Gpu);
    }

    #[test]
    fn replica_flags_carry_engine_and_url() {
        let config = ServeConfig::load(
            &args(&["r0=http://127.0.0.1:8081", "r1=vllm+http://10.0.0.2:8000"]),
            None,
        )
        .unwrap();
        assert!(config.front_enabled());
        assert_eq!(config.replicas[0].engine, "llamacpp");
        assert_eq!(
            config.replicas[0].url.as_deref(),
            Some("http://127.0.0.1:8081")
        );
        assert_eq!(config.replicas[1].engine, "vllm");
        assert!(!ServeConfig::load(&args(&["r0"]), None)
            .unwrap()
            .front_enabled());
    }
}
