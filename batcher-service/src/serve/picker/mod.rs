//! The Gateway API Inference Extension endpoint picker: `cohort serve`'s answer to Envoy's
//! external processing filter (`envoy.service.ext_proc.v3.ExternalProcessor/Process`) on
//! its own port (`[picker] listen`), with the standard gRPC health service beside it.
//!
//! Each HTTP request is one `Process` stream ([`exchange`]): the picker fingerprints the
//! request with the wasm filter's own code, decides with the batcher's brain as assign mode
//! does, and answers the endpoint (`x-gateway-destination-endpoint` and the `envoy.lb`
//! metadata, [`protocol`]) chosen among the replicas' endpoints ([`choose`]); the response
//! path reports first byte and end to the brain. docs/CONTRACT.md ("Endpoint picker") is
//! the contract.
//!
//! Health (`grpc.health.v1.Health`): `""` and `liveness` always SERVING; `readiness` and
//! `envoy.service.ext_proc.v3.ExternalProcessor` SERVING while the brain has a ready
//! replica with an endpoint and the batcher is not draining, re-checked every second.
//!
//! Shutdown: with the serve's stop signal a stream ends as soon as its request is answered
//! (the decision and every body chunk sent back; Envoy then goes on without the picker for
//! the response, whose end the ticket takes at once); a stream that has received nothing
//! ends with UNAVAILABLE, so Envoy applies the pool's failure mode. The server stops
//! accepting and the health task stops.

pub mod choose;
pub mod exchange;
pub mod metrics;
pub mod protocol;

use crate::clock::Clock;
use crate::config::ServeConfig;
use crate::serve::brain::pick::Decided;
use crate::serve::brain::Brain;
use cohort_ext_proc_proto::ext_proc::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use cohort_ext_proc_proto::ext_proc::{ProcessingRequest, ProcessingResponse};
use cohort_filter::config::{FilterConfig, Mode};
use cohort_proto as pb;
use exchange::{Decision, Exchange};
use metrics::PickerMetrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

/// The largest ext_proc message accepted: a buffered body at the filter's largest
/// `body_limit_bytes` (64 MiB) with its headers.
const MESSAGE_LIMIT: usize = 72 << 20;

/// What every stream shares.
pub struct Picker {
    pub brain: Arc<Brain>,
    /// The filter's configuration the picker fingerprints under (with block hashes on:
    /// the picker is the batcher).
    pub filter: FilterConfig,
    pub endpoints: choose::Endpoints,
    /// Request body → the engine's block keys (`[kv_events] prompt_tokens`), so decisions
    /// match what the engines publish they hold; `None`: the modelled residency only.
    pub prompts: Option<cohort_prompt_tokens::Prompts>,
    pub deadline: Duration,
    pub metrics: Arc<PickerMetrics>,
    pub clock: Clock,
    /// The learned cohorts' table (the filter's `learned_cohorts`), one for the picker as
    /// one Envoy's shared data holds one for its filters; unused without that setting.
    pub learned: std::sync::Mutex<cohort_fingerprint::learned::LearnedCohorts>,
    /// Tests: how long each decision waits before it asks the brain (a slow brain).
    #[cfg(test)]
    pub slow_decisions: Duration,
}

impl Picker {
    /// The picker of `config` over `brain`; refuses a filter configuration that does not
    /// parse.
    pub fn new(config: &ServeConfig, brain: Arc<Brain>, clock: Clock) -> anyhow::Result<Picker> {
        let mut filter = config
            .picker
            .filter_config_parsed()
            .map_err(|e| anyhow::anyhow!("picker.{e}"))?;
        // The filter computes the prefix block chain only for a batcher; here it is one.
        if filter.batcher_clusters.is_empty() {
            filter.batcher_clusters = vec!["cohort-picker".into()];
        }
        filter.mode = Mode::Assign;
        filter.observe = true;
        let prompts = crate::kv_events::prompts(&config.kv_events)
            .map_err(|e| anyhow::anyhow!("kv_events.prompt_tokens: {e}"))?;
        Ok(Picker {
            brain,
            prompts,
            filter,
            endpoints: choose::Endpoints::from_config(config),
            deadline: Duration::from_millis(config.picker.assign_deadline_ms),
            metrics: Arc::new(PickerMetrics::default()),
            clock,
            learned: std::sync::Mutex::new(Default::default()),
            #[cfg(test)]
            slow_decisions: Duration::ZERO,
        })
    }

    /// The brain's decision among the slots `among` marks, within the deadline. The
    /// decision runs as its own task: a slow one is left to finish, and a ticket it opens
    /// after the deadline is ended at once (nothing was sent there).
    /// The block keys of `body`'s prompt, when `[kv_events] prompt_tokens` is set and the
    /// API has a chat template or a prompt string (counted either way).
    pub fn prompt_keys(
        &self,
        api: cohort_fingerprint::Api,
        body: &[u8],
    ) -> Option<cohort_prompt_tokens::PromptKeys> {
        use cohort_prompt_tokens::Api;
        use metrics::PromptTokens;
        let prompts = self.prompts.as_ref()?;
        let api = match api {
            cohort_fingerprint::Api::OpenAiChat => Api::Chat,
            cohort_fingerprint::Api::OpenAiCompletions => Api::Completions,
            cohort_fingerprint::Api::OpenAiResponses
            | cohort_fingerprint::Api::AnthropicMessages => {
                self.metrics.prompt_tokens(PromptTokens::OtherApi);
                return None;
            }
        };
        match prompts.keys(api, body) {
            Ok(keys) => {
                self.metrics.prompt_tokens(PromptTokens::Keyed);
                Some(keys)
            }
            Err(error) => {
                self.metrics.prompt_tokens(PromptTokens::Failed);
                tracing::debug!(%error, "no engine tokens for the prompt: modelled residency");
                None
            }
        }
    }

    pub async fn decide(
        &self,
        assign: pb::AssignRequest,
        among: Vec<bool>,
        prompt: Option<cohort_prompt_tokens::PromptKeys>,
    ) -> Decision {
        let brain = Arc::clone(&self.brain);
        #[cfg(test)]
        let slow = self.slow_decisions;
        let mut task: JoinHandle<Result<Decided, crate::serve::brain::BrainError>> =
            tokio::spawn(async move {
                #[cfg(test)]
                if !slow.is_zero() {
                    tokio::time::sleep(slow).await;
                }
                brain.pick(&assign, &among, prompt.as_ref()).await
            });
        match tokio::time::timeout(self.deadline, &mut task).await {
            Ok(Ok(Ok(decided))) => Decision::Decided(decided),
            Ok(Ok(Err(error))) => Decision::Failed(error),
            Ok(Err(_panicked)) => Decision::Failed(crate::serve::brain::BrainError::NoReplicas),
            Err(_elapsed) => {
                let brain = Arc::clone(&self.brain);
                let clock = self.clock;
                tokio::spawn(async move {
                    if let Ok(Ok(late)) = task.await {
                        if late.reply.ticket != 0 {
                            brain.observe(
                                &pb::ObservationBatch {
                                    observations: vec![batcher_end(&late)],
                                    dropped: 0,
                                },
                                clock.now_ms(),
                            );
                        }
                    }
                });
                Decision::TimedOut
            }
        }
    }

    /// One observation (a filter's Observe, natively).
    pub fn observe(&self, observation: pb::Observation) {
        self.brain.observe(
            &pb::ObservationBatch {
                observations: vec![observation],
                dropped: 0,
            },
            self.clock.now_ms(),
        );
    }

    /// Whether a request could be picked now: a usable replica with an endpoint.
    pub fn ready(&self) -> bool {
        let slots = self.brain.slots(self.clock.now_ms());
        let mask = choose::eligible(&slots, &self.endpoints, None);
        choose::any_usable(&slots, &mask)
    }
}

/// The end (status 0) of a decision nobody was sent to.
fn batcher_end(late: &Decided) -> pb::Observation {
    cohort_filter::batcher::progress_observation(
        late.reply.ticket,
        pb::request_progress::Phase::End,
        0,
        0,
        &late.reply.shard,
        0,
    )
}

/// The ext_proc service.
struct PickerService {
    picker: Arc<Picker>,
    shutdown: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl ExternalProcessor for PickerService {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(32);
        let mut exchange = Exchange::new(Arc::clone(&self.picker));
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut stopping = false;
            'stream: loop {
                if stopping && exchange.request_answered() {
                    break;
                }
                let message = tokio::select! {
                    message = inbound.message() => Some(message),
                    _ = tx.closed() => break,
                    _ = shutdown.wait_for(|stopping| *stopping), if !stopping => None,
                };
                let Some(message) = message else {
                    stopping = true;
                    if exchange.untouched() {
                        // Nothing received yet: Envoy applies the pool's failure mode.
                        let stopping = Status::unavailable("the picker is stopping");
                        let _ = tx.send(Err(stopping)).await;
                        break;
                    }
                    continue;
                };
                let Ok(Some(message)) = message else { break };
                for answer in exchange.handle(message).await {
                    if tx.send(Ok(answer)).await.is_err() {
                        break 'stream;
                    }
                }
            }
            exchange.close();
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The picker's server on `listener` until `stop`: ext_proc and health. Returns the
/// server task and the health task.
pub fn serve(
    listener: tokio::net::TcpListener,
    picker: Arc<Picker>,
    stop: watch::Receiver<bool>,
    draining: Arc<AtomicBool>,
) -> (
    JoinHandle<Result<(), tonic::transport::Error>>,
    JoinHandle<()>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    let health_task = tokio::spawn({
        let picker = Arc::clone(&picker);
        let mut stop = stop.clone();
        async move {
            reporter
                .set_service_status("liveness", ServingStatus::Serving)
                .await;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                let ready = picker.ready() && !draining.load(Ordering::SeqCst);
                let status = if ready {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                for service in ["readiness", cohort_ext_proc_proto::SERVICE] {
                    reporter.set_service_status(service, status).await;
                }
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
    });
    let service = PickerService {
        picker,
        shutdown: stop.clone(),
    };
    let server = tokio::spawn({
        let mut stop = stop;
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(
                ExternalProcessorServer::new(service)
                    .max_decoding_message_size(MESSAGE_LIMIT)
                    .max_encoding_message_size(MESSAGE_LIMIT),
            )
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
    });
    (server, health_task)
}

#[cfg(test)]
mod tests;
