//! The fingerprint store on NVIDIA GPUs, behind the batcher core's `Store` trait.
//!
//! - [`layout`]: the device layout (48 bytes an entry) and launch plan, shared by the CUDA
//!   backend and its emulation;
//! - [`mirror`]: the host mirror of a shard (slots, metadata, the CPU store's eviction);
//! - [`store`]: [`GpuStore`], generic over a [`Backend`];
//! - [`emu`]: the kernels of `kernels/store.cu` executed lane by lane on the CPU;
//! - [`ivf`]: the approximate IVF path's host side (k-means, inverted lists, work items);
//! - `cuda` (feature `cuda`): the CUDA backend (cudarc, NVRTC at open, dynamic loading);
//! - `nvml` (feature `cuda`): the devices' utilisation through NVML, loaded at run time;
//! - [`open`]: choose the store (`cpu` | `gpu`), falling back to the CPU store with a reason;
//! - [`parity`]: the parity suite (GPU store against the CPU store) run by the tests and by
//!   `gpu-check`; [`bench`]: the benchmark `gpu-check` prints; [`rng`]: their deterministic
//!   generator.
//!
//! See docs/GPU-STORE.md.

pub mod backend;
pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod emu;
pub mod ivf;
pub mod layout;
pub mod mirror;
#[cfg(feature = "cuda")]
pub mod nvml;
pub mod open;
pub mod parity;
pub mod rng;
pub mod store;

pub use backend::{Backend, DeviceError};
pub use open::{open_store, GpuUtilization, OpenedStore, StoreKind};
pub use store::{GpuStore, IvfSummary};
