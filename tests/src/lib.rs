//! Harness for Cohort's cross-component tests: real Envoy processes running the real
//! filter, recording upstream HTTP servers on loopback, and the repository's Envoy configs
//! adapted to free ports.
//!
//! - [`envoy`]: start Envoy from the pinned wheel (`.cohort/bin/envoy`) with
//!   `--use-dynamic-base-id`, wait until ready, read admin stats, stop it by pid;
//! - [`upstream`]: HTTP/1.1 and HTTP/2 servers that record every request they receive;
//! - [`batcher`]: start `cohort serve`, read its `/metrics`, SIGTERM or SIGKILL it;
//! - [`engine_sim`]: `cohort engine-sim` as one engine pod on a loopback address;
//! - [`chromium`]: headless Chromium over the DevTools protocol, for the inspector page;
//! - [`llama`]: a real llama.cpp `llama-server` replica (Gemma 3 270M);
//! - [`dns`]: a real DNS server (dnsmasq) serving a headless Service's A and SRV records;
//! - [`config`]: load `istio/envoy/*.yaml` and point it at test ports and the built filter;
//! - [`client`]: a minimal HTTP/1.1 client over a raw socket, so tests control every byte;
//! - [`h2`]: an HTTP/2 cleartext (prior knowledge) client with raw header values and paced bodies.
//! - [`manifests`]: the Istio overlays as real kustomize renders them, and what ships inside;
//! - [`load`]: closed-loop load with a unique id per request, outcomes kept for windows;
//! - [`procstat`]: a process's RSS and open file descriptors from `/proc`;
//! - [`prometheus`]: a real Prometheus scraping the test's targets every second, and its API;
//! - [`stack`]: Envoy, `cohort serve` and the engines behind them, built in one place.

pub mod batcher;
pub mod chromium;
pub mod client;
pub mod config;
pub mod dns;
pub mod engine_sim;
pub mod envoy;
pub mod h2;
pub mod llama;
pub mod load;
pub mod manifests;
pub mod procstat;
pub mod prometheus;
pub mod stack;
pub mod upstream;

use std::path::PathBuf;

/// The repository root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The first value of header `name` (lowercase) in a list of (name, value) pairs.
pub fn header_value<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A TCP port free on loopback at the time of the call, for a server a test starts.
///
/// Taken from below the kernel's ephemeral range (`ip_local_port_range`), never from
/// `bind(0)`: ephemeral ports are also the source ports of outgoing connections, so a port
/// learnt from `bind(0)` could be taken by an Envoy, batcher or engine connection before the
/// server binds it ("Address already in use", seen in CI). Ports are handed out in turn
/// from a per-process start, and each is checked free before it is returned.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|low| *low > LOWEST + 1_000)
        .unwrap_or(32_768);
    let span = ephemeral_low - LOWEST;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = (LOWEST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {LOWEST} and {ephemeral_low}");
}

/// Waits until `check` holds or `timeout` passes (polling every 50 ms); returns whether it
/// held.
pub fn eventually(timeout: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    check()
}

/// How long a test watches for something that must not happen (a warm-up that a knob
/// forbids, a prefix that must not be warmed again) before it concludes that it did not.
/// Each such check has a positive control in the same test: the same action with the
/// condition met shows its effect within this window, observed the same way, so a feature
/// that broke entirely fails the test instead of passing it.
pub const QUIET_WINDOW: std::time::Duration = std::time::Duration::from_millis(1500);

/// Watches `check` for `window` (polling every 50 ms): returns false as soon as it fails,
/// true when it held throughout. The negative counterpart of [`eventually`]: "nothing
/// happened" is only known at the end of a deliberate window.
pub fn stays(window: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + window;
    while std::time::Instant::now() < deadline {
        if !check() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    check()
}

/// The machine as the tests share it: a test that takes all of it holds it alone
/// ([`one_at_a_time`]); tests under a long, bounded load whose checks do not measure
/// latency may hold it together ([`under_load_together`]).
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A test's hold on the machine, released when dropped. With `COHORT_MACHINE_LOG=FILE`, each
/// hold appends to FILE how long its test waited for it and held it, to find the tests that
/// make the run's critical path.
pub struct MachineGuard {
    _hold: Hold,
    since: std::time::Instant,
    kind: &'static str,
}

/// The lock guard a [`MachineGuard`] keeps alive.
enum Hold {
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
    Together(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
}

impl MachineGuard {
    fn new(hold: Hold, asked: std::time::Instant, kind: &'static str) -> MachineGuard {
        let since = std::time::Instant::now();
        machine_log(format_args!(
            "{} {kind} after waiting {:.1} s",
            std::thread::current().name().unwrap_or("?"),
            (since - asked).as_secs_f64()
        ));
        MachineGuard {
            _hold: hold,
            since,
            kind,
        }
    }
}

impl Drop for MachineGuard {
    fn drop(&mut self) {
        machine_log(format_args!(
            "{} held it {} for {:.1} s",
            std::thread::current().name().unwrap_or("?"),
            self.kind,
            self.since.elapsed().as_secs_f64()
        ));
    }
}

/// Appends a line to the file `COHORT_MACHINE_LOG` names, if it names one.
fn machine_log(line: std::fmt::Arguments) {
    use std::io::Write;
    if let Some(path) = std::env::var_os("COHORT_MACHINE_LOG") {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// Serialises the tests that take the whole machine (load at saturation, real engines,
/// latency claims): hold the guard for the test's duration. The end-to-end tests are one
/// test binary, so this serialises them across every module; tests otherwise run in
/// parallel, one per core.
pub fn one_at_a_time() -> MachineGuard {
    let asked = std::time::Instant::now();
    let hold = MACHINE
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    MachineGuard::new(Hold::Alone(hold), asked, "alone")
}

/// For the tests that hold a stated load for a long window (a minute of DNS changes, the
/// breaker's cool-down) and check outcomes, windows of seconds and state, not latency: they
/// run beside each other, never beside a test that holds the machine alone.
pub fn under_load_together() -> MachineGuard {
    let asked = std::time::Instant::now();
    let hold = MACHINE
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    MachineGuard::new(Hold::Together(hold), asked, "together")
}

/// The `p`-quantile (0–1) of `values`: the value at rank `(n - 1) · p`, rounded, after
/// sorting; zero when there are none.
pub fn percentile(
    values: impl IntoIterator<Item = std::time::Duration>,
    p: f64,
) -> std::time::Duration {
    let mut values: Vec<std::time::Duration> = values.into_iter().collect();
    values.sort_unstable();
    values
        .get(((values.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// Runs `start` with fresh ports until the process it starts binds them: `start` gets an
/// attempt number and returns `Err(reason)` when the child failed because a port was
/// taken between [`free_port`] and its bind (another test's server or an outgoing
/// connection), and the harness tries again with new ports; any other failure panics
/// inside `start`.
pub fn with_port_retries<T>(what: &str, mut start: impl FnMut(u32) -> Result<T, String>) -> T {
    const ATTEMPTS: u32 = 5;
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        match start(attempt) {
            Ok(started) => return started,
            Err(reason) => last = reason,
        }
    }
    panic!("{what}: a port was taken on each of {ATTEMPTS} tries; last:\n{last}");
}

/// Whether a child's log says that it could not bind its port (the wording of Envoy,
/// `cohort serve`, llama-server and the OS).
pub fn port_was_taken(log: &str) -> bool {
    let log = log.to_ascii_lowercase();
    log.contains("address already in use")
        || log.contains("addrinuse")
        || log.contains("couldn't bind")
        || log.contains("cannot bind")
        || log.contains("failed to bind")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_children_s_messages_for_a_taken_port_are_recognised() {
        for log in [
            // Envoy
            "error `cannot bind '127.0.0.1:17774': Address already in use` initializing config",
            // cohort serve
            "Error: cannot listen for gRPC on 127.0.0.1:17771\n\nCaused by:\n    Address already in use (os error 98)",
            // llama-server
            "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 17775",
        ] {
            assert!(port_was_taken(log), "{log}");
        }
        assert!(!port_was_taken("error: unknown argument --nope"));
    }

    #[test]
    fn a_start_is_tried_again_while_its_port_was_taken() {
        let mut tries = Vec::new();
        let started = with_port_retries("test", |attempt| {
            tries.push(attempt);
            if attempt < 2 {
                Err("Address already in use".to_owned())
            } else {
                Ok(attempt)
            }
        });
        assert_eq!((started, tries), (2, vec![0, 1, 2]));
    }

    #[test]
    fn percentile_rounds_the_rank() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| std::time::Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(percentile(ms(&[30, 10, 20, 40]), 0.5).as_millis(), 30);
        assert_eq!(percentile(ms(&[30, 10, 20, 40]), 0.99).as_millis(), 40);
        assert_eq!(percentile(ms(&[]), 0.5), std::time::Duration::ZERO);
    }
}
