//! The batcher's time: milliseconds since `cohort serve` started, injected into every
//! decision so the pure core never reads a clock and tests can drive time by hand.

use std::time::Instant;

/// Milliseconds since the batcher started: the injected time of every decision.
#[derive(Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    pub fn now_ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}
