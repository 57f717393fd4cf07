//! Whether discovery is current: each resolution's outcome moves it between *fresh* (the
//! last resolution found replicas) and *stale* (it failed or found none, so the last known
//! set stays in use), and only a change of state is worth a log line. Pure; the counters
//! feed `/metrics`.

/// How one resolution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It found this many replicas.
    Found(usize),
    /// The server answered, with no replica.
    Nothing,
    /// No usable answer (why).
    Failed(String),
}

/// A change of state, to log once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Resolutions stopped finding replicas: the last known set stays in use.
    Stale { why: String },
    /// A resolution found replicas again (or for the first time after failures).
    Fresh { replicas: usize },
}

/// Discovery's state and counters.
#[derive(Debug, Default)]
pub struct Freshness {
    stale: bool,
    failures: u64,
}

impl Freshness {
    /// Records `outcome`; returns the change to log, if the state changed.
    pub fn record(&mut self, outcome: &Outcome) -> Option<Change> {
        let why = match outcome {
            Outcome::Found(replicas) => {
                let was_stale = std::mem::replace(&mut self.stale, false);
                return was_stale.then_some(Change::Fresh {
                    replicas: *replicas,
                });
            }
            Outcome::Nothing => "the answer names no replica".to_owned(),
            Outcome::Failed(why) => why.clone(),
        };
        self.failures += 1;
        let was_stale = std::mem::replace(&mut self.stale, true);
        (!was_stale).then_some(Change::Stale { why })
    }

    /// Whether the set in use is the last known one (the latest resolution did not renew it).
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// Resolutions that failed or found no replica.
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_change_per_change_of_state() {
        let mut f = Freshness::default();
        assert_eq!(f.record(&Outcome::Found(2)), None);
        assert!(!f.is_stale());
        assert_eq!(
            f.record(&Outcome::Failed("timeout".into())),
            Some(Change::Stale {
                why: "timeout".into()
            })
        );
        assert_eq!(f.record(&Outcome::Failed("timeout".into())), None);
        assert_eq!(f.record(&Outcome::Nothing), None);
        assert!(f.is_stale());
        assert_eq!(f.failures(), 3);
        assert_eq!(
            f.record(&Outcome::Found(3)),
            Some(Change::Fresh { replicas: 3 })
        );
        assert_eq!(f.record(&Outcome::Found(3)), None);
        assert!(!f.is_stale());
        assert!(matches!(
            f.record(&Outcome::Nothing),
            Some(Change::Stale { .. })
        ));
    }
}
