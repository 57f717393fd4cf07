//! Which client knob acts in which mode, and which ones a request set for nothing.
//!
//! A caller who sets a knob header wants to know whether it did anything. Some knobs act
//! only through the batcher (the prefetch level, the cache TTL, the session for its
//! predictor), so in affinity mode, which has none, they would be read and dropped with
//! no sign. This module is the knob × mode table of docs/CONTRACT.md ("Knobs by mode") as
//! code: for every knob a request set, [`ignored`] says whether it has an effect in the
//! mode the request was routed in; the filter names the ones that did not in the response
//! header `x-cohort-ignored` (`prefetch,cache-ttl`) and counts each in
//! `cohort_knob_ignored_<knob>_<mode>_total`.
//!
//! The mode is the one the request was routed in, as the response's `x-cohort` says: an
//! assign or batch request whose `Assign` call failed was routed as in affinity mode. The
//! batcher adds what it cannot act on where it runs (`AssignReply.inert_knobs`: the
//! prefetch level and the session when it knows the replicas by name only, so has no
//! front to warm through and no predictor).
//! A request the filter passed through acted on no knob; its `x-cohort` already says
//! `bypass=…`, so it gets no `x-cohort-ignored`.

use crate::config::{HeaderNames, Mode};

/// A header a client sets to steer Cohort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Knob {
    Prefetch,
    BatchThreshold,
    CacheTtl,
    SemanticMode,
    RoutingKey,
    OriginalQuery,
    Session,
}

impl Knob {
    pub const ALL: [Knob; 7] = [
        Knob::Prefetch,
        Knob::BatchThreshold,
        Knob::CacheTtl,
        Knob::SemanticMode,
        Knob::RoutingKey,
        Knob::OriginalQuery,
        Knob::Session,
    ];

    /// The name in `x-cohort-ignored`: the default header's name without its prefix.
    pub fn name(self) -> &'static str {
        match self {
            Knob::Prefetch => "prefetch",
            Knob::BatchThreshold => "batch-threshold",
            Knob::CacheTtl => "cache-ttl",
            Knob::SemanticMode => "semantic-mode",
            Knob::RoutingKey => "routing-key",
            Knob::OriginalQuery => "original-query",
            Knob::Session => "session",
        }
    }

    /// The name in the stat `cohort_knob_ignored_<knob>_<mode>_total`.
    pub fn stat_name(self) -> &'static str {
        match self {
            Knob::Prefetch => "prefetch",
            Knob::BatchThreshold => "batch_threshold",
            Knob::CacheTtl => "cache_ttl",
            Knob::SemanticMode => "semantic_mode",
            Knob::RoutingKey => "routing_key",
            Knob::OriginalQuery => "original_query",
            Knob::Session => "session",
        }
    }

    /// The knob of an `x-cohort-ignored` name (the batcher's `inert_knobs`).
    pub fn from_name(name: &str) -> Option<Knob> {
        Knob::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The header this knob is read from (as configured).
    pub fn header(self, names: &HeaderNames) -> &str {
        match self {
            Knob::Prefetch => &names.prefetch,
            Knob::BatchThreshold => &names.batch_threshold,
            Knob::CacheTtl => &names.cache_ttl,
            Knob::SemanticMode => &names.semantic_mode,
            Knob::RoutingKey => &names.routing_key,
            Knob::OriginalQuery => &names.original_query,
            Knob::Session => &names.session,
        }
    }
}

/// What a knob does in a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// It changes the request's fingerprint, routing or the batcher's handling of it.
    Acts,
    /// It acts for requests that also carry a session (`x-cohort-session`), and is
    /// ignored without one.
    ActsWithSession,
    /// Nothing in this mode reads it.
    Ignored,
}

/// The knob × mode table (docs/CONTRACT.md, "Knobs by mode").
pub fn effect(knob: Knob, mode: Mode) -> Effect {
    match (mode, knob) {
        // No batcher: nothing warms, models residency, or predicts from sessions.
        (Mode::Affinity, Knob::Prefetch | Knob::CacheTtl | Knob::Session) => Effect::Ignored,
        // The batcher warms a predicted cohort only along a user session's sequence.
        (Mode::Assign, Knob::Prefetch) => Effect::ActsWithSession,
        _ => Effect::Acts,
    }
}

/// The knobs a batcher may report it cannot act on (`AssignReply.inert_knobs`).
pub const BATCHER_MAY_IGNORE: [Knob; 2] = [Knob::Prefetch, Knob::Session];

/// The (knob, mode) cells where a knob can be ignored, by the table or by the batcher: the
/// stats defined up front.
pub fn ignorable() -> Vec<(Knob, Mode)> {
    [Mode::Affinity, Mode::Assign, Mode::Batch]
        .into_iter()
        .flat_map(|mode| Knob::ALL.into_iter().map(move |knob| (knob, mode)))
        .filter(|&(knob, mode)| {
            effect(knob, mode) != Effect::Acts
                || (mode != Mode::Affinity && BATCHER_MAY_IGNORE.contains(&knob))
        })
        .collect()
}

/// The knobs a request set: their headers are present, whatever their values (a
/// malformed value is the default, counted as invalid, and still the caller's setting).
pub fn sent(names: &HeaderNames, headers: &[(String, String)]) -> Vec<Knob> {
    Knob::ALL
        .into_iter()
        .filter(|knob| headers.iter().any(|(n, _)| n == knob.header(names)))
        .collect()
}

/// Of the knobs `sent`, those with no effect on a request routed in `mode`, where the
/// batcher that assigned it (if any) cannot act on `inert`.
pub fn ignored(mode: Mode, sent: &[Knob], inert: &[Knob]) -> Vec<Knob> {
    let has_session = sent.contains(&Knob::Session);
    sent.iter()
        .copied()
        .filter(|&knob| {
            inert.contains(&knob)
                || match effect(knob, mode) {
                    Effect::Acts => false,
                    Effect::ActsWithSession => !has_session,
                    Effect::Ignored => true,
                }
        })
        .collect()
}

/// The `x-cohort-ignored` value: the knobs' names, comma-separated, in table order.
pub fn header_value(ignored: &[Knob]) -> String {
    ignored
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(names: &[&str]) -> Vec<(String, String)> {
        names
            .iter()
            .map(|n| (n.to_string(), "v".to_owned()))
            .collect()
    }

    #[test]
    fn affinity_mode_names_the_knobs_only_a_batcher_reads() {
        let names = HeaderNames::default();
        let sent = sent(
            &names,
            &headers(&[
                "x-cohort-cache-ttl",
                "x-cohort-prefetch",
                "x-cohort-batch-threshold",
                "content-type",
            ]),
        );
        assert_eq!(
            sent,
            [Knob::Prefetch, Knob::BatchThreshold, Knob::CacheTtl],
            "table order, other headers left out"
        );
        let ignored = ignored(Mode::Affinity, &sent, &[]);
        assert_eq!(header_value(&ignored), "prefetch,cache-ttl");
        assert_eq!(header_value(&[]), "");
    }

    #[test]
    fn every_cell_of_the_table() {
        use Effect::*;
        let table = [
            (Knob::Prefetch, [Ignored, ActsWithSession, Acts]),
            (Knob::BatchThreshold, [Acts, Acts, Acts]),
            (Knob::CacheTtl, [Ignored, Acts, Acts]),
            (Knob::SemanticMode, [Acts, Acts, Acts]),
            (Knob::RoutingKey, [Acts, Acts, Acts]),
            (Knob::OriginalQuery, [Acts, Acts, Acts]),
            (Knob::Session, [Ignored, Acts, Acts]),
        ];
        for (knob, effects) in table {
            for (mode, expected) in [Mode::Affinity, Mode::Assign, Mode::Batch]
                .into_iter()
                .zip(effects)
            {
                assert_eq!(effect(knob, mode), expected, "{knob:?} in {mode:?}");
            }
        }
        // The table's four, and the batcher's two in assign and batch mode (prefetch in
        // assign mode counted once).
        assert_eq!(ignorable().len(), 7);
    }

    #[test]
    fn assign_mode_ignores_prefetch_only_without_a_session() {
        assert_eq!(
            ignored(Mode::Assign, &[Knob::Prefetch], &[]),
            [Knob::Prefetch]
        );
        assert!(ignored(Mode::Assign, &[Knob::Prefetch, Knob::Session], &[]).is_empty());
        assert!(ignored(Mode::Batch, &Knob::ALL, &[]).is_empty());
        assert_eq!(
            ignored(Mode::Affinity, &Knob::ALL, &[]),
            [Knob::Prefetch, Knob::CacheTtl, Knob::Session]
        );
    }

    #[test]
    fn what_the_batcher_cannot_act_on_is_ignored_when_sent() {
        let inert = [Knob::Prefetch, Knob::Session];
        let sent = [Knob::Prefetch, Knob::CacheTtl, Knob::Session];
        assert_eq!(
            ignored(Mode::Assign, &sent, &inert),
            [Knob::Prefetch, Knob::Session]
        );
        // Only what the request set.
        assert!(ignored(Mode::Assign, &[Knob::CacheTtl], &inert).is_empty());
        assert_eq!(Knob::from_name("cache-ttl"), Some(Knob::CacheTtl));
        assert_eq!(Knob::from_name("cache_ttl"), None);
    }

    #[test]
    fn renamed_headers_are_the_knobs() {
        let names = HeaderNames {
            session: "x-conversation".into(),
            ..HeaderNames::default()
        };
        let sent = sent(&names, &headers(&["x-conversation", "x-cohort-session"]));
        assert_eq!(sent, [Knob::Session]);
    }
}
