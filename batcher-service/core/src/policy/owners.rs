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

    /// `replica` left: cohorts it served as secondary lose it, cohorts it served as primary
    /// are served by their secondary, or forgotten when they had none.
    pub fn forget(&mut self, replica: usize) {
        let mut orphans = Vec::new();
        for (&cohort, o) in self.owners.iter_mut() {
            if o.secondary == Some(replica) {
                o.secondary = None;
            }
            if o.primary == replica {
                match o.secondary.take() {
                    Some(next) => o.primary = next,
                    None => orphans.push(cohort),
                }
            }
        }
        for cohort in orphans {
            self.owners.pop(&cohort);
        }
    }

    /// Cohorts with a remembered owner.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_replica_hands_its_cohorts_to_their_secondary() {
        let mut o = CohortOwners::new(8);
        o.placed(1, None, 0);
        let first = o.get(1);
        o.placed(1, first, 2);
        o.placed(2, None, 0);
        o.placed(3, None, 1);
        let third = o.get(3);
        o.placed(3, third, 0);
        o.forget(0);
        assert_eq!(o.get(1).map(|o| (o.primary, o.secondary)), Some((2, None)));
        assert!(o.get(2).is_none());
        assert_eq!(o.get(3).map(|o| (o.primary, o.secondary)), Some((1, None)));
        assert_eq!(o.len(), 2);
    }
}
