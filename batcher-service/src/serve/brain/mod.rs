//! The batcher's decisions behind its gRPC API: one `Brain` per `cohort serve`, shared by
//! every connection.
//!
//! - **Assign** (read-mostly): the request's cohort from the online clustering (read-only,
//!   so an Assign and the Observe that follows it do not count twice) and the replica its
//!   most similar past requests went to, both read from the stores ([`lookup`]); then the
//!   replica from the policy, which records the request's prefix blocks and load on that
//!   replica.
//! - **Observe** (write): the cohort clustering learns the sketch, and the fingerprint
//!   store keeps the request's fingerprint (key: its last prefix block, which identifies
//!   the whole prompt) with its cohort, replica and TTL (`cache-ttl`); the cohort's list of
//!   recent members gains it.
//!
//! Both stores, the cohort centroids and the fingerprints, are of the kind `--store` chose
//! (`cpu`, or `gpu` with the `cuda` feature): decisions read them through the `Store`
//! trait, so the two kinds decide alike ([`store_parity`] replays a trace through both).
//!
//! Time is passed in (`now_ms` since the batcher started) so tests drive it; tenants are
//! hashed to 32 bits and every lookup stays within one tenant.

mod live;
mod lookup;
mod members;
pub(crate) use lookup::space;
pub use members::Member;
mod metrics;
mod observed;
pub(crate) mod pick;
mod replica_stats;
mod report;
#[cfg(test)]
mod store_parity;

use crate::audit::{AuditLog, AuditRecord};
use crate::clock::Clock;
use crate::config::ServeConfig;
use crate::metrics::{decision_seconds, Histogram};
use cohort_batcher_core::cohorts::Cohorts;
use cohort_batcher_core::neighbours::Neighbours;
use cohort_batcher_core::policy::burst_order::{self, Precedence};
use cohort_batcher_core::policy::{Policy, PolicyConfig, RouteRequest};
use cohort_batcher_core::store::cpu::{Capacity, CpuStoreConfig};
use cohort_batcher_core::store::{Coalesced, EntryMeta, SketchBytes, Store};
use cohort_fingerprint::knobs::policy::{KnobPolicy, RouteOf};
use cohort_fingerprint::knobs::{batch_threshold, cache_ttl_s, Knobs, Prefetch};
use cohort_fingerprint::sketch::SKETCH_VERSION;
use cohort_gpu_store::{open_store, GpuUtilization, StoreKind};
use cohort_proto as pb;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use thiserror::Error;

/// A request the batcher cannot act on (answered `INVALID_ARGUMENT`).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BrainError {
    #[error("the request has no fingerprint")]
    NoFingerprint,
    /// No replica can be chosen yet (discovery found none, or none answered its probe):
    /// answered `UNAVAILABLE`, so the filter routes by key.
    #[error("no engine replica is known and answering yet")]
    NoReplicas,
}

/// Replica index stored for fingerprints whose replica the batcher did not choose.
const UNKNOWN_REPLICA: u16 = u16::MAX;
/// Cohort centroids kept (least recently used evicted beyond).
const MAX_COHORTS: usize = 65_536;
/// Prompt bytes per token, for the policy's cost estimate before tokenisation.
const BYTES_PER_TOKEN: u32 = 4;
/// (cohort, source) pairs counted for the inspector's batch pivot; beyond, new pairs are
/// not counted (the page says so).
const PIVOT_CAP: usize = 4096;

/// Prompt-length bands (estimated prompt tokens) of the compute-per-token view: lower
/// bounds and labels.
const LENGTH_BANDS: [(u64, &str); 5] = [
    (0, "0-256"),
    (256, "256-1k"),
    (1024, "1k-4k"),
    (4096, "4k-16k"),
    (16384, "16k+"),
];

fn length_band(tokens: u64) -> usize {
    LENGTH_BANDS
        .iter()
        .rposition(|&(low, _)| tokens >= low)
        .unwrap_or(0)
}

/// (tenant, route) pairs whose effective cost is kept; beyond, new pairs are not counted.
const COST_CAP: usize = 1024;

/// One (tenant, route)'s Assign decisions, for `cohort_effective_cost`.
#[derive(Default, Clone)]
struct CostCounts {
    tenant: String,
    route: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    requests: u64,
    /// Requests whose chosen replica held any of their prefix.
    hits: u64,
}

/// Counters read by `/metrics` and `Status`.
#[derive(Default)]
struct Counters {
    /// Per prompt-length band: estimated prompt tokens of Assign decisions, and of those
    /// the tokens the chosen replica was believed to hold.
    band_prompt_tokens: [AtomicU64; LENGTH_BANDS.len()],
    band_cached_tokens: [AtomicU64; LENGTH_BANDS.len()],
    assigns: AtomicU64,
    /// Assigns that deferred to the others of their burst ([`Brain::assign_in_burst_order`]).
    burst_yields: AtomicU64,
    /// Assigns decided with some replica's own account of its cache (KV events), and
    /// those that had a prompt's keys but no healthy stream to ask ([`observed`]).
    decisions_observed: AtomicU64,
    decisions_modelled: AtomicU64,
    observations: AtomicU64,
    observations_without_sketch: AtomicU64,
    dropped_reported: AtomicU64,
    unknown_sketch_version: AtomicU64,
}

pub struct Brain {
    /// The replica each policy slot holds. Changed together with the policy (policy lock
    /// first, then this one), so a decision's slot always names its replica.
    members: RwLock<members::Members>,
    shard_index: u32,
    shard_count: u32,
    policy: Mutex<Policy>,
    /// `[policy] burst_order`: see [`Brain::assign_in_burst_order`].
    burst_order: bool,
    /// The online cohorts over a centroid store of the configured kind. Assigns read it
    /// together; an Observe writes.
    cohorts: RwLock<Cohorts<Coalesced<Box<dyn Store>>>>,
    /// The fingerprint store: `CpuStore`, or `GpuStore` with `--store gpu` (feature `cuda`).
    /// Both stores coalesce concurrent queries into batched scans.
    store: Coalesced<Box<dyn Store>>,
    /// Each cohort's recent members in `store`: the lists a neighbour search probes.
    neighbours: Mutex<Neighbours>,
    /// How the neighbour search finds the nearest past fingerprints.
    neighbour_search: crate::config::NeighbourSearch,
    /// Store queries made by decisions ([`lookup`]).
    reads: lookup::StoreReads,
    counters: Counters,
    assign_seconds: Histogram,
    /// Observed requests per (cohort, source), for the inspector's batch pivot. The source
    /// is the tenant the mesh established: the calling workload's identity.
    pivot: Mutex<std::collections::HashMap<(u32, String), u64>>,
    progress_counters: live::ProgressCounters,
    /// Per slot, what the inspector's Replicas panel shows beside the policy's own state:
    /// recent Assigns, times to first byte, the last probe.
    replica_stats: Mutex<replica_stats::ReplicaStats>,
    /// The time of reports that come without one (engine probes).
    clock: Clock,
    /// Per-request cost records (`GET /v1/audit/{request_id}`), shared with the front.
    audit: Arc<AuditLog>,
    /// The GPU store's devices' utilisation; `None` on the CPU store (the gauge is absent).
    gpu_utilization: Option<GpuUtilization>,
    /// What the stores are (`Stores::description`).
    store_description: String,
    /// Per (tenant, route): what the effective-cost model reads.
    costs: Mutex<std::collections::HashMap<u64, CostCounts>>,
    cost_model: cohort_score::cost::CostModel,
    /// The operator's knob defaults and bounds ([`Brain::knobs`]).
    knob_policy: KnobPolicy,
    /// The replicas' KV events streams (`[[replicas]] kv_events`): what each engine
    /// holds by its own account ([`observed`]), and the Replicas panel's column.
    kv_events: Arc<crate::kv_events::Streams>,
    /// Per replica name, the engine cache clears already applied to the policy.
    engine_clears: Mutex<std::collections::HashMap<String, u64>>,
    /// `[kv_events] pending_ms`: the longest a replica's blocks sent count over its events.
    kv_pending_ms: u64,
    /// Each replica's pending window, from its times to first byte ([`observed`]).
    pending: Mutex<observed::PendingWindows>,
}

impl crate::discovery::Replicas for Brain {
    fn set_replicas(&self, found: &[Member]) -> Vec<(usize, Member)> {
        Brain::set_replicas(self, found)
    }
}

/// A configured replica as a member. Static replicas are routed by their name (fixed
/// routes on `x-cohort-shard`, whose retries may go to any replica), so they carry no
/// endpoint: only discovered replicas are routed by `ip:port`.
fn static_member(replica: &crate::config::Replica) -> Member {
    Member {
        name: replica.name.clone(),
        endpoint: String::new(),
    }
}

/// The 32 sketch values, if the fingerprint carries a sketch this batcher understands.
fn sketch_of(fp: &pb::Fingerprint) -> Option<SketchBytes> {
    if fp.sketch_version != SKETCH_VERSION {
        return None;
    }
    let bytes: &[u8; 32] = fp.sketch.as_slice().try_into().ok()?;
    let sketch = bytes.map(|b| b as i8);
    (sketch != [0; 32]).then_some(sketch)
}

/// The stores a brain decides with: the fingerprints, and the cohort centroids.
pub struct Stores {
    pub fingerprints: Box<dyn Store>,
    pub centroids: Box<dyn Store>,
    /// The GPU store's devices' utilisation; `None` on the CPU store (the gauge is absent).
    pub gpu_utilization: Option<GpuUtilization>,
    /// What opened: `cpu`, the GPU store's description, or why the GPU store did not.
    pub description: String,
}

impl Stores {
    /// The shapes of the two stores `config` asks for: (fingerprints, centroids).
    pub fn shapes(config: &ServeConfig) -> (CpuStoreConfig, CpuStoreConfig) {
        (
            CpuStoreConfig {
                capacity: Capacity::Entries(config.store.max_entries),
                shards: config.store.shards,
            },
            CpuStoreConfig {
                capacity: Capacity::Entries(MAX_COHORTS),
                shards: 4,
            },
        )
    }

    /// Both stores of the kind `store.backend` asks for; `gpu` that cannot open falls back
    /// to the CPU store with one warning. With the GPU store, also its devices' utilisation
    /// reader (NVML).
    pub fn open(config: &ServeConfig) -> Stores {
        let kind = config.store.backend;
        let (fingerprints, centroids) = Stores::shapes(config);
        let opened = open_store(kind, fingerprints);
        match &opened.fallback {
            Some(why) => tracing::warn!("store gpu unavailable ({why}): using the CPU store"),
            None if kind == StoreKind::Gpu => {
                tracing::info!("fingerprint store on {}", opened.description)
            }
            None => {}
        }
        if let Some(why) = &opened.utilization_unavailable {
            tracing::warn!("no cohort_gpu_utilization: {why}");
        }
        // The centroids go where the fingerprints went (a fallback already warned).
        let centroid_kind = if opened.fallback.is_some() {
            StoreKind::Cpu
        } else {
            kind
        };
        let description = match (&opened.fallback, kind) {
            (Some(why), _) => format!("cpu (gpu unavailable: {why})"),
            (None, StoreKind::Gpu) => opened.description.clone(),
            (None, StoreKind::Cpu) => "cpu".to_owned(),
        };
        Stores {
            fingerprints: opened.store,
            centroids: open_store(centroid_kind, centroids).store,
            gpu_utilization: opened.utilization,
            description,
        }
    }
}

impl Brain {
    /// A brain over the stores `config` asks for.
    pub fn new(config: &ServeConfig, clock: Clock) -> Brain {
        Brain::with_stores(config, clock, Stores::open(config))
    }

    /// A brain over the given stores (tests compare the CPU store with the GPU store's
    /// emulation this way).
    pub fn with_stores(config: &ServeConfig, clock: Clock, stores: Stores) -> Brain {
        let shards = config.shard_count.max(1) as usize;
        // Each of S shards sees 1/S of the decisions: it gets 1/S of each replica's cache
        // and a load window S times as long (what the shard replay measures).
        let policy = PolicyConfig {
            balance: config.policy.balance,
            balance_slack: config.policy.balance_slack_tokens,
            load_half_life_ms: config.policy.load_half_life_ms * shards as u64,
            live_slack: config.policy.live_slack,
            live_slack_private: config.policy.live_slack_private,
            ..PolicyConfig::new(
                config.replicas.len(),
                (config.policy.kv_blocks_per_replica / shards).max(1),
            )
        };
        let mut policy = Policy::new(policy);
        if config.replicas.is_empty() {
            // Replicas come from discovery: the policy's one default slot holds nobody.
            policy.leave(0);
        }
        Brain {
            members: RwLock::new(members::Members::new(
                config.replicas.iter().map(static_member).collect(),
            )),
            shard_index: config.shard_index,
            shard_count: config.shard_count,
            policy: Mutex::new(policy),
            burst_order: config.policy.burst_order,
            cohorts: RwLock::new(Cohorts::new(
                Coalesced::new(stores.centroids),
                config.store.cohort_idle_s,
            )),
            store: Coalesced::new(stores.fingerprints),
            neighbours: Mutex::new(Neighbours::new(
                config.store.neighbours_per_cohort,
                MAX_COHORTS,
            )),
            neighbour_search: config.store.neighbour_search,
            reads: lookup::StoreReads::default(),
            counters: Counters::default(),
            assign_seconds: decision_seconds(),
            pivot: Mutex::new(std::collections::HashMap::new()),
            progress_counters: live::ProgressCounters::default(),
            replica_stats: Mutex::new(replica_stats::ReplicaStats::default()),
            clock,
            audit: Arc::new(AuditLog::new(config.audit_max_records)),
            gpu_utilization: stores.gpu_utilization,
            store_description: stores.description,
            costs: Mutex::new(std::collections::HashMap::new()),
            cost_model: config.cost,
            knob_policy: config.knobs.clone(),
            kv_events: Arc::new(crate::kv_events::Streams::new(config, clock)),
            engine_clears: Mutex::new(std::collections::HashMap::new()),
            kv_pending_ms: config.kv_events.pending_ms,
            pending: Mutex::new(observed::PendingWindows::default()),
        }
    }

    /// The replicas' KV events streams, for their tasks and `/metrics`.
    pub fn kv_events(&self) -> Arc<crate::kv_events::Streams> {
        Arc::clone(&self.kv_events)
    }

    /// The knobs a request acts with: the filter's values (a request that carried none gets
    /// the contract's defaults), narrowed to this batcher's policy for the request's route
    /// and tenant; a request without knobs gets the policy's defaults. The semantic mode
    /// is the sketch's own (the filter computed the sketch in it).
    pub(crate) fn knobs(&self, request: &pb::RequestInfo) -> Knobs {
        let route = RouteOf {
            authority: &request.authority,
            path: &request.path,
        };
        let tenant = Some(request.tenant.as_str()).filter(|t| !t.is_empty());
        let limits = self.knob_policy.limits(route, tenant);
        let Some(sent) = request.knobs else {
            return limits.defaults;
        };
        let prefetch = match pb::Prefetch::try_from(sent.prefetch) {
            Ok(pb::Prefetch::None) => Prefetch::None,
            Ok(pb::Prefetch::Low) => Prefetch::Low,
            Ok(pb::Prefetch::Medium) => Prefetch::Medium,
            Ok(pb::Prefetch::High) => Prefetch::High,
            _ => limits.defaults.prefetch,
        };
        // A value the filter left unset (0) takes this policy's default.
        let d = limits.defaults;
        limits.narrow(Knobs {
            prefetch,
            batch_threshold: if sent.batch_threshold > 0.0 {
                batch_threshold(sent.batch_threshold)
            } else {
                d.batch_threshold
            },
            cache_ttl_s: if sent.cache_ttl_s > 0 {
                cache_ttl_s(sent.cache_ttl_s)
            } else {
                d.cache_ttl_s
            },
            semantic_mode: d.semantic_mode,
        })
    }

    /// Makes `found` the replica set (engine discovery): replicas that stay keep their
    /// slot and state, those gone are dropped from decisions at once, new ones join held
    /// out until their first probe answers ([`crate::fleet::EngineEvents::engine_up`]).
    /// With `[kv_events] port`, their KV events streams follow them.
    /// Returns the set after the change, by slot.
    pub fn set_replicas(&self, found: &[Member]) -> Vec<(usize, Member)> {
        let mut policy = lock(&self.policy);
        let mut members = write(&self.members);
        let mut stats = lock(&self.replica_stats);
        let plan = members.plan(found);
        for slot in plan.leave {
            if let Some(gone) = members.get(slot) {
                tracing::info!(replica = %gone.name, endpoint = %gone.endpoint, slot, "engine replica left");
            }
            policy.leave(slot);
            members.vacate(slot);
            stats.reset(slot);
        }
        for member in plan.join {
            let slot = policy.join();
            tracing::info!(replica = %member.name, endpoint = %member.endpoint, slot, "engine replica joined; used once a probe answers");
            members.place(slot, member);
            stats.reset(slot);
        }
        let found_streams: Vec<(&str, &str)> = found
            .iter()
            .map(|m| (m.name.as_str(), m.endpoint.as_str()))
            .collect();
        self.kv_events.set_members(&found_streams);
        members.held().map(|(i, m)| (i, m.clone())).collect()
    }

    /// The audit log the brain writes at Assign and on progress reports.
    pub fn audit(&self) -> Arc<AuditLog> {
        Arc::clone(&self.audit)
    }

    /// Decides `assign` in burst order ([`burst_order`]): when every replica holds its
    /// prefix alike, the Assigns received with it, already runnable, decide first (it
    /// steps behind them [`burst_order::DEFERRALS`] times), so its choice is made knowing
    /// where they went. With `[policy] burst_order = false` it decides at once.
    pub async fn assign_in_burst_order(
        &self,
        assign: &pb::AssignRequest,
    ) -> Result<pb::AssignReply, BrainError> {
        if self.defers(assign, self.clock.now_ms()) {
            self.counters.burst_yields.fetch_add(1, Ordering::Relaxed);
            for _ in 0..burst_order::DEFERRALS {
                tokio::task::yield_now().await;
            }
        }
        self.assign(assign, self.clock.now_ms())
    }

    /// Whether burst order is on and the policy gives `assign` no precedence.
    fn defers(&self, assign: &pb::AssignRequest, now_ms: u64) -> bool {
        if !self.burst_order {
            return false;
        }
        let Some(fp) = assign.request.as_ref().and_then(|r| r.fingerprint.as_ref()) else {
            return false;
        };
        lock(&self.policy).precedence(&fp.blocks, now_ms) == Precedence::Anywhere
    }

    pub fn assign(
        &self,
        assign: &pb::AssignRequest,
        now_ms: u64,
    ) -> Result<pb::AssignReply, BrainError> {
        self.decide(assign, now_ms, None, None).map(|d| d.reply)
    }

    /// [`Brain::assign`], restricted to the slots `among` marks when given; then also
    /// the decision's slot and its alternatives ([`pick`]). With the prompt's block keys
    /// (`prompt`), replicas whose engines publish their caches are matched on what they
    /// hold ([`observed`]).
    fn decide(
        &self,
        assign: &pb::AssignRequest,
        now_ms: u64,
        among: Option<&[bool]>,
        prompt: Option<&cohort_prompt_tokens::PromptKeys>,
    ) -> Result<pick::Decided, BrainError> {
        let started = std::time::Instant::now();
        let request = assign.request.as_ref().ok_or(BrainError::NoFingerprint)?;
        let fp = request
            .fingerprint
            .as_ref()
            .ok_or(BrainError::NoFingerprint)?;
        let knobs = self.knobs(request);
        let found = sketch_of(fp)
            .map(|sketch| {
                self.lookup(
                    lookup::space(&request.tenant, fp.semantic_mode),
                    &sketch,
                    knobs.batch_threshold,
                    now_ms,
                )
            })
            .unwrap_or_default();
        let cohort = found.cohort;
        let observed = self.observed(prompt, fp.blocks.len(), now_ms);
        let (choice, rate, member, alternatives) = {
            let mut policy = lock(&self.policy);
            self.apply_engine_clears(&mut policy);
            if !policy.choosable(now_ms) {
                return Err(BrainError::NoReplicas);
            }
            let route = RouteRequest {
                blocks: &fp.blocks,
                cohort,
                similar: found.similar,
                resident_ms: u64::from(knobs.cache_ttl_s) * 1000,
                cost: fp.prompt_bytes / BYTES_PER_TOKEN,
                now_ms,
                track: assign.reports_progress,
                observed: &observed,
            };
            let (choice, alternatives) = match among {
                None => (policy.choose(&route), Vec::new()),
                Some(among) => {
                    if !pick::any_usable_among(&policy, among, now_ms) {
                        return Err(BrainError::NoReplicas);
                    }
                    let choice = policy.choose_among(&route, among);
                    let alternatives = policy.alternatives(choice.replica, Some(among));
                    (choice, alternatives)
                }
            };
            let member = read(&self.members).get(choice.replica).cloned();
            (choice, policy.prefill_rate_per_ms(), member, alternatives)
        };
        let member = member.ok_or(BrainError::NoReplicas)?;
        self.counters.assigns.fetch_add(1, Ordering::Relaxed);
        lock(&self.replica_stats).assigned(choice.replica, now_ms);
        self.assign_seconds.observe(started.elapsed().as_secs_f64());
        let reply = pb::AssignReply {
            shard: member.name,
            endpoint: member.endpoint,
            cluster: cohort.map(|c| format!("{c:08x}")).unwrap_or_default(),
            matched_blocks: choice.matched_blocks as u32,
            reason: choice.reason.as_str().to_owned(),
            ticket: choice.ticket,
            // The front's to set (assign-mode prefetch, serve/grpc.rs).
            exemplar_wanted: false,
            // Set where the service knows whether it has a front (serve/grpc.rs).
            inert_knobs: Vec::new(),
        };
        let record = audit_record(request, fp, &reply, rate);
        let band = length_band(record.prompt_tokens_est);
        self.counters.band_prompt_tokens[band]
            .fetch_add(record.prompt_tokens_est, Ordering::Relaxed);
        self.counters.band_cached_tokens[band]
            .fetch_add(record.cached_tokens_est, Ordering::Relaxed);
        self.count_cost(&request.tenant, &request.path, &record);
        if !request.request_id.is_empty() {
            self.audit.assigned(&request.tenant, record, reply.ticket);
        }
        Ok(pick::Decided {
            reply,
            slot: choice.replica,
            alternatives,
        })
    }

    /// Adds one Assign decision to its (tenant, route)'s effective-cost counts (keyed by a
    /// hash of the pair, so the common case allocates nothing).
    fn count_cost(&self, tenant: &str, route: &str, record: &AuditRecord) {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(tenant.as_bytes());
        hasher.update(&[0]);
        hasher.update(route.as_bytes());
        let key = hasher.digest();
        let mut costs = lock(&self.costs);
        let len = costs.len();
        let counts = match costs.get_mut(&key) {
            Some(counts) => counts,
            None if len < COST_CAP => costs.entry(key).or_insert_with(|| CostCounts {
                tenant: tenant.to_owned(),
                route: route.to_owned(),
                ..CostCounts::default()
            }),
            None => return,
        };
        counts.prompt_tokens += record.prompt_tokens_est;
        counts.cached_tokens += record.cached_tokens_est;
        counts.requests += 1;
        counts.hits += u64::from(record.matched_blocks > 0);
    }

    pub fn observe(&self, batch: &pb::ObservationBatch, now_ms: u64) {
        self.counters
            .dropped_reported
            .fetch_add(batch.dropped, Ordering::Relaxed);
        for observation in &batch.observations {
            self.observe_one(observation, now_ms);
        }
    }

    fn observe_one(&self, observation: &pb::Observation, now_ms: u64) {
        // A progress report is not an observation of a request (it has its own counter).
        if let Some(progress) = &observation.progress {
            self.progress(progress, now_ms);
            return;
        }
        // Nor is a bypass: the filter passed the request through; only the audit keeps it.
        if !observation.bypass.is_empty() {
            if let Some(request) = &observation.request {
                self.audit.bypassed(
                    &request.tenant,
                    &request.request_id,
                    &request.mode,
                    &observation.bypass,
                );
            }
            return;
        }
        self.counters.observations.fetch_add(1, Ordering::Relaxed);
        let Some(request) = &observation.request else {
            return;
        };
        let Some(fp) = &request.fingerprint else {
            return;
        };
        let Some(sketch) = sketch_of(fp) else {
            let counter = if fp.sketch.is_empty() {
                &self.counters.observations_without_sketch
            } else {
                &self.counters.unknown_sketch_version
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let knobs = self.knobs(request);
        let tenant = lookup::space(&request.tenant, fp.semantic_mode);
        let now_s = secs(now_ms);
        let membership =
            write(&self.cohorts).observe(tenant, &sketch, knobs.batch_threshold, now_s);
        self.count_pivot(membership.cohort, &request.tenant);
        let replica = read(&self.members)
            .position(&observation.shard)
            .map_or(UNKNOWN_REPLICA, |i| i as u16);
        let key = fp.blocks.last().copied().unwrap_or(fp.key);
        self.keep_fingerprint(
            key,
            &sketch,
            EntryMeta {
                tenant,
                cohort: membership.cohort,
                replica,
                expires_at_s: now_s.saturating_add(knobs.cache_ttl_s),
            },
            now_s,
        );
    }

    /// Store an observed fingerprint (key: its last prefix block) with its cohort, replica
    /// and expiry, as its cohort's newest member.
    pub(crate) fn keep_fingerprint(
        &self,
        key: u64,
        sketch: &SketchBytes,
        meta: EntryMeta,
        now_s: u32,
    ) {
        self.store.upsert(key, sketch, meta, now_s);
        self.remember(meta.cohort, key);
    }

    fn count_pivot(&self, cohort: u32, source: &str) {
        let mut pivot = lock(&self.pivot);
        let len = pivot.len();
        match pivot.get_mut(&(cohort, source.to_owned())) {
            Some(n) => *n += 1,
            None if len < PIVOT_CAP => {
                pivot.insert((cohort, source.to_owned()), 1);
            }
            None => {}
        }
    }

    /// Periodic upkeep: expired fingerprints and idle cohorts go.
    pub fn expire(&self, now_ms: u64) {
        let now_s = secs(now_ms);
        self.store.expire(now_s);
        write(&self.cohorts).expire(now_s);
        self.forget_expired_cohorts();
        lock(&self.policy).expire(now_ms);
    }
}

/// The audit's record of one Assign decision: the prompt's size and the share of it the
/// chosen replica should serve from cache (matched blocks of the prompt's), with the
/// prefill that leaves at the fleet's learnt rate.
fn audit_record(
    request: &pb::RequestInfo,
    fp: &pb::Fingerprint,
    reply: &pb::AssignReply,
    rate_per_ms: f64,
) -> AuditRecord {
    let prompt = u64::from(fp.prompt_bytes / BYTES_PER_TOKEN);
    let blocks = fp.blocks.len() as u64;
    let matched = u64::from(reply.matched_blocks).min(blocks);
    let cached = (prompt * matched).checked_div(blocks).unwrap_or(0);
    AuditRecord {
        request_id: request.request_id.clone(),
        mode: request.mode.clone(),
        cohort: reply.cluster.clone(),
        replica: reply.shard.clone(),
        reason: reply.reason.clone(),
        prefix_blocks: blocks as u32,
        matched_blocks: matched as u32,
        prompt_tokens_est: prompt,
        cached_tokens_est: cached,
        prefill_ms_est: ((prompt - cached) as f64 / rate_per_ms * 10.0).round() / 10.0,
        ..AuditRecord::default()
    }
}

fn secs(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 1000).unwrap_or(u32::MAX)
}

/// Read access to an `RwLock`, poisoned or not (see [`lock`]).
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Write access to an `RwLock`, poisoned or not (see [`lock`]).
fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A poisoned lock only means another handler panicked mid-update; the state is still
/// usable for routing decisions, so keep serving.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Assign mode's prefetch reads the brain's books: requests in flight per replica, and
/// which prefixes count as held (what a warm-up need not compute, and what it computed).
impl crate::front::LiveFleet for Brain {
    fn in_flight(&self) -> Vec<u32> {
        lock(&self.policy).in_flight()
    }

    fn holds(&self, replica: usize, blocks: &[u64]) -> bool {
        lock(&self.policy).holds(replica, blocks, self.clock.now_ms())
    }

    fn warmed(&self, replica: usize, blocks: &[u64], resident_s: u32) {
        let now = self.clock.now_ms();
        lock(&self.policy).warmed(replica, blocks, now, u64::from(resident_s) * 1000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Replica;
    use std::sync::Arc;

    /// The brain's `/metrics` part at `now_ms`.
    fn page(brain: &Arc<Brain>, now_ms: u64) -> String {
        let brain = Arc::clone(brain);
        crate::metrics::render_one(move |scrape: &mut crate::metrics::Scrape<'_>| {
            brain.write_metrics(scrape, now_ms)
        })
    }

    fn brain(replicas: usize, shard_count: u32) -> Arc<Brain> {
        let config = ServeConfig {
            replicas: (0..replicas)
                .map(|i| Replica::named(&format!("r{i}")))
                .collect(),
            shard_count,
            ..ServeConfig::default()
        };
        Arc::new(Brain::new(&config, Clock::start()))
    }

    #[test]
    fn discovered_replicas_are_used_after_their_probe_and_answer_their_endpoint() {
        use crate::fleet::EngineEvents;
        let config = ServeConfig {
            discovery: crate::config::DiscoverySection {
                dns: Some("llm-engine.test".into()),
                ..Default::default()
            },
            ..ServeConfig::default()
        };
        let brain = Brain::new(&config, Clock::start());
        let request = pb::AssignRequest {
            request: Some(pb::RequestInfo {
                fingerprint: Some(fingerprint(vec![1, 2, 3], [3; 32])),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(brain.assign(&request, 1_000), Err(BrainError::NoReplicas));
        let member = |name: &str, endpoint: &str| Member {
            name: name.into(),
            endpoint: endpoint.into(),
        };
        let set = brain.set_replicas(&[member("llm-engine-0", "10.0.0.1:8000")]);
        assert_eq!(set.len(), 1);
        assert_eq!(
            brain.assign(&request, 1_000),
            Err(BrainError::NoReplicas),
            "not yet probed"
        );
        brain.engine_up(set[0].0);
        let reply = brain.assign(&request, 1_000).unwrap();
        assert_eq!(reply.shard, "llm-engine-0");
        assert_eq!(reply.endpoint, "10.0.0.1:8000");
        // Another joins and the first leaves: every Assign goes to the newcomer once probed.
        let set = brain.set_replicas(&[member("llm-engine-1", "10.0.0.2:8000")]);
        assert_eq!(set.len(), 1);
        brain.engine_up(set[0].0);
        for i in 0..20u64 {
            let mut r = request.clone();
            if let Some(fp) = r.request.as_mut().and_then(|q| q.fingerprint.as_mut()) {
                fp.blocks = vec![i, i + 100];
            }
            let reply = brain.assign(&r, 2_000 + i).unwrap();
            assert_eq!(reply.endpoint, "10.0.0.2:8000");
        }
        let status = brain.status(3_000);
        let names: Vec<&str> = status.replicas.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["llm-engine-1"]);
    }

    fn fingerprint(blocks: Vec<u64>, sketch: [i8; 32]) -> pb::Fingerprint {
        pb::Fingerprint {
            key: blocks[0],
            blocks,
            sketch: sketch.iter().map(|&v| v as u8).collect(),
            sketch_version: SKETCH_VERSION,
            prompt_bytes: 4096,
            ..Default::default()
        }
    }

    fn assign(brain: &Brain, blocks: Vec<u64>, sketch: [i8; 32], tenant: &str) -> pb::AssignReply {
        let request = pb::AssignRequest {
            request: Some(pb::RequestInfo {
                fingerprint: Some(fingerprint(blocks, sketch)),
                tenant: tenant.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        brain.assign(&request, 1_000).unwrap()
    }

    fn observe(brain: &Brain, blocks: Vec<u64>, sketch: [i8; 32], tenant: &str, shard: &str) {
        let batch = pb::ObservationBatch {
            observations: vec![pb::Observation {
                request: Some(pb::RequestInfo {
                    fingerprint: Some(fingerprint(blocks, sketch)),
                    tenant: tenant.into(),
                    ..Default::default()
                }),
                shard: shard.into(),
                ..Default::default()
            }],
            dropped: 2,
        };
        brain.observe(&batch, 1_000);
    }

    fn sketch(seed: i8) -> [i8; 32] {
        std::array::from_fn(|i| if (i as i8 + seed) % 3 == 0 { 90 } else { -40 })
    }

    #[test]
    fn store_gpu_serves_with_whichever_store_opened() {
        // Without the `cuda` feature or a GPU this is the CPU store after one warning; on a
        // GPU machine built with `--features cuda` it is the GPU store. Either way it holds
        // the observed fingerprints.
        let mut config = ServeConfig {
            replicas: vec![Replica::named("r0")],
            ..ServeConfig::default()
        };
        config.store.backend = StoreKind::Gpu;
        config.store.max_entries = 1000;
        let brain = Brain::new(&config, Clock::start());
        observe(&brain, vec![7], sketch(1), "a", "r0");
        observe(&brain, vec![8], sketch(2), "a", "r0");
        assert_eq!(brain.status(1_000).store_entries, 2);
    }

    #[test]
    fn a_new_cohort_follows_its_nearest_past_requests_unless_neighbours_are_off() {
        use crate::config::NeighbourSearch::{Exact, Recent};
        for (per_cohort, search, similar) in [
            (16, Recent, true),
            (16, Exact, true),
            (0, Recent, false),
            (0, Exact, false),
        ] {
            let mut config = ServeConfig {
                replicas: (0..4).map(|i| Replica::named(&format!("r{i}"))).collect(),
                ..ServeConfig::default()
            };
            config.store.neighbours_per_cohort = per_cohort;
            config.store.neighbour_search = search;
            let brain = Arc::new(Brain::new(&config, Clock::start()));
            // Three requests of one intent were observed on r2 (another batcher shard, or
            // a mode without Assign, chose it): their cohort has no owner in the policy.
            for key in 10..13 {
                observe(&brain, vec![key], sketch(1), "a", "r2");
            }
            // A new prompt of the same intent, no prefix anywhere: it goes where they went.
            let reply = assign(&brain, vec![99], sketch(1), "a");
            assert_eq!(reply.cluster.len(), 8, "joined their cohort");
            if similar {
                assert_eq!(
                    (reply.shard.as_str(), reply.reason.as_str()),
                    ("r2", "similar")
                );
            } else {
                assert_ne!(reply.reason, "similar");
            }
            let metrics = page(&brain, 1_000);
            let neighbour_queries = if similar { 1 } else { 0 };
            assert!(
                metrics.contains(&format!(
                    "cohort_store_queries_total{{query=\"neighbours\"}} {neighbour_queries}.0\n"
                )),
                "{metrics}"
            );
            assert!(metrics.contains("cohort_store_queries_total{query=\"cohorts\"} 1.0\n"));
            // One caller at a time: every centroid query (3 Observes, 1 Assign) was its own
            // scan.
            assert!(
                metrics.contains("cohort_store_scans_total{store=\"centroids\"} 4.0\n"),
                "{metrics}"
            );
            assert!(
                metrics.contains("cohort_store_scanned_queries_total{store=\"centroids\"} 4.0\n")
            );
            // Another tenant's identical request finds no neighbours of its own.
            let other = assign(&brain, vec![98], sketch(1), "b");
            assert_ne!(other.reason, "similar");
        }
    }

    #[test]
    fn a_prefix_counts_as_resident_for_its_cache_ttl() {
        let brain = brain(3, 1);
        let at = |blocks: Vec<u64>, ttl_s: u32, now_ms: u64| {
            let request = pb::AssignRequest {
                request: Some(pb::RequestInfo {
                    fingerprint: Some(fingerprint(blocks, sketch(0))),
                    knobs: Some(pb::Knobs {
                        cache_ttl_s: ttl_s,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            brain.assign(&request, now_ms).unwrap()
        };
        // Sent at 1 s with a 600 s TTL: held at 600 s, not at 601 s.
        at(vec![1, 2, 3, 4], 600, 1_000);
        assert_eq!(at(vec![1, 2, 3, 5], 600, 600_000).matched_blocks, 3);
        // That request refreshed 1, 2, 3 until 1,200 s; 4 expired at 601 s.
        assert_eq!(at(vec![1, 2, 3, 4], 300, 601_000).matched_blocks, 3);
        // The knob is clamped to 300–3600 s; beyond, nothing is held.
        at(vec![7, 8], 5, 2_000_000);
        assert_eq!(at(vec![7, 8], 5, 2_299_000).matched_blocks, 2);
        assert_eq!(at(vec![7, 9], 5, 2_600_000).matched_blocks, 0);
        // No knob (0) is the header's default, 600 s.
        at(vec![20, 21], 0, 3_000_000);
        assert_eq!(at(vec![20, 21], 0, 3_599_000).matched_blocks, 2);
        assert_eq!(at(vec![20, 22], 0, 4_200_000).matched_blocks, 0);
    }

    #[test]
    fn the_knob_policy_bounds_residency_per_tenant_and_sets_it_per_route() {
        // `[knobs]`: tenant "short" may hold a prefix at most 300 s whatever the filter
        // sent; requests to /batch/ without knobs hold it 1,800 s.
        let mut config = ServeConfig {
            replicas: (0..3).map(|i| Replica::named(&format!("r{i}"))).collect(),
            ..ServeConfig::default()
        };
        config.knobs = toml::from_str(
            "[tenants.short]\ncache_ttl_range_s = [300, 300]\n\
             [[routes]]\npath_prefix = \"/batch/\"\n[routes.knobs]\ncache_ttl_s = 1800\n",
        )
        .unwrap();
        let brain = Brain::new(&config, Clock::start());
        let at = |blocks: Vec<u64>, tenant: &str, path: &str, ttl_s: Option<u32>, now_ms| {
            let request = pb::AssignRequest {
                request: Some(pb::RequestInfo {
                    fingerprint: Some(fingerprint(blocks, sketch(0))),
                    knobs: ttl_s.map(|cache_ttl_s| pb::Knobs {
                        cache_ttl_s,
                        ..Default::default()
                    }),
                    tenant: tenant.into(),
                    path: path.into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            brain.assign(&request, now_ms).unwrap().matched_blocks
        };
        // The filter sent 3,600 s; tenant "short" holds 300 s, tenant "long" the 3,600.
        at(
            vec![1, 2],
            "short",
            "/v1/chat/completions",
            Some(3600),
            1_000,
        );
        at(
            vec![11, 12],
            "long",
            "/v1/chat/completions",
            Some(3600),
            1_000,
        );
        assert_eq!(
            at(
                vec![1, 3],
                "short",
                "/v1/chat/completions",
                Some(3600),
                302_000
            ),
            0
        );
        assert_eq!(
            at(
                vec![11, 13],
                "long",
                "/v1/chat/completions",
                Some(3600),
                302_000
            ),
            1
        );
        // No knobs at all: the route's default (1,800 s), else the contract's (600 s).
        at(vec![21, 22], "long", "/batch/v1/completions", None, 1_000);
        at(vec![31, 32], "long", "/v1/completions", None, 1_000);
        assert_eq!(
            at(
                vec![21, 23],
                "long",
                "/batch/v1/completions",
                None,
                1_200_000
            ),
            1
        );
        assert_eq!(
            at(vec![31, 33], "long", "/v1/completions", None, 1_200_000),
            0
        );
    }

    #[test]
    fn cohorts_of_different_semantic_modes_do_not_mix() {
        let brain = brain(2, 1);
        let with_mode = |mode: pb::SemanticMode, key: u64| pb::RequestInfo {
            fingerprint: Some(pb::Fingerprint {
                semantic_mode: mode as i32,
                ..fingerprint(vec![key], sketch(1))
            }),
            tenant: "a".into(),
            ..Default::default()
        };
        for (mode, key) in [(pb::SemanticMode::Intent, 1), (pb::SemanticMode::Topic, 2)] {
            brain.observe(
                &pb::ObservationBatch {
                    observations: vec![pb::Observation {
                        request: Some(with_mode(mode, key)),
                        shard: "r0".into(),
                        ..Default::default()
                    }],
                    dropped: 0,
                },
                1_000,
            );
        }
        // The same sketch made two cohorts, one per mode.
        assert_eq!(brain.status(1_000).cohorts, 2);
        let cluster = |mode| {
            let request = pb::AssignRequest {
                request: Some(with_mode(mode, 3)),
                ..Default::default()
            };
            brain.assign(&request, 1_000).unwrap().cluster
        };
        let (intent, topic) = (
            cluster(pb::SemanticMode::Intent),
            cluster(pb::SemanticMode::Topic),
        );
        assert!(!intent.is_empty() && !topic.is_empty());
        assert_ne!(intent, topic);
        // A mode no cohort was made in finds none; unspecified is intent.
        assert_eq!(cluster(pb::SemanticMode::Hybrid), "");
        assert_eq!(cluster(pb::SemanticMode::Unspecified), intent);
        // The inspector's playground looks in the default (intent) space.
        let nearest = brain.nearest_cohorts("a", &sketch(1), 1_000);
        assert_eq!(nearest[0].0, intent);
    }

    #[test]
    fn tickets_open_only_for_requests_whose_progress_will_be_reported() {
        let brain = brain(2, 1);
        let request = |reports_progress| pb::AssignRequest {
            request: Some(pb::RequestInfo {
                fingerprint: Some(fingerprint(vec![1, 2], sketch(0))),
                ..Default::default()
            }),
            reports_progress,
            ..Default::default()
        };
        // Batch mode's filter asks without reporting: no ticket, nothing left open.
        assert_eq!(brain.assign(&request(false), 0).unwrap().ticket, 0);
        let reply = brain.assign(&request(true), 0).unwrap();
        assert_ne!(reply.ticket, 0);
        let in_flight = || {
            lock(&brain.policy)
                .snapshot(0)
                .replicas
                .iter()
                .map(|r| r.in_flight)
                .sum::<u32>()
        };
        assert_eq!(in_flight(), 1);
        let end = pb::ObservationBatch {
            observations: vec![pb::Observation {
                shard: reply.shard.clone(),
                progress: Some(pb::RequestProgress {
                    ticket: reply.ticket,
                    phase: pb::request_progress::Phase::End as i32,
                    status: 200,
                    elapsed_ms: 5,
                }),
                ..Default::default()
            }],
            dropped: 0,
        };
        brain.observe(&end, 10);
        assert_eq!(in_flight(), 0);
        assert_eq!(
            brain.status(10).observations,
            0,
            "a progress report is not an observation"
        );
    }

    #[test]
    fn the_replicas_panel_follows_assigns_first_bytes_ends_and_probes() {
        use crate::fleet::EngineEvents;
        let brain = brain(3, 1);
        let rows = |now_ms| match brain.replicas_state(now_ms) {
            serde_json::Value::Array(rows) => rows,
            other => panic!("not an array: {other}"),
        };
        let row = |now_ms, name: &str| {
            rows(now_ms)
                .into_iter()
                .find(|r| r["name"] == name)
                .unwrap_or_else(|| panic!("no row {name}"))
        };
        let names: Vec<_> = rows(0).iter().map(|r| r["name"].clone()).collect();
        assert_eq!(names, ["r0", "r1", "r2"]);
        let idle = row(0, "r1");
        assert_eq!(idle["source"], "static");
        assert_eq!(idle["endpoint"], serde_json::Value::Null);
        assert_eq!(idle["health"], "up");
        assert_eq!(idle["probe"], serde_json::Value::Null);
        assert_eq!(idle["in_flight"], 0);
        assert_eq!(idle["share_60s"], serde_json::Value::Null);
        assert_eq!(idle["ttft_ms"], serde_json::Value::Null);
        assert_eq!(idle["blocks_resident"], 0);
        assert_eq!(idle["kv_events"], serde_json::Value::Null);

        let send = |blocks: Vec<u64>, now_ms| {
            let request = pb::AssignRequest {
                request: Some(pb::RequestInfo {
                    fingerprint: Some(fingerprint(blocks, sketch(0))),
                    ..Default::default()
                }),
                reports_progress: true,
                ..Default::default()
            };
            brain.assign(&request, now_ms).unwrap()
        };
        let report =
            |reply: &pb::AssignReply, phase: pb::request_progress::Phase, status, ms, now_ms| {
                let batch = pb::ObservationBatch {
                    observations: vec![pb::Observation {
                        shard: reply.shard.clone(),
                        progress: Some(pb::RequestProgress {
                            ticket: reply.ticket,
                            phase: phase as i32,
                            status,
                            elapsed_ms: ms,
                        }),
                        ..Default::default()
                    }],
                    dropped: 0,
                };
                brain.observe(&batch, now_ms);
            };
        use pb::request_progress::Phase::{End, FirstByte};
        // One request of four blocks: its replica has it in flight, all the recent
        // Assigns, and its blocks.
        let first = send(vec![1, 2, 3, 4], 1_000);
        let a = first.shard.as_str();
        let r = row(1_000, a);
        assert_eq!(r["in_flight"], 1);
        assert_eq!(r["assigns_60s"], 1);
        assert_eq!(r["share_60s"], 1.0);
        assert_eq!(r["blocks_resident"], 4);
        assert_eq!(r["ttft_ms"], serde_json::Value::Null);
        // Its first byte after 40 ms, then its end.
        report(&first, FirstByte, 0, 40, 1_100);
        let r = row(1_100, a);
        assert_eq!(
            (r["ttft_ms"]["p50"].clone(), r["ttft_ms"]["p95"].clone()),
            (40.into(), 40.into())
        );
        assert_eq!(r["in_flight"], 1);
        report(&first, End, 200, 90, 1_200);
        assert_eq!(row(1_200, a)["in_flight"], 0);
        // Three more of the same prefix go there too, one slow: the shares and the
        // quantiles move.
        for (i, ms) in [(5, 10), (6, 20), (7, 400)] {
            let reply = send(vec![1, 2, 3, i], 2_000);
            assert_eq!(reply.shard, a);
            report(&reply, FirstByte, 0, ms, 2_100);
        }
        let r = row(2_100, a);
        assert_eq!(r["assigns_60s"], 4);
        assert_eq!(r["in_flight"], 3);
        assert_eq!(r["blocks_resident"], 7);
        assert_eq!(r["ttft_ms"]["p50"], 20);
        assert_eq!(r["ttft_ms"]["p95"], 400);
        assert_eq!(r["ttft_ms"]["samples"], 4);
        // A request elsewhere: the shares split 4:1.
        let other = send(vec![50, 51], 3_000);
        let b = other.shard.as_str();
        assert_ne!(b, a);
        assert_eq!(row(3_000, a)["share_60s"], 0.8);
        assert_eq!(row(3_000, b)["share_60s"], 0.2);
        // A minute later no Assign is recent; the blocks count until their TTL (600 s).
        assert_eq!(row(63_000, a)["share_60s"], serde_json::Value::Null);
        assert_eq!(row(63_000, a)["blocks_resident"], 7);
        assert_eq!(row(1_000 + 600_000, a)["blocks_resident"], 6);
        assert_eq!(row(2_000 + 600_000, a)["blocks_resident"], 0);
        // A failed probe: the row says so, and when.
        let slot = lock(&brain.policy).replicas() - 1;
        brain.engine_probed(slot, false);
        brain.engine_down(slot);
        let r = row(brain.clock.now_ms() + 2_000, "r2");
        assert_eq!(r["health"], "probe failing");
        assert_eq!(r["probe"]["up"], false);
        assert!(r["probe"]["age_s"].as_f64().unwrap() >= 2.0, "{r}");
        brain.engine_probed(slot, true);
        brain.engine_up(slot);
        assert_eq!(row(brain.clock.now_ms(), "r2")["probe"]["up"], true);
        assert_eq!(row(brain.clock.now_ms(), "r2")["health"], "up");
        // A 5xx holds its replica out.
        report(&other, End, 503, 5, 4_000);
        let r = row(4_000, b);
        assert_eq!(r["health"], "held out after 5xx");
        assert_eq!(r["available"], false);
        assert!(r["held_out_s"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn discovered_replicas_show_their_endpoint_and_a_new_one_in_a_slot_starts_empty() {
        use crate::fleet::EngineEvents;
        let config = ServeConfig {
            discovery: crate::config::DiscoverySection {
                dns: Some("llm-engine.test".into()),
                ..Default::default()
            },
            ..ServeConfig::default()
        };
        let brain = Brain::new(&config, Clock::start());
        let member = |name: &str, endpoint: &str| Member {
            name: name.into(),
            endpoint: endpoint.into(),
        };
        assert_eq!(brain.replicas_state(0), serde_json::json!([]));
        let set = brain.set_replicas(&[member("e0", "10.0.0.1:8000")]);
        let rows = brain.replicas_state(0);
        assert_eq!(rows[0]["name"], "e0");
        assert_eq!(rows[0]["source"], "discovered");
        assert_eq!(rows[0]["endpoint"], "10.0.0.1:8000");
        assert_eq!(rows[0]["health"], "awaiting first probe");
        brain.engine_probed(set[0].0, true);
        brain.engine_up(set[0].0);
        let request = pb::AssignRequest {
            request: Some(pb::RequestInfo {
                fingerprint: Some(fingerprint(vec![1, 2], sketch(0))),
                ..Default::default()
            }),
            ..Default::default()
        };
        brain.assign(&request, 1_000).unwrap();
        let rows = brain.replicas_state(1_000);
        assert_eq!(rows[0]["health"], "up");
        assert_eq!(rows[0]["probe"]["up"], true);
        assert_eq!(rows[0]["share_60s"], 1.0);
        // e0 goes, e1 takes its slot: nothing of e0's shows under e1.
        brain.set_replicas(&[member("e1", "10.0.0.2:8000")]);
        let rows = brain.replicas_state(1_000);
        assert_eq!(rows.as_array().unwrap().len(), 1);
        assert_eq!(rows[0]["name"], "e1");
        assert_eq!(rows[0]["assigns_60s"], 0);
        assert_eq!(rows[0]["probe"], serde_json::Value::Null);
        assert_eq!(rows[0]["blocks_resident"], 0);
    }

    #[test]
    fn the_live_slack_setting_reaches_the_policy() {
        let mut config = ServeConfig {
            replicas: vec![Replica::named("r0")],
            ..ServeConfig::default()
        };
        let slack = |config: &ServeConfig| {
            let brain = Brain::new(config, Clock::start());
            let slack = brain.policy.lock().unwrap().config().live_slack;
            slack
        };
        assert_eq!(slack(&config), 1.0);
        config.policy.live_slack = 2.5;
        assert_eq!(slack(&config), 2.5);
    }

    #[test]
    fn a_shared_prefix_goes_back_to_its_replica() {
        let brain = brain(3, 1);
        let first = assign(&brain, vec![1, 2, 3, 4], sketch(0), "t");
        let again = assign(&brain, vec![1, 2, 3, 4, 5], sketch(0), "t");
        assert_eq!(first.shard, again.shard);
        assert_eq!(again.matched_blocks, 4);
        assert_eq!(again.reason, "prefix");
        assert!(["r0", "r1", "r2"].contains(&first.shard.as_str()));
    }

    #[test]
    fn observations_build_cohorts_per_tenant_and_fill_the_store() {
        let brain = brain(2, 1);
        assert_eq!(
            assign(&brain, vec![7], sketch(1), "a").cluster,
            "",
            "no cohort yet"
        );
        observe(&brain, vec![7], sketch(1), "a", "r1");
        observe(&brain, vec![8], sketch(1), "a", "r0");
        let cluster = assign(&brain, vec![9], sketch(1), "a").cluster;
        assert_eq!(cluster.len(), 8, "joined the observed cohort: {cluster:?}");
        assert_eq!(
            assign(&brain, vec![9], sketch(1), "b").cluster,
            "",
            "other tenant"
        );
        let status = brain.status(1_000);
        assert_eq!(status.observations, 2);
        assert_eq!(status.dropped_reported, 4);
        assert_eq!(status.store_entries, 2);
        assert_eq!(status.cohorts, 1);
        let metrics = page(&brain, 1_000);
        assert!(
            metrics.contains("cohort_observations_total 2\n"),
            "{metrics}"
        );
        assert!(metrics.contains("cohort_store_entries 2\n"));
        assert!(metrics.contains("cohort_replica_assigned_total{replica=\"r0\"}"));
        // The pivot: tenant a's two observations in one cohort.
        assert!(
            metrics.contains(&format!(
                "cohort_pivot_requests_total{{cohort=\"{cluster}\",source=\"a\"}} 2.0\n"
            )),
            "{metrics}"
        );
        // Three Assign decisions of 4,096 prompt bytes (1,024 tokens): the 1k-4k band; the
        // repeat of block 9 found it held on its replica (cached).
        assert!(metrics.contains("cohort_prompt_tokens_est_total{band=\"1k-4k\"} 3072.0\n"));
        assert!(metrics.contains("cohort_prompt_tokens_est_total{band=\"0-256\"} 0.0\n"));
        assert!(metrics.contains("cohort_cached_tokens_est_total{band=\"1k-4k\"} 1024.0\n"));
    }

    #[test]
    fn the_effective_cost_is_per_tenant_and_route_and_its_coefficients_act() {
        let with_penalty = |miss_penalty: f64| {
            let config = ServeConfig {
                replicas: (0..2).map(|i| Replica::named(&format!("r{i}"))).collect(),
                cost: cohort_score::cost::CostModel {
                    base: 1.0,
                    miss_penalty,
                },
                ..ServeConfig::default()
            };
            Arc::new(Brain::new(&config, Clock::start()))
        };
        for (penalty, first, both) in [(0.5, "1.5", "0.625"), (2.0, "3.0", "1.0")] {
            let brain = with_penalty(penalty);
            // A cold request: nothing cached, no hit.
            assign(&brain, vec![41], sketch(1), "a");
            let page1 = page(&brain, 1_000);
            let line = format!("cohort_effective_cost{{tenant=\"a\",route=\"\"}} {first}\n");
            assert!(page1.contains(&line), "{line} in {page1}");
            // The same prompt again: all of it held, a hit. Half the tokens and half the
            // requests now: (1 − 0.5) × (1 + penalty × 0.5).
            assign(&brain, vec![41], sketch(1), "a");
            let line = format!("cohort_effective_cost{{tenant=\"a\",route=\"\"}} {both}\n");
            assert!(page(&brain, 1_000).contains(&line), "{line}");
            // Another tenant has its own line.
            assign(&brain, vec![42], sketch(1), "b");
            assert!(page(&brain, 1_000).contains("cohort_effective_cost{tenant=\"b\",route=\"\"}"));
        }
    }

    #[test]
    fn audit_max_records_bounds_the_audit_and_zero_turns_it_off() {
        for (records, kept) in [(65_536, true), (0, false)] {
            let config = ServeConfig {
                replicas: (0..2).map(|i| Replica::named(&format!("r{i}"))).collect(),
                audit_max_records: records,
                ..ServeConfig::default()
            };
            let brain = Brain::new(&config, Clock::start());
            let request = pb::AssignRequest {
                request: Some(pb::RequestInfo {
                    fingerprint: Some(fingerprint(vec![5], sketch(1))),
                    tenant: "a".into(),
                    request_id: "req-1".into(),
                    mode: "assign".into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let reply = brain.assign(&request, 1_000).unwrap();
            let record = brain.audit().get("a", "req-1");
            assert_eq!(record.is_some(), kept, "audit_max_records {records}");
            if let Some(record) = record {
                assert_eq!(record.replica, reply.shard);
                assert_eq!(record.prompt_tokens_est, 1024);
            }
        }
    }

    #[test]
    fn prompt_lengths_fall_into_bands() {
        assert_eq!(LENGTH_BANDS[length_band(0)].1, "0-256");
        assert_eq!(LENGTH_BANDS[length_band(255)].1, "0-256");
        assert_eq!(LENGTH_BANDS[length_band(256)].1, "256-1k");
        assert_eq!(LENGTH_BANDS[length_band(5000)].1, "4k-16k");
        assert_eq!(LENGTH_BANDS[length_band(1 << 40)].1, "16k+");
    }

    #[test]
    fn bad_requests_are_refused_or_routed_on_prefix_alone() {
        let brain = brain(2, 2);
        let empty = pb::AssignRequest::default();
        assert_eq!(brain.assign(&empty, 0), Err(BrainError::NoFingerprint));
        // A sketch of an unknown version, or of the wrong length, is ignored.
        let mut fp = fingerprint(vec![3], sketch(2));
        fp.sketch_version = 99;
        let request = pb::AssignRequest {
            request: Some(pb::RequestInfo {
                fingerprint: Some(fp.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(brain.assign(&request, 0).unwrap().cluster, "");
        fp.sketch_version = SKETCH_VERSION;
        fp.sketch.truncate(5);
        let batch = pb::ObservationBatch {
            observations: vec![pb::Observation {
                request: Some(pb::RequestInfo {
                    fingerprint: Some(fp),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            dropped: 0,
        };
        brain.observe(&batch, 0);
        assert!(page(&brain, 0).contains("cohort_observations_unknown_sketch_version_total 1\n"));
        assert_eq!(brain.status(0).shard_count, 2);
    }
}
