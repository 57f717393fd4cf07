//! GPU utilisation through NVML, for the `cohort_gpu_utilization` gauge.
//!
//! NVML (`libnvidia-ml.so.1`, installed with the driver) is loaded at run time, like the
//! CUDA libraries, so the binary builds and starts without it. It is opened only when the
//! GPU store opened; without a GPU the gauge is absent (not zero), so a dashboard or an
//! alert cannot mistake "no GPU" for "idle GPU".
//!
//! Devices are NVML's, by index: inside a container or a Kubernetes pod NVML sees the GPUs
//! given to it, which are the ones the store uses. (On a host with more GPUs than
//! `CUDA_VISIBLE_DEVICES` names, NVML reports them all.)

// NVML is a C library loaded at run time: calling it is unsafe (each call commented).
#![allow(unsafe_code)]

use libloading::Library;
use std::ffi::c_void;

type Device = *mut c_void;

/// `nvmlUtilization_t`: percentages over the driver's last sample period.
#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: u32,
    memory: u32,
}

type Init = unsafe extern "C" fn() -> i32;
type Count = unsafe extern "C" fn(*mut u32) -> i32;
type Handle = unsafe extern "C" fn(u32, *mut Device) -> i32;
type Rates = unsafe extern "C" fn(Device, *mut Utilization) -> i32;

/// NVML, initialised, with a handle per device.
pub struct Nvml {
    rates: Rates,
    devices: Vec<Device>,
    /// Keeps the library (and so `rates`) loaded.
    _library: Library,
}

// SAFETY: NVML is thread-safe (its documentation: all functions may be called from any
// thread); device handles are plain identifiers valid until `nvmlShutdown`, which is never
// called while the `Nvml` lives.
unsafe impl Send for Nvml {}
// SAFETY: as above; `&Nvml` only reads the handles and calls thread-safe functions.
unsafe impl Sync for Nvml {}

const NVML_SUCCESS: i32 = 0;

impl Nvml {
    /// Loads NVML and opens every device it sees; `Err` says why not.
    pub fn open() -> Result<Nvml, String> {
        // SAFETY: loading the driver's NVML runs its initialisers, which have no
        // preconditions.
        let library = unsafe { Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("NVML not loaded: {e}"))?;
        // SAFETY: the symbols are NVML's C functions with these signatures (nvml.h).
        let (init, count, handle, rates) = unsafe {
            let symbol = |name: &[u8]| format!("NVML lacks {}", String::from_utf8_lossy(name));
            (
                *library
                    .get::<Init>(b"nvmlInit_v2")
                    .map_err(|_| symbol(b"nvmlInit_v2"))?,
                *library
                    .get::<Count>(b"nvmlDeviceGetCount_v2")
                    .map_err(|_| symbol(b"nvmlDeviceGetCount_v2"))?,
                *library
                    .get::<Handle>(b"nvmlDeviceGetHandleByIndex_v2")
                    .map_err(|_| symbol(b"nvmlDeviceGetHandleByIndex_v2"))?,
                *library
                    .get::<Rates>(b"nvmlDeviceGetUtilizationRates")
                    .map_err(|_| symbol(b"nvmlDeviceGetUtilizationRates"))?,
            )
        };
        // SAFETY: nvmlInit_v2 takes no arguments and may be called more than once.
        let status = unsafe { init() };
        if status != NVML_SUCCESS {
            return Err(format!("nvmlInit_v2 failed ({status})"));
        }
        let mut n = 0u32;
        // SAFETY: `n` is a valid out-pointer for the call's duration.
        let status = unsafe { count(&mut n) };
        if status != NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2 failed ({status})"));
        }
        let mut devices = Vec::with_capacity(n as usize);
        for index in 0..n {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: `device` is a valid out-pointer; `index` is below the count.
            let status = unsafe { handle(index, &mut device) };
            if status != NVML_SUCCESS {
                return Err(format!("no NVML handle for device {index} ({status})"));
            }
            devices.push(device);
        }
        Ok(Nvml {
            rates,
            devices,
            _library: library,
        })
    }

    /// Each device's utilisation (0–1) over the driver's last sample period, by NVML index;
    /// a device whose reading fails is left out.
    pub fn utilization(&self) -> Vec<(usize, f64)> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(i, &device)| {
                let mut rates = Utilization::default();
                // SAFETY: `device` came from nvmlDeviceGetHandleByIndex_v2 and NVML is
                // still initialised; `rates` is a valid out-pointer.
                let status = unsafe { (self.rates)(device, &mut rates) };
                (status == NVML_SUCCESS).then(|| (i, f64::from(rates.gpu.min(100)) / 100.0))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_it_says_why() {
        match Nvml::open() {
            Ok(nvml) => {
                // A GPU machine: every reading is a share.
                for (_, u) in nvml.utilization() {
                    assert!((0.0..=1.0).contains(&u));
                }
            }
            Err(why) => assert!(why.contains("NVML"), "{why}"),
        }
    }
}
