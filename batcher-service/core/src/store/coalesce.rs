//! Coalesced queries: concurrent `top_k` calls on one store become one batched scan.
//!
//! Assign and Observe handlers run on many threads at once, and each makes single-query
//! store calls. A store answers a batch for about the cost of one query (the CPU store
//! reads every page once per batch; the GPU store makes one kernel launch per batch, and a
//! launch and its synchronisation cost more than scanning a few thousand centroids). So
//! [`Coalesced`] wraps a store and combines the calls that arrive together:
//!
//! - a caller queues its query and, if no scan is running, becomes the *leader*: it takes
//!   every queued query, runs one [`Store::top_k_batch`] per (tenant, k, time) group, posts
//!   the answers and wakes the waiters;
//! - a caller that arrives while a scan runs waits; the next leader (the first waiter to
//!   wake, or itself) takes its query with the others that queued meanwhile.
//!
//! No timer and no background thread: a query never waits for a tick, only for the scan
//! in progress, so a lone caller pays one uncontended lock more than the bare store, and
//! under load the batch grows with the arrival rate (group commit, as databases do for
//! their log). A batch takes at most [`MAX_BATCH`] queries. The answers are exactly the
//! bare store's: a batch answers each query as `top_k` would.
//!
//! Only `top_k` is coalesced; writes and the other reads pass straight through.

use super::{EntryMeta, Hit, SketchBytes, Store, StoreStats};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Queries one scan takes at most.
pub const MAX_BATCH: usize = 4096;

/// A queued query.
struct Ask {
    ticket: u64,
    tenant: u32,
    query: SketchBytes,
    k: usize,
    now_s: u32,
}

#[derive(Default)]
struct Queue {
    asks: Vec<Ask>,
    answers: HashMap<u64, Vec<Hit>>,
    next_ticket: u64,
    scanning: bool,
    /// Scans run and queries they answered (for the batch-size metric).
    scans: u64,
    answered: u64,
}

/// A store whose concurrent `top_k` calls are answered by batched scans (see the module
/// doc).
pub struct Coalesced<S: Store> {
    inner: S,
    queue: Mutex<Queue>,
    done: Condvar,
}

impl<S: Store> Coalesced<S> {
    pub fn new(inner: S) -> Coalesced<S> {
        Coalesced {
            inner,
            queue: Mutex::new(Queue::default()),
            done: Condvar::new(),
        }
    }

    /// Scans run and queries they answered so far: queries / scans is the mean batch.
    pub fn scans(&self) -> (u64, u64) {
        let queue = self.lock();
        (queue.scans, queue.answered)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answer `asks` with one batch per (tenant, k, time), in arrival order within each.
    fn scan(&self, asks: Vec<Ask>) -> Vec<(u64, Vec<Hit>)> {
        let mut groups: Vec<((u32, usize, u32), Vec<Ask>)> = Vec::new();
        for ask in asks {
            let key = (ask.tenant, ask.k, ask.now_s);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, group)) => group.push(ask),
                None => groups.push((key, vec![ask])),
            }
        }
        let mut answers = Vec::new();
        for ((tenant, k, now_s), group) in groups {
            let queries: Vec<SketchBytes> = group.iter().map(|a| a.query).collect();
            let hits = self.inner.top_k_batch(tenant, &queries, k, now_s);
            answers.extend(group.iter().map(|a| a.ticket).zip(hits));
        }
        answers
    }
}

impl<S: Store> Store for Coalesced<S> {
    fn upsert(&self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32) {
        self.inner.upsert(key, sketch, meta, now_s)
    }

    fn get(&self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)> {
        self.inner.get(key, now_s)
    }

    fn remove(&self, key: u64) -> bool {
        self.inner.remove(key)
    }

    fn top_k(&self, tenant: u32, query: &SketchBytes, k: usize, now_s: u32) -> Vec<Hit> {
        let mut queue = self.lock();
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.asks.push(Ask {
            ticket,
            tenant,
            query: *query,
            k,
            now_s,
        });
        loop {
            if let Some(hits) = queue.answers.remove(&ticket) {
                return hits;
            }
            if queue.scanning {
                queue = self.done.wait(queue).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Lead: take what is queued (ours included, unless a leader answered it).
            let take = queue.asks.len().min(MAX_BATCH);
            let asks: Vec<Ask> = queue.asks.drain(..take).collect();
            queue.scanning = true;
            drop(queue);
            let answered = asks.len() as u64;
            let tickets: Vec<u64> = asks.iter().map(|a| a.ticket).collect();
            // A panicking store must not leave the queue busy, nor the batch's other
            // callers waiting for answers that will never come: they get none.
            let answers =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.scan(asks)));
            queue = self.lock();
            queue.scanning = false;
            queue.scans += 1;
            queue.answered += answered;
            match answers {
                Ok(answers) => queue.answers.extend(answers),
                Err(panic) => {
                    for t in tickets.into_iter().filter(|&t| t != ticket) {
                        queue.answers.insert(t, Vec::new());
                    }
                    self.done.notify_all();
                    drop(queue);
                    std::panic::resume_unwind(panic);
                }
            }
            self.done.notify_all();
        }
    }

    fn top_k_batch(
        &self,
        tenant: u32,
        queries: &[SketchBytes],
        k: usize,
        now_s: u32,
    ) -> Vec<Vec<Hit>> {
        self.inner.top_k_batch(tenant, queries, k, now_s)
    }

    fn top_k_among(
        &self,
        tenant: u32,
        query: &SketchBytes,
        keys: &[u64],
        k: usize,
        now_s: u32,
    ) -> Vec<(Hit, SketchBytes)> {
        self.inner.top_k_among(tenant, query, keys, k, now_s)
    }

    fn expire(&self, now_s: u32) -> usize {
        self.inner.expire(now_s)
    }

    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CpuStore, CpuStoreConfig};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A store that counts its batches and makes each take a while, so callers overlap.
    struct Slow {
        inner: CpuStore,
        batches: AtomicUsize,
    }

    impl Store for Slow {
        fn upsert(&self, key: u64, sketch: &SketchBytes, meta: EntryMeta, now_s: u32) {
            self.inner.upsert(key, sketch, meta, now_s)
        }
        fn get(&self, key: u64, now_s: u32) -> Option<(SketchBytes, EntryMeta)> {
            self.inner.get(key, now_s)
        }
        fn remove(&self, key: u64) -> bool {
            self.inner.remove(key)
        }
        fn top_k_batch(
            &self,
            tenant: u32,
            queries: &[SketchBytes],
            k: usize,
            now_s: u32,
        ) -> Vec<Vec<Hit>> {
            self.batches.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(5));
            self.inner.top_k_batch(tenant, queries, k, now_s)
        }
        fn expire(&self, now_s: u32) -> usize {
            self.inner.expire(now_s)
        }
        fn stats(&self) -> StoreStats {
            self.inner.stats()
        }
    }

    fn sketch(i: u64) -> SketchBytes {
        std::array::from_fn(|d| (((i * 31 + d as u64 * 7) % 200) as i64 - 100) as i8)
    }

    #[test]
    fn concurrent_queries_share_scans_and_get_the_bare_stores_answers() {
        let store = Arc::new(Coalesced::new(Slow {
            inner: CpuStore::new(CpuStoreConfig::default()),
            batches: AtomicUsize::new(0),
        }));
        for key in 0..500u64 {
            let meta = EntryMeta {
                tenant: (key % 2) as u32,
                cohort: 0,
                replica: 0,
                expires_at_s: 100,
            };
            store.upsert(key, &sketch(key), meta, 0);
        }
        let threads = 16;
        let per_thread = 20;
        std::thread::scope(|scope| {
            for t in 0..threads {
                let store = Arc::clone(&store);
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let q = sketch(t * 1000 + i);
                        let tenant = ((t + i) % 2) as u32;
                        let got = store.top_k(tenant, &q, 8, 1);
                        let want = store.inner.inner.top_k(tenant, &q, 8, 1);
                        assert_eq!(got, want);
                    }
                });
            }
        });
        let (scans, answered) = store.scans();
        let batches = store.inner.batches.load(Ordering::Relaxed) as u64;
        assert_eq!(answered, threads * per_thread);
        // 320 queries, but overlapping callers shared scans (each scan takes 5 ms).
        assert!(scans < answered / 2, "{scans} scans for {answered} queries");
        assert!(batches >= scans, "a scan makes one batch per tenant group");
    }

    #[test]
    fn a_lone_caller_is_answered_at_once() {
        let store = Coalesced::new(CpuStore::new(CpuStoreConfig::default()));
        let meta = EntryMeta {
            tenant: 1,
            cohort: 0,
            replica: 0,
            expires_at_s: 10,
        };
        store.upsert(1, &sketch(1), meta, 0);
        assert_eq!(store.top_k(1, &sketch(1), 4, 0).len(), 1);
        assert_eq!(store.top_k(2, &sketch(1), 4, 0).len(), 0);
        assert_eq!(store.scans(), (2, 2));
    }
}
