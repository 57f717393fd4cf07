//! Choosing the store at start-up: `cpu`, or `gpu` when this binary has the CUDA backend and
//! a driver, a device and NVRTC are there; otherwise the CPU store, with the reason for one
//! log line.

use crate::backend::DeviceError;
use cohort_batcher_core::store::{CpuStore, CpuStoreConfig, Store};

/// The store asked for (`store.backend`, `--store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Cpu,
    Gpu,
}

impl std::str::FromStr for StoreKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(StoreKind::Cpu),
            "gpu" => Ok(StoreKind::Gpu),
            other => Err(format!("unknown store `{other}` (cpu | gpu)")),
        }
    }
}

/// Reads each GPU's utilisation (0–1) by device index: the `cohort_gpu_utilization` gauge.
pub type GpuUtilization = Box<dyn Fn() -> Vec<(usize, f64)> + Send + Sync>;

/// The store opened, what it is, and why it is not the one asked for (if so).
pub struct OpenedStore {
    pub store: Box<dyn Store>,
    /// "cpu" or a description of the devices.
    pub description: String,
    /// Set when `gpu` was asked for and the CPU store is used instead.
    pub fallback: Option<DeviceError>,
    /// The GPU store's devices' utilisation (NVML); `None` on the CPU store, or with the
    /// reason NVML could not be opened in `utilization_unavailable`.
    pub utilization: Option<GpuUtilization>,
    pub utilization_unavailable: Option<String>,
}

/// Open the store of `kind` with `config` (capacity and logical shards).
pub fn open_store(kind: StoreKind, config: CpuStoreConfig) -> OpenedStore {
    let cpu = |fallback| OpenedStore {
        store: Box::new(CpuStore::new(config)),
        description: "cpu".to_owned(),
        fallback,
        utilization: None,
        utilization_unavailable: None,
    };
    match kind {
        StoreKind::Cpu => cpu(None),
        StoreKind::Gpu => match open_gpu(config) {
            Ok(opened) => opened,
            Err(e) => cpu(Some(e)),
        },
    }
}

#[cfg(feature = "cuda")]
fn open_gpu(config: CpuStoreConfig) -> Result<OpenedStore, DeviceError> {
    let store = crate::cuda::open(config)?;
    let description = store.describe().join(", ");
    let (utilization, utilization_unavailable) = match crate::nvml::Nvml::open() {
        Ok(nvml) => (
            Some(Box::new(move || nvml.utilization()) as GpuUtilization),
            None,
        ),
        Err(why) => (None, Some(why)),
    };
    Ok(OpenedStore {
        store: Box::new(store),
        description,
        fallback: None,
        utilization,
        utilization_unavailable,
    })
}

#[cfg(not(feature = "cuda"))]
fn open_gpu(_config: CpuStoreConfig) -> Result<OpenedStore, DeviceError> {
    Err(DeviceError::NotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_without_a_device_falls_back_to_cpu() {
        let opened = open_store(StoreKind::Gpu, CpuStoreConfig::default());
        if opened.fallback.is_none() {
            eprintln!("a GPU store opened here: {}", opened.description);
            return;
        }
        assert_eq!(opened.description, "cpu");
        // No GPU store, no utilisation gauge (absent, not zero).
        assert!(opened.utilization.is_none());
        assert_eq!(opened.store.stats().entries, 0);
        assert!("tpu".parse::<StoreKind>().is_err());
    }
}
