//! A process's resident memory and open file descriptors, read from `/proc`, so a soak
//! test can tell a leak (memory or sockets that grow with the number of requests) from a
//! steady state.

use std::fmt;

/// One reading of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// `VmRSS` from `/proc/PID/status`, in KiB.
    pub rss_kib: u64,
    /// Entries of `/proc/PID/fd`.
    pub fds: usize,
}

impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, {} fds",
            self.rss_kib as f64 / 1024.0,
            self.fds
        )
    }
}

/// Reads process `pid` now; `None` when it is gone.
pub fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status.lines().find_map(|line| {
        line.strip_prefix("VmRSS:")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Sample { rss_kib, fds })
}
