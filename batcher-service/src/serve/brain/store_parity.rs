//! `--store cpu` and `--store gpu` decide alike: one trace replayed through a brain over
//! CPU stores and a brain over GPU stores, whose kernels run in their lane-by-lane CPU
//! emulation (`cohort_gpu_store::emu`, held equal to the CUDA source by the GPU store's own
//! tests). Every Assign reply (replica, cohort, matched blocks, reason) must be the same,
//! and so must the stores' counts at the end.

use super::{Brain, Stores};
use crate::clock::Clock;
use crate::config::{NeighbourSearch, Replica, ServeConfig};
use cohort_batcher_core::store::{CpuStore, CpuStoreConfig, Store};
use cohort_fingerprint::sketch::SKETCH_VERSION;
use cohort_gpu_store::emu::EmuDevice;
use cohort_gpu_store::rng::Rng;
use cohort_gpu_store::GpuStore;
use cohort_proto as pb;

/// One step of the trace.
enum Step {
    /// Assign, then (as the filter does in assign mode) observe on the chosen replica.
    Assign(pb::RequestInfo),
    /// Observe a request another shard or mode routed to `replica`.
    Observe(pb::RequestInfo, usize),
    /// Periodic upkeep.
    Expire,
}

/// 600 requests of 3 tenants: 10 intents (sketches around 10 centres), half with one of
/// 20 applications' prefixes and conversation turns; a third observed without an Assign; time advances
/// 200 ms a request, with upkeep every 50.
fn trace() -> Vec<(u64, Step)> {
    let mut rng = Rng(0x5eed_cafe);
    let centres: Vec<[i8; 32]> = (0..10)
        .map(|_| std::array::from_fn(|_| (rng.below(200) as i64 - 100) as i8))
        .collect();
    let mut steps = Vec::new();
    for i in 0..600u64 {
        let now_ms = 1_000 + i * 200;
        let intent = rng.below(centres.len() as u64) as usize;
        let sketch: Vec<u8> = centres[intent]
            .iter()
            .map(|&c| (i64::from(c) + rng.below(41) as i64 - 20).clamp(-127, 127) as i8 as u8)
            .collect();
        let app = rng.below(20);
        let turns = 1 + rng.below(4);
        // Half the requests carry an application's prompt and turns; the others share no
        // prefix, so the cohorts and the neighbours decide them.
        let mut blocks: Vec<u64> = Vec::new();
        if rng.below(2) == 0 {
            blocks.extend((0..4).map(|b| app * 1_000 + b));
            blocks.extend((0..turns).map(|t| 1_000_000 + app * 100 + t));
        }
        blocks.push(10_000_000 + i);
        let request = pb::RequestInfo {
            tenant: format!("tenant-{}", rng.below(3)),
            fingerprint: Some(pb::Fingerprint {
                key: blocks[0],
                blocks,
                sketch,
                sketch_version: SKETCH_VERSION,
                prompt_bytes: 2_048,
                ..Default::default()
            }),
            ..Default::default()
        };
        let step = if rng.below(3) == 0 {
            Step::Observe(request, rng.below(4) as usize)
        } else {
            Step::Assign(request)
        };
        steps.push((now_ms, step));
        if i % 50 == 49 {
            steps.push((now_ms, Step::Expire));
        }
    }
    steps
}

fn observation(request: pb::RequestInfo, shard: &str) -> pb::ObservationBatch {
    pb::ObservationBatch {
        observations: vec![pb::Observation {
            request: Some(request),
            shard: shard.to_owned(),
            ..Default::default()
        }],
        dropped: 0,
    }
}

/// An Assign reply as compared: replica, cohort, matched blocks, reason.
type Decision = (String, String, u32, String);
/// A brain's run over the trace: its decisions, then (live cohorts, stored fingerprints).
type Run = (Vec<Decision>, (u64, u64));

/// The replies and end state of one brain over the trace.
fn replay(brain: &Brain) -> Run {
    let replicas: Vec<String> = (0..4).map(|i| format!("r{i}")).collect();
    let mut replies = Vec::new();
    for (now_ms, step) in trace() {
        match step {
            Step::Assign(request) => {
                let reply = brain
                    .assign(
                        &pb::AssignRequest {
                            request: Some(request.clone()),
                            ..Default::default()
                        },
                        now_ms,
                    )
                    .expect("a fingerprint");
                brain.observe(&observation(request, &reply.shard), now_ms);
                replies.push((
                    reply.shard,
                    reply.cluster,
                    reply.matched_blocks,
                    reply.reason,
                ));
            }
            Step::Observe(request, replica) => {
                brain.observe(&observation(request, &replicas[replica]), now_ms)
            }
            Step::Expire => brain.expire(now_ms),
        }
    }
    let status = brain.status(200_000);
    (replies, (status.cohorts, status.store_entries))
}

fn config() -> ServeConfig {
    let mut config = ServeConfig {
        replicas: (0..4).map(|i| Replica::named(&format!("r{i}"))).collect(),
        ..ServeConfig::default()
    };
    // Small enough that the CLOCK eviction of both stores takes part.
    config.store.max_entries = 256;
    config.store.cohort_idle_s = 30;
    config
}

fn emulated(shape: CpuStoreConfig) -> Box<dyn Store> {
    Box::new(
        GpuStore::new(shape, 1, |_, slots| Ok(EmuDevice::new(slots))).expect("emulated device"),
    )
}

/// The two brains' replies and end states over the trace, with the neighbour search
/// `search`.
fn replay_both(search: NeighbourSearch) -> [Run; 2] {
    let mut config = config();
    config.store.neighbour_search = search;
    let (fingerprints, centroids) = Stores::shapes(&config);
    let cpu = Brain::with_stores(
        &config,
        Clock::start(),
        Stores {
            fingerprints: Box::new(CpuStore::new(fingerprints)),
            centroids: Box::new(CpuStore::new(centroids)),
            gpu_utilization: None,
            description: String::new(),
        },
    );
    let gpu = Brain::with_stores(
        &config,
        Clock::start(),
        Stores {
            fingerprints: emulated(fingerprints),
            centroids: emulated(centroids),
            gpu_utilization: None,
            description: String::new(),
        },
    );
    [replay(&cpu), replay(&gpu)]
}

#[test]
fn cpu_and_emulated_gpu_stores_make_the_same_decisions_on_a_replayed_trace() {
    // `exact` runs the neighbour search as a full top-k scan: on the GPU store, its kernels.
    for search in [NeighbourSearch::Recent, NeighbourSearch::Exact] {
        let [(cpu_replies, cpu_end), (gpu_replies, gpu_end)] = replay_both(search);
        assert_eq!(cpu_replies.len(), gpu_replies.len());
        for (i, (c, g)) in cpu_replies.iter().zip(&gpu_replies).enumerate() {
            assert_eq!(c, g, "{search:?}: decision {i} differs");
        }
        assert_eq!(cpu_end, gpu_end);
        // The trace exercises what it claims: cohorts formed, the store filled past its
        // capacity, and decisions of every store-fed kind happened.
        let reasons = |r: &str| cpu_replies.iter().filter(|x| x.3 == r).count();
        eprintln!(
            "{search:?}: {} decisions: prefix {}, cohort {}, similar {}, load_spill {}, least_loaded {}; cohorts {}, store entries {}",
            cpu_replies.len(),
            reasons("prefix"),
            reasons("cohort"),
            reasons("similar"),
            reasons("load_spill"),
            reasons("least_loaded"),
            cpu_end.0,
            cpu_end.1
        );
        assert!(cpu_end.0 >= 5, "cohorts {}", cpu_end.0);
        assert_eq!(cpu_end.1, 256, "the fingerprint store is full");
        assert!(reasons("similar") > 0 && reasons("cohort") > 0 && reasons("prefix") > 0);
        assert!(cpu_replies.iter().filter(|x| !x.1.is_empty()).count() > 300);
    }
}
