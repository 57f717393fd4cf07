//! `cohort engine-sim serve`, the OpenAI-compatible engine simulator (docs/ENGINE-SIM.md), as
//! one engine pod: one replica on a given loopback address and port, so DNS can name several
//! pods on one port by address. Answers chat completions with a simulated prefix cache
//! (`x-sim-cached-tokens` on every response) and `/health`, as an engine's probe expects.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running simulated engine; stopped when dropped.
pub struct EngineSim {
    child: Child,
    dir: PathBuf,
    pub ip: Ipv4Addr,
    pub port: u16,
}

impl EngineSim {
    /// One replica at `ip:port`, `time_scale` × its calibrated durations; `Err` (with its
    /// log) when it could not bind.
    pub fn start_at(ip: Ipv4Addr, port: u16, time_scale: f64) -> Result<EngineSim, String> {
        let dir = std::env::temp_dir().join(format!(
            "cohort-engine-sim-{}-{ip}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ports_file = dir.join("ports.json");
        let log = dir.join("engine-sim.log");
        let child = Command::new(crate::batcher::binary())
            .args(["engine-sim", "serve", "--replicas", "1"])
            .args(["--host", &ip.to_string(), "--base-port", &port.to_string()])
            .arg("--ports-file")
            .arg(&ports_file)
            .args(["--time-scale", &time_scale.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("start cohort engine-sim: {e}"))?;
        let mut sim = EngineSim {
            child,
            dir,
            ip,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ports_file.exists() {
                return Ok(sim);
            }
            if let Ok(Some(status)) = sim.child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "engine-sim at {ip}:{port} exited with {status}: {text}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("engine-sim at {ip}:{port} not listening in 10 s");
    }

    /// `ip:port`, as an endpoint.
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }
}

impl Drop for EngineSim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `cohort engine-sim serve --replicas N` on loopback with more arguments (a cache size,
/// `--kv-events-port`), its replicas' ports read from its ports file; stopped when dropped.
pub struct SimFleet {
    child: Child,
    dir: PathBuf,
    /// Replica i's HTTP port.
    pub ports: Vec<u16>,
}

impl SimFleet {
    /// `replicas` replicas on free ports with `args` after the fleet's own.
    pub fn start(replicas: usize, args: &[String]) -> Result<SimFleet, String> {
        let dir = std::env::temp_dir().join(format!(
            "cohort-sim-fleet-{}-{}",
            std::process::id(),
            crate::free_port()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ports_file = dir.join("ports.json");
        let log = dir.join("engine-sim.log");
        let child = Command::new(crate::batcher::binary())
            .args(["engine-sim", "serve", "--replicas", &replicas.to_string()])
            .arg("--ports-file")
            .arg(&ports_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("start cohort engine-sim: {e}"))?;
        let mut fleet = SimFleet {
            child,
            dir,
            ports: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(text) = std::fs::read_to_string(&ports_file) {
                if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
                    fleet.ports = value["ports"]
                        .as_array()
                        .map(|p| {
                            p.iter()
                                .filter_map(|p| p.as_u64())
                                .map(|p| p as u16)
                                .collect()
                        })
                        .unwrap_or_default();
                    return Ok(fleet);
                }
            }
            if let Ok(Some(status)) = fleet.child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("engine-sim exited with {status}: {text}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("engine-sim fleet not listening in 10 s".into())
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
