//! Checking a merged configuration: every refusal is a typed [`ConfigError`] that says
//! what is wrong and where, so `cohort serve` stops at start instead of serving with a
//! setting it would silently misread.

use super::ServeConfig;
use cohort_fingerprint::headers::HeaderNameError;
use cohort_fingerprint::knobs::policy::KnobPolicyError;
use cohort_proto::is_plain_name;
use std::path::PathBuf;
use thiserror::Error;

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
    #[error("no engine replicas configured (a [[replicas]] table, --replica, or [discovery])")]
    NoReplicas,
    #[error("discovery: {0}")]
    Discovery(String),
    #[error("replica name {0:?} must be 1-64 of [A-Za-z0-9._-] and unique")]
    ReplicaName(String),
    #[error("shard_index {index} is not below shard_count {count}")]
    Shard { index: u32, count: u32 },
    #[error("policy.balance must be at least 1.0, got {0}")]
    Balance(f64),
    #[error("policy.balance_slack_tokens must be a finite number ≥ 0, got {0}")]
    Slack(f64),
    #[error("policy.{0} must be a finite number ≥ 0, got {1}")]
    LiveSlack(&'static str, f64),
    #[error("cost.{0} must be a finite number ≥ 0, got {1}")]
    Cost(&'static str, f64),
    #[error("replica {name}: {problem}")]
    ReplicaTarget { name: String, problem: String },
    #[error("batch mode needs a url for every replica or for none (missing: {0})")]
    MixedUrls(String),
    #[error("batch: {0}")]
    Batch(String),
    #[error("lora {0:?}: name must be 1-64 of [A-Za-z0-9._-] and path non-empty")]
    Lora(String),
    #[error("headers: {0}")]
    Headers(#[from] HeaderNameError),
    #[error(transparent)]
    Knobs(#[from] KnobPolicyError),
    #[error("picker.{0}")]
    Picker(String),
    #[error("kv_events.{0}")]
    KvEvents(String),
}

impl ServeConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match (&self.discovery.dns, self.replicas.is_empty()) {
            (None, true) => return Err(ConfigError::NoReplicas),
            (Some(_), false) => {
                return Err(ConfigError::Discovery(
                    "replicas come from [discovery] or from [[replicas]], not both".into(),
                ))
            }
            (Some(dns), true) => self.validate_discovery(dns)?,
            (None, false) => {}
        }
        self.headers.validate(&self.tenant_header)?;
        self.knobs.validate()?;
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
        for (name, slack) in [
            ("live_slack", self.policy.live_slack),
            ("live_slack_private", self.policy.live_slack_private),
        ] {
            if !slack.is_finite() || slack < 0.0 {
                return Err(ConfigError::LiveSlack(name, slack));
            }
        }
        for (name, value) in [
            ("base", self.cost.base),
            ("miss_penalty", self.cost.miss_penalty),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(ConfigError::Cost(name, value));
            }
        }
        self.validate_picker()?;
        self.validate_kv_events()?;
        self.validate_front()
    }

    /// `[kv_events]` and the replicas' endpoints (each checked when read): a replay socket
    /// only beside an events socket, and settings the streams can run with.
    fn validate_kv_events(&self) -> Result<(), ConfigError> {
        for replica in &self.replicas {
            if replica.kv_events_replay.is_some() && replica.kv_events.is_none() {
                return Err(ConfigError::ReplicaTarget {
                    name: replica.name.clone(),
                    problem: "kv_events_replay needs kv_events (the events socket)".into(),
                });
            }
        }
        let k = &self.kv_events;
        let zero = [
            ("block_size", k.block_size == 0),
            ("silence_s", k.silence_s == 0),
            ("recover_after", k.recover_after == 0),
            ("replay_timeout_ms", k.replay_timeout_ms == 0),
            ("max_held", k.max_held == 0),
            ("max_prompt_bytes", k.max_prompt_bytes == 0),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, is_zero)| *is_zero) {
            return Err(ConfigError::KvEvents(format!("{name} must be at least 1")));
        }
        if k.replay_port.is_some() && k.port.is_none() {
            return Err(ConfigError::KvEvents(
                "replay_port needs port (the events port)".into(),
            ));
        }
        if k.port == Some(0) || k.replay_port == Some(0) {
            return Err(ConfigError::KvEvents("ports must be 1-65535".into()));
        }
        match (k.prompt_tokens, &k.model_dir) {
            (super::PromptTokensKind::Model, None) => {
                return Err(ConfigError::KvEvents(
                    "prompt_tokens = \"model\" needs model_dir (the model's tokenizer.json and chat template)".into(),
                ))
            }
            (super::PromptTokensKind::Model, Some(_)) | (_, None) => {}
            (_, Some(_)) => {
                return Err(ConfigError::KvEvents(
                    "model_dir is read only with prompt_tokens = \"model\"".into(),
                ))
            }
        }
        if k.main_medium.is_empty() {
            return Err(ConfigError::KvEvents(
                "main_medium must name a tier (vLLM's own cache is \"GPU\")".into(),
            ));
        }
        Ok(())
    }

    /// `[picker]`: a deadline of 1 ms to 10 s (the filter's bounds), and a filter
    /// configuration that reads and parses (the picker would otherwise fingerprint under
    /// settings other than the filter's).
    fn validate_picker(&self) -> Result<(), ConfigError> {
        let p = &self.picker;
        if !(1..=10_000).contains(&p.assign_deadline_ms) {
            return Err(ConfigError::Picker(format!(
                "assign_deadline_ms must be 1 to 10000, got {}",
                p.assign_deadline_ms
            )));
        }
        p.filter_config_parsed()
            .map(|_| ())
            .map_err(ConfigError::Picker)
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
        if !(0.0..=1.0).contains(&b.min_shared) {
            return Err(ConfigError::Batch(format!(
                "min_shared must be within 0–1, got {}",
                b.min_shared
            )));
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
        for lora in &self.lora {
            if !is_plain_name(&lora.name) || lora.path.is_empty() {
                return Err(ConfigError::Lora(lora.name.clone()));
            }
        }
        Ok(())
    }

    /// `[discovery]`: a DNS name, a port name that can be an SRV service label (or a port
    /// when there is none), an interval of 1 s to 1 h.
    fn validate_discovery(&self, dns: &str) -> Result<(), ConfigError> {
        let d = &self.discovery;
        let name_ok = !dns.is_empty()
            && dns.len() <= 253
            && dns.trim_end_matches('.').split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !name_ok {
            return Err(ConfigError::Discovery(format!(
                "dns {dns:?} is not a DNS name"
            )));
        }
        let port_name_ok = d.port_name.len() <= 15
            && d.port_name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !port_name_ok {
            return Err(ConfigError::Discovery(format!(
                "port_name {:?} is not a Service port name (lowercase letters, digits, '-')",
                d.port_name
            )));
        }
        if d.port_name.is_empty() && d.port == 0 {
            return Err(ConfigError::Discovery(
                "port must be set when port_name is empty".into(),
            ));
        }
        if !(1..=3600).contains(&d.interval_s) {
            return Err(ConfigError::Discovery(format!(
                "interval_s must be 1 to 3600, got {}",
                d.interval_s
            )));
        }
        Ok(())
    }
}
