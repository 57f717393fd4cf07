//! Which endpoints the picker may answer and in what order, as pure functions over the
//! brain's replica set ([`SlotView`]).
//!
//! - **Endpoints.** A replica's endpoint is the `ip:port` discovery found for it, or else
//!   the `host:port` of its configured `url` (port 80 when the URL names none). A replica
//!   with neither (a static replica known by name only) cannot be picked.
//! - **Eligible slots** ([`eligible`]): slots with an endpoint and, when the proxy sent a
//!   subset hint, whose endpoint is in it. The brain decides among these only. Endpoints
//!   are compared as socket addresses ([`same_endpoint`]): `[fd00:0::1]:8000` and
//!   `[fd00::1]:8000` are one endpoint, whichever spelling the URL and the proxy use.
//! - **Destination** ([`destination`]): the chosen endpoint first, then up to
//!   [`MAX_FALLBACKS`] others in the decision's order of preference, comma-separated.
//! - **Deadline fallback** ([`by_key`]): when the brain did not answer in time, a usable
//!   eligible slot by jump hash of the request's routing key (affinity, as the filter
//!   falls back to), or of nothing for a request without one.

use crate::config::ServeConfig;
use crate::serve::brain::pick::SlotView;
use std::collections::HashMap;
use std::net::SocketAddr;

/// Endpoints after the primary in the destination list.
pub const MAX_FALLBACKS: usize = 2;

/// Replica name → endpoint for replicas discovery does not give one.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    configured: HashMap<String, String>,
}

impl Endpoints {
    /// The endpoints of the configured replicas' URLs.
    pub fn from_config(config: &ServeConfig) -> Endpoints {
        Endpoints {
            configured: config
                .replicas
                .iter()
                .filter_map(|r| {
                    let uri = r.url.as_ref()?.uri();
                    let host = uri.host()?;
                    let port = uri.port_u16().unwrap_or(80);
                    let endpoint = format!("{host}:{port}");
                    if endpoint.parse::<SocketAddr>().is_err() {
                        // override_host selects a host of the cluster by address: a name
                        // never matches one.
                        tracing::warn!(
                            replica = %r.name,
                            %endpoint,
                            "the picker's endpoint for this replica is not an ip:port; a proxy routing with override_host cannot use it"
                        );
                    }
                    Some((r.name.clone(), endpoint))
                })
                .collect(),
        }
    }

    /// The endpoint of `slot`'s replica, if it has one.
    pub fn of<'a>(&'a self, slot: &'a SlotView) -> Option<&'a str> {
        if !slot.member.endpoint.is_empty() {
            return Some(&slot.member.endpoint);
        }
        self.configured.get(&slot.member.name).map(String::as_str)
    }
}

/// Per slot (indexed by slot number): whether the picker may choose it: it has an
/// endpoint and, with a subset hint, that endpoint is in the subset.
pub fn eligible(slots: &[SlotView], endpoints: &Endpoints, subset: Option<&[String]>) -> Vec<bool> {
    let len = slots.iter().map(|s| s.slot + 1).max().unwrap_or(0);
    let mut mask = vec![false; len];
    for s in slots {
        mask[s.slot] = endpoints.of(s).is_some_and(|e| {
            subset.is_none_or(|subset| subset.iter().any(|x| same_endpoint(x, e)))
        });
    }
    mask
}

/// Whether any eligible slot is usable now.
pub fn any_usable(slots: &[SlotView], mask: &[bool]) -> bool {
    slots
        .iter()
        .any(|s| s.usable && mask.get(s.slot).copied().unwrap_or(false))
}

/// The destination list: `primary`'s endpoint, then those of `alternatives` (in order,
/// at most [`MAX_FALLBACKS`], duplicates of an earlier endpoint skipped).
pub fn destination(
    slots: &[SlotView],
    endpoints: &Endpoints,
    primary: usize,
    alternatives: &[usize],
) -> Option<String> {
    let endpoint = |slot: usize| {
        slots
            .iter()
            .find(|s| s.slot == slot)
            .and_then(|s| endpoints.of(s))
    };
    let first = endpoint(primary)?;
    let mut list = vec![first];
    for &alt in alternatives {
        if list.len() > MAX_FALLBACKS {
            break;
        }
        if let Some(e) = endpoint(alt).filter(|e| !list.contains(e)) {
            list.push(e);
        }
    }
    Some(list.join(","))
}

/// The deadline fallback: among the usable eligible slots, the one `key` jump-hashes to,
/// then the next ones in slot order as alternatives.
pub fn by_key(slots: &[SlotView], mask: &[bool], key: u64) -> Option<(usize, Vec<usize>)> {
    let usable: Vec<usize> = slots
        .iter()
        .filter(|s| s.usable && mask.get(s.slot).copied().unwrap_or(false))
        .map(|s| s.slot)
        .collect();
    if usable.is_empty() {
        return None;
    }
    let i = cohort_fingerprint::shard::jump_hash(key, usable.len() as u32) as usize;
    let rest = (1..usable.len())
        .map(|k| usable[(i + k) % usable.len()])
        .collect();
    Some((usable[i], rest))
}

/// The slot whose replica's endpoint is `endpoint` (the first of a list).
pub fn slot_of(slots: &[SlotView], endpoints: &Endpoints, endpoint: &str) -> Option<usize> {
    slots
        .iter()
        .find(|s| endpoints.of(s).is_some_and(|e| same_endpoint(e, endpoint)))
        .map(|s| s.slot)
}

/// Whether two endpoints name the same address: compared as socket addresses when both
/// parse as one (IPv6 spelled either way), else as text.
pub fn same_endpoint(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    match (a.parse::<SocketAddr>(), b.parse::<SocketAddr>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Member;

    #[test]
    fn endpoints_are_compared_as_addresses() {
        assert!(same_endpoint("[fd00:0::1]:8000", "[fd00::1]:8000"));
        assert!(same_endpoint(" 10.0.0.1:8000", "10.0.0.1:8000"));
        assert!(!same_endpoint("10.0.0.1:8000", "10.0.0.1:8001"));
        assert!(same_endpoint("engine-0:8000", "engine-0:8000"));
        assert!(!same_endpoint("engine-0:8000", "10.0.0.1:8000"));
        let slots = vec![slot(0, "r0", "[fd00:0::1]:8000", true)];
        let endpoints = Endpoints::default();
        assert_eq!(slot_of(&slots, &endpoints, "[fd00::1]:8000"), Some(0));
        let subset = vec!["[fd00::1]:8000".to_owned()];
        assert_eq!(eligible(&slots, &endpoints, Some(&subset)), vec![true]);
    }

    fn slot(slot: usize, name: &str, endpoint: &str, usable: bool) -> SlotView {
        SlotView {
            slot,
            member: Member {
                name: name.into(),
                endpoint: endpoint.into(),
            },
            usable,
        }
    }

    #[test]
    fn endpoints_are_discovered_or_the_configured_urls_host_and_port() {
        let config: ServeConfig = toml::from_str(
            "[[replicas]]\nname = \"a\"\nurl = \"http://10.0.0.9:8081\"\n\
             [[replicas]]\nname = \"b\"\nurl = \"http://10.0.0.8\"\n\
             [[replicas]]\nname = \"c\"\n",
        )
        .unwrap();
        let endpoints = Endpoints::from_config(&config);
        let slots = [
            slot(0, "a", "", true),
            slot(1, "b", "", true),
            slot(2, "c", "", true),
            slot(3, "d", "10.0.0.4:8000", true),
        ];
        let of: Vec<Option<&str>> = slots.iter().map(|s| endpoints.of(s)).collect();
        assert_eq!(
            of,
            [
                Some("10.0.0.9:8081"),
                Some("10.0.0.8:80"),
                None,
                Some("10.0.0.4:8000")
            ]
        );
        assert_eq!(
            eligible(&slots, &endpoints, None),
            [true, true, false, true]
        );
        let subset = ["10.0.0.4:8000".to_owned(), "10.9.9.9:1".to_owned()];
        assert_eq!(
            eligible(&slots, &endpoints, Some(&subset)),
            [false, false, false, true]
        );
        assert_eq!(slot_of(&slots, &endpoints, "10.0.0.8:80"), Some(1));
    }

    #[test]
    fn the_destination_lists_the_primary_then_two_fallbacks() {
        let endpoints = Endpoints::default();
        let slots: Vec<SlotView> = (0..5)
            .map(|i| slot(i, &format!("r{i}"), &format!("10.0.0.{i}:8000"), true))
            .collect();
        assert_eq!(
            destination(&slots, &endpoints, 3, &[1, 4, 0]).as_deref(),
            Some("10.0.0.3:8000,10.0.0.1:8000,10.0.0.4:8000")
        );
        assert_eq!(
            destination(&slots, &endpoints, 2, &[]).as_deref(),
            Some("10.0.0.2:8000")
        );
        assert_eq!(destination(&slots, &endpoints, 9, &[1]), None);
    }

    #[test]
    fn the_key_fallback_is_stable_and_skips_what_cannot_be_used() {
        let slots = vec![
            slot(0, "r0", "10.0.0.0:1", true),
            slot(1, "r1", "10.0.0.1:1", false),
            slot(2, "r2", "10.0.0.2:1", true),
        ];
        let mask = vec![true, true, true];
        for key in 0..50u64 {
            let (chosen, rest) = by_key(&slots, &mask, key).unwrap();
            assert_ne!(chosen, 1);
            assert_eq!(by_key(&slots, &mask, key).unwrap().0, chosen);
            assert_eq!(rest.len(), 1);
        }
        assert_eq!(by_key(&slots, &[false, false, false], 7), None);
        assert!(!any_usable(&slots, &[false, true, false]));
        assert!(any_usable(&slots, &mask));
    }
}
