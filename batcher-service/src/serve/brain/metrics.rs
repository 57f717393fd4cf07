//! The batcher's part of `/metrics`: Assign and Observe counts and decision times, the
//! fingerprint store, the online cohorts and the policy's per-replica view. Read at
//! scrape time from the atomics and snapshots that own them.

use super::lookup::Query;
use super::{lock, read, Brain};
use crate::metrics::Scrape;
use cohort_batcher_core::policy::ChoiceReason;
use cohort_batcher_core::store::Store;
use std::sync::atomic::{AtomicU64, Ordering};

impl Brain {
    /// The batcher's part of `/metrics` (names documented in docs/METRICS.md).
    pub fn write_metrics(&self, scrape: &mut Scrape<'_>, now_ms: u64) {
        let c = &self.counters;
        let snapshot = lock(&self.policy).snapshot(now_ms);
        let store = self.store.stats();
        let cohorts = read(&self.cohorts).counters();
        let held: Vec<(usize, String)> = read(&self.members)
            .held()
            .map(|(i, m)| (i, m.name.clone()))
            .collect();
        let per_replica = |f: &dyn Fn(usize) -> f64| -> Vec<(String, f64)> {
            held.iter()
                .filter(|(i, _)| *i < snapshot.replicas.len())
                .map(|(i, name)| (name.clone(), f(*i)))
                .collect()
        };
        scrape.counter(
            "cohort_assign_total",
            "Assign calls answered.",
            c.assigns.load(Ordering::Relaxed),
        );
        scrape.labelled_counter(
            "cohort_assign_reason_total",
            "Assign decisions by why the replica was chosen.",
            "reason",
            &ChoiceReason::ALL
                .iter()
                .map(|r| r.as_str())
                .zip(snapshot.reasons)
                .map(|(r, n)| (r.to_string(), n as f64))
                .collect::<Vec<_>>(),
        );
        scrape.counter(
            "cohort_assign_burst_yields_total",
            "Assigns with no home (every replica holds their prefix alike) that let the \
             others received with them decide first ([policy] burst_order).",
            c.burst_yields.load(Ordering::Relaxed),
        );
        scrape.labelled_counter(
            "cohort_assign_residency_total",
            "Decisions that had the prompt's token blocks (the endpoint picker with [kv_events] \
             prompt_tokens), by whether some replica's own account of its cache (a healthy KV \
             events stream) decided them (`events`) or only the modelled residency could \
             (`modelled`).",
            "residency",
            &[
                (
                    "events".to_string(),
                    c.decisions_observed.load(Ordering::Relaxed) as f64,
                ),
                (
                    "modelled".to_string(),
                    c.decisions_modelled.load(Ordering::Relaxed) as f64,
                ),
            ],
        );
        scrape.histogram(
            "cohort_assign_decision_seconds",
            "Time to decide one Assign inside the batcher.",
            &self.assign_seconds,
        );
        scrape.counter(
            "cohort_observations_total",
            "Observations received from filters.",
            c.observations.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_observations_without_sketch_total",
            "Observations with no intent text (no sketch): routed on prefix only.",
            c.observations_without_sketch.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_observations_unknown_sketch_version_total",
            "Observations whose sketch version this batcher does not know.",
            c.unknown_sketch_version.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_observations_dropped_by_filters_total",
            "Observations filters reported dropping (queue full while the batcher was away).",
            c.dropped_reported.load(Ordering::Relaxed),
        );
        scrape.count_gauge(
            "cohort_store_entries",
            "Fingerprints in the store.",
            store.entries,
        );
        scrape.count_gauge(
            "cohort_store_bytes",
            "Memory held by the fingerprint store.",
            store.bytes,
        );
        scrape.labelled_counter(
            "cohort_store_queries_total",
            "Store queries made by Assign decisions: cohorts (centroid search), neighbours (the nearest past fingerprints).",
            "query",
            &Query::ALL
                .iter()
                .map(|&q| (q.as_str().to_owned(), self.reads.queries(q) as f64))
                .collect::<Vec<_>>(),
        );
        let scans = [
            ("centroids", read(&self.cohorts).store().scans()),
            ("fingerprints", self.store.scans()),
        ];
        let per_store = |pick: fn((u64, u64)) -> u64| {
            scans
                .iter()
                .map(|&(store, counts)| (store.to_owned(), pick(counts) as f64))
                .collect::<Vec<_>>()
        };
        scrape.labelled_counter(
            "cohort_store_scans_total",
            "Batched top-k scans run by each store: concurrent queries coalesce into one scan.",
            "store",
            &per_store(|(scans, _)| scans),
        );
        scrape.labelled_counter(
            "cohort_store_scanned_queries_total",
            "Top-k queries those scans answered (queries / scans = the mean batch).",
            "store",
            &per_store(|(_, queries)| queries),
        );
        scrape.labelled_counter(
            "cohort_store_query_seconds_total",
            "Time Assign decisions spent in store queries.",
            "query",
            &Query::ALL
                .iter()
                .map(|&q| (q.as_str().to_owned(), self.reads.seconds(q)))
                .collect::<Vec<_>>(),
        );
        let bands = |counts: &[AtomicU64]| -> Vec<(String, f64)> {
            super::LENGTH_BANDS
                .iter()
                .zip(counts)
                .map(|(&(_, label), n)| (label.to_owned(), n.load(Ordering::Relaxed) as f64))
                .collect()
        };
        scrape.labelled_counter(
            "cohort_prompt_tokens_est_total",
            "Estimated prompt tokens of Assign decisions, by prompt-length band.",
            "band",
            &bands(&c.band_prompt_tokens),
        );
        scrape.labelled_counter(
            "cohort_cached_tokens_est_total",
            "Of those, tokens the chosen replica was believed to hold, by prompt-length band.",
            "band",
            &bands(&c.band_cached_tokens),
        );
        let pivot: Vec<(Vec<String>, f64)> = lock(&self.pivot)
            .iter()
            .map(|((cohort, source), n)| (vec![format!("{cohort:08x}"), source.clone()], *n as f64))
            .collect();
        scrape.counter_by(
            "cohort_pivot_requests_total",
            "Observed requests per cohort and source (the tenant the mesh established), at most 4096 pairs.",
            &["cohort", "source"],
            &pivot,
        );
        let costs: Vec<(Vec<String>, f64)> = lock(&self.costs)
            .values()
            .map(|c| {
                let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
                let cost = self.cost_model.effective(
                    ratio(c.cached_tokens, c.prompt_tokens),
                    ratio(c.hits, c.requests),
                );
                (vec![c.tenant.clone(), c.route.clone()], cost)
            })
            .collect();
        scrape.gauge_by(
            "cohort_effective_cost",
            "Effective cost per prompt token since start, per tenant and route: base x (1 - tokens cached) x (1 + miss_penalty x (1 - requests hitting)).",
            &["tenant", "route"],
            &costs,
        );
        // Only with the GPU store (NVML): absent, not zero, without a GPU.
        if let Some(read) = &self.gpu_utilization {
            let devices: Vec<(String, f64)> = read()
                .into_iter()
                .map(|(i, u)| (i.to_string(), u))
                .collect();
            if !devices.is_empty() {
                scrape.labelled_gauge(
                    "cohort_gpu_utilization",
                    "GPU utilisation (0-1) of the fingerprint store's devices, from NVML.",
                    "device",
                    &devices,
                );
            }
        }
        scrape.counter(
            "cohort_store_evictions_total",
            "Fingerprints evicted for capacity (least recently used).",
            store.evictions,
        );
        scrape.counter(
            "cohort_store_expirations_total",
            "Fingerprints expired by their cache-ttl.",
            store.expirations,
        );
        scrape.count_gauge("cohort_cohorts", "Live cohorts.", cohorts.live);
        scrape.counter(
            "cohort_cohorts_created_total",
            "Cohorts started.",
            cohorts.created,
        );
        scrape.counter(
            "cohort_cohorts_expired_total",
            "Cohorts expired after idling.",
            cohorts.expired,
        );
        scrape.counter(
            "cohort_semantic_conflicts_total",
            "Observations whose runner-up cohort was within the conflict margin of the best.",
            cohorts.conflicts,
        );
        scrape.labelled_gauge(
            "cohort_replica_load",
            "Estimated load per engine replica (decayed assigned work).",
            "replica",
            &per_replica(&|i| snapshot.replicas[i].load),
        );
        scrape.labelled_gauge(
            "cohort_replica_prefix_blocks",
            "Prefix blocks the batcher believes each replica holds.",
            "replica",
            &per_replica(&|i| snapshot.replicas[i].blocks_held as f64),
        );
        scrape.labelled_counter(
            "cohort_replica_prefix_evictions_total",
            "Blocks evicted from each replica's approximate prefix state (cache eviction rate).",
            "replica",
            &per_replica(&|i| snapshot.replicas[i].evictions as f64),
        );
        scrape.labelled_counter(
            "cohort_replica_assigned_total",
            "Requests assigned to each replica.",
            "replica",
            &per_replica(&|i| snapshot.replicas[i].assigned as f64),
        );
        scrape.labelled_gauge(
            "cohort_replica_in_flight",
            "Assigned requests not ended on each replica (from the filters' progress reports).",
            "replica",
            &per_replica(&|i| f64::from(snapshot.replicas[i].in_flight)),
        );
        scrape.labelled_gauge(
            "cohort_replica_pending_prefill",
            "Prefill work (prompt tokens) of assigned requests with no first byte yet.",
            "replica",
            &per_replica(&|i| snapshot.replicas[i].pending_work),
        );
        scrape.labelled_gauge(
            "cohort_replica_available",
            "Whether Assign may choose the replica (probe up, no 5xx in the hold time).",
            "replica",
            &per_replica(&|i| f64::from(u8::from(snapshot.replicas[i].available))),
        );
        scrape.count_gauge(
            "cohort_assign_live_load",
            "1 while Assign decides on the live load (progress reports arriving), 0 on the estimate.",
            u64::from(snapshot.live),
        );
        let p = &self.progress_counters;
        scrape.labelled_counter(
            "cohort_progress_reports_total",
            "Progress reports of assigned requests from filters, by phase (unknown: no such ticket).",
            "phase",
            &[
                ("first_byte".into(), p.first_byte.load(Ordering::Relaxed) as f64),
                ("end".into(), p.end.load(Ordering::Relaxed) as f64),
                ("unknown".into(), p.unknown.load(Ordering::Relaxed) as f64),
            ],
        );
        scrape.counter(
            "cohort_replica_server_errors_total",
            "Assigned requests that ended with a 5xx (the replica is left out for a hold time).",
            p.server_errors.load(Ordering::Relaxed),
        );
        scrape.counter(
            "cohort_tickets_expired_total",
            "Assign tickets closed because their progress reports never came.",
            snapshot.tickets_expired,
        );
    }
}
