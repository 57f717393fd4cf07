//! What each replica has in flight, exactly, from the filter's progress reports.
//!
//! Every Assign decision opens a *ticket* (an id the filter gets in its reply) holding the
//! replica and the prefill work the decision expected there (the request's uncached
//! prompt). The filter reports the request's first response byte and its end under that
//! ticket. So per replica the book knows:
//!
//! - **pending prefill**: the work of tickets with no first byte yet. On an engine that
//!   prefills in arrival order this is the queue a new request waits behind, in the same
//!   units as its own prefill: the time-to-first-token signal;
//! - **in flight**: tickets not ended (prefilling, waiting for a slot, or decoding);
//! - **service rate**: how fast the replica gets through the work queued on it, learnt
//!   from each first byte: (the work queued ahead of the ticket when it opened + its own)
//!   over its time to first byte, averaged. It turns pending work into time, so a slow
//!   replica (a smaller GPU, a noisy neighbour, slots full of long decodes) looks slow;
//! - **backlog** ([`InFlight::backlog`]): the pending work less what the replica has done
//!   of it since its last first byte. The request at the head of the queue has been
//!   prefilling since the previous one's first byte (or since it arrived on an idle
//!   replica): `rate × that time` of it is done, at most its own work. Without this a
//!   replica half-way through a long prefill looked as busy as one that had just begun it,
//!   and short requests went behind the wrong long one;
//! - **expected wait** ([`InFlight::wait_ms`]): the backlog over the rate.
//!
//! A replica that stops answering is caught by health, not by a floor of the wait at the
//! age of its oldest pending request; and the next request in line is taken to start its
//! prefill when the head's first-byte report arrives (up to 20 ms after the byte, as the
//! filter batches reports). Both were measured against the alternatives:
//! docs/DECISIONS.md.
//!
//! A ticket whose reports never come (a filter without progress reports, a dropped
//! observation, an Envoy restart) expires after `ttl_ms`, so a lost report cannot pin a
//! replica's load for good. The book is bounded: beyond `max_tickets` open tickets a
//! decision gets no ticket (0) and counts only in the decaying estimate.

use std::collections::{HashMap, VecDeque};

/// Weight of a new rate sample in the average.
const RATE_WEIGHT: f64 = 0.2;

/// One open decision.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    replica: usize,
    work: f64,
    /// Pending work on the replica when this ticket opened (queued ahead of it).
    ahead: f64,
    opened_ms: u64,
    prefilled: bool,
}

/// Per-replica totals over open tickets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplicaInFlight {
    /// Work of tickets with no first byte yet.
    pub pending_work: f64,
    /// Tickets with no first byte yet.
    pub pending: u32,
    /// Tickets not ended.
    pub in_flight: u32,
    /// Learnt service rate, work per ms (`None` until a first byte taught it).
    pub rate: Option<f64>,
}

/// What a progress report said, for the caller's health bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub replica: usize,
    /// When the ticket's decision was made.
    pub opened_ms: u64,
    /// The response status when the report is an end (0 when there was none).
    pub status: Option<u32>,
}

/// The ticket book of one policy.
#[derive(Debug)]
pub struct InFlight {
    tickets: HashMap<u64, Ticket>,
    replicas: Vec<ReplicaInFlight>,
    next: u64,
    ttl_ms: u64,
    max_tickets: usize,
    last_report_ms: Option<u64>,
    expired: u64,
    /// Per replica: its pending tickets in the order they were opened, `(ticket, work)`
    /// (entries already prefilled or closed are dropped lazily from the front), and when
    /// the head of that queue started (the last first byte, or its arrival on an idle
    /// replica).
    queues: Vec<VecDeque<(u64, f64)>>,
    head_since_ms: Vec<u64>,
}

impl InFlight {
    pub fn new(replicas: usize, ttl_ms: u64, max_tickets: usize) -> InFlight {
        InFlight {
            tickets: HashMap::new(),
            replicas: vec![ReplicaInFlight::default(); replicas],
            next: 0,
            ttl_ms,
            max_tickets,
            last_report_ms: None,
            expired: 0,
            queues: vec![VecDeque::new(); replicas],
            head_since_ms: vec![0; replicas],
        }
    }

    /// Empties `replica`'s slot (growing the book when it is new): its totals, its queue,
    /// and every ticket open on it (a late report for one is then ignored).
    pub fn reset_slot(&mut self, replica: usize) {
        if replica >= self.replicas.len() {
            self.replicas
                .resize(replica + 1, ReplicaInFlight::default());
            self.queues.resize(replica + 1, VecDeque::new());
            self.head_since_ms.resize(replica + 1, 0);
        }
        self.replicas[replica] = ReplicaInFlight::default();
        self.queues[replica].clear();
        self.head_since_ms[replica] = 0;
        self.tickets.retain(|_, t| t.replica != replica);
    }

    /// Opens a ticket for `work` sent to `replica`; 0 when the book is full.
    pub fn open(&mut self, replica: usize, work: f64, now_ms: u64) -> u64 {
        if replica >= self.replicas.len() || self.tickets.len() >= self.max_tickets {
            return 0;
        }
        self.next = self.next.wrapping_add(1).max(1);
        let work = if work.is_finite() { work.max(0.0) } else { 0.0 };
        if self.replicas[replica].pending == 0 {
            self.head_since_ms[replica] = now_ms;
        }
        let own_rate = self.replicas[replica].rate;
        let ahead = own_rate.map_or(self.replicas[replica].pending_work, |rate| {
            self.backlog(replica, rate, now_ms)
        });
        self.prune(replica);
        self.queues[replica].push_back((self.next, work));
        self.tickets.insert(
            self.next,
            Ticket {
                replica,
                work,
                ahead,
                opened_ms: now_ms,
                prefilled: false,
            },
        );
        let r = &mut self.replicas[replica];
        r.pending_work += work;
        r.pending += 1;
        r.in_flight += 1;
        self.next
    }

    /// Takes `t`'s work off its replica's pending total; the next request in line starts
    /// its prefill at `now_ms`.
    fn unpend(&mut self, t: &Ticket, now_ms: u64) {
        self.head_since_ms[t.replica] = now_ms;
        let r = &mut self.replicas[t.replica];
        r.pending = r.pending.saturating_sub(1);
        // With nothing pending the sum is exactly 0 (no floating-point residue).
        r.pending_work = if r.pending == 0 {
            0.0
        } else {
            (r.pending_work - t.work).max(0.0)
        };
    }

    /// The request's first response byte went by, `elapsed_ms` after its decision.
    /// Unknown tickets are ignored.
    pub fn first_byte(&mut self, ticket: u64, elapsed_ms: u32, now_ms: u64) -> Option<Reported> {
        self.last_report_ms = Some(now_ms);
        let entry = self.tickets.get_mut(&ticket)?;
        let first = !entry.prefilled;
        entry.prefilled = true;
        let t = *entry;
        if first {
            self.unpend(&t, now_ms);
            let sample = (t.ahead + t.work) / f64::from(elapsed_ms.max(1));
            let rate = &mut self.replicas[t.replica].rate;
            *rate = Some(match *rate {
                Some(r) => r + RATE_WEIGHT * (sample - r),
                None => sample,
            });
        }
        Some(Reported {
            replica: t.replica,
            opened_ms: t.opened_ms,
            status: None,
        })
    }

    /// The request ended with `status`. Unknown tickets are ignored.
    pub fn end(&mut self, ticket: u64, status: u32, now_ms: u64) -> Option<Reported> {
        self.last_report_ms = Some(now_ms);
        let t = self.tickets.remove(&ticket)?;
        if !t.prefilled {
            self.unpend(&t, now_ms);
        }
        let r = &mut self.replicas[t.replica];
        r.in_flight = r.in_flight.saturating_sub(1);
        Some(Reported {
            replica: t.replica,
            opened_ms: t.opened_ms,
            status: Some(status),
        })
    }

    /// `ticket`'s request is served by `replica` instead of the replica it was opened
    /// for: a ticket still pending leaves its queue there (no rate is learnt from it), and
    /// its in-flight count moves to `replica`. Unknown tickets and replicas are ignored.
    pub fn moved(&mut self, ticket: u64, replica: usize, now_ms: u64) -> bool {
        if replica >= self.replicas.len() {
            return false;
        }
        let Some(entry) = self.tickets.get_mut(&ticket) else {
            return false;
        };
        let t = *entry;
        if t.replica == replica {
            return true;
        }
        entry.replica = replica;
        entry.prefilled = true;
        if !t.prefilled {
            self.unpend(&t, now_ms);
        }
        let from = &mut self.replicas[t.replica];
        from.in_flight = from.in_flight.saturating_sub(1);
        self.replicas[replica].in_flight += 1;
        true
    }

    /// Closes tickets older than the TTL (their reports are not coming).
    pub fn expire(&mut self, now_ms: u64) {
        let ttl = self.ttl_ms;
        let mut gone = Vec::new();
        self.tickets.retain(|_, t| {
            let keep = now_ms.saturating_sub(t.opened_ms) <= ttl;
            if !keep {
                gone.push(*t);
            }
            keep
        });
        for t in &gone {
            if !t.prefilled {
                self.unpend(t, now_ms);
            }
            let r = &mut self.replicas[t.replica];
            r.in_flight = r.in_flight.saturating_sub(1);
        }
        self.expired += gone.len() as u64;
    }

    /// The prefill work still ahead of a request sent to `replica` at `now_ms`: its
    /// pending work less what `rate` (work per ms) has done of the head of its queue since
    /// that began (at most the head's own work).
    pub fn backlog(&mut self, replica: usize, rate: f64, now_ms: u64) -> f64 {
        let Some(pending) = self.replicas.get(replica).map(|r| r.pending_work) else {
            return 0.0;
        };
        self.prune(replica);
        let head = self.queues[replica].front().map_or(0.0, |&(_, work)| work);
        let since = now_ms.saturating_sub(self.head_since_ms[replica]) as f64;
        let done = (rate.max(0.0) * since).min(head);
        (pending - done).max(0.0)
    }

    /// Drops the front entries of `replica`'s queue that are no longer pending (called on
    /// every open too, so the queue stays bounded when nothing asks for the backlog).
    fn prune(&mut self, replica: usize) {
        let tickets = &self.tickets;
        let queue = &mut self.queues[replica];
        while queue
            .front()
            .is_some_and(|(id, _)| tickets.get(id).is_none_or(|t| t.prefilled))
        {
            queue.pop_front();
        }
    }

    /// How long a request sent to `replica` at `now_ms` would wait for its prefill to
    /// start, ms: its [backlog](Self::backlog) over `rate` (work per ms).
    pub fn wait_ms(&mut self, replica: usize, rate: f64, now_ms: u64) -> f64 {
        let rate = rate.max(1e-6);
        self.backlog(replica, rate, now_ms) / rate
    }

    /// The replica's learnt rate, else `default_rate` (work per ms, floored above 0).
    pub fn rate(&self, replica: usize, default_rate: f64) -> f64 {
        self.replicas
            .get(replica)
            .and_then(|r| r.rate)
            .unwrap_or(default_rate)
            .max(1e-6)
    }

    /// The mean learnt rate over the replicas that have one.
    pub fn mean_rate(&self) -> Option<f64> {
        let rates: Vec<f64> = self.replicas.iter().filter_map(|r| r.rate).collect();
        (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
    }

    /// Whether progress reports are arriving: one came within `window_ms`.
    pub fn is_live(&self, now_ms: u64, window_ms: u64) -> bool {
        self.last_report_ms
            .is_some_and(|at| now_ms.saturating_sub(at) <= window_ms)
    }

    pub fn replica(&self, replica: usize) -> ReplicaInFlight {
        self.replicas.get(replica).copied().unwrap_or_default()
    }

    /// Tickets closed by expiry so far (reports that never came).
    pub fn expired(&self) -> u64 {
        self.expired
    }

    pub fn open_tickets(&self) -> usize {
        self.tickets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_pending_and_in_flight_exactly() {
        let mut book = InFlight::new(2, 1_000, 10);
        let a = book.open(0, 100.0, 0);
        let b = book.open(0, 50.0, 0);
        let c = book.open(1, 10.0, 0);
        assert_ne!(a, b);
        assert_eq!(book.replica(0).pending_work, 150.0);
        assert_eq!(book.replica(0).in_flight, 2);
        assert_eq!(
            book.first_byte(a, 5, 5),
            Some(Reported {
                replica: 0,
                opened_ms: 0,
                status: None
            })
        );
        book.first_byte(a, 6, 6); // a repeated report changes nothing
        assert_eq!(book.replica(0).pending_work, 50.0);
        assert_eq!(book.replica(0).pending, 1);
        assert_eq!(book.replica(0).in_flight, 2);
        // An end without a first byte (a failure) clears both.
        assert_eq!(book.end(b, 503, 7).unwrap().status, Some(503));
        assert_eq!(book.replica(0).pending_work, 0.0);
        assert_eq!(book.replica(0).in_flight, 1);
        book.end(a, 200, 8);
        assert_eq!(book.replica(0).in_flight, 0);
        assert_eq!(book.replica(0).pending_work, 0.0);
        assert_eq!(book.end(a, 200, 9), None, "unknown ticket");
        assert_eq!(book.replica(1).in_flight, 1);
        let _ = c;
        assert!(book.is_live(100, 1_000));
        assert!(!book.is_live(2_000, 1_000));
    }

    #[test]
    fn learns_the_rate_from_first_bytes() {
        let mut book = InFlight::new(2, 10_000, 10);
        assert_eq!(book.rate(0, 2.0), 2.0, "the default until a first byte");
        // 100 work ahead of nothing, first byte after 50 ms: 2 work/ms.
        let a = book.open(0, 100.0, 0);
        book.first_byte(a, 50, 50);
        assert_eq!(book.replica(0).rate, Some(2.0));
        // 300 work queued: 150 ms at 2/ms.
        let b = book.open(0, 300.0, 100);
        assert_eq!(book.wait_ms(0, book.rate(0, 1.0), 100), 150.0);
        // A second sample moves the average a fifth of the way: 300 / 300 ms = 1 → 1.8.
        book.first_byte(b, 300, 400);
        assert!((book.rate(0, 1.0) - 1.8).abs() < 1e-9);
        assert_eq!(book.rate(1, 1.0), 1.0, "replica 1 uses the default rate");
        assert_eq!(book.mean_rate(), Some(book.rate(0, 1.0)));
    }

    #[test]
    fn the_backlog_drains_the_head_of_the_queue_between_first_bytes() {
        let mut book = InFlight::new(1, 10_000, 10);
        let a = book.open(0, 100.0, 0);
        let b = book.open(0, 40.0, 10);
        // At 1 work/ms, 30 ms into `a`: 70 of it and all of `b` remain.
        assert_eq!(book.backlog(0, 1.0, 30), 110.0);
        // Past `a`'s own work the head is late: `b` is not counted done on a guess.
        assert_eq!(book.backlog(0, 1.0, 500), 40.0);
        // `a`'s first byte at 120: `b` starts then.
        book.first_byte(a, 120, 120);
        assert_eq!(book.backlog(0, 1.0, 130), 30.0);
        book.first_byte(b, 160, 160);
        assert_eq!(book.backlog(0, 1.0, 170), 0.0);
        // An idle replica's clock restarts with the next request.
        book.open(0, 50.0, 1_000);
        assert_eq!(book.backlog(0, 1.0, 1_000), 50.0);
        assert_eq!(book.backlog(0, 1.0, 1_020), 30.0);
    }

    #[test]
    fn lost_reports_expire_and_the_book_is_bounded() {
        let mut book = InFlight::new(1, 1_000, 2);
        book.open(0, 10.0, 0);
        book.open(0, 10.0, 500);
        assert_eq!(book.open(0, 10.0, 500), 0, "full");
        book.expire(1_200);
        assert_eq!(book.replica(0).in_flight, 1);
        assert_eq!(book.replica(0).pending_work, 10.0);
        assert_eq!(book.expired(), 1);
        assert!(!book.is_live(0, 1_000), "no report ever came");
        assert_eq!(book.open(7, 1.0, 0), 0, "unknown replica");
        assert_ne!(book.open(0, f64::NAN, 0), 0);
        assert_eq!(book.replica(0).pending_work, 10.0, "NaN work counts as 0");
    }
}
