//! What a decision is asked ([`RouteRequest`]) and what it answers ([`Choice`], with its
//! [`ChoiceReason`]).

/// What the policy needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    /// Chained prefix block hashes, first block first.
    pub blocks: &'a [u64],
    /// Intent cohort, when the clustering assigned one.
    pub cohort: Option<u32>,
    /// The replica the most similar past requests went to ([`crate::neighbours::vote`]),
    /// when any is similar enough. While the cohort has no owner (a new cohort, one whose
    /// owner was forgotten, or no cohort) it breaks ties between replicas equal on prefix
    /// and expected cost, before the fewest blocks held.
    pub similar: Option<usize>,
    /// How long the request's blocks count as held on the chosen replica after it: the
    /// `cache-ttl` knob ([`super::prefix_state`]); `u64::MAX` for no limit.
    pub resident_ms: u64,
    /// Prompt size (tokens or bytes; the same unit as `per_request_work`).
    pub cost: u32,
    /// Injected time.
    pub now_ms: u64,
    /// Per slot, what the replica's engine holds of `blocks` by its own account (its KV
    /// cache events), or `None` where the modelled residency stands (no stream, an
    /// unhealthy one, a request the batcher could not tokenize). Empty: every slot
    /// modelled. See [`super::Policy::choose`], rule 1.
    pub observed: &'a [Option<Observed>],
    /// Whether the caller will report the request's progress ([`super::Policy::first_byte`],
    /// [`super::Policy::end`]): only then is a ticket opened for it.
    pub track: bool,
}

/// One replica's own account of a request's prefix ([`RouteRequest::observed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// Leading blocks of the request the engine holds.
    pub held: usize,
    /// Blocks a request brought to this replica at or after this time count too, where
    /// longer: the engine has not published them yet (they are being prefilled, or their
    /// events are on the way).
    pub pending_since_ms: u64,
}

/// Why a replica was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChoiceReason {
    /// It holds the longest cached prefix, longer than some other replica's.
    Prefix,
    /// No replica holds a longer prefix; it owns the request's cohort.
    Cohort,
    /// No replica holds a longer prefix, the cohort has no owner, and among the equally
    /// cheap replicas the most similar past requests went there.
    Similar,
    /// The prefix holder or cohort owner was over the balance bound; moved here.
    LoadSpill,
    /// Nothing distinguishes the replicas but load.
    LeastLoaded,
}

impl ChoiceReason {
    /// Every reason, in declaration order (the index of a reason's counter).
    pub const ALL: [ChoiceReason; 5] = [
        Self::Prefix,
        Self::Cohort,
        Self::Similar,
        Self::LoadSpill,
        Self::LeastLoaded,
    ];

    /// Lower-case name for metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::Cohort => "cohort",
            Self::Similar => "similar",
            Self::LoadSpill => "load_spill",
            Self::LeastLoaded => "least_loaded",
        }
    }
}

/// The policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Replica index in `0..replicas`.
    pub replica: usize,
    /// Leading blocks of the request the chosen replica is believed to hold.
    pub matched_blocks: usize,
    /// Why.
    pub reason: ChoiceReason,
    /// The decision's ticket for progress reports ([`super::Policy::first_byte`],
    /// [`super::Policy::end`]); 0 when the request is not tracked or the book is full.
    pub ticket: u64,
}
