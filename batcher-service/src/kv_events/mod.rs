//! The engines' KV cache events inside `cohort serve`: one subscription task per replica
//! configured with `kv_events` (docs/KV-EVENTS.md), each feeding the replica's
//! [`ReplicaEvents`] (sequence numbers, replays, residency, health) from the
//! `cohort-kv-events` crate's ZeroMQ subscriber.
//!
//! What the streams know is read through [`Streams`], shared by the tasks, the brain (the
//! inspector's Replicas panel) and `/metrics`; every lock is held for one message or one
//! read, never across an await. A stream's health is logged once per change. While a
//! stream is healthy, decisions that know the request's tokens (the endpoint picker with
//! `[kv_events] prompt_tokens`) read what the engine holds from it
//! ([`Stream::held_prefix`]); every decision drops the modelled residency of an engine
//! whose cache was cleared ([`Stream::engine_clears`]). An unhealthy stream leaves the
//! replica to the modelled residency.
//!
//! Each task runs until `cohort serve` stops: it follows the stream with the subscriber,
//! and every [`TICK`] passes time to the replica (replay timeouts, silence, also while the
//! subscriber is still connecting) and samples its counters for the time of the last
//! message ([`state::Activity`]). When the events socket fails the subscriber returns; the
//! task logs it and follows again after [`RETRY_AFTER`], keeping the replica's state (the
//! next message's sequence number says whether a replay is needed).

pub mod state;

use crate::clock::Clock;
use crate::config::ServeConfig;
use crate::metrics::{MetricSource, Scrape};
use cohort_kv_events::replica::{Outcome, ReplicaEvents};
use cohort_kv_events::subscriber::{self, FrameCounters, SubscriberConfig};
use cohort_prompt_tokens::{ModelTokens, PromptTokenizer, Prompts};
use state::{Activity, View};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// How often each stream gets the time and its activity is sampled.
pub const TICK: Duration = Duration::from_millis(100);
/// The pause before following a stream again after its events socket failed.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One replica's stream.
pub struct Stream {
    /// The replica's name (the `replica` label).
    pub name: String,
    subscriber: SubscriberConfig,
    replica: Arc<Mutex<ReplicaEvents>>,
    frames: Arc<Mutex<FrameCounters>>,
    activity: Mutex<Activity>,
    /// Turns true when the replica left (engine discovery): its task ends.
    gone: watch::Sender<bool>,
}

impl Stream {
    /// Passes time to the replica and samples its counters at `now_ms`; returns what the
    /// tick reported (a replay timed out, the stream went silent).
    fn tick(&self, now: Instant, now_ms: u64) -> Outcome {
        let (outcome, counters) = {
            let mut replica = lock(&self.replica);
            (replica.tick(now), *replica.counters())
        };
        let frames = *lock(&self.frames);
        lock(&self.activity).observe(state::messages(&counters, &frames), now_ms);
        outcome
    }

    /// Messages the stream has delivered so far.
    fn messages(&self) -> u64 {
        let frames = *lock(&self.frames);
        state::messages(lock(&self.replica).counters(), &frames)
    }

    /// The stream's snapshot at `now_ms` (which also samples its activity).
    pub fn view(&self, now_ms: u64) -> View {
        let frames = *lock(&self.frames);
        let replica = lock(&self.replica);
        let activity = {
            let mut activity = lock(&self.activity);
            activity.observe(state::messages(replica.counters(), &frames), now_ms);
            *activity
        };
        View::of(&replica, &frames, &activity, now_ms)
    }
}

/// Every stream of this batcher: the configured replicas' in configuration order, then the
/// discovered replicas' as they join.
pub struct Streams {
    streams: RwLock<Vec<Arc<Stream>>>,
    clock: Clock,
    /// The settings every stream is read with.
    settings: Settings,
    /// `[kv_events] port` (and `replay_port`) with `[discovery]`: a discovered replica's
    /// events are at its address on these ports.
    discovered_ports: Option<(u16, Option<u16>)>,
    /// Set by [`spawn`]: where a stream added later runs its task, and the stop signal.
    running: Mutex<Option<(tokio::runtime::Handle, watch::Receiver<bool>)>>,
}

/// What each stream is read with (`[kv_events]`).
struct Settings {
    replica: cohort_kv_events::replica::ReplicaConfig,
    topic: String,
}

impl Streams {
    /// A stream for each configured replica with `kv_events`, followed from now (no task
    /// yet: [`spawn`]).
    pub fn new(config: &ServeConfig, clock: Clock) -> Streams {
        let settings = Settings {
            replica: config.kv_events.replica_config(),
            topic: config.kv_events.topic.clone(),
        };
        let streams = config
            .replicas
            .iter()
            .filter_map(|r| {
                let endpoint = r.kv_events.as_ref()?;
                Some(Arc::new(Stream::new(
                    &r.name,
                    endpoint.as_str(),
                    r.kv_events_replay.as_ref().map(|e| e.as_str()),
                    &settings,
                    clock,
                )))
            })
            .collect();
        let discovered_ports = config
            .discovery
            .dns
            .as_ref()
            .and(config.kv_events.port)
            .map(|port| (port, config.kv_events.replay_port));
        Streams {
            streams: RwLock::new(streams),
            clock,
            settings,
            discovered_ports,
            running: Mutex::new(None),
        }
    }

    /// Whether no replica has a stream, and none can get one.
    pub fn is_empty(&self) -> bool {
        self.discovered_ports.is_none() && read(&self.streams).is_empty()
    }

    /// The stream of the replica named `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<Arc<Stream>> {
        read(&self.streams).iter().find(|s| s.name == name).cloned()
    }

    fn all(&self) -> Vec<Arc<Stream>> {
        read(&self.streams).clone()
    }

    /// Engine discovery found `members` (name, `ip:port` endpoint): with `[kv_events]
    /// port`, each new one is followed at `tcp://<ip>:<port>` (a task at once, once
    /// [`spawn`] ran), and the streams of those gone end. Without it, nothing changes.
    pub fn set_members(&self, members: &[(&str, &str)]) {
        let Some((port, replay_port)) = self.discovered_ports else {
            return;
        };
        let mut added = Vec::new();
        {
            let mut streams = write(&self.streams);
            streams.retain(|stream| {
                let stays = members.iter().any(|(name, _)| *name == stream.name);
                if !stays {
                    stream.gone.send_replace(true);
                    info!(replica = %stream.name, "replica left: no longer following its KV events");
                }
                stays
            });
            for &(name, endpoint) in members {
                if streams.iter().any(|s| s.name == name) {
                    continue;
                }
                let Some((host, _)) = endpoint.rsplit_once(':') else {
                    continue;
                };
                let stream = Arc::new(Stream::new(
                    name,
                    &format!("tcp://{host}:{port}"),
                    replay_port.map(|p| format!("tcp://{host}:{p}")).as_deref(),
                    &self.settings,
                    self.clock,
                ));
                streams.push(Arc::clone(&stream));
                added.push(stream);
            }
        }
        if let Some((runtime, stop)) = lock(&self.running).as_ref() {
            for stream in added {
                runtime.spawn(follow(stream, self.clock, stop.clone()));
            }
        }
    }
}

impl Stream {
    fn new(
        name: &str,
        endpoint: &str,
        replay_endpoint: Option<&str>,
        settings: &Settings,
        clock: Clock,
    ) -> Stream {
        Stream {
            name: name.to_owned(),
            subscriber: SubscriberConfig {
                endpoint: endpoint.to_owned(),
                replay_endpoint: replay_endpoint.map(str::to_owned),
                topic: settings.topic.clone(),
                tick: TICK,
            },
            replica: Arc::new(Mutex::new(ReplicaEvents::new(
                &settings.replica,
                Instant::now(),
            ))),
            frames: Arc::default(),
            activity: Mutex::new(Activity::new(clock.now_ms())),
            gone: watch::channel(false).0,
        }
    }

    /// How many of `keys` (a prompt's block keys, first block first) the engine holds as a
    /// leading run by its own account, while its stream is healthy; `None` when it is not
    /// (the modelled residency stands in).
    pub fn held_prefix(&self, keys: &[u64]) -> Option<usize> {
        let replica = lock(&self.replica);
        replica
            .health()
            .is_healthy()
            .then(|| replica.residency().held_prefix_blocks(keys))
    }

    /// How many times the engine dropped its whole cache: `AllBlocksCleared` (a prefix
    /// cache reset) or a restart of its stream.
    pub fn engine_clears(&self) -> u64 {
        let replica = lock(&self.replica);
        let counters = replica.counters();
        counters.blocks.cleared + counters.restarts
    }
}

/// The request → engine token ids → block keys conversion `[kv_events] prompt_tokens`
/// asks for (loading the model's files for `model`); `None` for `none`.
pub fn prompts(
    config: &crate::config::KvEventsSection,
) -> Result<Option<Prompts>, cohort_prompt_tokens::PromptError> {
    use crate::config::PromptTokensKind;
    let tokenizer = match (config.prompt_tokens, &config.model_dir) {
        (PromptTokensKind::None, _) => return Ok(None),
        (PromptTokensKind::EngineSim, _) => PromptTokenizer::EngineSim,
        (PromptTokensKind::Model, Some(dir)) => {
            PromptTokenizer::Model(Box::new(ModelTokens::load(dir)?))
        }
        (PromptTokensKind::Model, None) => {
            return Err(cohort_prompt_tokens::PromptError::Load {
                path: "model_dir".into(),
                reason: "not set".into(),
            })
        }
    };
    Ok(Some(Prompts::new(
        tokenizer,
        config.block_size,
        config.max_prompt_bytes,
    )))
}

/// Logs a change of a stream's health, once (the crate reports each change once).
fn log_change(name: &str, outcome: &Outcome) {
    let Some(change) = outcome.health else {
        return;
    };
    if change.to.is_healthy() {
        info!(replica = name, from = %change.from, "KV events stream healthy");
    } else {
        warn!(
            replica = name,
            state = %change.to,
            "KV events stream degraded: the replica's residency is the modelled one"
        );
    }
}

/// Spawns one task per stream, and one for each stream a discovered replica adds later;
/// they end when `stop` turns true (or, for a discovered replica, when it leaves). Returns
/// the tasks of the streams there now.
pub fn spawn(
    streams: Arc<Streams>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    *lock(&streams.running) = Some((tokio::runtime::Handle::current(), stop.clone()));
    streams
        .all()
        .into_iter()
        .map(|stream| tokio::spawn(follow(stream, streams.clock, stop.clone())))
        .collect()
}

async fn follow(stream: Arc<Stream>, clock: Clock, mut stop: watch::Receiver<bool>) {
    let mut gone = stream.gone.subscribe();
    let name = stream.name.as_str();
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(
        replica = name,
        endpoint = %stream.subscriber.endpoint,
        replay = ?stream.subscriber.replay_endpoint,
        "following KV events"
    );
    // The last socket failure logged, and the stream's message count then: a failure is
    // logged when it differs, or when messages came in between (the socket had worked).
    let mut failed: Option<(String, u64)> = None;
    loop {
        let run = subscriber::run(
            &stream.subscriber,
            Arc::clone(&stream.replica),
            Arc::clone(&stream.frames),
            |outcome| log_change(name, outcome),
        );
        tokio::pin!(run);
        let retry_at = loop {
            tokio::select! {
                result = &mut run => {
                    if let Err(error) = result {
                        let failure = (error.to_string(), stream.messages());
                        if failed.as_ref() != Some(&failure) {
                            warn!(replica = name, %error, "KV events socket failed; following again every {RETRY_AFTER:?}");
                        }
                        failed = Some(failure);
                    }
                    break tokio::time::Instant::now() + RETRY_AFTER;
                }
                _ = ticks.tick() => log_change(name, &stream.tick(Instant::now(), clock.now_ms())),
                _ = stop.wait_for(|s| *s) => return,
                _ = gone.wait_for(|g| *g) => return,
            }
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(retry_at) => break,
                _ = ticks.tick() => log_change(name, &stream.tick(Instant::now(), clock.now_ms())),
                _ = stop.wait_for(|s| *s) => return,
                _ = gone.wait_for(|g| *g) => return,
            }
        }
    }
}

/// One number of a stream's snapshot.
type Read = fn(&View) -> u64;

/// The streams' part of `/metrics`, per replica with a stream.
impl MetricSource for Streams {
    fn write_metrics(&self, scrape: &mut Scrape<'_>) {
        let streams = self.all();
        if streams.is_empty() {
            return;
        }
        let now_ms = self.clock.now_ms();
        let views: Vec<(String, View)> = streams
            .iter()
            .map(|s| (s.name.clone(), s.view(now_ms)))
            .collect();
        let each = |f: &dyn Fn(&View) -> f64| -> Vec<(String, f64)> {
            views.iter().map(|(n, v)| (n.clone(), f(v))).collect()
        };
        let counters: [(&str, &str, Read); 8] = [
            (
                "cohort_kv_events_applied_total",
                "KV events payloads applied to the replica's residency.",
                |v| v.totals.applied,
            ),
            (
                "cohort_kv_events_duplicates_total",
                "KV events payloads skipped as already applied.",
                |v| v.totals.duplicates,
            ),
            (
                "cohort_kv_events_replays_total",
                "Replays asked of the replica's replay socket (gaps and late joins).",
                |v| v.totals.replays,
            ),
            (
                "cohort_kv_events_restarts_total",
                "Restarts of the replica's stream (its sequence back at 0): residency dropped.",
                |v| v.totals.restarts,
            ),
            (
                "cohort_kv_events_gaps_lost_total",
                "Gaps the replay could not fill (and undecodable payloads): residency dropped.",
                |v| v.totals.gaps_lost,
            ),
            (
                "cohort_kv_events_malformed_total",
                "KV events payloads that did not decode.",
                |v| v.totals.malformed,
            ),
            (
                "cohort_kv_events_unknown_events_total",
                "Events of unknown types, skipped.",
                |v| v.totals.unknown_events,
            ),
            (
                "cohort_kv_events_bad_frames_total",
                "ZeroMQ messages that were not a KV events message or replay reply.",
                |v| v.totals.bad_frames,
            ),
        ];
        for (name, help, value) in counters {
            scrape.labelled_counter(name, help, "replica", &each(&|v| value(v) as f64));
        }
        let skipped: [(&str, Read); 5] = [
            ("block_size", |v| v.totals.skipped_block_size),
            ("medium", |v| v.totals.skipped_medium),
            ("orphan", |v| v.totals.skipped_orphan),
            ("sliding_window", |v| v.totals.skipped_sliding_window),
            ("token_count", |v| v.totals.skipped_token_count),
        ];
        let rows: Vec<(Vec<String>, f64)> = views
            .iter()
            .flat_map(|(n, v)| {
                skipped
                    .iter()
                    .map(move |(why, value)| (vec![n.clone(), (*why).to_owned()], value(v) as f64))
            })
            .collect();
        scrape.counter_by(
            "cohort_kv_events_skipped_blocks_total",
            "Stored blocks the residency does not hold, by why.",
            &["replica", "reason"],
            &rows,
        );
        scrape.labelled_gauge(
            "cohort_kv_events_blocks_held",
            "Blocks the replica holds in its main tier, by its KV events.",
            "replica",
            &each(&|v| v.blocks_held as f64),
        );
        scrape.labelled_gauge(
            "cohort_kv_events_healthy",
            "1 while the replica's KV events stream is healthy (not malformed, right block size, not silent).",
            "replica",
            &each(&|v| if v.healthy { 1.0 } else { 0.0 }),
        );
        scrape.labelled_gauge(
            "cohort_kv_events_complete",
            "1 while the residency covers the stream since the engine's start or last clear.",
            "replica",
            &each(&|v| if v.complete { 1.0 } else { 0.0 }),
        );
        scrape.labelled_gauge(
            "cohort_kv_events_last_message_age_seconds",
            "Seconds since the replica's last KV events message (since it was followed, if none).",
            "replica",
            &each(&|v| v.lag_s),
        );
    }
}

#[cfg(test)]
mod tests {
    //! Every `[kv_events]` setting changes what a stream does, shown on the real vLLM
    //! recording (block size 128, tier `GPU`) through the settings the section gives the
    //! crate; `topic` is shown on sockets in `serve/inspect.rs`.
    use super::*;
    use crate::config::KvEventsSection;

    /// A well-formed batch with no events: `[ts, [], 0]`.
    const EMPTY_BATCH: [u8; 12] = [0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x00];

    fn cpu() -> KvEventsSection {
        KvEventsSection {
            block_size: 128,
            ..KvEventsSection::default()
        }
    }

    fn replica(section: &KvEventsSection, start: Instant) -> ReplicaEvents {
        ReplicaEvents::new(&section.replica_config(), start)
    }

    /// The recording, in order.
    fn replayed(section: &KvEventsSection) -> ReplicaEvents {
        let start = Instant::now();
        let mut r = replica(section, start);
        for (seq, payload) in cohort_kv_events::testing::live_payloads()
            .into_iter()
            .enumerate()
        {
            r.on_live(seq as u64, payload, start);
        }
        r
    }

    #[test]
    fn the_defaults_are_the_crates() {
        let section = KvEventsSection::default();
        assert_eq!(section.block_size, 16);
        assert_eq!(
            section.replica_config(),
            cohort_kv_events::replica::ReplicaConfig::new(16)
        );
    }

    #[test]
    fn block_size_and_main_medium_decide_what_is_held() {
        // The recording's last request holds its three full blocks after the reset.
        let r = replayed(&cpu());
        assert_eq!(r.counters().applied, 9);
        assert_eq!(r.residency().len(), 3);
        assert!(r.health().is_healthy());
        // At the GPU default of 16 tokens, every store is of the wrong size.
        let r = replayed(&KvEventsSection::default());
        assert_eq!(r.residency().len(), 0);
        assert!(r.counters().blocks.wrong_block_size > 0);
        assert_eq!(r.health().to_string(), "degraded (block_size)");
        // Counting an offloaded tier instead: vLLM's own cache says GPU, so nothing counts.
        let r = replayed(&KvEventsSection {
            main_medium: "CPU".into(),
            ..cpu()
        });
        assert_eq!(r.residency().len(), 0);
        assert!(r.counters().blocks.other_medium > 0);
    }

    #[test]
    fn silence_s_and_recover_after_set_the_health() {
        let start = Instant::now();
        let later = start + Duration::from_secs(2);
        let mut quick = replica(
            &KvEventsSection {
                silence_s: 1,
                ..cpu()
            },
            start,
        );
        let mut patient = replica(&cpu(), start);
        assert!(quick.tick(later).health.is_some());
        assert_eq!(quick.health().to_string(), "degraded (silent)");
        assert!(patient.tick(later).health.is_none());
        assert!(patient.health().is_healthy());

        let mut eager = replica(
            &KvEventsSection {
                recover_after: 1,
                ..cpu()
            },
            start,
        );
        let mut wary = replica(&cpu(), start);
        for r in [&mut eager, &mut wary] {
            r.on_live(0, vec![0xc1], start);
            r.on_live(1, EMPTY_BATCH.to_vec(), start);
            assert_eq!(r.counters().applied, 1);
        }
        assert!(eager.health().is_healthy());
        assert_eq!(wary.health().to_string(), "degraded (malformed)");
    }

    #[test]
    fn the_sequence_settings_decide_repeats_and_replays() {
        let start = Instant::now();
        let run = |section: KvEventsSection, steps: &dyn Fn(&mut ReplicaEvents)| {
            let mut r = replica(&section, start);
            steps(&mut r);
            *r.counters()
        };
        // Ten applied, then number 5 again: a repeat within 16, a restart beyond 2.
        let repeat = |r: &mut ReplicaEvents| {
            for seq in 0..10 {
                r.on_live(seq, EMPTY_BATCH.to_vec(), start);
            }
            r.on_live(5, EMPTY_BATCH.to_vec(), start);
        };
        let c = run(cpu(), &repeat);
        assert_eq!((c.duplicates, c.restarts), (1, 0));
        let narrow = KvEventsSection {
            duplicate_window: 2,
            ..cpu()
        };
        let c = run(narrow, &repeat);
        assert_eq!((c.duplicates, c.restarts), (0, 1));

        // A gap asks for a replay; one second without an answer loses it under a
        // 500 ms timeout, not under the 2 s default.
        let unanswered = |r: &mut ReplicaEvents| {
            r.on_live(0, EMPTY_BATCH.to_vec(), start);
            assert_eq!(
                r.on_live(2, EMPTY_BATCH.to_vec(), start).replay_from,
                Some(1)
            );
            r.tick(start + Duration::from_secs(1));
        };
        assert_eq!(run(cpu(), &unanswered).gaps_lost, 0);
        let short = KvEventsSection {
            replay_timeout_ms: 500,
            ..cpu()
        };
        assert_eq!(run(short, &unanswered).gaps_lost, 1);

        // Live messages pile up during the replay: beyond max_held the gap is lost.
        let piling = |r: &mut ReplicaEvents| {
            r.on_live(0, EMPTY_BATCH.to_vec(), start);
            for seq in 2..5 {
                r.on_live(seq, EMPTY_BATCH.to_vec(), start);
            }
        };
        assert_eq!(run(cpu(), &piling).gaps_lost, 0);
        let small = KvEventsSection {
            max_held: 1,
            ..cpu()
        };
        assert_eq!(run(small, &piling).gaps_lost, 1);
    }

    #[tokio::test]
    async fn a_stream_is_silent_while_its_engine_is_unreachable_and_follows_it_once_up() {
        use zeromq::{PubSocket, Socket, SocketSend};
        // A port nothing listens on yet.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let mut config = ServeConfig {
            replicas: vec![crate::config::Replica::named("r0")],
            kv_events: KvEventsSection {
                silence_s: 1,
                ..cpu()
            },
            ..ServeConfig::default()
        };
        config.replicas[0].kv_events = Some(endpoint.clone().try_into().unwrap());
        let clock = Clock::start();
        let streams = Arc::new(Streams::new(&config, clock));
        let (stop_tx, stop_rx) = watch::channel(false);
        let tasks = spawn(Arc::clone(&streams), stop_rx);
        let view = || streams.get("r0").unwrap().view(clock.now_ms());
        let deadline = Instant::now() + Duration::from_secs(8);
        // Ticks go on while the socket is still connecting: the stream turns silent.
        while view().healthy {
            assert!(Instant::now() < deadline, "never silent: {:?}", view());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let v = view();
        assert_eq!(
            (v.health.as_str(), v.messages_seen),
            ("degraded (silent)", false)
        );
        // The engine comes up and publishes: followed, healthy again.
        let mut publisher = PubSocket::new();
        publisher.bind(&endpoint).await.unwrap();
        let first = cohort_kv_events::testing::zmq_message(
            cohort_kv_events::testing::recording("stream.jsonl").remove(0),
        );
        while view().totals.applied == 0 {
            assert!(Instant::now() < deadline, "never followed: {:?}", view());
            publisher.send(first.clone()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let v = view();
        assert!(v.healthy && v.messages_seen, "{v:?}");
        assert_eq!(v.blocks_held, 3);
        stop_tx.send(true).unwrap();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .expect("the task stops")
                .unwrap();
        }
    }

    #[tokio::test]
    async fn discovered_replicas_are_followed_at_their_address_while_they_stay() {
        use zeromq::{PubSocket, Socket, SocketSend};
        let mut publisher = PubSocket::new();
        let bound = publisher
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap()
            .to_string();
        let port: u16 = bound.rsplit_once(':').unwrap().1.parse().unwrap();
        let config = ServeConfig {
            discovery: crate::config::DiscoverySection {
                dns: Some("engines.llm.svc".into()),
                ..Default::default()
            },
            kv_events: KvEventsSection {
                port: Some(port),
                replay_port: Some(port + 1),
                ..cpu()
            },
            ..ServeConfig::default()
        };
        let clock = Clock::start();
        let streams = Arc::new(Streams::new(&config, clock));
        assert!(!streams.is_empty(), "replicas may join with streams");
        let (stop_tx, stop_rx) = watch::channel(false);
        assert!(spawn(Arc::clone(&streams), stop_rx).is_empty());
        let pod = |name: &'static str| (name, "127.0.0.1:8000");
        streams.set_members(&[pod("pod-a")]);
        let stream = streams.get("pod-a").expect("followed once found");
        assert_eq!(
            stream.subscriber.endpoint,
            format!("tcp://127.0.0.1:{port}")
        );
        assert_eq!(
            stream.subscriber.replay_endpoint,
            Some(format!("tcp://127.0.0.1:{}", port + 1))
        );
        // Its task follows the engine's stream.
        let first = cohort_kv_events::testing::zmq_message(
            cohort_kv_events::testing::recording("stream.jsonl").remove(0),
        );
        let deadline = Instant::now() + Duration::from_secs(8);
        while stream.view(clock.now_ms()).totals.applied == 0 {
            assert!(Instant::now() < deadline, "never followed");
            publisher.send(first.clone()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Found again with another: the first keeps its stream, the second gets one.
        streams.set_members(&[pod("pod-a"), pod("pod-b")]);
        assert!(Arc::ptr_eq(&stream, &streams.get("pod-a").unwrap()));
        assert!(streams.get("pod-b").is_some());
        // Gone: no stream, and its task ends (it held the other reference).
        streams.set_members(&[pod("pod-b")]);
        assert!(streams.get("pod-a").is_none());
        while Arc::strong_count(&stream) > 1 {
            assert!(Instant::now() < deadline, "the task outlived its replica");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop_tx.send(true).unwrap();
        // Without `port`, discovery adds no stream.
        let plain = Streams::new(
            &ServeConfig {
                discovery: config.discovery.clone(),
                ..ServeConfig::default()
            },
            clock,
        );
        plain.set_members(&[pod("pod-a")]);
        assert!(plain.get("pod-a").is_none() && plain.is_empty());
    }

    #[test]
    fn a_stream_without_a_task_reads_as_silent_since_it_was_followed() {
        let mut config = ServeConfig {
            replicas: vec![
                crate::config::Replica::named("r0"),
                crate::config::Replica::named("r1"),
            ],
            kv_events: cpu(),
            ..ServeConfig::default()
        };
        config.replicas[1].kv_events = Some("tcp://127.0.0.1:5557".to_owned().try_into().unwrap());
        let streams = Streams::new(&config, Clock::start());
        assert!(streams.get("r0").is_none());
        let stream = streams.get("r1").unwrap();
        assert_eq!(stream.subscriber.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(stream.subscriber.replay_endpoint, None);
        let view = stream.view(5_000);
        assert!(!view.messages_seen);
        assert!(view.lag_s >= 4.9, "{view:?}");
        // A message applied: the next tick (or read) dates it.
        let payload = cohort_kv_events::testing::live_payloads().remove(0);
        lock(&stream.replica).on_live(0, payload, Instant::now());
        assert!(stream.tick(Instant::now(), 5_000).health.is_none());
        let view = stream.view(5_300);
        assert!(view.messages_seen);
        assert_eq!((view.lag_s, view.blocks_held), (0.3, 3));
        let page = crate::metrics::render_one(move |scrape: &mut Scrape<'_>| {
            streams.write_metrics(scrape)
        });
        assert!(
            page.contains("cohort_kv_events_applied_total{replica=\"r1\"} 1.0\n"),
            "{page}"
        );
        assert!(!page.contains("replica=\"r0\""), "{page}");
    }
}
