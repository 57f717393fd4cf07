//! The CUDA backend: one `CudaDevice` per visible GPU, kernels from `kernels/store.cu`
//! compiled by NVRTC when the device opens (for `compute_90` on Hopper and later, else
//! `compute_80`: `mma.sync` int8 needs 8.0), launched through cudarc on one stream.
//!
//! cudarc is built with `dynamic-loading`: libcuda and libnvrtc are opened on first use, so
//! the binary builds and starts on machines without them. [`probe`] checks both libraries
//! with `is_culib_present` before any other cudarc call (a missing library would otherwise
//! panic inside cudarc), and [`open`] runs the whole opening under `catch_unwind`.

// Kernel launches and the driver-presence checks are unsafe cudarc calls (each commented).
#![allow(unsafe_code)]

use crate::backend::{Backend, DeviceError, RawHit, SlotWrite};
use crate::ivf::ListItems;
use crate::layout::{
    pack_queries, padded_slots, plan_scan, ScanPlan, DEVICE_BYTES_PER_ENTRY, NO_SLOT, ROWS, WARPS,
    WORDS,
};
use crate::store::GpuStore;
use cohort_batcher_core::store::{CpuStoreConfig, SketchBytes};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::sync::{Arc, Mutex};

/// The kernels' source, embedded at build time.
pub const SOURCE: &str = include_str!("../../../kernels/store.cu");

fn driver(e: DriverError) -> DeviceError {
    DeviceError::Driver(format!("{e:?}"))
}

/// Number of visible CUDA devices, after checking that libcuda and libnvrtc load.
pub fn probe() -> Result<usize, DeviceError> {
    // SAFETY: these only try to dlopen the libraries; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(DeviceError::NoDriver);
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(DeviceError::NoNvrtc);
    }
    let n = catch(|| CudaContext::device_count().map_err(driver))?;
    match usize::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(DeviceError::NoDevice),
    }
}

fn catch<T>(f: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(DeviceError::Panicked(msg))
    })
}

/// A GPU store over every visible device (probe first; panics become errors).
pub fn open(config: CpuStoreConfig) -> Result<GpuStore<CudaDevice>, DeviceError> {
    let devices = probe()?;
    catch(|| GpuStore::new(config, devices, CudaDevice::open))
}

/// `kernels/store.cu` compiled for `arch`, once a process (stores opened later reuse it).
fn compiled(arch: &'static str) -> Result<Ptx, DeviceError> {
    static CACHE: Mutex<Vec<(&'static str, Ptx)>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, ptx)) = cache.iter().find(|(a, _)| *a == arch) {
        return Ok(ptx.clone());
    }
    let ptx = compile_ptx_with_opts(
        SOURCE,
        CompileOptions {
            arch: Some(arch),
            name: Some("store.cu".to_owned()),
            ..CompileOptions::default()
        },
    )
    .map_err(|e| DeviceError::Compile(e.to_string()))?;
    cache.push((arch, ptx.clone()));
    Ok(ptx)
}

/// Scratch buffers of launches, grown on demand.
struct Scratch {
    queries: CudaSlice<u32>,
    part_s: CudaSlice<i32>,
    part_k: CudaSlice<u64>,
    part_slot: CudaSlice<u32>,
    out_s: CudaSlice<i32>,
    out_k: CudaSlice<u64>,
    out_slot: CudaSlice<u32>,
    w_slots: CudaSlice<u32>,
    w_words: CudaSlice<u32>,
    w_keys: CudaSlice<u64>,
    w_tenants: CudaSlice<u32>,
    w_expires: CudaSlice<u32>,
    item_list: CudaSlice<u32>,
    item_q: CudaSlice<u32>,
    item_p: CudaSlice<u32>,
}

/// One GPU.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    sms: usize,
    stream: Arc<CudaStream>,
    scatter_fn: CudaFunction,
    scan_fn: CudaFunction,
    merge_fn: CudaFunction,
    lists_fn: CudaFunction,
    tiles: CudaSlice<u32>,
    keys: CudaSlice<u64>,
    tenants: CudaSlice<u32>,
    expires: CudaSlice<u32>,
    slots: usize,
    /// The inverted lists (`ivf::pack_lists`); `lists` is 0 without an index.
    list_off: CudaSlice<u32>,
    list_slots: CudaSlice<u32>,
    lists: usize,
    scratch: Scratch,
    /// (queries, k) of the launch in flight.
    pending: Option<(usize, usize)>,
}

fn grow<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    len: usize,
) -> Result<(), DeviceError> {
    if buf.len() < len {
        *buf = stream
            .alloc_zeros::<T>(len.next_power_of_two())
            .map_err(driver)?;
    }
    Ok(())
}

impl CudaDevice {
    /// Open device `ordinal` with room for `slots` entries: compile and load the kernels,
    /// allocate the entry arrays (zero: every slot empty).
    pub fn open(ordinal: usize, slots: usize) -> Result<CudaDevice, DeviceError> {
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        if major < 8 {
            return Err(DeviceError::Driver(format!(
                "device {ordinal} has compute capability {major}.{minor}; int8 mma.sync needs 8.0"
            )));
        }
        let arch = if major >= 9 {
            "compute_90"
        } else {
            "compute_80"
        };
        let module = ctx.load_module(compiled(arch)?).map_err(driver)?;
        let f = |name: &str| module.load_function(name).map_err(driver);
        let (scatter_fn, scan_fn, merge_fn, lists_fn) = (
            f("store_scatter")?,
            f("topk_scan")?,
            f("topk_merge")?,
            f("topk_scan_lists")?,
        );
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver)? as usize;
        let name = ctx.name().map_err(driver)?;
        let stream = ctx.new_stream().map_err(driver)?;
        let slots = padded_slots(slots);
        let z32 = |n: usize| stream.alloc_zeros::<u32>(n.max(1)).map_err(driver);
        let scratch = Scratch {
            queries: z32(1)?,
            part_s: stream.alloc_zeros::<i32>(1).map_err(driver)?,
            part_k: stream.alloc_zeros::<u64>(1).map_err(driver)?,
            part_slot: z32(1)?,
            out_s: stream.alloc_zeros::<i32>(1).map_err(driver)?,
            out_k: stream.alloc_zeros::<u64>(1).map_err(driver)?,
            out_slot: z32(1)?,
            w_slots: z32(1)?,
            w_words: z32(1)?,
            w_keys: stream.alloc_zeros::<u64>(1).map_err(driver)?,
            w_tenants: z32(1)?,
            w_expires: z32(1)?,
            item_list: z32(1)?,
            item_q: z32(1)?,
            item_p: z32(1)?,
        };
        Ok(CudaDevice {
            ordinal,
            name,
            sms,
            tiles: z32(slots * WORDS)?,
            keys: stream.alloc_zeros::<u64>(slots).map_err(driver)?,
            tenants: z32(slots)?,
            expires: z32(slots)?,
            slots,
            list_off: z32(1)?,
            list_slots: z32(1)?,
            lists: 0,
            scratch,
            pending: None,
            scatter_fn,
            scan_fn,
            merge_fn,
            lists_fn,
            stream,
        })
    }

    fn n_tiles(&self) -> usize {
        self.slots / ROWS
    }

    fn plan(&self, queries: usize) -> ScanPlan {
        plan_scan(self.n_tiles(), queries, self.sms)
    }

    /// `topk_merge` of the per-part lists in scratch (`parts` × k a query) into the outputs.
    fn launch_merge(&mut self, parts: usize, nq: usize, k: usize) -> Result<(), DeviceError> {
        let (parts32, nq32, k32) = (u32_of(parts)?, u32_of(nq)?, u32_of(k)?);
        let s = &mut self.scratch;
        let mut b = self.stream.launch_builder(&self.merge_fn);
        b.arg(&s.part_s)
            .arg(&s.part_k)
            .arg(&s.part_slot)
            .arg(&parts32)
            .arg(&nq32)
            .arg(&k32)
            .arg(&mut s.out_s)
            .arg(&mut s.out_k)
            .arg(&mut s.out_slot);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(nq.div_ceil(8))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match topk_merge; the partial buffers hold nq * parts * k and
        // the outputs nq * k (grown by the caller).
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }
}

/// Copy `host` into `buf` (grown as needed) on `st`.
fn upload(st: &Arc<CudaStream>, buf: &mut CudaSlice<u32>, host: &[u32]) -> Result<(), DeviceError> {
    grow(st, buf, host.len().max(1))?;
    if !host.is_empty() {
        st.memcpy_htod(host, &mut buf.slice_mut(0..host.len()))
            .map_err(driver)?;
    }
    Ok(())
}

fn u32_of(n: usize) -> Result<u32, DeviceError> {
    u32::try_from(n).map_err(|_| DeviceError::Driver(format!("{n} does not fit a launch")))
}

impl Backend for CudaDevice {
    fn slots(&self) -> usize {
        self.slots
    }

    fn scatter(&mut self, writes: &[SlotWrite]) -> Result<(), DeviceError> {
        let n = writes.len();
        if n == 0 {
            return Ok(());
        }
        let slots: Vec<u32> = writes.iter().map(|w| w.slot).collect();
        let words: Vec<u32> = writes.iter().flat_map(|w| w.words).collect();
        let keys: Vec<u64> = writes.iter().map(|w| w.key).collect();
        let tenants: Vec<u32> = writes.iter().map(|w| w.tenant).collect();
        let expires: Vec<u32> = writes.iter().map(|w| w.expires).collect();
        let s = &mut self.scratch;
        let st = &self.stream;
        grow(st, &mut s.w_slots, n)?;
        grow(st, &mut s.w_words, n * WORDS)?;
        grow(st, &mut s.w_keys, n)?;
        grow(st, &mut s.w_tenants, n)?;
        grow(st, &mut s.w_expires, n)?;
        st.memcpy_htod(&slots, &mut s.w_slots.slice_mut(0..n))
            .map_err(driver)?;
        st.memcpy_htod(&words, &mut s.w_words.slice_mut(0..n * WORDS))
            .map_err(driver)?;
        st.memcpy_htod(&keys, &mut s.w_keys.slice_mut(0..n))
            .map_err(driver)?;
        st.memcpy_htod(&tenants, &mut s.w_tenants.slice_mut(0..n))
            .map_err(driver)?;
        st.memcpy_htod(&expires, &mut s.w_expires.slice_mut(0..n))
            .map_err(driver)?;
        let n32 = u32_of(n)?;
        let mut b = st.launch_builder(&self.scatter_fn);
        b.arg(&s.w_slots)
            .arg(&s.w_words)
            .arg(&s.w_keys)
            .arg(&s.w_tenants)
            .arg(&s.w_expires)
            .arg(&n32)
            .arg(&mut self.tiles)
            .arg(&mut self.keys)
            .arg(&mut self.tenants)
            .arg(&mut self.expires);
        let cfg = LaunchConfig {
            grid_dim: (u32_of(n.div_ceil(256))?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match store_scatter's signature; every slot < self.slots
        // (the mirror only writes its own ranges) and each appears once.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }

    fn submit_top_k(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Result<(), DeviceError> {
        let nq = queries.len();
        let plan = self.plan(nq);
        let words = pack_queries(queries);
        let parts = plan.parts;
        let (n_tiles, part_tiles) = (u32_of(self.n_tiles())?, u32_of(plan.part_tiles)?);
        let s = &mut self.scratch;
        let st = &self.stream;
        grow(st, &mut s.queries, words.len())?;
        grow(st, &mut s.part_s, nq * parts * k)?;
        grow(st, &mut s.part_k, nq * parts * k)?;
        grow(st, &mut s.part_slot, nq * parts * k)?;
        grow(st, &mut s.out_s, nq * k)?;
        grow(st, &mut s.out_k, nq * k)?;
        grow(st, &mut s.out_slot, nq * k)?;
        st.memcpy_htod(&words, &mut s.queries.slice_mut(0..words.len()))
            .map_err(driver)?;
        let (nq32, k32, parts32) = (u32_of(nq)?, u32_of(k)?, u32_of(parts)?);
        let mut b = st.launch_builder(&self.scan_fn);
        b.arg(&self.tiles)
            .arg(&self.keys)
            .arg(&self.tenants)
            .arg(&self.expires)
            .arg(&n_tiles)
            .arg(&part_tiles)
            .arg(&s.queries)
            .arg(&nq32)
            .arg(&tenant)
            .arg(&now_s)
            .arg(&k32)
            .arg(&mut s.part_s)
            .arg(&mut s.part_k)
            .arg(&mut s.part_slot);
        let cfg = LaunchConfig {
            grid_dim: (parts32, u32_of(plan.query_blocks)?, 1),
            block_dim: (u32_of(WARPS * 32)?, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match topk_scan; the query words are padded to WARP_Q queries
        // and the partial buffers hold nq * parts * k.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        self.launch_merge(parts, nq, k)?;
        // `words` is pageable host memory: the copy has staged it before returning, so it
        // may be freed while the kernels run.
        self.pending = Some((nq, k));
        Ok(())
    }

    fn collect_top_k(&mut self) -> Result<Vec<Vec<RawHit>>, DeviceError> {
        let Some((nq, k)) = self.pending.take() else {
            return Ok(Vec::new());
        };
        let st = &self.stream;
        let n = nq * k;
        let mut s = vec![0i32; n];
        let mut keys = vec![0u64; n];
        let mut slots = vec![0u32; n];
        st.memcpy_dtoh(&self.scratch.out_s.slice(0..n), &mut s)
            .map_err(driver)?;
        st.memcpy_dtoh(&self.scratch.out_k.slice(0..n), &mut keys)
            .map_err(driver)?;
        st.memcpy_dtoh(&self.scratch.out_slot.slice(0..n), &mut slots)
            .map_err(driver)?;
        st.synchronize().map_err(driver)?;
        Ok((0..nq)
            .map(|q| {
                (q * k..(q + 1) * k)
                    .filter(|&i| slots[i] != NO_SLOT)
                    .map(|i| RawHit {
                        slot: slots[i],
                        key: keys[i],
                        score: s[i],
                    })
                    .collect()
            })
            .collect())
    }

    fn entry_bytes(&self) -> u64 {
        (self.slots * DEVICE_BYTES_PER_ENTRY) as u64
    }

    fn scratch_bytes(&self) -> u64 {
        let s = &self.scratch;
        (s.queries.num_bytes()
            + s.part_s.num_bytes()
            + s.part_k.num_bytes()
            + s.part_slot.num_bytes()
            + s.out_s.num_bytes()
            + s.out_k.num_bytes()
            + s.out_slot.num_bytes()
            + s.w_slots.num_bytes()
            + s.w_words.num_bytes()
            + s.w_keys.num_bytes()
            + s.w_tenants.num_bytes()
            + s.w_expires.num_bytes()
            + s.item_list.num_bytes()
            + s.item_q.num_bytes()
            + s.item_p.num_bytes()) as u64
    }

    fn open_like(&self, slots: usize) -> Result<CudaDevice, DeviceError> {
        CudaDevice::open(self.ordinal, slots)
    }

    fn set_lists(&mut self, list_off: &[u32], list_slots: &[u32]) -> Result<(), DeviceError> {
        if list_slots
            .iter()
            .any(|&e| e != NO_SLOT && e as usize >= self.slots)
        {
            return Err(DeviceError::Driver(
                "a list slot is out of range".to_owned(),
            ));
        }
        // Exact sizes (not grown), so that index_bytes is what the lists take.
        let exact = |host: &[u32]| -> Result<CudaSlice<u32>, DeviceError> {
            let mut buf = self
                .stream
                .alloc_zeros::<u32>(host.len().max(1))
                .map_err(driver)?;
            upload(&self.stream, &mut buf, host)?;
            Ok(buf)
        };
        self.list_off = exact(list_off)?;
        self.list_slots = exact(list_slots)?;
        self.lists = list_off.len().saturating_sub(1);
        Ok(())
    }

    fn submit_top_k_lists(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        items: &ListItems,
        k: usize,
        nprobe: usize,
        now_s: u32,
    ) -> Result<(), DeviceError> {
        let nq = queries.len();
        let n_items = items.list.len();
        if self.lists == 0 || items.list.iter().any(|&l| l as usize >= self.lists) {
            return Err(DeviceError::Driver(
                "no inverted lists for this launch".to_owned(),
            ));
        }
        let words = pack_queries(queries);
        let st = &self.stream;
        let s = &mut self.scratch;
        upload(st, &mut s.queries, &words)?;
        upload(st, &mut s.item_list, &items.list)?;
        upload(st, &mut s.item_q, &items.q)?;
        upload(st, &mut s.item_p, &items.p)?;
        grow(st, &mut s.part_s, nq * nprobe * k)?;
        grow(st, &mut s.part_k, nq * nprobe * k)?;
        grow(st, &mut s.part_slot, nq * nprobe * k)?;
        grow(st, &mut s.out_s, nq * k)?;
        grow(st, &mut s.out_k, nq * k)?;
        grow(st, &mut s.out_slot, nq * k)?;
        let (n_items32, nprobe32, k32) = (u32_of(n_items)?, u32_of(nprobe)?, u32_of(k)?);
        if n_items > 0 {
            let mut b = st.launch_builder(&self.lists_fn);
            b.arg(&self.tiles)
                .arg(&self.keys)
                .arg(&self.tenants)
                .arg(&self.expires)
                .arg(&self.list_off)
                .arg(&self.list_slots)
                .arg(&s.item_list)
                .arg(&s.item_q)
                .arg(&s.item_p)
                .arg(&n_items32)
                .arg(&s.queries)
                .arg(&nprobe32)
                .arg(&tenant)
                .arg(&now_s)
                .arg(&k32)
                .arg(&mut s.part_s)
                .arg(&mut s.part_k)
                .arg(&mut s.part_slot);
            let cfg = LaunchConfig {
                grid_dim: (u32_of(n_items.div_ceil(WARPS))?, 1, 1),
                block_dim: (u32_of(WARPS * 32)?, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match topk_scan_lists; every list index < lists (checked),
            // every list slot < slots (checked in set_lists), items hold 32 entries each and
            // cover every (query, rank < nprobe) once, so the partial buffers (nq * nprobe *
            // k) are written in full.
            unsafe { b.launch(cfg) }.map_err(driver)?;
        }
        self.launch_merge(nprobe, nq, k)?;
        self.pending = Some((nq, k));
        Ok(())
    }

    fn index_bytes(&self) -> u64 {
        if self.lists == 0 {
            return 0;
        }
        (self.list_off.num_bytes() + self.list_slots.num_bytes()) as u64
    }

    fn describe(&self) -> String {
        format!(
            "GPU {} ({}, {} SMs, {} slots)",
            self.ordinal, self.name, self.sms, self.slots
        )
    }
}
