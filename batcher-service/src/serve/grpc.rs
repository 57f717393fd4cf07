//! The `cohort.v1.Batcher` gRPC service: thin handlers over the [`Brain`].
//!
//! `Observe` streams live as long as the filter's VM; on shutdown every open stream is
//! ended with its summary so the server can drain instead of waiting for them forever.

use super::brain::{Brain, BrainError};
use crate::clock::Clock;
use crate::front::{Front, LiveFleet};
use cohort_proto as pb;
use pb::batcher_server::Batcher;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

/// The knobs nothing acts on without the front (replicas known by name only): it is the
/// front that warms predicted cohorts and learns the sessions' sequences. Named in
/// `AssignReply.inert_knobs`, so the filter tells the caller (`x-cohort-ignored`).
pub const INERT_WITHOUT_FRONT: [&str; 2] = ["prefetch", "session"];

pub struct BatcherService {
    pub brain: Arc<Brain>,
    /// Batch mode's front, when the replicas have URLs: it also learns and warms cohorts
    /// for assign mode's requests ([`Front::assigned`]).
    pub front: Option<Arc<Front>>,
    pub clock: Clock,
    /// Becomes true when the server starts shutting down.
    pub shutdown: watch::Receiver<bool>,
}

impl From<BrainError> for Status {
    fn from(error: BrainError) -> Status {
        match error {
            BrainError::NoFingerprint => Status::invalid_argument(error.to_string()),
            BrainError::NoReplicas => Status::unavailable(error.to_string()),
        }
    }
}

#[tonic::async_trait]
impl Batcher for BatcherService {
    async fn assign(
        &self,
        request: Request<pb::AssignRequest>,
    ) -> Result<Response<pb::AssignReply>, Status> {
        let assign = request.get_ref();
        let mut reply = self.brain.assign_in_burst_order(assign).await?;
        if let (Some(front), Some(info)) = (&self.front, &assign.request) {
            let knobs = self.brain.knobs(info);
            let live: Arc<dyn LiveFleet> = self.brain.clone();
            reply.exemplar_wanted =
                front.assigned(info, &reply, knobs.prefetch, knobs.cache_ttl_s, &live);
        }
        if self.front.is_none() {
            reply.inert_knobs = INERT_WITHOUT_FRONT.map(String::from).to_vec();
        }
        Ok(Response::new(reply))
    }

    async fn observe(
        &self,
        request: Request<Streaming<pb::ObservationBatch>>,
    ) -> Result<Response<pb::ObserveSummary>, Status> {
        let mut stream = request.into_inner();
        let mut shutdown = self.shutdown.clone();
        let mut received = 0u64;
        loop {
            let batch = tokio::select! {
                batch = stream.message() => batch?,
                _ = shutdown.wait_for(|stopping| *stopping) => None,
            };
            let Some(batch) = batch else { break };
            received += batch.observations.len() as u64;
            self.brain.observe(&batch, self.clock.now_ms());
            if let Some(front) = &self.front {
                for observation in &batch.observations {
                    if !observation.exemplar.is_empty() {
                        front.exemplar_observed(observation);
                    }
                    if let Some(progress) = &observation.progress {
                        if progress.phase == pb::request_progress::Phase::FirstByte as i32 {
                            let live: Arc<dyn LiveFleet> = self.brain.clone();
                            front.first_byte(progress.ticket, &live);
                        }
                    }
                }
            }
        }
        Ok(Response::new(pb::ObserveSummary { received }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        Ok(Response::new(self.brain.status(self.clock.now_ms())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Replica, ServeConfig};

    fn service(burst_order: bool) -> Arc<BatcherService> {
        let mut config = ServeConfig {
            replicas: vec![Replica::named("r0"), Replica::named("r1")],
            ..ServeConfig::default()
        };
        config.policy.burst_order = burst_order;
        let clock = Clock::start();
        Arc::new(BatcherService {
            brain: Arc::new(Brain::new(&config, clock)),
            front: None,
            clock,
            shutdown: watch::channel(false).1,
        })
    }

    /// An Assign of `blocks` and a prompt of `prompt_bytes` (no sketch: no cohort).
    fn request(blocks: Vec<u64>, prompt_bytes: u32) -> Request<pb::AssignRequest> {
        Request::new(pb::AssignRequest {
            request: Some(pb::RequestInfo {
                fingerprint: Some(pb::Fingerprint {
                    key: blocks[0],
                    blocks,
                    prompt_bytes,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn shard(service: &BatcherService, blocks: Vec<u64>, prompt_bytes: u32) -> String {
        let reply = service.assign(request(blocks, prompt_bytes)).await.unwrap();
        reply.into_inner().shard
    }

    /// A burst of two received together, a cold prompt first and a conversation's next
    /// turn second, on a fleet where the turn's holder carries less load than the other
    /// replica. Returns (cold, turn) shards.
    async fn burst(burst_order: bool) -> (String, String) {
        let service = service(burst_order);
        let history = shard(&service, vec![1, 2], 4_096).await;
        let other = shard(&service, vec![100, 101, 102, 103, 104], 16_384).await;
        assert_ne!(history, other);
        let cold = tokio::spawn({
            let service = Arc::clone(&service);
            async move { shard(&service, vec![500, 501, 502], 2_048).await }
        });
        let turn = tokio::spawn({
            let service = Arc::clone(&service);
            async move { shard(&service, vec![1, 2, 3], 48_000).await }
        });
        let (cold, turn) = (cold.await.unwrap(), turn.await.unwrap());
        assert_eq!(turn, history, "the turn goes to its history either way");
        // Every Assign but the turn had no home (the first two found an empty fleet).
        let brain = Arc::clone(&service.brain);
        let page = crate::metrics::render_one(move |scrape: &mut crate::metrics::Scrape<'_>| {
            brain.write_metrics(scrape, 0)
        });
        let yields = if burst_order { 3 } else { 0 };
        assert!(
            page.contains(&format!("cohort_assign_burst_yields_total {yields}\n")),
            "{page}"
        );
        (cold, turn)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn burst_order_decides_the_turn_with_a_home_before_the_cold_prompt() {
        // On: the cold prompt yields, the turn loads its holder first, and the prompt goes
        // to the other replica.
        let (cold, turn) = burst(true).await;
        assert_ne!(cold, turn, "burst order on");
        // Off: decided as they came, the prompt takes the less loaded holder and the
        // turn's 12k-token prefill then queues behind it there.
        let (cold, turn) = burst(false).await;
        assert_eq!(cold, turn, "burst order off");
    }
}
