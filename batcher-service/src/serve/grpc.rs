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
        Status::invalid_argument(error.to_string())
    }
}

#[tonic::async_trait]
impl Batcher for BatcherService {
    async fn assign(
        &self,
        request: Request<pb::AssignRequest>,
    ) -> Result<Response<pb::AssignReply>, Status> {
        let assign = request.get_ref();
        let mut reply = self.brain.assign(assign, self.clock.now_ms())?;
        if let (Some(front), Some(info)) = (&self.front, &assign.request) {
            let knobs = self.brain.knobs(info);
            let live: Arc<dyn LiveFleet> = self.brain.clone();
            reply.exemplar_wanted =
                front.assigned(info, &reply, knobs.prefetch, knobs.cache_ttl_s, &live);
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
