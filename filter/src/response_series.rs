//! Which series a response is counted in, and the Envoy stat names that carry it (pure).
//!
//! Every LLM API request the filter counts ends in one *group*: routed by Cohort, held out
//! by the rollout (the control group), or bypassed for a reason. Its response is measured
//! per group, per Envoy route and, for the two groups `cohort report` compares, per *unit*:
//! a fixed eighth of the users ([`crate::rollout::unit_of_bucket`]), so the report can use
//! users, not requests, as its independent units.
//!
//! proxy-wasm stats have no labels, so the tags go into the stat name the way Istio encodes
//! them, `<tag>=.=<value>;.;`, and Envoy's `stats_tags` (one regex per tag,
//! `(<tag>=\.=(.*?);\.;)`, what Istio's bootstrap writes for `extraStatTags`) turn each into
//! a Prometheus label and remove it from the name:
//!
//! ```text
//! cohort_group=.=routed;.;cohort_route=.=chat;.;cohort_unit=.=3;.;cohort_response_ttfb_ms
//!   -> cohort_response_ttfb_ms_bucket{cohort_group="routed",cohort_route="chat",cohort_unit="3",le="…"}
//! ```
//!
//! Routes: the first [`RouteTable`] `max_routes` route names an Envoy sees get their own
//! series, in the order its workers first meet them (the list is shared by all workers, so
//! they agree); later ones are counted under `other`, and a request the host names no route
//! for under `none`.

use crate::decision::reason;

/// The route tag of routes past the cap.
pub const OTHER_ROUTE: &str = "other";
/// The route tag of a request the host names no route for.
pub const NO_ROUTE: &str = "none";
/// Longest route tag kept (longer names are cut).
pub const MAX_ROUTE_TAG: usize = 64;

/// The group a counted request ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    /// Cohort routed it (on its fingerprint, assigned or by key).
    Routed,
    /// The rollout held it out: it went exactly as it came (the control group).
    Holdout,
    /// Passed through for this reason (the breaker open, a body too large, …).
    Bypassed(&'static str),
}

impl Group {
    /// The group of a request left untouched or bypassed for `why`.
    pub fn of_bypass(why: &'static str) -> Group {
        if why == reason::HOLDOUT {
            Group::Holdout
        } else {
            Group::Bypassed(why)
        }
    }

    pub fn tag(self) -> &'static str {
        match self {
            Group::Routed => "routed",
            Group::Holdout => "holdout",
            Group::Bypassed(_) => "bypassed",
        }
    }

    /// Whether the group is one `cohort report` compares (so it is split by unit).
    pub fn compared(self) -> bool {
        matches!(self, Group::Routed | Group::Holdout)
    }
}

/// Upstream status classes, in the order of [`StatusClass::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    Informational,
    Success,
    Redirect,
    ClientError,
    ServerError,
    /// No response headers came (the client or the stream went away first).
    None,
}

impl StatusClass {
    pub const ALL: [StatusClass; 6] = [
        StatusClass::Informational,
        StatusClass::Success,
        StatusClass::Redirect,
        StatusClass::ClientError,
        StatusClass::ServerError,
        StatusClass::None,
    ];

    /// The class of an HTTP status (0: none came).
    pub fn of(status: u16) -> StatusClass {
        match status {
            100..=199 => StatusClass::Informational,
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirect,
            400..=499 => StatusClass::ClientError,
            500..=599 => StatusClass::ServerError,
            _ => StatusClass::None,
        }
    }

    pub fn tag(self) -> &'static str {
        match self {
            StatusClass::Informational => "1xx",
            StatusClass::Success => "2xx",
            StatusClass::Redirect => "3xx",
            StatusClass::ClientError => "4xx",
            StatusClass::ServerError => "5xx",
            StatusClass::None => "none",
        }
    }

    pub fn index(self) -> usize {
        StatusClass::ALL
            .iter()
            .position(|c| *c == self)
            .unwrap_or(0)
    }
}

/// The series one response is counted in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    pub group: Group,
    /// The route tag ([`RouteTable::tag`]).
    pub route: String,
    /// The user's unit; only for the compared groups while a hold-out exists.
    pub unit: Option<u8>,
}

/// The metrics of a series, by the name Prometheus shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Request headers in -> first response body byte (the first SSE data frame), ms.
    TtfbMs,
    /// -> response headers, ms.
    HeadersMs,
    /// -> end of the stream, ms.
    TotalMs,
    /// Responses, by status class (the tag `cohort_status`).
    Responses(StatusClass),
    /// Prompt tokens responses reported.
    PromptTokens,
    /// Of which cached.
    CachedTokens,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::TtfbMs => "cohort_response_ttfb_ms",
            Metric::HeadersMs => "cohort_response_headers_ms",
            Metric::TotalMs => "cohort_response_total_ms",
            Metric::Responses(_) => "cohort_responses_total",
            Metric::PromptTokens => "cohort_response_prompt_tokens_total",
            Metric::CachedTokens => "cohort_response_cached_tokens_total",
        }
    }

    /// Whether the metric is split by unit (what `cohort report` reads); the headers and
    /// total times are per group and route only, which halves the series a route costs.
    fn by_unit(self) -> bool {
        !matches!(self, Metric::HeadersMs | Metric::TotalMs)
    }
}

/// The Envoy stat name of `metric` in series `key`, its tags encoded for `stats_tags`.
pub fn stat_name(key: &SeriesKey, metric: Metric) -> String {
    let mut name = String::with_capacity(96);
    let mut tag = |tag: &str, value: &str| {
        name.push_str(tag);
        name.push_str("=.=");
        name.push_str(value);
        name.push_str(";.;");
    };
    tag("cohort_group", key.group.tag());
    if let Group::Bypassed(why) = key.group {
        tag("cohort_reason", why);
    }
    tag("cohort_route", &key.route);
    if let (Some(unit), true) = (key.unit, metric.by_unit()) {
        tag("cohort_unit", &unit.to_string());
    }
    if let Metric::Responses(class) = metric {
        tag("cohort_status", class.tag());
    }
    name.push_str(metric.name());
    name
}

/// A route name as a tag value: characters outside `[A-Za-z0-9_-]` become `_` (they would
/// break the name's encoding or the label), cut at [`MAX_ROUTE_TAG`]; empty is [`NO_ROUTE`].
pub fn route_tag(name: Option<&str>) -> String {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return NO_ROUTE.into();
    };
    name.chars()
        .take(MAX_ROUTE_TAG)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The route tags that have their own series, as kept in Envoy's shared data (one per line)
/// so every worker agrees on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTable {
    routes: Vec<String>,
}

/// Where [`RouteTable::place`] put a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePlacement {
    /// The tag its requests are counted under.
    pub tag: String,
    /// Whether the table gained it (and must be written back).
    pub added: bool,
}

impl RouteTable {
    pub fn from_bytes(bytes: &[u8]) -> RouteTable {
        let text = String::from_utf8_lossy(bytes);
        RouteTable {
            routes: text
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.routes.join("\n").into_bytes()
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The tag of route `tag` (already [`route_tag`]ged) under a cap of `max_routes`: its
    /// own while the table holds it or has room for it, else [`OTHER_ROUTE`].
    /// [`NO_ROUTE`] is its own tag and takes no room.
    pub fn place(&mut self, tag: &str, max_routes: usize) -> RoutePlacement {
        if tag == NO_ROUTE || self.routes.iter().any(|r| r == tag) {
            return RoutePlacement {
                tag: tag.into(),
                added: false,
            };
        }
        if self.routes.len() < max_routes {
            self.routes.push(tag.into());
            return RoutePlacement {
                tag: tag.into(),
                added: true,
            };
        }
        RoutePlacement {
            tag: OTHER_ROUTE.into(),
            added: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(group: Group, route: &str, unit: Option<u8>) -> SeriesKey {
        SeriesKey {
            group,
            route: route.into(),
            unit,
        }
    }

    #[test]
    fn names_carry_the_tags_envoy_extracts() {
        let routed = key(Group::Routed, "chat", Some(3));
        assert_eq!(
            stat_name(&routed, Metric::TtfbMs),
            "cohort_group=.=routed;.;cohort_route=.=chat;.;cohort_unit=.=3;.;cohort_response_ttfb_ms"
        );
        assert_eq!(
            stat_name(&routed, Metric::TotalMs),
            "cohort_group=.=routed;.;cohort_route=.=chat;.;cohort_response_total_ms",
            "times other than the first byte are not split by unit"
        );
        assert_eq!(
            stat_name(&routed, Metric::Responses(StatusClass::ServerError)),
            "cohort_group=.=routed;.;cohort_route=.=chat;.;cohort_unit=.=3;.;cohort_status=.=5xx;.;cohort_responses_total"
        );
        let bypassed = key(Group::of_bypass("breaker_open"), "chat", None);
        assert_eq!(
            stat_name(&bypassed, Metric::CachedTokens),
            "cohort_group=.=bypassed;.;cohort_reason=.=breaker_open;.;cohort_route=.=chat;.;cohort_response_cached_tokens_total"
        );
        assert_eq!(Group::of_bypass(reason::HOLDOUT), Group::Holdout);
        assert!(Group::Holdout.compared() && !bypassed.group.compared());
    }

    #[test]
    fn the_regex_envoy_applies_recovers_each_tag() {
        // What `(<tag>=\.=(.*?);\.;)` extracts: the text between `<tag>=.=` and the next `;.;`.
        let name = stat_name(
            &key(Group::Holdout, "legacy-chat", Some(7)),
            Metric::Responses(StatusClass::Success),
        );
        let value = |tag: &str| {
            let start = name.find(&format!("{tag}=.=")).unwrap() + tag.len() + 3;
            let end = start + name[start..].find(";.;").unwrap();
            name[start..end].to_owned()
        };
        assert_eq!(value("cohort_group"), "holdout");
        assert_eq!(value("cohort_route"), "legacy-chat");
        assert_eq!(value("cohort_unit"), "7");
        assert_eq!(value("cohort_status"), "2xx");
        assert!(name.ends_with(";.;cohort_responses_total"));
    }

    #[test]
    fn route_names_become_safe_tags() {
        assert_eq!(route_tag(Some("chat-v1_b")), "chat-v1_b");
        assert_eq!(route_tag(Some("a.b;c=.=d")), "a_b_c___d");
        assert_eq!(route_tag(Some("")), NO_ROUTE);
        assert_eq!(route_tag(None), NO_ROUTE);
        assert_eq!(route_tag(Some(&"x".repeat(300))).len(), MAX_ROUTE_TAG);
        assert_eq!(route_tag(Some("é")), "_");
    }

    #[test]
    fn the_first_routes_up_to_the_cap_get_their_own_series() {
        let mut table = RouteTable::default();
        assert_eq!(
            table.place("a", 2),
            RoutePlacement {
                tag: "a".into(),
                added: true
            }
        );
        assert!(!table.place("a", 2).added);
        assert!(table.place("b", 2).added);
        assert_eq!(table.place("c", 2).tag, OTHER_ROUTE);
        assert_eq!(table.place(NO_ROUTE, 2).tag, NO_ROUTE);
        assert_eq!(table.place("b", 2).tag, "b");
        let shared = RouteTable::from_bytes(&table.to_bytes());
        assert_eq!(shared, table);
        assert_eq!(shared.len(), 2);
        assert_eq!(RouteTable::default().place("a", 0).tag, OTHER_ROUTE);
        assert!(RouteTable::from_bytes(b"").is_empty());
    }

    #[test]
    fn status_classes() {
        assert_eq!(StatusClass::of(200), StatusClass::Success);
        assert_eq!(StatusClass::of(503).tag(), "5xx");
        assert_eq!(StatusClass::of(0), StatusClass::None);
        assert_eq!(StatusClass::of(999), StatusClass::None);
        for (i, class) in StatusClass::ALL.iter().enumerate() {
            assert_eq!(class.index(), i);
        }
    }
}
