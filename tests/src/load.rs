//! Closed-loop load for soak and fault tests: `clients` threads, each on its own keep-alive
//! connection, send requests back to back until told to stop (or a hard time cap passes).
//! Every request carries a unique numeric id in [`ID_HEADER`], so a test can count it at
//! the engines as well as here, and every outcome is kept with its start time and latency
//! so a test can cut the run into windows (before, during and after a fault).

use crate::client::Connection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The header carrying each request's id (forwarded by Envoy and the batch front).
pub const ID_HEADER: &str = "x-load-id";

/// One request's fate.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub id: u64,
    pub started: Instant,
    pub latency: Duration,
    /// The HTTP status, or 0 when the connection failed (nothing or half an answer came back).
    pub status: u16,
    /// Whether the answer came through the batch front (it carries `x-cohort-batch`).
    pub batched: bool,
}

/// What to send: the request path and the body of request `id`.
pub struct Plan<'a> {
    pub port: u16,
    pub path: &'a str,
    pub clients: usize,
    pub body: &'a (dyn Fn(u64) -> Vec<u8> + Sync),
    /// Stop at this point whatever `stop` says (every load loop is bounded in time).
    pub cap: Duration,
}

/// Runs the load until `stop` is set (or the cap passes); returns every outcome.
pub fn run(plan: &Plan<'_>, stop: &AtomicBool) -> Vec<Outcome> {
    let outcomes = Mutex::new(Vec::new());
    let until = Instant::now() + plan.cap;
    std::thread::scope(|scope| {
        for client in 0..plan.clients {
            let outcomes = &outcomes;
            scope.spawn(move || {
                let mut connection = Connection::new(plan.port);
                let mut mine = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    // Ids are unique across clients: client index in the low bits.
                    let id = n * plan.clients as u64 + client as u64;
                    n += 1;
                    let id_text = id.to_string();
                    let body = (plan.body)(id);
                    let started = Instant::now();
                    let response = connection.post_json(plan.path, &[(ID_HEADER, &id_text)], &body);
                    let latency = started.elapsed();
                    let (status, batched) = match &response {
                        Ok(r) => (r.status, r.header("x-cohort-batch").is_some()),
                        Err(_) => (0, false),
                    };
                    mine.push(Outcome {
                        id,
                        started,
                        latency,
                        status,
                        batched,
                    });
                }
                outcomes.lock().unwrap().extend(mine);
            });
        }
    });
    let mut all = outcomes.into_inner().unwrap();
    all.sort_by_key(|o| o.started);
    all
}

/// The latencies of `outcomes` (for [`crate::percentile`]).
pub fn latencies(outcomes: &[Outcome]) -> impl Iterator<Item = Duration> + '_ {
    outcomes.iter().map(|o| o.latency)
}

/// The outcomes of requests started in `[from, to)`.
pub fn window(outcomes: &[Outcome], from: Instant, to: Instant) -> Vec<Outcome> {
    outcomes
        .iter()
        .filter(|o| o.started >= from && o.started < to)
        .copied()
        .collect()
}

/// Checks the ids an engine fleet received against the requests that succeeded here:
/// returns (lost: succeeded here but never reached an engine, duplicated: reached the
/// engines more than once, unknown: reached an engine but no client sent it).
pub fn reconcile(outcomes: &[Outcome], mut received: Vec<u64>) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    received.sort_unstable();
    let mut duplicated: Vec<u64> = received
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    duplicated.dedup();
    received.dedup();
    let mut sent: Vec<u64> = outcomes.iter().map(|o| o.id).collect();
    sent.sort_unstable();
    let succeeded: std::collections::BTreeSet<u64> = outcomes
        .iter()
        .filter(|o| o.status == 200)
        .map(|o| o.id)
        .collect();
    let lost = succeeded
        .iter()
        .filter(|id| received.binary_search(id).is_err())
        .copied()
        .collect();
    let unknown = received
        .iter()
        .filter(|id| sent.binary_search(id).is_err())
        .copied()
        .collect();
    (lost, duplicated, unknown)
}
