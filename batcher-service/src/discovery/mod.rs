//! Engine discovery: `cohort serve` learns its engine replicas from DNS (a Kubernetes
//! headless Service) instead of a static list, and keeps the brain's replica set current.
//!
//! Every `interval_s` (5 s by default: CoreDNS's own cache time for Kubernetes records, so
//! asking more often only reads its cache) one task asks the configured DNS server for the
//! SRV records `_<port_name>._tcp.<dns>` (or the A records of `<dns>` without a port
//! name), turns the answer into replicas ([`answer`]: the pod's stable name, its
//! `ip:port`), and hands the set to the brain ([`Replicas::set_replicas`]):
//!
//! - a new replica joins held out of decisions; the task probes it at once (the engine
//!   adapter's health path) and it is used from its first good probe;
//! - a replica gone from DNS stops receiving Assigns at that resolution, and its state
//!   (prefix residency, load, tickets, cohort ownership) is dropped;
//! - when DNS fails, times out, or answers no replica, the last known set stays in use:
//!   `cohort_discovery_stale` turns 1 and one line is logged per change of state
//!   ([`state`]). A malformed answer is an error like any other ([`dns`]).
//!
//! Between resolutions the task probes every replica every `batch.scrape_interval_s`, as
//! the static fleet's probes do, and reports up, down and the engines' queues to the brain.

pub mod answer;
pub mod dns;
pub mod state;

use crate::config::ServeConfig;
use crate::fleet::upstream::Upstream;
use crate::fleet::EngineEvents;
use crate::metrics::{MetricSource, Scrape};
use axum::http::{Method, Uri};
use cohort_batcher_core::engines::Engine;
use hickory_proto::rr::RecordType;
use state::{Change, Freshness, Outcome};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tracing::{info, warn};

/// One engine replica as discovery names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    /// The replica's identity and `x-cohort-shard` value.
    pub name: String,
    /// `ip:port` Envoy reaches it at; empty when unknown (a static replica).
    pub endpoint: String,
}

/// What keeps the replica set discovery finds (the brain), and hears its probes.
pub trait Replicas: EngineEvents {
    /// Makes `found` the replica set; returns the set after the change with each
    /// replica's slot (the index probes report under).
    fn set_replicas(&self, found: &[Member]) -> Vec<(usize, Member)>;
}

/// How long one DNS question may take.
const DNS_TIMEOUT: Duration = Duration::from_secs(2);
/// A question that did not reach the server, or got no answer in time, is asked once more
/// after this pause (UDP loses datagrams; a server restarts).
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// How long one engine probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why discovery cannot start.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    #[error("no discovery.resolver set and no nameserver in /etc/resolv.conf")]
    NoResolver,
}

/// What discovery asks, whom, and how often.
#[derive(Clone)]
pub struct Settings {
    /// The Service's DNS name.
    pub service: String,
    /// SRV port name; empty: A records on `port`.
    pub port_name: String,
    pub port: u16,
    pub resolver: SocketAddr,
    pub interval: Duration,
    pub probe_interval: Duration,
    pub engine: &'static dyn Engine,
}

impl Settings {
    /// The settings of `config`'s `[discovery]`, `None` when it names no DNS name. The
    /// resolver, when unset, is the first nameserver of `/etc/resolv.conf` (read only then).
    pub fn from_config(config: &ServeConfig) -> Result<Option<Settings>, DiscoveryError> {
        let d = &config.discovery;
        let Some(service) = d.dns.clone() else {
            return Ok(None);
        };
        let resolver = match d.resolver {
            Some(resolver) => resolver,
            None => std::fs::read_to_string("/etc/resolv.conf")
                .ok()
                .and_then(|text| dns::first_nameserver(&text))
                .ok_or(DiscoveryError::NoResolver)?,
        };
        Ok(Some(Settings {
            service,
            port_name: d.port_name.clone(),
            port: d.port,
            resolver,
            interval: Duration::from_secs(d.interval_s.max(1)),
            probe_interval: Duration::from_secs(config.batch.scrape_interval_s.max(1)),
            engine: d.engine.adapter(),
        }))
    }
}

/// [`dns::ask`], once more after [`RETRY_AFTER`] when the first try did not get through.
async fn ask(
    server: SocketAddr,
    name: &str,
    kind: RecordType,
) -> Result<hickory_proto::op::Message, dns::DnsError> {
    match dns::ask(server, name, kind, DNS_TIMEOUT).await {
        Err(e) if e.is_transient() => {
            tokio::time::sleep(RETRY_AFTER).await;
            dns::ask(server, name, kind, DNS_TIMEOUT).await
        }
        answered => answered,
    }
}

/// The replicas the DNS server names now.
pub async fn resolve(settings: &Settings) -> Result<Vec<Member>, dns::DnsError> {
    let server = settings.resolver;
    if settings.port_name.is_empty() {
        let reply = ask(server, &settings.service, RecordType::A).await?;
        return Ok(answer::a_members(&reply, settings.port));
    }
    let question = format!("_{}._tcp.{}", settings.port_name, settings.service);
    let reply = ask(server, &question, RecordType::SRV).await?;
    let mut members = Vec::new();
    for target in answer::srv_targets(&reply) {
        let mut ips = answer::addresses_of(&reply, &target.target);
        if ips.is_empty() {
            // The server left the target's address out of the additional section.
            let a = ask(server, &target.target.to_ascii(), RecordType::A).await?;
            ips = answer::addresses(&a);
        }
        if let Some(member) = ips.first().and_then(|ip| answer::srv_member(&target, *ip)) {
            members.push(member);
        }
    }
    Ok(members)
}

/// Discovery's state, shared between its task and `/metrics`.
pub struct Discovery {
    settings: Settings,
    freshness: Mutex<Freshness>,
    replicas: AtomicUsize,
}

impl Discovery {
    pub fn new(settings: Settings) -> Discovery {
        Discovery {
            settings,
            freshness: Mutex::new(Freshness::default()),
            replicas: AtomicUsize::new(0),
        }
    }

    fn record(&self, outcome: &Outcome) {
        let change = self
            .freshness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(outcome);
        let service = &self.settings.service;
        match change {
            Some(Change::Stale { why }) => warn!(
                %service, %why,
                "engine discovery: no replicas from DNS; keeping the last known set"
            ),
            Some(Change::Fresh { replicas }) => {
                info!(%service, replicas, "engine discovery: DNS answers again")
            }
            None => {}
        }
    }
}

impl MetricSource for Discovery {
    fn write_metrics(&self, scrape: &mut Scrape<'_>) {
        let freshness = self.freshness.lock().unwrap_or_else(|e| e.into_inner());
        scrape.count_gauge(
            "cohort_discovery_replicas",
            "Engine replicas in the set discovery keeps (the last known set while stale).",
            self.replicas.load(Ordering::Relaxed) as u64,
        );
        scrape.counter(
            "cohort_discovery_resolve_failures_total",
            "DNS resolutions that failed, timed out or named no replica.",
            freshness.failures(),
        );
        scrape.gauge(
            "cohort_discovery_stale",
            "1 while the latest resolution did not renew the replica set (the last known set is in use).",
            if freshness.is_stale() { 1.0 } else { 0.0 },
        );
    }
}

/// Starts the discovery task; it ends when `stop` turns true.
pub fn spawn(
    discovery: Arc<Discovery>,
    brain: Arc<dyn Replicas>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let settings = discovery.settings.clone();
        info!(
            service = %settings.service, port_name = %settings.port_name,
            resolver = %settings.resolver, interval = ?settings.interval,
            "engine discovery from DNS"
        );
        let upstream = Arc::new(Upstream::new());
        let mut members: Vec<(usize, Member)> = Vec::new();
        // Each replica's last probe, for one log line per change.
        let mut health = Health::default();
        let mut resolve_tick = tokio::time::interval(settings.interval);
        resolve_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probe_tick = tokio::time::interval(settings.probe_interval);
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = resolve_tick.tick() => {
                    let outcome = match resolve(&settings).await {
                        Ok(found) if !found.is_empty() => {
                            let before = std::mem::replace(&mut members, brain.set_replicas(&found));
                            let joined: Vec<(usize, Member)> = members
                                .iter()
                                .filter(|m| !before.contains(m))
                                .cloned()
                                .collect();
                            health.keep(&members);
                            probe(&upstream, settings.engine, &brain, &joined, &mut health).await;
                            Outcome::Found(found.len())
                        }
                        Ok(_) => Outcome::Nothing,
                        Err(e) => Outcome::Failed(e.to_string()),
                    };
                    discovery.replicas.store(members.len(), Ordering::Relaxed);
                    discovery.record(&outcome);
                }
                _ = probe_tick.tick() => {
                    probe(&upstream, settings.engine, &brain, &members, &mut health).await
                }
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            }
        }
    })
}

/// The last probe of each discovered replica, so that only changes are logged.
#[derive(Default)]
struct Health {
    up: std::collections::HashMap<Member, bool>,
}

impl Health {
    /// Forgets replicas no longer in `members`.
    fn keep(&mut self, members: &[(usize, Member)]) {
        self.up
            .retain(|member, _| members.iter().any(|(_, m)| m == member));
    }

    /// Records a probe of `member`; the change to log, if any (the first answer, and
    /// every change after it).
    fn probed(&mut self, member: &Member, up: bool) -> Option<&'static str> {
        match (self.up.insert(member.clone(), up), up) {
            (None, true) => Some("engine replica answered its first probe: now used"),
            (None, false) => Some("engine replica does not answer its probe yet"),
            (Some(false), true) => Some("engine replica is up"),
            (Some(true), false) => Some("engine replica is down"),
            _ => None,
        }
    }
}

/// Probes `members` at once and tells the brain: up (health path below 500) or down, and
/// the engine's published queue when it has a metrics page.
async fn probe(
    upstream: &Arc<Upstream>,
    engine: &'static dyn Engine,
    brain: &Arc<dyn Replicas>,
    members: &[(usize, Member)],
    health: &mut Health,
) {
    let mut probes = tokio::task::JoinSet::new();
    for (slot, member) in members.iter().cloned() {
        let Ok(base) = format!("http://{}", member.endpoint).parse::<Uri>() else {
            continue;
        };
        let upstream = Arc::clone(upstream);
        probes.spawn(async move {
            let health = upstream
                .call(
                    Method::GET,
                    &base,
                    engine.health_path(),
                    None,
                    PROBE_TIMEOUT,
                )
                .await;
            let up = matches!(health, Ok((status, _)) if status < 500);
            let metrics = match engine.metrics_path() {
                Some(path) if up => match upstream
                    .call(Method::GET, &base, path, None, PROBE_TIMEOUT)
                    .await
                {
                    Ok((200, body)) => Some(engine.parse_metrics(&String::from_utf8_lossy(&body))),
                    _ => None,
                },
                _ => None,
            };
            (slot, member, up, metrics)
        });
    }
    // Applied after every probe returned, in this task: no resolution can move a slot
    // to another replica meanwhile.
    while let Some(done) = probes.join_next().await {
        let Ok((slot, member, up, metrics)) = done else {
            continue;
        };
        if let Some(change) = health.probed(&member, up) {
            let (replica, endpoint) = (&member.name, &member.endpoint);
            match up {
                true => info!(%replica, %endpoint, "{change}"),
                false => warn!(%replica, %endpoint, "{change}"),
            }
        }
        brain.engine_probed(slot, up);
        if up {
            brain.engine_up(slot);
        } else {
            brain.engine_down(slot);
        }
        if let Some(metrics) = metrics {
            brain.engine_metrics(slot, &metrics);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_logs_name_the_first_answer_and_each_change() {
        let m = |endpoint: &str| Member {
            name: "llm-engine-0".into(),
            endpoint: endpoint.into(),
        };
        let mut h = Health::default();
        assert!(h
            .probed(&m("10.0.0.1:80"), false)
            .is_some_and(|s| s.contains("yet")));
        assert!(h.probed(&m("10.0.0.1:80"), false).is_none());
        assert!(h
            .probed(&m("10.0.0.1:80"), true)
            .is_some_and(|s| s.ends_with("up")));
        assert!(h.probed(&m("10.0.0.1:80"), true).is_none());
        assert!(h
            .probed(&m("10.0.0.1:80"), false)
            .is_some_and(|s| s.ends_with("down")));
        // The same name at a new address is a new replica; the old one is forgotten.
        h.keep(&[(0, m("10.0.0.2:80"))]);
        assert!(h
            .probed(&m("10.0.0.2:80"), true)
            .is_some_and(|s| s.contains("first")));
        assert_eq!(h.up.len(), 1);
    }
}
