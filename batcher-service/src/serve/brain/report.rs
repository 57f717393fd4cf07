//! What the brain shows operators: the inspector page's state, its Replicas panel and
//! nearest cohorts, and the `Status` RPC. Nothing here shows prompt text: cohorts are ids,
//! sources are the tenant names the mesh set, replicas are their names.

use super::{lock, read, secs, space, Brain, PIVOT_CAP};
use cohort_batcher_core::policy::ReplicaHealth;
use cohort_batcher_core::store::SketchBytes;
use cohort_batcher_core::store::Store;
use cohort_proto as pb;
use std::sync::atomic::Ordering;

impl Brain {
    /// The inspector's view: live cohorts, the batch pivot (cohort × source), store
    /// statistics. Sources are tenant names as the mesh set them; prompts never appear.
    pub fn inspector_state(&self, now_ms: u64) -> serde_json::Value {
        let now_s = secs(now_ms);
        let cohorts = read(&self.cohorts);
        let live = cohorts.live(now_s);
        let counters = cohorts.counters();
        drop(cohorts);
        let (mut pivot, pivot_full) = {
            let counts = lock(&self.pivot);
            let rows: Vec<_> = counts
                .iter()
                .map(|((c, src), n)| (*c, src.clone(), *n))
                .collect();
            (rows, counts.len() >= PIVOT_CAP)
        };
        pivot.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        let store = self.store.stats();
        serde_json::json!({
            "cohorts": live.iter().take(50).map(|&(id, tenant, members, last)| serde_json::json!({
                "cohort": format!("{id:08x}"),
                "tenant": format!("{tenant:08x}"),
                "members": members,
                "idle_s": now_s.saturating_sub(last),
            })).collect::<Vec<_>>(),
            "cohorts_live": live.len(),
            "cohorts_created": counters.created,
            "semantic_conflicts": counters.conflicts,
            "pivot": pivot.iter().take(200).map(|(c, src, n)| serde_json::json!({
                "cohort": format!("{c:08x}"),
                "source": if src.is_empty() { "(no tenant)" } else { src.as_str() },
                "requests": n,
            })).collect::<Vec<_>>(),
            "pivot_full": pivot_full,
            "store": {
                "entries": store.entries,
                "bytes": store.bytes,
                "evictions": store.evictions,
                "expirations": store.expirations,
            },
            "observations": self.counters.observations.load(Ordering::Relaxed),
            "assigns": self.counters.assigns.load(Ordering::Relaxed),
        })
    }

    /// The inspector's Replicas panel: one row per replica of the current set (configured
    /// or discovered), in slot order, with its health and last probe, its requests in
    /// flight (Assign tickets not ended), its share of the Assigns of the last minute, its
    /// time to first byte (p50/p95 of the filter's recent reports), and the prefix blocks
    /// the policy counts as held on it now. `kv_events` is its KV events stream's
    /// snapshot ([`crate::kv_events::state::View`]: health, blocks held, lag, counters), or
    /// `null` for a replica without one.
    pub fn replicas_state(&self, now_ms: u64) -> serde_json::Value {
        let (snapshot, capacity) = {
            let policy = lock(&self.policy);
            (policy.snapshot(now_ms), policy.config().blocks_per_replica)
        };
        let held: Vec<_> = read(&self.members)
            .held()
            .filter_map(|(slot, m)| Some((slot, m.clone(), snapshot.replicas.get(slot)?.clone())))
            .collect();
        let figures: Vec<_> = {
            let stats = lock(&self.replica_stats);
            held.iter()
                .map(|(slot, ..)| stats.figures(*slot, now_ms))
                .collect()
        };
        let recent: u64 = figures.iter().map(|f| f.assigns).sum();
        let rows = held.iter().zip(&figures).map(|((slot, member, replica), f)| {
            // One replica's walk per lock hold: Assigns wait for at most one.
            let resident = lock(&self.policy).resident_blocks(*slot, now_ms);
            serde_json::json!({
                "name": member.name,
                "endpoint": Some(member.endpoint.as_str()).filter(|e| !e.is_empty()),
                "source": if member.endpoint.is_empty() { "static" } else { "discovered" },
                "health": replica.health.as_str(),
                "available": replica.available,
                "held_out_s": match replica.health {
                    ReplicaHealth::ServerErrors { until_ms } => Some(tenths(until_ms.saturating_sub(now_ms))),
                    _ => None,
                },
                "probe": f.probe.map(|p| serde_json::json!({
                    "age_s": tenths(now_ms.saturating_sub(p.at_ms)),
                    "up": p.up,
                })),
                "in_flight": replica.in_flight,
                "assigns_60s": f.assigns,
                "share_60s": (recent > 0).then(|| f.assigns as f64 / recent as f64),
                "assigned_total": replica.assigned,
                "ttft_ms": f.ttft.map(|q| serde_json::json!({
                    "p50": q.p50_ms,
                    "p95": q.p95_ms,
                    "samples": q.samples,
                })),
                "blocks_resident": resident,
                "blocks_capacity": capacity,
                "kv_events": self.kv_events.get(&member.name).map(|s| s.view(now_ms)),
            })
        });
        serde_json::Value::Array(rows.collect())
    }

    /// The live cohorts of `tenant` nearest to `sketch`: (cluster id, cosine).
    pub fn nearest_cohorts(
        &self,
        tenant: &str,
        sketch: &SketchBytes,
        now_ms: u64,
    ) -> Vec<(String, f32)> {
        read(&self.cohorts)
            .nearest_cohorts(space(tenant, 0), sketch, 5, secs(now_ms))
            .into_iter()
            .map(|(id, cos)| (format!("{id:08x}"), cos))
            .collect()
    }

    pub fn status(&self, now_ms: u64) -> pb::StatusReply {
        let snapshot = lock(&self.policy).snapshot(now_ms);
        pb::StatusReply {
            observations: self.counters.observations.load(Ordering::Relaxed),
            assigns: self.counters.assigns.load(Ordering::Relaxed),
            cohorts: read(&self.cohorts).counters().live,
            store_entries: self.store.stats().entries,
            replicas: read(&self.members)
                .held()
                .filter_map(|(i, m)| Some((m, snapshot.replicas.get(i)?)))
                .map(|(m, r)| pb::ReplicaStatus {
                    name: m.name.clone(),
                    load: r.load,
                    blocks: r.blocks_held as u64,
                    assigned: r.assigned,
                })
                .collect(),
            shard_index: self.shard_index,
            shard_count: self.shard_count,
            dropped_reported: self.counters.dropped_reported.load(Ordering::Relaxed),
        }
    }
}

/// `ms` in seconds, to a tenth.
fn tenths(ms: u64) -> f64 {
    (ms / 100) as f64 / 10.0
}
