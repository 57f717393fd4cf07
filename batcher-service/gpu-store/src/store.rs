//! `GpuStore`: the fingerprint store with its sketches on one or more devices.
//!
//! The logical shards of the CPU store's plan (`CpuStoreConfig::shard_capacities`, keys
//! placed by `clock::shard_of`) are dealt round-robin to the devices; each owns a contiguous
//! slot range on its device. The host mirror of each shard decides slots and eviction
//! exactly as the CPU store does; the device writes a change implies are queued and sent in
//! one `store_scatter` launch before the next query (or when many are pending). A query
//! batch is launched on every device, then each device's exact top-k lists are merged on the
//! host with the metadata from the mirror. One mutex guards the mirror and the devices:
//! launches on a device are serial anyway, and a query sees every write made before it.

use crate::backend::{Backend, DeviceError, RawHit, SlotWrite};
use crate::ivf::{kmeans, pack_lists, plan_items, probe_lists};
use crate::layout::{pack_words, KMAX, MAX_LAUNCH_QUERIES, NO_SLOT};
use crate::mirror::MirrorShard;
use cohort_batcher_core::store::clock_sweep::shard_of;
use cohort_batcher_core::store::{
    is_live, CpuStoreConfig, EntryMeta, Hit, SketchBytes, Store, StoreStats, TopK,
};
use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

/// Pending device writes that trigger a flush without waiting for a query.
const FLUSH_AT: usize = 1 << 16;

struct Device<B> {
    backend: B,
    pending: Vec<SlotWrite>,
    /// (first slot, shard) of the shards on this device, by first slot.
    owners: Vec<(u32, usize)>,
}

/// The IVF index (see `ivf` and docs/GPU-STORE.md): built by [`GpuStore::build_ivf`] from
/// the entries held then; entries inserted later are in no list until the next build, and a
/// slot that changes entry keeps its list (the query still scores the slot's current entry).
struct Ivf<B> {
    centroids: Vec<SketchBytes>,
    /// The centroids on device 0 (key = list, tenant 0, never expiring), ranked for each
    /// query by the exact kernels.
    coarse: B,
    /// Per device, the lists as sent to it (`pack_lists`): offsets and slots.
    lists: Vec<(Vec<u32>, Vec<u32>)>,
    /// Per device, the members of each list (the work-item order).
    list_len: Vec<Vec<usize>>,
}

/// What [`GpuStore::build_ivf`] built.
#[derive(Clone, Debug, PartialEq)]
pub struct IvfSummary {
    pub nlist: usize,
    /// Entries in the lists.
    pub entries: usize,
    /// Sketches k-means ran on.
    pub sample: usize,
    /// Device bytes of the lists and centroids, summed over devices.
    pub index_bytes: u64,
    /// Members of the largest list.
    pub largest_list: usize,
}

/// Sketches sampled per list for k-means.
const SAMPLE_PER_LIST: usize = 32;

struct Inner<B> {
    shards: Vec<MirrorShard>,
    ivf: Option<Ivf<B>>,
    /// Device of each shard.
    device_of: Vec<usize>,
    devices: Vec<Device<B>>,
    /// A device error seen since the last report (the `Store` trait has no error path).
    errors: u64,
    last_error: Option<String>,
}

/// The GPU store over backends `B` (see the module doc).
pub struct GpuStore<B: Backend> {
    inner: Mutex<Inner<B>>,
    capacity: usize,
}

impl<B: Backend> GpuStore<B> {
    /// Build over devices made by `open(device index, slots)`; `devices` ≥ 1.
    pub fn new(
        config: CpuStoreConfig,
        devices: usize,
        mut open: impl FnMut(usize, usize) -> Result<B, DeviceError>,
    ) -> Result<GpuStore<B>, DeviceError> {
        let caps = config.shard_capacities();
        let n_dev = devices.max(1).min(caps.len());
        let mut used = vec![0usize; n_dev];
        let mut shards = Vec::with_capacity(caps.len());
        let mut device_of = Vec::with_capacity(caps.len());
        let mut owners = vec![Vec::new(); n_dev];
        for (i, &cap) in caps.iter().enumerate() {
            let d = i % n_dev;
            let base = u32::try_from(used[d]).map_err(|_| {
                DeviceError::Driver("more than 2^32 slots on one device".to_owned())
            })?;
            owners[d].push((base, i));
            shards.push(MirrorShard::new(base, cap));
            device_of.push(d);
            used[d] += cap;
        }
        let mut devs = Vec::with_capacity(n_dev);
        for (d, owners) in owners.into_iter().enumerate() {
            devs.push(Device {
                backend: open(d, used[d])?,
                pending: Vec::new(),
                owners,
            });
        }
        Ok(GpuStore {
            inner: Mutex::new(Inner {
                shards,
                ivf: None,
                device_of,
                devices: devs,
                errors: 0,
                last_error: None,
            }),
            capacity: caps.iter().sum(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner<B>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Device bytes of the entry arrays and of the launch scratch, summed over devices.
    pub fn device_bytes(&self) -> (u64, u64) {
        let inner = self.lock();
        inner.devices.iter().fold((0, 0), |(e, s), d| {
            (e + d.backend.entry_bytes(), s + d.backend.scratch_bytes())
        })
    }

    /// The devices, described.
    pub fn describe(&self) -> Vec<String> {
        self.lock()
            .devices
            .iter()
            .map(|d| d.backend.describe())
            .collect()
    }

    /// Device errors since the store opened, and the last one (queries that met one were
    /// answered from the host mirror).
    pub fn errors(&self) -> (u64, Option<String>) {
        let inner = self.lock();
        (inner.errors, inner.last_error.clone())
    }

    /// Send pending writes to every device now.
    pub fn flush(&self) -> Result<(), DeviceError> {
        self.lock().flush_all()
    }

    /// Batched cohort assignment: the nearest entry (k = 1) of each observation.
    pub fn assign_batch(
        &self,
        tenant: u32,
        sketches: &[SketchBytes],
        now_s: u32,
    ) -> Vec<Option<Hit>> {
        self.top_k_batch(tenant, sketches, 1, now_s)
            .into_iter()
            .map(|hits| hits.into_iter().next())
            .collect()
    }

    /// Build the IVF index over the entries held now (replacing any before): k-means with
    /// `iters` rounds (seed `seed`) over a sample of at most 32 × `nlist` sketches gives
    /// `nlist` centroids; each entry joins the list of its best centroid by inner product,
    /// ranked on device 0 by the exact kernels (as queries rank them).
    pub fn build_ivf(
        &self,
        nlist: usize,
        iters: usize,
        seed: u64,
    ) -> Result<IvfSummary, DeviceError> {
        let mut inner = self.lock();
        inner.ivf = None;
        inner.flush_all()?;
        let all: Vec<SketchBytes> = inner
            .shards
            .iter()
            .flat_map(|sh| (0..sh.len()).map(move |i| *sh.entry(i).1))
            .collect();
        let want = (SAMPLE_PER_LIST * nlist).max(1);
        let step = all.len().div_ceil(want).max(1);
        let sample: Vec<SketchBytes> = all.iter().step_by(step).copied().collect();
        let centroids = kmeans(&sample, nlist, iters, seed);
        let mut coarse = inner.devices[0].backend.open_like(centroids.len())?;
        let writes: Vec<SlotWrite> = centroids
            .iter()
            .enumerate()
            .map(|(i, c)| SlotWrite {
                slot: i as u32,
                key: i as u64,
                words: pack_words(c),
                tenant: 0,
                expires: u32::MAX,
            })
            .collect();
        coarse.scatter(&writes)?;
        let mut lists = Vec::with_capacity(inner.devices.len());
        let mut list_len = Vec::with_capacity(inner.devices.len());
        let mut index_bytes = (centroids.len() * crate::layout::DEVICE_BYTES_PER_ENTRY) as u64;
        let mut largest = 0;
        for d in 0..inner.devices.len() {
            let mut members = vec![Vec::new(); centroids.len()];
            let held: Vec<(u32, SketchBytes)> = inner.devices[d]
                .owners
                .iter()
                .flat_map(|&(_, sh)| {
                    let shard = &inner.shards[sh];
                    (0..shard.len()).map(move |i| (shard.base + i as u32, *shard.entry(i).1))
                })
                .collect();
            // Each entry joins its best centroid, ranked by the exact kernels (k = 1).
            for chunk in held.chunks(MAX_LAUNCH_QUERIES) {
                let sketches: Vec<SketchBytes> = chunk.iter().map(|&(_, s)| s).collect();
                coarse.submit_top_k(0, &sketches, 1, 0)?;
                let best = coarse.collect_top_k()?;
                for (&(slot, _), hits) in chunk.iter().zip(&best) {
                    let l = hits.first().map_or(0, |h| h.key as usize);
                    members[l.min(centroids.len().saturating_sub(1))].push(slot);
                }
            }
            let (off, slots) = if centroids.is_empty() {
                (Vec::new(), Vec::new())
            } else {
                pack_lists(&members)
            };
            inner.devices[d].backend.set_lists(&off, &slots)?;
            index_bytes += inner.devices[d].backend.index_bytes();
            let lens: Vec<usize> = members.iter().map(Vec::len).collect();
            largest = largest.max(lens.iter().copied().max().unwrap_or(0));
            lists.push((off, slots));
            list_len.push(lens);
        }
        let summary = IvfSummary {
            nlist: centroids.len(),
            entries: all.len(),
            sample: sample.len(),
            index_bytes,
            largest_list: largest,
        };
        if !centroids.is_empty() {
            inner.ivf = Some(Ivf {
                centroids,
                coarse,
                lists,
                list_len,
            });
        }
        Ok(summary)
    }

    /// Approximate top-k through the IVF index: the `nprobe` best lists of each query
    /// (centroids ranked by the exact kernels), then the exact top-k of the live entries of
    /// `tenant` in those lists (`topk_scan_lists` + `topk_merge`). `nprobe` is clamped to
    /// 1..=min(nlist, 16). Without an index this is the exact [`Store::top_k_batch`]; k > 16,
    /// or a device error (counted), takes the host path over the same lists.
    pub fn top_k_ivf(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        nprobe: usize,
        now_s: u32,
    ) -> Vec<Vec<Hit>> {
        if k == 0 || queries.is_empty() {
            return vec![Vec::new(); queries.len()];
        }
        let mut inner = self.lock();
        let Some(nlist) = inner.ivf.as_ref().map(|ivf| ivf.centroids.len()) else {
            drop(inner);
            return self.top_k_batch(tenant, queries, k, now_s);
        };
        let nprobe = nprobe.clamp(1, nlist.min(KMAX));
        let mut tops: Vec<TopK> = (0..queries.len()).map(|_| TopK::new(k)).collect();
        if k > KMAX {
            inner.host_ivf(tenant, queries, nprobe, &mut tops, now_s);
        } else if let Err(e) = inner.device_ivf(tenant, queries, k, nprobe, now_s, &mut tops) {
            inner.note(&e);
            tops = (0..queries.len()).map(|_| TopK::new(k)).collect();
            inner.host_ivf(tenant, queries, nprobe, &mut tops, now_s);
        }
        tops.into_iter().map(TopK::into_sorted).collect()
    }

    /// The IVF answer computed on the host from the same centroids and lists (the reference
    /// the device path must equal); `None` without an index.
    pub fn top_k_ivf_host(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        nprobe: usize,
        now_s: u32,
    ) -> Option<Vec<Vec<Hit>>> {
        let inner = self.lock();
        let nlist = inner.ivf.as_ref()?.centroids.len();
        let nprobe = nprobe.clamp(1, nlist.min(KMAX));
        let mut tops: Vec<TopK> = (0..queries.len()).map(|_| TopK::new(k)).collect();
        if k > 0 {
            inner.host_ivf(tenant, queries, nprobe, &mut tops, now_s);
        }
        Some(tops.into_iter().map(TopK::into_sorted).collect())
    }

    /// Mean share of the held entries a query's `nprobe` lists hold (the scanned fraction);
    /// `None` without an index.
    pub fn ivf_scanned_fraction(&self, queries: &[SketchBytes], nprobe: usize) -> Option<f64> {
        let inner = self.lock();
        let ivf = inner.ivf.as_ref()?;
        let nprobe = nprobe.clamp(1, ivf.centroids.len().min(KMAX));
        let total: usize = ivf.list_len.iter().flatten().sum();
        let mut sum = 0usize;
        for q in queries {
            for l in probe_lists(&ivf.centroids, q, nprobe) {
                sum += ivf
                    .list_len
                    .iter()
                    .map(|lens| lens[l as usize])
                    .sum::<usize>();
            }
        }
        Some(sum as f64 / (queries.len().max(1) * total.max(1)) as f64)
    }

    /// Every held entry (expired ones included), for tests.
    pub fn entries(&self) -> Vec<(u64, SketchBytes, EntryMeta)> {
        let inner = self.lock();
        let mut out = Vec::new();
        for shard in &inner.shards {
            for slot in 0..shard.len() {
                let (key, sketch, meta) = shard.entry(slot);
                out.push((key, *sketch, meta));
            }
        }
        out
    }
}

impl<B: Backend> Inner<B> {
    fn shard_mut(&mut self, key: u64) -> (usize, &mut MirrorShard) {
        let i = shard_of(key, self.shards.len());
        (i, &mut self.shards[i])
    }

    fn queue(&mut self, shard: usize, writes: Vec<SlotWrite>) {
        if writes.is_empty() {
            return;
        }
        let d = self.device_of[shard];
        self.devices[d].pending.extend(writes);
        if self.devices[d].pending.len() >= FLUSH_AT {
            if let Err(e) = self.flush(d) {
                self.note(&e);
            }
        }
    }

    fn note(&mut self, e: &DeviceError) {
        self.errors += 1;
        self.last_error = Some(e.to_string());
    }

    /// Send device `d`'s pending writes, the last write of each slot only.
    fn flush(&mut self, d: usize) -> Result<(), DeviceError> {
        let dev = &mut self.devices[d];
        if dev.pending.is_empty() {
            return Ok(());
        }
        let mut seen = HashSet::with_capacity(dev.pending.len());
        let mut writes: Vec<SlotWrite> = dev
            .pending
            .iter()
            .rev()
            .filter(|w| seen.insert(w.slot))
            .copied()
            .collect();
        writes.reverse();
        dev.pending.clear();
        dev.backend.scatter(&writes)
    }

    fn flush_all(&mut self) -> Result<(), DeviceError> {
        for d in 0..self.devices.len() {
            self.flush(d)?;
        }
        Ok(())
    }

    /// The entry in slot `slot` of device `d`, from the mirror.
    fn slot_entry(&self, d: usize, slot: u32) -> Option<(u64, &SketchBytes, EntryMeta)> {
        let owners = &self.devices[d].owners;
        let at = owners.partition_point(|&(base, _)| base <= slot);
        let (base, shard) = *owners.get(at.checked_sub(1)?)?;
        let shard = &self.shards[shard];
        let local = (slot - base) as usize;
        (local < shard.len()).then(|| shard.entry(local))
    }

    /// The hit of a device answer, with its metadata from the mirror.
    fn hit(&self, d: usize, raw: RawHit) -> Option<Hit> {
        let (key, _, meta) = self.slot_entry(d, raw.slot)?;
        (key == raw.key).then_some(Hit {
            key,
            score: raw.score,
            meta,
        })
    }

    /// Collect every device's answers to the launch in flight into `tops[from..]`.
    fn collect_into(&mut self, from: usize, tops: &mut [TopK]) -> Result<(), DeviceError> {
        for d in 0..self.devices.len() {
            let answers = self.devices[d].backend.collect_top_k()?;
            for (q, hits) in answers.into_iter().enumerate() {
                for raw in hits {
                    let hit = self.hit(d, raw).ok_or_else(|| {
                        DeviceError::Driver(format!(
                            "device slot {} does not match the mirror",
                            raw.slot
                        ))
                    })?;
                    tops[from + q].offer(hit);
                }
            }
        }
        Ok(())
    }

    /// The IVF device path: rank the centroids (exact kernels, k = nprobe), group the
    /// probes by list, scan those lists on every device, merge.
    fn device_ivf(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        nprobe: usize,
        now_s: u32,
        tops: &mut [TopK],
    ) -> Result<(), DeviceError> {
        self.flush_all()?;
        for chunk in (0..queries.len()).step_by(MAX_LAUNCH_QUERIES) {
            let qs = &queries[chunk..(chunk + MAX_LAUNCH_QUERIES).min(queries.len())];
            let Some(ivf) = self.ivf.as_mut() else {
                return Err(DeviceError::Driver("no IVF index".to_owned()));
            };
            ivf.coarse.submit_top_k(0, qs, nprobe, 0)?;
            let probes: Vec<Vec<u32>> = ivf
                .coarse
                .collect_top_k()?
                .into_iter()
                .map(|hits| hits.iter().map(|h| h.key as u32).collect())
                .collect();
            if probes.len() != qs.len() || probes.iter().any(|p| p.len() != nprobe) {
                return Err(DeviceError::Driver(
                    "the centroid ranking returned too few lists".to_owned(),
                ));
            }
            for d in 0..self.devices.len() {
                let Some(ivf) = self.ivf.as_ref() else {
                    return Err(DeviceError::Driver("no IVF index".to_owned()));
                };
                let items = plan_items(&probes, &ivf.list_len[d]);
                self.devices[d]
                    .backend
                    .submit_top_k_lists(tenant, qs, &items, k, nprobe, now_s)?;
            }
            self.collect_into(chunk, tops)?;
        }
        Ok(())
    }

    /// The IVF host path: the same probes and lists, scored from the mirror.
    fn host_ivf(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        nprobe: usize,
        tops: &mut [TopK],
        now_s: u32,
    ) {
        let Some(ivf) = self.ivf.as_ref() else {
            return;
        };
        for (query, top) in queries.iter().zip(tops.iter_mut()) {
            for l in probe_lists(&ivf.centroids, query, nprobe) {
                for (d, (off, slots)) in ivf.lists.iter().enumerate() {
                    let range = off[l as usize] as usize..off[l as usize + 1] as usize;
                    for &slot in &slots[range] {
                        if slot == NO_SLOT {
                            continue;
                        }
                        let Some((key, sketch, meta)) = self.slot_entry(d, slot) else {
                            continue;
                        };
                        if meta.tenant != tenant || !is_live(&meta, now_s) {
                            continue;
                        }
                        let score = cohort_batcher_core::store::dot(sketch, query);
                        top.offer(Hit { key, score, meta });
                    }
                }
            }
        }
    }

    fn device_top_k(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
        tops: &mut [TopK],
    ) -> Result<(), DeviceError> {
        self.flush_all()?;
        for chunk in (0..queries.len()).step_by(MAX_LAUNCH_QUERIES) {
            let qs = &queries[chunk..(chunk + MAX_LAUNCH_QUERIES).min(queries.len())];
            for dev in &mut self.devices {
                dev.backend.submit_top_k(tenant, qs, k, now_s)?;
            }
            self.collect_into(chunk, tops)?;
        }
        Ok(())
    }

    /// The host path (k > KMAX, or after a device error): a scan of the mirror.
    fn host_top_k(&self, tenant: u32, queries: &[SketchBytes], tops: &mut [TopK], now_s: u32) {
        for shard in &self.shards {
            for slot in 0..shard.len() {
                let (key, sketch, meta) = shard.entry(slot);
                if meta.tenant != tenant || !is_live(&meta, now_s) {
                    continue;
                }
                for (query, top) in queries.iter().zip(tops.iter_mut()) {
                    let score = cohort_batcher_core::store::dot(sketch, query);
                    if score >= top.floor() {
                        top.offer(Hit { key, score, meta });
                    }
                }
            }
        }
    }
}

impl<B: Backend> Store for GpuStore<B> {
    fn upsert(&self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32) {
        let mut inner = self.lock();
        let mut writes = Vec::new();
        let (i, shard) = inner.shard_mut(key);
        shard.upsert(key, sketch, meta, now_s, &mut writes);
        inner.queue(i, writes);
    }

    fn get(&self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)> {
        self.lock().shard_mut(key).1.get(key, now_s)
    }

    fn remove(&self, key: u64) -> bool {
        let mut inner = self.lock();
        let mut writes = Vec::new();
        let (i, shard) = inner.shard_mut(key);
        let held = shard.remove(key, &mut writes);
        inner.queue(i, writes);
        held
    }

    fn top_k_batch(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Vec<Vec<Hit>> {
        if k == 0 || queries.is_empty() {
            return vec![Vec::new(); queries.len()];
        }
        let mut inner = self.lock();
        let mut tops: Vec<TopK> = (0..queries.len()).map(|_| TopK::new(k)).collect();
        if k > KMAX {
            inner.host_top_k(tenant, queries, &mut tops, now_s);
        } else if let Err(e) = inner.device_top_k(tenant, queries, k, now_s, &mut tops) {
            inner.note(&e);
            tops = (0..queries.len()).map(|_| TopK::new(k)).collect();
            inner.host_top_k(tenant, queries, &mut tops, now_s);
        }
        tops.into_iter().map(TopK::into_sorted).collect()
    }

    fn expire(&self, now_s: u32) -> usize {
        let mut inner = self.lock();
        let mut dropped = 0;
        for i in 0..inner.shards.len() {
            let mut writes = Vec::new();
            dropped += inner.shards[i].expire(now_s, &mut writes);
            inner.queue(i, writes);
        }
        dropped
    }

    fn stats(&self) -> StoreStats {
        let inner = self.lock();
        let mut stats = StoreStats::default();
        for shard in &inner.shards {
            stats.entries += shard.len() as u64;
            stats.bytes += shard.bytes() as u64;
            stats.evictions += shard.evictions;
            stats.expirations += shard.expirations;
        }
        for dev in &inner.devices {
            stats.bytes += dev.backend.entry_bytes() + dev.backend.scratch_bytes();
        }
        stats
    }
}
