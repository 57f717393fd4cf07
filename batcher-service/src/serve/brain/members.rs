//! The replica set by policy slot: which replica (name and endpoint) each slot of the
//! policy holds, and how a newly discovered set maps onto the slots.
//!
//! The policy keys everything by slot ([`cohort_batcher_core::policy::Policy::join`]);
//! this table is the other half: a slot's replica name (what `x-cohort-shard` carries)
//! and its endpoint (`ip:port`, what `x-gateway-destination-endpoint` carries for
//! Envoy's `override_host`). A replica is identified by its name: one whose name stays
//! keeps its slot and its state; one whose name stays but whose endpoint changed (a pod
//! rescheduled under the same stable name) comes back empty, so it leaves and joins
//! again. Pure: the brain applies the plan to the policy and the table together.

pub use crate::discovery::Member;

/// What changes when a new set is applied.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Slots whose replica left (or changed endpoint).
    pub leave: Vec<usize>,
    /// Replicas that join, in the order found.
    pub join: Vec<Member>,
}

/// The slot table.
#[derive(Debug, Default)]
pub struct Members {
    slots: Vec<Option<Member>>,
}

impl Members {
    /// A table whose slot `i` holds `members[i]`.
    pub fn new(members: Vec<Member>) -> Members {
        Members {
            slots: members.into_iter().map(Some).collect(),
        }
    }

    /// The replica at `slot`, if one holds it.
    pub fn get(&self, slot: usize) -> Option<&Member> {
        self.slots.get(slot)?.as_ref()
    }

    /// The slot held by the replica named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|m| m.as_ref().is_some_and(|m| m.name == name))
    }

    /// Slots, held or not (the policy's count).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The held slots with their replicas, in slot order.
    pub fn held(&self) -> impl Iterator<Item = (usize, &Member)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().map(|m| (i, m)))
    }

    /// What must change for the set to become `found` (duplicate names: the first wins).
    pub fn plan(&self, found: &[Member]) -> Plan {
        let mut wanted: Vec<&Member> = Vec::with_capacity(found.len());
        for m in found {
            if !wanted.iter().any(|w| w.name == m.name) {
                wanted.push(m);
            }
        }
        let leave = self
            .held()
            .filter(|(_, m)| !wanted.contains(m))
            .map(|(i, _)| i)
            .collect();
        let join = wanted
            .into_iter()
            .filter(|w| !self.held().any(|(_, m)| m == *w))
            .cloned()
            .collect();
        Plan { leave, join }
    }

    /// Empties `slot`.
    pub fn vacate(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = None;
        }
    }

    /// `member` holds `slot` (the slot the policy gave it).
    pub fn place(&mut self, slot: usize, member: Member) {
        if slot >= self.slots.len() {
            self.slots.resize(slot + 1, None);
        }
        self.slots[slot] = Some(member);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, endpoint: &str) -> Member {
        Member {
            name: name.into(),
            endpoint: endpoint.into(),
        }
    }

    #[test]
    fn replicas_that_stay_keep_their_slots() {
        let mut t = Members::new(vec![m("a", "10.0.0.1:8000"), m("b", "10.0.0.2:8000")]);
        let plan = t.plan(&[m("b", "10.0.0.2:8000"), m("c", "10.0.0.3:8000")]);
        assert_eq!(plan.leave, vec![0]);
        assert_eq!(plan.join, vec![m("c", "10.0.0.3:8000")]);
        t.vacate(0);
        t.place(0, m("c", "10.0.0.3:8000"));
        assert_eq!(t.position("b"), Some(1));
        assert_eq!(t.position("c"), Some(0));
        assert_eq!(
            t.plan(&[m("c", "10.0.0.3:8000"), m("b", "10.0.0.2:8000")]),
            Plan::default()
        );
    }

    #[test]
    fn a_new_endpoint_under_the_same_name_leaves_and_joins() {
        let t = Members::new(vec![m("a", "10.0.0.1:8000")]);
        let plan = t.plan(&[m("a", "10.0.0.9:8000")]);
        assert_eq!(plan.leave, vec![0]);
        assert_eq!(plan.join, vec![m("a", "10.0.0.9:8000")]);
    }

    #[test]
    fn duplicates_count_once_and_slots_grow_on_place() {
        let mut t = Members::default();
        let plan = t.plan(&[m("a", "1"), m("a", "2"), m("b", "3")]);
        assert_eq!(plan.join, vec![m("a", "1"), m("b", "3")]);
        t.place(3, m("b", "3"));
        assert_eq!(t.slots(), 4);
        assert!(t.get(0).is_none() && t.get(9).is_none());
        assert_eq!(t.held().count(), 1);
        t.vacate(9);
    }
}
