//! The residency index's memory and speed, on one thread: fills one replica's index with
//! batches of 1,000 stored blocks (10 `BlockStored` events of 100 chained blocks, 16 tokens
//! per block, random engine hashes and tokens, map-tagged msgpack as vLLM >= 0.24 sends
//! them) up to each size, and prints per size:
//!
//! - bytes per block held, from the tables' capacity ([`Residency::heap_bytes`]) and as the
//!   process's resident memory grew while filling (`/proc/self/statm`, Linux);
//! - milliseconds per batch to apply the decoded events while filling (mean, 99th
//!   percentile, worst: a table doubling when grown); then at size, 200 batches that each
//!   store 1,000 new blocks and remove the 1,000 oldest, as a full cache does (median and
//!   99th percentile); and to decode one batch's msgpack payload.
//!
//! Each size runs twice: with the tables grown as blocks arrive (a doubling stalls one
//! batch), and reserved up front for the engine's block count ([`Residency::reserve`]; an
//! engine's cache has a fixed number of blocks). Each row runs in a child process of its
//! own, so that the resident-memory growth is not blurred by what the allocator kept from
//! the row before.
//!
//! `cargo run --release -p cohort-kv-events --example residency_bench [SIZE...]`
//! (default sizes 250000 500000 1000000 2000000). docs/KV-EVENTS.md has the numbers.

use cohort_kv_events::decode::{decode, BlockRemoved, KvEvent};
use cohort_kv_events::residency::{ApplyReport, Residency};
use cohort_kv_events::testing::SplitMix64;
use rmpv::Value;
use std::time::{Duration, Instant};

const BLOCK_SIZE: u32 = 16;
const BLOCKS_PER_EVENT: usize = 100;
const EVENTS_PER_BATCH: usize = 10;
const BATCH: usize = BLOCKS_PER_EVENT * EVENTS_PER_BATCH;

/// One batch's msgpack payload: 10 events of 100 chained blocks each.
fn batch_payload(rng: &mut SplitMix64) -> Vec<u8> {
    let events = (0..EVENTS_PER_BATCH)
        .map(|_| {
            let hashes = (0..BLOCKS_PER_EVENT)
                .map(|_| Value::from(rng.next_u64()))
                .collect();
            let tokens = (0..BLOCKS_PER_EVENT * BLOCK_SIZE as usize)
                .map(|_| Value::from(rng.next_u64() % 262_144))
                .collect();
            Value::Map(vec![
                (Value::from("type"), Value::from("BlockStored")),
                (Value::from("block_hashes"), Value::Array(hashes)),
                (Value::from("parent_block_hash"), Value::Nil),
                (Value::from("token_ids"), Value::Array(tokens)),
                (Value::from("block_size"), Value::from(BLOCK_SIZE)),
                (Value::from("lora_id"), Value::Nil),
                (Value::from("medium"), Value::from("GPU")),
                (Value::from("lora_name"), Value::Nil),
                (Value::from("group_idx"), Value::from(0)),
                (
                    Value::from("kv_cache_spec_kind"),
                    Value::from("full_attention"),
                ),
            ])
        })
        .collect();
    let batch = Value::Map(vec![
        (Value::from("ts"), Value::F64(1.0)),
        (Value::from("events"), Value::Array(events)),
        (Value::from("data_parallel_rank"), Value::from(0)),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("writing to a Vec");
    out
}

/// Resident memory in bytes, where the platform says (Linux).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--row") {
        let size = args[1].parse().expect("a size in blocks");
        row(size, args[2] == "reserved");
        return;
    }
    let sizes: Vec<usize> = args
        .iter()
        .map(|a| a.parse().expect("a size in blocks"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![250_000, 500_000, 1_000_000, 2_000_000]
    } else {
        sizes
    };
    println!(
        "| blocks held | tables | bytes/block (capacity) | bytes/block (RSS growth) | fill: ms/batch mean | fill: p99 | fill: worst | at size: ms/batch p50 | at size: p99 | decode: ms/batch mean |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let me = std::env::current_exe().expect("this program's path");
    for size in sizes {
        for tables in ["grown", "reserved"] {
            let status = std::process::Command::new(&me)
                .args(["--row", &size.to_string(), tables])
                .status()
                .expect("running a row");
            assert!(status.success(), "the row {size} {tables} failed");
        }
    }
}

/// The `q` quantile of `samples` (sorted in place), in milliseconds.
fn quantile(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort();
    let at = ((samples.len() - 1) as f64 * q).round() as usize;
    ms(samples[at])
}

/// One row of the table: fill an index of `size` blocks, then churn it at that size.
fn row(size: usize, reserved: bool) {
    let mut rng = SplitMix64(size as u64);
    let before = resident_bytes();
    let mut residency = Residency::new(BLOCK_SIZE, "GPU");
    if reserved {
        residency.reserve(size);
    }
    let batches = size.div_ceil(BATCH);
    let mut fill = Vec::with_capacity(batches);
    let mut decoding = Duration::ZERO;
    let mut stored_hashes: Vec<Vec<u64>> = Vec::with_capacity(batches);
    let mut resident_after_fill = None;
    let churn_batches = 200;
    let mut churn = Vec::with_capacity(churn_batches);
    for b in 0..batches + churn_batches {
        let payload = batch_payload(&mut rng);
        let start = Instant::now();
        let batch = decode(&payload).expect("the payload decodes");
        decoding += start.elapsed();
        let hashes: Vec<u64> = batch
            .events
            .iter()
            .flat_map(|e| match e {
                KvEvent::Stored(s) => s.block_hashes.clone(),
                _ => Vec::new(),
            })
            .collect();
        // At size, each batch also evicts the oldest batch's blocks, as a full cache does.
        let eviction = (b >= batches).then(|| {
            KvEvent::Removed(BlockRemoved {
                block_hashes: stored_hashes[b - batches].clone(),
                medium: Some("GPU".to_owned()),
                group_idx: Some(0),
            })
        });
        let mut report = ApplyReport::default();
        let start = Instant::now();
        for event in batch.events.iter().chain(&eviction) {
            residency.apply(event, &mut report);
        }
        let took = start.elapsed();
        assert_eq!(report.stored, BATCH as u64);
        if b < batches {
            fill.push(took);
        } else {
            assert_eq!(report.removed, BATCH as u64);
            churn.push(took);
        }
        if b + 1 == batches {
            // Before the churn's own bookkeeping grows the process.
            resident_after_fill = resident_bytes();
            assert_eq!(residency.len(), batches * BATCH, "every block is held once");
        }
        stored_hashes.push(hashes);
    }
    let held = residency.len();
    let capacity_bytes = residency.heap_bytes() as f64 / held as f64;
    // The hashes kept for the churn are the benchmark's, not the index's.
    let bookkeeping = (batches * BATCH * 8) as u64;
    let rss = match (before, resident_after_fill) {
        (Some(a), Some(b)) => format!(
            "{:.1}",
            b.saturating_sub(a).saturating_sub(bookkeeping) as f64 / held as f64
        ),
        _ => "n/a".to_owned(),
    };
    let mean = fill.iter().sum::<Duration>().as_secs_f64() * 1e3 / fill.len() as f64;
    let worst = fill.iter().max().copied().unwrap_or_default();
    println!(
        "| {held} | {} | {capacity_bytes:.1} | {rss} | {mean:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
        if reserved { "reserved" } else { "grown" },
        quantile(&mut fill, 0.99),
        ms(worst),
        quantile(&mut churn, 0.5),
        quantile(&mut churn, 0.99),
        decoding.as_secs_f64() * 1e3 / (batches + churn_batches) as f64,
    );
}
