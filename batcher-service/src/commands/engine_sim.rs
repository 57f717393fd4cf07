//! `cohort engine-sim`: the OpenAI-compatible engine simulator (see the `cohort-engine-sim`
//! crate and docs/ENGINE-SIM.md). Thin: flags → the crate.
//!
//! - `serve`: N replicas on their own ports; writes `{"ports":[…]}` to `--ports-file` (tmp
//!   file, then rename) once all listen; SIGTERM/SIGINT → graceful exit 0. With
//!   `--kv-events-port`, each replica publishes its KV cache events as vLLM does.
//! - `bound`: the pooled-cache hit-ratio bound of a JSONL request stream.
//!
//! Calibration is `cohort_tools/bench/engine_sim_calibrate.py` (it drives a real llama-server).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use cohort_engine_sim::calibration::Calibration;
use cohort_engine_sim::server::{bind_with, KvEventsConfig, SimConfig};
use serde_json::json;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser)]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// Run N simulated engine replicas, each on its own port.
    Serve(ServeArgs),
    /// Prefix-cache hit ratio of a request stream on ONE pooled LRU cache (JSON on stdout).
    Bound(BoundArgs),
}

#[derive(Parser)]
struct ServeArgs {
    /// Replicas (independent caches, queues and counters).
    #[arg(long)]
    replicas: usize,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Replica i listens on base-port + i; 0 = ephemeral ports.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// Where to write {"ports":[…]} once every replica listens.
    #[arg(long)]
    ports_file: PathBuf,
    /// Calibration JSON (default: the committed data/bench/engine_sim_calibration.json).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Multiplies every simulated duration (0.1 = ten times faster than calibrated).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// KV cache capacity per replica, in blocks.
    #[arg(long, default_value_t = 4096)]
    kv_blocks: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_tokens: usize,
    /// Requests running at once per replica (others wait).
    #[arg(long, default_value_t = 8)]
    slots: usize,
    #[arg(long, default_value = "sim-model")]
    model: String,
    #[arg(long, default_value_t = 131072)]
    max_model_len: usize,
    /// KV cache events as vLLM publishes them: replica i's ZeroMQ PUB socket on this port +
    /// 2i, its replay ROUTER socket on this port + 2i + 1; 0 = no events.
    #[arg(long, default_value_t = 0)]
    kv_events_port: u16,
    /// Event batches each replica keeps for replays.
    #[arg(long, default_value_t = KvEventsConfig::DEFAULT_BUFFER_STEPS)]
    kv_events_buffer_steps: usize,
}

#[derive(Parser)]
struct BoundArgs {
    /// Capacity of the one pooled cache, in blocks (replicas × per-replica blocks).
    #[arg(long)]
    kv_blocks: usize,
    #[arg(long, default_value_t = 16)]
    block_tokens: usize,
    /// JSONL of request bodies in arrival order; stdin if absent or "-".
    file: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Sub::Serve(args) => serve(args),
        Sub::Bound(args) => bound(args),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let (calibration, source) = match &args.calibration {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let c = Calibration::parse(&text)
                .with_context(|| format!("invalid calibration {}", path.display()))?;
            (c, path.display().to_string())
        }
        None => (
            Calibration::measured_default(),
            "data/bench/engine_sim_calibration.json (built in)".to_owned(),
        ),
    };
    let kv_events = (args.kv_events_port != 0).then(|| KvEventsConfig {
        buffer_steps: args.kv_events_buffer_steps,
        ..KvEventsConfig::new(args.kv_events_port)
    });
    let config = SimConfig {
        replicas: args.replicas,
        host: args.host,
        base_port: args.base_port,
        kv_blocks: args.kv_blocks,
        block_tokens: args.block_tokens,
        slots: args.slots,
        model: args.model,
        max_model_len: args.max_model_len,
        time_scale: args.time_scale,
        cost: calibration.constants,
        calibration: json!({"source": source, "fit_error": calibration.fit_error()}),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async move {
        // Listen for SIGTERM/SIGINT before the ports file tells anyone we are up: a signal
        // sent right after must stop us gracefully, not find the default action.
        let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        let sim = bind_with(config, kv_events).await?;
        write_ports(&args.ports_file, sim.ports())?;
        eprintln!(
            "cohort engine-sim: {} replicas on ports {:?} (calibration: {source})",
            sim.ports().len(),
            sim.ports()
        );
        for (i, ports) in sim.kv_events_ports().iter().enumerate() {
            eprintln!(
                "cohort engine-sim: replica {i} KV events on port {}, replays on {}",
                ports.publish, ports.replay
            );
        }
        sim.serve(shutdown).await?;
        eprintln!("cohort engine-sim: stopped");
        anyhow::Ok(())
    })
}

/// Writes {"ports":[…]} atomically: a sibling tmp file, then a rename.
fn write_ports(path: &Path, ports: &[u16]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, json!({ "ports": ports }).to_string())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename to {}", path.display()))
}

fn bound(args: BoundArgs) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = match &args.file {
        Some(path) if path.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        _ => Box::new(std::io::stdin().lock()),
    };
    let report = cohort_engine_sim::bound::bound(input, args.kv_blocks, args.block_tokens)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
