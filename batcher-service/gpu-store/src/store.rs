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
use crate::layout::{KMAX, MAX_LAUNCH_QUERIES};
use crate::mirror::MirrorShard;
use cohort_batcher_core::store::clock::shard_of;
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

struct Inner<B> {
    shards: Vec<MirrorShard>,
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

    /// The hit of a device answer, with its metadata from the mirror.
    fn hit(&self, d: usize, raw: RawHit) -> Option<Hit> {
        let owners = &self.devices[d].owners;
        let at = owners.partition_point(|&(base, _)| base <= raw.slot);
        let (base, shard) = *owners.get(at.checked_sub(1)?)?;
        let shard = &self.shards[shard];
        let local = (raw.slot - base) as usize;
        if local >= shard.len() {
            return None;
        }
        let (key, _, meta) = shard.entry(local);
        (key == raw.key).then_some(Hit {
            key,
            score: raw.score,
            meta,
        })
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
                        tops[chunk + q].offer(hit);
                    }
                }
            }
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

    fn top_k(&self, tenant: u32, query: &SketchBytes, k: usize, now_s: u32) -> Vec<Hit> {
        self.top_k_batch(tenant, std::slice::from_ref(query), k, now_s)
            .pop()
            .unwrap_or_default()
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
