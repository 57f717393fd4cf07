//! Online cohorts: requests of one tenant whose intent sketches are close in cosine join
//! the same cohort, so the batcher can co-batch and warm them as one unit of work.
//!
//! Clustering is a leader/online-means scheme: a sketch joins the nearest live cohort of
//! its tenant whose cosine similarity is at least the threshold (the `batch-threshold`
//! knob, 0.1–0.9, default [`DEFAULT_THRESHOLD`]), or starts a new cohort centred on it.
//!
//! # Centroids live in a [`Store`]
//! Every cohort is an entry of a store (key = cohort id, `meta.cohort` = id, tenant = the
//! cohort's tenant), so the nearest-cohort search is the store's top-k and the CUDA store
//! accelerates it too. The store scores int8 dot products; to make them rank by cosine,
//! both sides are normalised before quantisation:
//! - the centroid is kept exactly here as the running mean of its members' *unit* vectors
//!   (`f32`; a plain mean for the first [`MEAN_WINDOW`] members, then an exponential mean
//!   over about that many, so it keeps following drift without losing precision), and
//!   requantised into the store scaled to L2 norm [`QUANT_NORM`] (127: every component
//!   then fits in int8);
//! - the query is scaled to the same norm, so `dot / 127²` ≈ cosine, with an error of about
//!   1% from rounding.
//!
//! The store's top [`CANDIDATES`] by dot product are then re-ranked by the exact cosine
//! against the `f32` means, so the similarity reported and compared with the threshold is
//! exact; quantisation only matters if more than [`CANDIDATES`] cohorts tie within ~1%.
//!
//! # Semantic conflicts
//! A conflict is counted when the runner-up is also at or above the threshold and within
//! [`CONFLICT_MARGIN`] (0.05) cosine of the best: the request could as well belong to
//! either cohort, a sign that the threshold is too low or two cohorts should merge.
//!
//! # Expiry and the zero sketch
//! A cohort expires after `idle_ttl_s` without a member (its store entry's `expires_at_s`
//! is refreshed on every join; [`Cohorts::expire`] drops the bookkeeping). A zero sketch
//! (no intent text) has no direction: it never joins nor starts a cohort, and
//! [`Cohorts::observe`] answers [`NO_COHORT`] (ids start at 1).

use crate::store::{EntryMeta, SketchBytes, Store, DIMS};
use std::collections::HashMap;

/// Default of the `batch-threshold` knob.
pub const DEFAULT_THRESHOLD: f32 = 0.5;
/// Runner-up within this cosine of the best (and above the threshold) = a conflict.
pub const CONFLICT_MARGIN: f32 = 0.05;
/// The cohort id answered for a zero sketch; real ids start at 1.
pub const NO_COHORT: u32 = 0;
/// L2 norm of quantised centroids and queries in the store.
pub const QUANT_NORM: f32 = 127.0;
/// Store candidates re-ranked by exact cosine.
pub const CANDIDATES: usize = 8;
/// Members over which a centroid's mean is taken before it becomes exponential.
pub const MEAN_WINDOW: u32 = 1024;

/// Where a sketch belongs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Membership {
    pub cohort: u32,
    /// Exact cosine to the cohort's centroid before this sketch joined (1.0 for a new one).
    pub similarity: f32,
    /// The cohort was created by this sketch.
    pub new: bool,
    /// The runner-up cohort was also above the threshold, within [`CONFLICT_MARGIN`].
    pub conflict: bool,
}

/// Counters of a [`Cohorts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CohortCounters {
    pub live: u64,
    pub created: u64,
    pub expired: u64,
    pub conflicts: u64,
}

#[derive(Clone, Debug)]
struct CohortState {
    tenant: u32,
    /// Running mean of the members' unit vectors.
    mean: [f32; DIMS],
    members: u32,
    last_seen_s: u32,
}

/// Online cohorts over a store of centroids (see the module doc). The store should be
/// used by this struct only: its keys are cohort ids.
pub struct Cohorts<S: Store> {
    store: S,
    idle_ttl_s: u32,
    states: HashMap<u32, CohortState>,
    next_id: u32,
    counters: CohortCounters,
}

/// The unit vector of a sketch, or None for the zero sketch.
fn unit(sketch: &SketchBytes) -> Option<[f32; DIMS]> {
    let norm = sketch
        .iter()
        .map(|&x| f32::from(x) * f32::from(x))
        .sum::<f32>()
        .sqrt();
    (norm > 0.0).then(|| std::array::from_fn(|i| f32::from(sketch[i]) / norm))
}

/// `v` scaled to L2 norm [`QUANT_NORM`] and rounded (v must be a unit vector).
fn quantise(v: &[f32; DIMS]) -> SketchBytes {
    std::array::from_fn(|i| (v[i] * QUANT_NORM).round().clamp(-127.0, 127.0) as i8)
}

fn norm(v: &[f32; DIMS]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

fn sanitise(threshold: f32) -> f32 {
    if threshold.is_finite() {
        threshold.clamp(-1.0, 1.0)
    } else {
        DEFAULT_THRESHOLD
    }
}

/// The membership the ranked cohorts (best first, exact cosine) give at `threshold`: the
/// best if within it, with a conflict when the runner-up is too and close.
fn membership_of(ranked: &[(u32, f32)], threshold: f32) -> Option<Membership> {
    let (cohort, similarity) = ranked.first().copied().filter(|&(_, s)| s >= threshold)?;
    let conflict = ranked
        .get(1)
        .is_some_and(|&(_, s)| s >= threshold && similarity - s <= CONFLICT_MARGIN);
    Some(Membership {
        cohort,
        similarity,
        new: false,
        conflict,
    })
}

impl<S: Store> Cohorts<S> {
    /// Cohorts in `store`, expiring after `idle_ttl_s` seconds without a member.
    pub fn new(store: S, idle_ttl_s: u32) -> Cohorts<S> {
        Cohorts {
            store,
            idle_ttl_s,
            states: HashMap::new(),
            next_id: 1,
            counters: CohortCounters::default(),
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn counters(&self) -> CohortCounters {
        CohortCounters {
            live: self.states.len() as u64,
            ..self.counters
        }
    }

    /// Tenant, unit centroid and member count (saturating at [`MEAN_WINDOW`]) of a cohort.
    pub fn centroid(&self, cohort: u32) -> Option<(u32, [f32; DIMS], u32)> {
        self.states.get(&cohort).map(|s| {
            let n = norm(&s.mean);
            let unit = if n > 0.0 {
                std::array::from_fn(|i| s.mean[i] / n)
            } else {
                s.mean
            };
            (s.tenant, unit, s.members)
        })
    }

    fn alive(&self, state: &CohortState, now_s: u32) -> bool {
        now_s < state.last_seen_s.saturating_add(self.idle_ttl_s)
    }

    /// Cohorts of `tenant` nearest to the unit vector `u` by exact cosine (at most
    /// [`CANDIDATES`] from the store, re-ranked), best first.
    fn ranked(&self, tenant: u32, u: &[f32; DIMS], now_s: u32) -> Vec<(u32, f32)> {
        let mut ranked: Vec<(u32, f32)> = self
            .store
            .top_k(tenant, &quantise(u), CANDIDATES, now_s)
            .into_iter()
            .filter_map(|hit| {
                let id = u32::try_from(hit.key).ok()?;
                let state = self.states.get(&id)?;
                if state.tenant != tenant || !self.alive(state, now_s) {
                    return None;
                }
                let n = norm(&state.mean);
                let cos = if n > 0.0 {
                    u.iter().zip(&state.mean).map(|(a, b)| a * b).sum::<f32>() / n
                } else {
                    0.0
                };
                Some((id, cos))
            })
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
    }

    /// The live cohorts of `tenant` nearest to `sketch` (id, cosine), best first, at most
    /// `k` (≤ [`CANDIDATES`]): what the inspector's playground shows.
    pub fn nearest_cohorts(
        &self,
        tenant: u32,
        sketch: &SketchBytes,
        k: usize,
        now_s: u32,
    ) -> Vec<(u32, f32)> {
        let Some(u) = unit(sketch) else {
            return Vec::new();
        };
        let mut ranked = self.ranked(tenant, &u, now_s);
        ranked.truncate(k);
        ranked
    }

    /// Every live cohort: (id, tenant, members, last seen), most members first.
    pub fn live(&self, now_s: u32) -> Vec<(u32, u32, u32, u32)> {
        let mut live: Vec<_> = self
            .states
            .iter()
            .filter(|(_, s)| self.alive(s, now_s))
            .map(|(&id, s)| (id, s.tenant, s.members, s.last_seen_s))
            .collect();
        live.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        live
    }

    fn judge(
        &self,
        tenant: u32,
        u: &[f32; DIMS],
        threshold: f32,
        now_s: u32,
    ) -> Option<Membership> {
        membership_of(&self.ranked(tenant, u, now_s), threshold)
    }

    /// Where `sketch` would go, without changing anything: None for a zero sketch or when
    /// no live cohort of the tenant is within the threshold.
    pub fn assign(
        &self,
        tenant: u32,
        sketch: &SketchBytes,
        threshold: f32,
        now_s: u32,
    ) -> Option<Membership> {
        self.locate(tenant, sketch, threshold, now_s).0
    }

    /// What [`Cohorts::assign`] answers, and the live cohorts of `tenant` nearest to
    /// `sketch`, best first, above the threshold or not (at most [`CANDIDATES`]): the lists
    /// a neighbour search probes ([`crate::neighbours`]). One store query for both.
    pub fn locate(
        &self,
        tenant: u32,
        sketch: &SketchBytes,
        threshold: f32,
        now_s: u32,
    ) -> (Option<Membership>, Vec<u32>) {
        let Some(u) = unit(sketch) else {
            return (None, Vec::new());
        };
        let ranked = self.ranked(tenant, &u, now_s);
        let membership = membership_of(&ranked, sanitise(threshold));
        (membership, ranked.into_iter().map(|(id, _)| id).collect())
    }

    /// Whether `cohort` is a live cohort (not yet expired).
    pub fn contains(&self, cohort: u32) -> bool {
        self.states.contains_key(&cohort)
    }

    /// Place `sketch`: join the nearest cohort within the threshold (updating its centroid)
    /// or start a new one. A zero sketch answers [`NO_COHORT`] and changes nothing.
    pub fn observe(
        &mut self,
        tenant: u32,
        sketch: &SketchBytes,
        threshold: f32,
        now_s: u32,
    ) -> Membership {
        let Some(u) = unit(sketch) else {
            return Membership {
                cohort: NO_COHORT,
                similarity: 0.0,
                new: false,
                conflict: false,
            };
        };
        if let Some(joined) = self.judge(tenant, &u, sanitise(threshold), now_s) {
            if joined.conflict {
                self.counters.conflicts += 1;
            }
            if let Some(state) = self.states.get_mut(&joined.cohort) {
                state.members = state.members.saturating_add(1).min(MEAN_WINDOW);
                let weight = 1.0 / state.members as f32;
                for (m, x) in state.mean.iter_mut().zip(&u) {
                    *m += (x - *m) * weight;
                }
                if norm(&state.mean) < 1e-6 {
                    state.mean = u;
                }
                state.last_seen_s = now_s;
            }
            self.publish(joined.cohort, tenant, now_s);
            return joined;
        }
        let id = self.fresh_id();
        self.states.insert(
            id,
            CohortState {
                tenant,
                mean: u,
                members: 1,
                last_seen_s: now_s,
            },
        );
        self.counters.created += 1;
        self.publish(id, tenant, now_s);
        Membership {
            cohort: id,
            similarity: 1.0,
            new: true,
            conflict: false,
        }
    }

    /// Write a cohort's requantised centroid into the store, refreshing its expiry.
    fn publish(&self, id: u32, tenant: u32, now_s: u32) {
        let Some((_, unit, _)) = self.centroid(id) else {
            return;
        };
        let meta = EntryMeta {
            tenant,
            cohort: id,
            replica: 0,
            expires_at_s: now_s.saturating_add(self.idle_ttl_s),
        };
        self.store
            .upsert(u64::from(id), &quantise(&unit), meta, now_s);
    }

    fn fresh_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if id != NO_COHORT && !self.states.contains_key(&id) {
                return id;
            }
        }
    }

    /// Drop cohorts idle for the TTL (and expired store entries); returns how many cohorts.
    pub fn expire(&mut self, now_s: u32) -> usize {
        let ttl = self.idle_ttl_s;
        let idle: Vec<u32> = self
            .states
            .iter()
            .filter(|(_, s)| now_s >= s.last_seen_s.saturating_add(ttl))
            .map(|(&id, _)| id)
            .collect();
        for id in &idle {
            self.states.remove(id);
            self.store.remove(u64::from(*id));
        }
        self.store.expire(now_s);
        self.counters.expired += idle.len() as u64;
        idle.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CpuStore;

    fn cohorts() -> Cohorts<CpuStore> {
        Cohorts::new(CpuStore::with_capacity(1000), 600)
    }

    #[test]
    fn zero_sketch_never_joins() {
        let mut c = cohorts();
        let m = c.observe(1, &[0; DIMS], 0.5, 0);
        assert_eq!(m.cohort, NO_COHORT);
        assert!(!m.new);
        assert_eq!(c.counters().created, 0);
        assert_eq!(c.assign(1, &[0; DIMS], 0.5, 0), None);
    }

    #[test]
    fn quantised_dot_approximates_cosine() {
        let a: SketchBytes = std::array::from_fn(|i| ((i * 7) % 100) as i8 - 50);
        let b: SketchBytes = std::array::from_fn(|i| ((i * 13) % 90) as i8 - 40);
        let (ua, ub) = (
            unit(&a).unwrap_or([0.0; DIMS]),
            unit(&b).unwrap_or([0.0; DIMS]),
        );
        let exact: f32 = ua.iter().zip(&ub).map(|(x, y)| x * y).sum();
        let approx =
            crate::store::dot(&quantise(&ua), &quantise(&ub)) as f32 / (QUANT_NORM * QUANT_NORM);
        assert!((exact - approx).abs() < 0.02, "{exact} vs {approx}");
    }

    #[test]
    fn nan_threshold_is_the_default() {
        assert_eq!(sanitise(f32::NAN), DEFAULT_THRESHOLD);
        assert_eq!(sanitise(7.0), 1.0);
    }
}
