//! What a device does for the store, as a trait: the CUDA backend (`cuda.rs`) and its
//! lane-by-lane CPU emulation (`emu.rs`) implement it, so the whole `GpuStore` (mirror,
//! scatter, scan, merge) runs in the CPU tests and on the GPU alike.

use cohort_batcher_core::store::SketchBytes;
use thiserror::Error;

/// One slot written on a device: an insert, an update, a move, or a clear (`expires` 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotWrite {
    pub slot: u32,
    pub key: u64,
    pub words: [u32; crate::layout::WORDS],
    pub tenant: u32,
    pub expires: u32,
}

/// One device hit: the slot (to find the metadata in the mirror), key and score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHit {
    pub slot: u32,
    pub key: u64,
    pub score: i32,
}

/// Why a device could not be opened or used.
#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("no CUDA driver (libcuda) could be loaded")]
    NoDriver,
    #[error("no NVRTC library (libnvrtc) could be loaded")]
    NoNvrtc,
    #[error("no CUDA device is visible")]
    NoDevice,
    #[error("CUDA driver error: {0}")]
    Driver(String),
    #[error("NVRTC could not compile kernels/store.cu: {0}")]
    Compile(String),
    #[error("opening the device panicked: {0}")]
    Panicked(String),
    #[error("built without the `cuda` feature")]
    NotBuilt,
}

/// A device holding `slots()` entry slots.
pub trait Backend: Send {
    /// Entry slots allocated on the device (a multiple of [`crate::layout::ROWS`]).
    fn slots(&self) -> usize;
    /// Apply writes; each slot appears at most once.
    fn scatter(&mut self, writes: &[SlotWrite]) -> Result<(), DeviceError>;
    /// Start the exact top-k (1 ≤ k ≤ [`crate::layout::KMAX`]) of each query among the live
    /// entries of `tenant`; at most [`crate::layout::MAX_LAUNCH_QUERIES`] queries.
    fn submit_top_k(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Result<(), DeviceError>;
    /// The answers of the last submit, best first.
    fn collect_top_k(&mut self) -> Result<Vec<Vec<RawHit>>, DeviceError>;
    /// Device memory held: the entry arrays (what scales with entries).
    fn entry_bytes(&self) -> u64;
    /// Device memory held for launches (queries, per-part lists); not per entry.
    fn scratch_bytes(&self) -> u64;
    /// The device, for logs and the benchmark table.
    fn describe(&self) -> String;
    /// Another backend on the same device with room for `slots` entries (the IVF index
    /// keeps its centroids in one, scored by the exact kernels).
    fn open_like(&self, slots: usize) -> Result<Self, DeviceError>
    where
        Self: Sized;
    /// Hold the inverted lists (`crate::ivf::pack_lists`: offsets, slots padded to tiles),
    /// replacing any before; empty slices drop them.
    fn set_lists(&mut self, list_off: &[u32], list_slots: &[u32]) -> Result<(), DeviceError>;
    /// Start the top-k of each query among the live entries of `tenant` in the lists it
    /// probes (`items`: every (query, rank < nprobe) once); answers by `collect_top_k`.
    fn submit_top_k_lists(
        &mut self,
        tenant: u32,
        queries: &[SketchBytes],
        items: &crate::ivf::ListItems,
        k: usize,
        nprobe: usize,
        now_s: u32,
    ) -> Result<(), DeviceError>;
    /// Device memory held by the inverted lists.
    fn index_bytes(&self) -> u64;
}
