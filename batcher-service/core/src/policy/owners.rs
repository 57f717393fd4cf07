//! Cohort owners: per intent cohort, the replica that serves it and, once it has spilled,
//! a second one.
//!
//! A cohort's first request makes its replica the *primary* owner; a later request of the
//! cohort placed elsewhere (the owner was over the bound, or another replica held more of
//! its prefix) makes that replica the *secondary*. The owners break ties between replicas
//! equal on prefix ([`super::load_model`] says where in the order), so a cohort's
//! requests gather on one or two replicas rather than spreading. Bounded: least recently
//! used cohorts are forgotten beyond `max_cohorts`.

use lru::LruCache;
use std::num::NonZeroUsize;

#[derive(Debug, Clone, Copy)]
pub struct Owners {
    pub primary: usize,
    pub secondary: Option<usize>,
}

impl Owners {
    /// 2 for the primary owner, 1 for the secondary, 0 otherwise.
    pub fn rank(owners: Option<Owners>, replica: usize) -> u8 {
        match owners {
            Some(o) if o.primary == replica => 2,
            Some(o) if o.secondary == Some(replica) => 1,
            _ => 0,
        }
    }
}

/// The owners of the cohorts remembered.
#[derive(Debug)]
pub struct CohortOwners {
    owners: LruCache<u32, Owners>,
}

impl CohortOwners {
    pub fn new(max_cohorts: usize) -> CohortOwners {
        let cap = NonZeroUsize::new(max_cohorts.max(1)).unwrap_or(NonZeroUsize::MIN);
        CohortOwners {
            owners: LruCache::new(cap),
        }
    }

    /// The cohort's owners (refreshing its place in the LRU).
    pub fn get(&mut self, cohort: u32) -> Option<Owners> {
        self.owners.get(&cohort).copied()
    }

    /// A request of `cohort`, whose owners were `before`, went to `replica`.
    pub fn placed(&mut self, cohort: u32, before: Option<Owners>, replica: usize) {
        let next = match before {
            None => Owners {
                primary: replica,
                secondary: None,
            },
            Some(o) if o.primary == replica || o.secondary == Some(replica) => o,
            Some(o) => Owners {
                primary: o.primary,
                secondary: Some(replica),
            },
        };
        self.owners.put(cohort, next);
    }

    /// Cohorts with a remembered owner.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}
