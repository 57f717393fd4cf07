//! `cohort serve`'s flags. Each also reads a `COHORT_*` environment variable, and each
//! overrides the configuration file ([`super::ServeConfig::load`] merges them).

use cohort_batcher_core::engines::EngineKind;
use cohort_gpu_store::StoreKind;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Flags (and their environment variables) that override the file.
#[derive(Debug, Clone, Default, clap::Args)]
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
    /// Learn the engine replicas from this DNS name (the engines' headless Service)
    /// instead of `--replica`.
    #[arg(long, env = "COHORT_DISCOVERY_DNS")]
    pub discovery_dns: Option<String>,
    /// The Service's named port, for SRV records `_<name>._tcp.<dns>` ("" = A records only).
    #[arg(long, env = "COHORT_DISCOVERY_PORT_NAME")]
    pub discovery_port_name: Option<String>,
    /// The engines' port when the port name is empty.
    #[arg(long, env = "COHORT_DISCOVERY_PORT")]
    pub discovery_port: Option<u16>,
    /// The DNS server to ask (`ip:port`); default: the first nameserver of /etc/resolv.conf.
    #[arg(long, env = "COHORT_DISCOVERY_RESOLVER")]
    pub discovery_resolver: Option<SocketAddr>,
    /// Seconds between two resolutions (default 5).
    #[arg(long, env = "COHORT_DISCOVERY_INTERVAL_S")]
    pub discovery_interval_s: Option<u64>,
    /// The discovered engines' adapter (health path): llamacpp, vllm, sglang, tgi, …
    #[arg(long, env = "COHORT_DISCOVERY_ENGINE", value_parser = parse_engine)]
    pub discovery_engine: Option<EngineKind>,
    /// The endpoint picker's gRPC listen address (Envoy ext_proc and gRPC health); unset:
    /// no picker.
    #[arg(long, env = "COHORT_PICKER_LISTEN")]
    pub picker_listen: Option<SocketAddr>,
    /// The wasm filter's plugin configuration (JSON) the picker fingerprints under.
    #[arg(long, env = "COHORT_PICKER_FILTER_CONFIG")]
    pub picker_filter_config: Option<PathBuf>,
    /// Balance bound (see the policy).
    #[arg(long, env = "COHORT_BALANCE")]
    pub balance: Option<f64>,
    /// Live load: extra wait a request may take on its prefix's holder, in its own cold
    /// prefills (see the policy).
    #[arg(long, env = "COHORT_LIVE_SLACK")]
    pub live_slack: Option<f64>,
    /// The same for a private prefix (a conversation's own history).
    #[arg(long, env = "COHORT_LIVE_SLACK_PRIVATE")]
    pub live_slack_private: Option<f64>,
    /// Decide a burst's requests with a home before its cold ones (see the policy).
    #[arg(long, env = "COHORT_BURST_ORDER")]
    pub burst_order: Option<bool>,
    /// Fingerprint store: `cpu` or `gpu` (gpu falls back to cpu with one warning when the
    /// binary lacks the `cuda` feature or no GPU is usable).
    #[arg(long, env = "COHORT_STORE")]
    pub store: Option<StoreKind>,
    /// Per-request audit records kept (`GET /v1/audit/{id}`); 0 turns the audit off.
    #[arg(long, env = "COHORT_AUDIT_MAX_RECORDS")]
    pub audit_max_records: Option<usize>,
    /// Milliseconds to keep serving after SIGTERM while health checks answer 503.
    #[arg(long, env = "COHORT_DRAIN_DELAY_MS")]
    pub drain_delay_ms: Option<u64>,
}

fn parse_engine(name: &str) -> Result<EngineKind, String> {
    EngineKind::parse(name).map_err(|e| e.to_string())
}
