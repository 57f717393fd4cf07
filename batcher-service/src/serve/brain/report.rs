//! What the brain shows operators: the inspector page's state and nearest cohorts, and
//! the `Status` RPC. Nothing here shows prompt text: cohorts are ids, sources are the
//! tenant names the mesh set.

use super::{lock, read, secs, space, Brain, PIVOT_CAP};
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
