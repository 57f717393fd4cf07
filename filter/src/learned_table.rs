//! The learned cohorts' table in Envoy's shared data ([`cohort_fingerprint::learned`]):
//! one table per plugin, shared by every worker's VM, read on each fingerprinted request
//! and written back with compare-and-swap when a leader starts or takes one of its first
//! members. A frozen leader is only read, so on steady traffic writes are rare.
//!
//! A write that loses [`CAS_TRIES`] races in a row is dropped: the request keeps the code
//! it was placed with (reported as not `changed`, so the stats count only kept starts), and
//! the next request of its intent places itself again. A table the host cannot read leaves
//! the request with its codebook id.
//!
//! The host compares versions only for a key that exists, so the root context creates the
//! table, empty, when it is configured ([`create`]); two workers' first writes then cannot
//! overwrite each other.

use crate::decision::LearnedTable;
use cohort_fingerprint::learned::{LearnedCohorts, Placement};
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// Tries of one placement against concurrent writers.
const CAS_TRIES: usize = 4;

/// The table under a shared-data key.
pub struct SharedTable<'a> {
    pub key: &'a str,
}

impl LearnedTable for SharedTable<'_> {
    fn update(
        &mut self,
        place: &mut dyn FnMut(&mut LearnedCohorts) -> Option<Placement>,
    ) -> Option<Placement> {
        let mut placed = None;
        for _ in 0..CAS_TRIES {
            let Ok((bytes, cas)) = hostcalls::get_shared_data(self.key) else {
                return placed;
            };
            let mut table = LearnedCohorts::from_bytes(bytes.unwrap_or_default());
            placed = place(&mut table);
            match placed {
                Some(p) if p.changed => {}
                _ => return placed,
            }
            match hostcalls::set_shared_data(self.key, Some(table.as_bytes()), cas) {
                Ok(()) => return placed,
                Err(Status::CasMismatch) => continue,
                Err(_) => break,
            }
        }
        placed.map(|p| Placement {
            changed: false,
            ..p
        })
    }
}

/// Creates the table under `key`, empty, unless it exists (a reload keeps what was learnt).
pub fn create(key: &str) {
    if let Ok((None, _)) = hostcalls::get_shared_data(key) {
        let _ = hostcalls::set_shared_data(key, Some(LearnedCohorts::default().as_bytes()), None);
    }
}
