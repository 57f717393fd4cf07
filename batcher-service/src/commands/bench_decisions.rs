//! `cohort bench-decisions`: the decision path's benchmark, Assign in to reply out, over a
//! fingerprint store of 10 k to millions of entries.
//!
//! For each size it builds the batcher's brain on the chosen store (`--store cpu|gpu`),
//! fills the store, then drives Assign at a fixed rate from one thread (open loop: a late
//! reply delays the next, and the latency is counted from the time the Assign was due),
//! each followed by its Observe, as in assign mode. It prints one row per size:
//! Assign/s reached, latency p50/p99 from due time, the service time's p99, the Observe
//! p99, the share of Assign time spent in store queries, store queries per Assign, and the
//! store's bytes per entry and the process's resident memory.
//!
//! The workload: `--tenants` tenants, `--intents` intents (sketches within ±20 of random
//! centres, so about one cohort an intent), half the requests with one of 64 applications'
//! 4-block prefixes, the rest sharing no prefix. The fill sends the first 20,000
//! fingerprints through Observe (cohorts form, lists fill) and stores the rest directly
//! with their intent's cohort, which is where Observe would put them, without paying one
//! centroid search per fingerprint (5 M Observes would take minutes on a GPU store, each
//! a kernel launch).
//!
//! One core: by default the load runs on one thread; pin it (`taskset -c 0`) to keep it on
//! one core. With `--threads T`, T threads share the rate, and their concurrent store
//! queries coalesce into batched scans (`queries / scan` in the table).

use crate::clock::Clock;
use crate::config::{NeighbourSearch, Replica, ServeConfig};
use crate::serve::brain::{space, Brain};
use anyhow::bail;
use cohort_batcher_core::store::{EntryMeta, SketchBytes};
use cohort_fingerprint::sketch::SKETCH_VERSION;
use cohort_gpu_store::rng::Rng;
use cohort_gpu_store::StoreKind;
use cohort_proto as pb;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Fingerprints stored, one row each (comma-separated).
    #[arg(long, default_value = "10000,1000000", value_delimiter = ',')]
    entries: Vec<usize>,
    /// Assign calls per second (each followed by its Observe).
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Seconds of load per row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// The store: cpu or gpu (gpu needs a build with `--features cuda` and a GPU).
    #[arg(long, default_value = "cpu")]
    store: String,
    /// Engine replicas.
    #[arg(long, default_value_t = 8)]
    replicas: usize,
    #[arg(long, default_value_t = 4)]
    tenants: usize,
    #[arg(long, default_value_t = 1024)]
    intents: usize,
    /// Threads sending the load (the rate is shared among them); concurrent calls
    /// coalesce into batched scans.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The neighbour search: recent (the nearest cohorts' recent members) or exact (a scan
    /// of every fingerprint of the tenant).
    #[arg(long, value_enum, default_value = "recent")]
    neighbours: NeighbourSearch,
}

/// Fingerprints sent through Observe before the rest are stored directly.
const OBSERVED_FILL: usize = 20_000;
/// Fingerprints live this long (longer than any run).
const TTL_S: u32 = 86_400;

/// The workload (see the module doc).
struct Workload {
    rng: Rng,
    centres: Vec<SketchBytes>,
    tenants: Vec<String>,
    serial: u64,
}

impl Workload {
    fn new(args: &Args) -> Workload {
        let mut rng = Rng(0x0dec_1510);
        let centres = (0..args.intents.max(1))
            .map(|_| std::array::from_fn(|_| (rng.below(201) as i32 - 100) as i8))
            .collect();
        Workload {
            rng,
            centres,
            tenants: (0..args.tenants.max(1))
                .map(|t| format!("tenant-{t}"))
                .collect(),
            serial: 0,
        }
    }

    /// An intent's tenant (intents are dealt to tenants round-robin).
    fn tenant_of(&self, intent: usize) -> &str {
        &self.tenants[intent % self.tenants.len()]
    }

    fn sketch(&mut self, intent: usize) -> SketchBytes {
        let centre = self.centres[intent];
        std::array::from_fn(|d| {
            (i32::from(centre[d]) + self.rng.below(41) as i32 - 20).clamp(-127, 127) as i8
        })
    }

    /// The next request: its intent and request info.
    fn request(&mut self) -> (usize, pb::RequestInfo) {
        let intent = self.rng.below(self.centres.len() as u64) as usize;
        let sketch = self.sketch(intent);
        self.serial += 1;
        let mut blocks = Vec::with_capacity(5);
        if self.rng.below(2) == 0 {
            let app = self.rng.below(64);
            blocks.extend((0..4).map(|b| (app << 8) | b));
        }
        blocks.push((1 << 63) | self.serial);
        let request = pb::RequestInfo {
            tenant: self.tenant_of(intent).to_owned(),
            fingerprint: Some(pb::Fingerprint {
                key: blocks[0],
                blocks,
                sketch: sketch.iter().map(|&v| v as u8).collect(),
                sketch_version: SKETCH_VERSION,
                prompt_bytes: 4_096,
                ..Default::default()
            }),
            ..Default::default()
        };
        (intent, request)
    }
}

fn observation(request: pb::RequestInfo, shard: String) -> pb::ObservationBatch {
    pb::ObservationBatch {
        observations: vec![pb::Observation {
            request: Some(request),
            shard,
            ..Default::default()
        }],
        dropped: 0,
    }
}

fn percentile(values: &mut [Duration], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable();
    let at = ((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1;
    values[at].as_secs_f64() * 1e3
}

/// Resident memory of this process (MB), from /proc.
fn rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Fill the brain's store with `n` fingerprints (see the module doc).
fn fill(brain: &Brain, work: &mut Workload, n: usize, replicas: usize, now_ms: u64) {
    let observed = n.min(OBSERVED_FILL);
    for i in 0..observed {
        let (_, request) = work.request();
        brain.observe(&observation(request, format!("r{}", i % replicas)), now_ms);
    }
    // Each intent's cohort, as the clustering now places its centre.
    let cohorts: Vec<Option<u32>> = (0..work.centres.len())
        .map(|intent| {
            brain
                .nearest_cohorts(work.tenant_of(intent), &work.centres[intent], now_ms)
                .first()
                .and_then(|(id, _)| u32::from_str_radix(id, 16).ok())
        })
        .collect();
    let now_s = (now_ms / 1000) as u32;
    for i in observed..n {
        let intent = work.rng.below(work.centres.len() as u64) as usize;
        let sketch = work.sketch(intent);
        let key = work.rng.next_u64();
        brain.keep_fingerprint(
            key,
            &sketch,
            EntryMeta {
                tenant: space(work.tenant_of(intent), 0),
                cohort: cohorts[intent].unwrap_or(0),
                replica: (i % replicas) as u16,
                expires_at_s: now_s + TTL_S,
            },
            now_s,
        );
    }
}

/// What one load thread measured.
struct Timings {
    latency: Vec<Duration>,
    service: Vec<Duration>,
    observe: Vec<Duration>,
}

/// Send `lane`'s requests at their due times (open loop), each Assign followed by its
/// Observe.
fn drive(
    brain: &Brain,
    lane: Vec<(usize, pb::AssignRequest)>,
    start: Instant,
    period: Duration,
) -> anyhow::Result<Timings> {
    let mut t = Timings {
        latency: Vec::with_capacity(lane.len()),
        service: Vec::with_capacity(lane.len()),
        observe: Vec::with_capacity(lane.len()),
    };
    for (i, request) in lane {
        let due = start + period * i as u32;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let now_ms = 1_000 + start.elapsed().as_millis() as u64;
        let began = Instant::now();
        let reply = brain.assign(&request, now_ms)?;
        let answered = Instant::now();
        t.latency.push(answered - due);
        t.service.push(answered - began);
        let info = request.request.unwrap_or_default();
        brain.observe(&observation(info, reply.shard), now_ms);
        t.observe.push(answered.elapsed());
    }
    Ok(t)
}

/// One row: the brain over `n` fingerprints under `args.rate` Assign/s.
fn row(args: &Args, kind: StoreKind, n: usize) -> anyhow::Result<String> {
    let mut config = ServeConfig {
        replicas: (0..args.replicas)
            .map(|i| Replica::named(&format!("r{i}")))
            .collect(),
        ..ServeConfig::default()
    };
    config.store.max_entries = n;
    config.store.backend = kind;
    config.store.neighbour_search = args.neighbours;
    let brain = Brain::new(&config, Clock::start());
    if !brain.store_description().starts_with(args.store.as_str()) || kind == StoreKind::Gpu {
        eprintln!("{n} entries: store {}", brain.store_description());
    }
    let mut work = Workload::new(args);
    let filled_at = Instant::now();
    let now_ms = 1_000;
    fill(&brain, &mut work, n, args.replicas, now_ms);
    let fill_s = filled_at.elapsed().as_secs_f64();
    let held = brain.status(now_ms).store_entries;
    let store_bytes = brain.store_bytes();
    // The requests, made before the clock starts.
    let total = (args.rate * args.seconds).ceil() as usize;
    let requests: Vec<pb::AssignRequest> = (0..total)
        .map(|_| pb::AssignRequest {
            request: Some(work.request().1),
            ..Default::default()
        })
        .collect();
    let before = brain.store_reads();
    let scans_before = brain.store_scans();
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let threads = args.threads.max(1);
    // Request i is due at start + i × period; thread t sends the requests i ≡ t (mod T).
    let mut lanes: Vec<Vec<(usize, pb::AssignRequest)>> = vec![Vec::new(); threads];
    for (i, request) in requests.into_iter().enumerate() {
        lanes[i % threads].push((i, request));
    }
    let start = Instant::now();
    let timings: Vec<anyhow::Result<Timings>> = std::thread::scope(|scope| {
        let brain = &brain;
        let handles: Vec<_> = lanes
            .into_iter()
            .map(|lane| scope.spawn(move || drive(brain, lane, start, period)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a load thread panicked"))
            .collect()
    });
    let mut latency = Vec::with_capacity(total);
    let mut service = Vec::with_capacity(total);
    let mut observe = Vec::with_capacity(total);
    for t in timings {
        let t = t?;
        latency.extend(t.latency);
        service.extend(t.service);
        observe.extend(t.observe);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = brain.store_reads();
    let scans_after = brain.store_scans();
    let batch =
        (scans_after.1 - scans_before.1) as f64 / (scans_after.0 - scans_before.0).max(1) as f64;
    let assign_s: f64 = service.iter().map(Duration::as_secs_f64).sum();
    let store_share = (after.seconds - before.seconds) / assign_s.max(1e-12);
    let per_assign = (after.queries - before.queries) as f64 / service.len().max(1) as f64;
    let rate = service.len() as f64 / elapsed;
    Ok(format!(
        "| {} | {} | {n} | {held} | {fill_s:.1} | {:.0} | {rate:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1}% | {per_assign:.2} | {batch:.2} | {:.1} | {} |",
        if brain.store_description().starts_with("cpu") {
            "cpu"
        } else {
            "gpu"
        },
        match args.neighbours {
            NeighbourSearch::Recent => "recent",
            NeighbourSearch::Exact => "exact",
        },
        args.rate,
        percentile(&mut latency.clone(), 0.5),
        percentile(&mut latency, 0.99),
        percentile(&mut service, 0.99),
        percentile(&mut observe, 0.99),
        100.0 * store_share,
        store_bytes as f64 / held.max(1) as f64,
        rss_mb().map_or("—".to_owned(), |mb| format!("{mb:.0}")),
    ))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let kind = match args.store.as_str() {
        "cpu" => StoreKind::Cpu,
        "gpu" => StoreKind::Gpu,
        other => bail!("--store {other}: cpu or gpu"),
    };
    if !(args.rate > 0.0 && args.seconds > 0.0) {
        bail!("--rate and --seconds must be positive");
    }
    println!(
        "decision path: {} replicas, {} tenants, {} intents; {} s per row, {} load thread(s)",
        args.replicas, args.tenants, args.intents, args.seconds, args.threads
    );
    println!("| store | neighbours | entries | held | fill s | target Assign/s | Assign/s | p50 ms | p99 ms | service p99 ms | Observe p99 ms | time in store | store queries / Assign | queries / scan | store B/entry | RSS MB |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &args.entries {
        println!("{}", row(&args, kind, n)?);
    }
    Ok(())
}
