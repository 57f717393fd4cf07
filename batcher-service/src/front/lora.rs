//! LoRA adapters: which requests need one, and where each is loaded.
//!
//! A request needs adapter `A` when its `model` is `A`'s name (how vLLM and SGLang name
//! adapters) or its cohort is listed under `A` in the configuration. Leaders of such
//! cohorts go to a replica that has `A` loaded when one is healthy; otherwise `A` is
//! loaded on the chosen replica first (engines that load at run time). Warm-ups of a
//! predicted cohort load its adapter on the owner replica ahead of time.

use crate::config::LoraSection;
use cohort_batcher_core::engines::LoraAdapter;
use std::collections::HashSet;
use std::sync::Mutex;

pub struct Lora {
    adapters: Vec<(LoraAdapter, Vec<u64>)>,
    loaded: Mutex<HashSet<(usize, String)>>,
}

impl Lora {
    pub fn new(sections: &[LoraSection]) -> Lora {
        Lora {
            adapters: sections
                .iter()
                .map(|s| {
                    let cohorts = s
                        .cohorts
                        .iter()
                        .filter_map(|c| u64::from_str_radix(c, 16).ok())
                        .collect();
                    (
                        LoraAdapter {
                            name: s.name.clone(),
                            path: s.path.clone(),
                        },
                        cohorts,
                    )
                })
                .collect(),
            loaded: Mutex::new(HashSet::new()),
        }
    }

    /// The adapter a request of `model` in `cohort` needs, if any.
    pub fn needed(&self, model: Option<&str>, cohort: u64) -> Option<&LoraAdapter> {
        self.adapters
            .iter()
            .find(|(a, cohorts)| Some(a.name.as_str()) == model || cohorts.contains(&cohort))
            .map(|(a, _)| a)
    }

    pub fn is_loaded(&self, replica: usize, adapter: &LoraAdapter) -> bool {
        self.lock().contains(&(replica, adapter.name.clone()))
    }

    /// Replicas that have `adapter` loaded.
    pub fn loaded_on(&self, adapter: &LoraAdapter) -> Vec<usize> {
        let mut on: Vec<usize> = self
            .lock()
            .iter()
            .filter(|(_, name)| *name == adapter.name)
            .map(|(r, _)| *r)
            .collect();
        on.sort_unstable();
        on
    }

    pub fn mark_loaded(&self, replica: usize, adapter: &LoraAdapter) {
        self.lock().insert((replica, adapter.name.clone()));
    }

    /// A replica restarted or went away: it holds nothing.
    pub fn forget_replica(&self, replica: usize) {
        self.lock().retain(|(r, _)| *r != replica);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(usize, String)>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_by_model_or_cohort() {
        let lora = Lora::new(&[LoraSection {
            name: "sql".into(),
            path: "/a/sql".into(),
            cohorts: vec!["00000000000000ff".into(), "not hex".into()],
        }]);
        assert_eq!(lora.needed(Some("sql"), 1).unwrap().path, "/a/sql");
        assert!(lora.needed(Some("base"), 0xff).is_some());
        assert!(lora.needed(Some("base"), 1).is_none());
        let a = lora.needed(None, 0xff).unwrap().clone();
        assert!(lora.loaded_on(&a).is_empty());
        lora.mark_loaded(2, &a);
        lora.mark_loaded(0, &a);
        assert_eq!(lora.loaded_on(&a), vec![0, 2]);
        assert!(lora.is_loaded(2, &a));
        lora.forget_replica(2);
        assert_eq!(lora.loaded_on(&a), vec![0]);
    }
}
