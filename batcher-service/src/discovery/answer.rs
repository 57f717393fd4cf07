//! DNS answers to replicas: what identifies an engine replica and where Envoy reaches it.
//!
//! - SRV (`_<port_name>._tcp.<service>`): one replica per record; its name is the first
//!   label of the record's target (a StatefulSet pod's stable name, `llm-engine-0` from
//!   `llm-engine-0.llm-engine-pods.llm.svc.cluster.local`; for pods without a
//!   hostname Kubernetes names the target by the dashed address, `10-1-2-3`), its
//!   endpoint the target's address on the record's port.
//! - A only (no port name): one replica per address, named by the address itself.
//!
//! Pure, and defensive: records of other types, targets that are not plain names,
//! duplicate names and anything past [`MAX_REPLICAS`] are skipped, never trusted.

use super::Member;
use hickory_proto::op::Message;
use hickory_proto::rr::{Name, RData};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Replicas taken from one answer; the rest are ignored (a runaway answer cannot grow the
/// policy without bound).
pub const MAX_REPLICAS: usize = 256;

/// One SRV record: the target host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvTarget {
    pub target: Name,
    pub port: u16,
}

/// The SRV records of an answer, in answer order.
pub fn srv_targets(reply: &Message) -> Vec<SrvTarget> {
    reply
        .answers
        .iter()
        .filter_map(|record| match &record.data {
            RData::SRV(srv) if srv.port != 0 => Some(SrvTarget {
                target: srv.target.clone(),
                port: srv.port,
            }),
            _ => None,
        })
        .take(MAX_REPLICAS)
        .collect()
}

/// The IPv4 addresses an answer gives `name` (answer and additional sections).
pub fn addresses_of(reply: &Message, name: &Name) -> Vec<Ipv4Addr> {
    reply
        .answers
        .iter()
        .chain(&reply.additionals)
        .filter(|record| {
            record.name.eq_case(name) || record.name.to_lowercase() == name.to_lowercase()
        })
        .filter_map(|record| match &record.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// Every IPv4 address in an answer's answer section (an A question, CNAMEs followed by
/// the server).
pub fn addresses(reply: &Message) -> Vec<Ipv4Addr> {
    reply
        .answers
        .iter()
        .filter_map(|record| match &record.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// A replica's name from an SRV target: its first label, lowercase, if it is a plain name.
pub fn replica_name(target: &Name) -> Option<String> {
    let label = target.iter().next()?;
    let name = std::str::from_utf8(label).ok()?.to_ascii_lowercase();
    cohort_proto::is_plain_name(&name).then_some(name)
}

/// A replica from an SRV target and its address.
pub fn srv_member(target: &SrvTarget, address: Ipv4Addr) -> Option<Member> {
    Some(Member {
        name: replica_name(&target.target)?,
        endpoint: SocketAddr::new(IpAddr::V4(address), target.port).to_string(),
    })
}

/// The replicas of an A answer, each named by its address, on `port`.
pub fn a_members(reply: &Message, port: u16) -> Vec<Member> {
    let mut ips = addresses(reply);
    ips.dedup();
    ips.into_iter()
        .filter(|ip| !ip.is_unspecified() && !ip.is_broadcast())
        .take(MAX_REPLICAS)
        .map(|ip| Member {
            name: ip.to_string(),
            endpoint: SocketAddr::new(IpAddr::V4(ip), port).to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, OpCode};
    use hickory_proto::rr::rdata::{A, CNAME, SRV, TXT};
    use hickory_proto::rr::Record;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn reply() -> Message {
        Message::new(7, MessageType::Response, OpCode::Query)
    }

    fn srv(target: &str, port: u16) -> Record {
        Record::from_rdata(
            name("_http._tcp.llm-engine.llm.svc.cluster.local."),
            5,
            RData::SRV(SRV::new(0, 50, port, name(target))),
        )
    }

    fn a(owner: &str, ip: [u8; 4]) -> Record {
        Record::from_rdata(name(owner), 5, RData::A(A::from(Ipv4Addr::from(ip))))
    }

    #[test]
    fn srv_targets_name_replicas_by_their_pod() {
        let mut m = reply();
        m.add_answer(srv("llm-engine-0.llm-engine.llm.svc.cluster.local.", 8000));
        m.add_answer(srv("LLM-Engine-1.llm-engine.llm.svc.cluster.local.", 8001));
        m.add_answer(srv("ignored.example.", 0));
        m.add_answer(a("x.example.", [1, 2, 3, 4]));
        m.add_additional(a(
            "llm-engine-0.llm-engine.llm.svc.cluster.local.",
            [10, 0, 0, 5],
        ));
        let targets = srv_targets(&m);
        assert_eq!(targets.len(), 2);
        let ips = addresses_of(&m, &targets[0].target);
        assert_eq!(ips, vec![Ipv4Addr::new(10, 0, 0, 5)]);
        assert!(addresses_of(&m, &targets[1].target).is_empty());
        let member = srv_member(&targets[0], ips[0]).unwrap();
        assert_eq!(member.name, "llm-engine-0");
        assert_eq!(member.endpoint, "10.0.0.5:8000");
        assert_eq!(
            srv_member(&targets[1], Ipv4Addr::new(10, 0, 0, 6))
                .unwrap()
                .name,
            "llm-engine-1"
        );
    }

    #[test]
    fn a_answers_name_replicas_by_address_and_skip_other_records() {
        let mut m = reply();
        m.add_answer(Record::from_rdata(
            name("llm-engine.test."),
            5,
            RData::CNAME(CNAME(name("pods.test."))),
        ));
        m.add_answer(a("pods.test.", [127, 0, 0, 2]));
        m.add_answer(a("pods.test.", [127, 0, 0, 3]));
        m.add_answer(a("pods.test.", [0, 0, 0, 0]));
        m.add_answer(Record::from_rdata(
            name("pods.test."),
            5,
            RData::TXT(TXT::new(vec!["x".into()])),
        ));
        let members = a_members(&m, 9000);
        let endpoints: Vec<&str> = members.iter().map(|m| m.endpoint.as_str()).collect();
        assert_eq!(endpoints, ["127.0.0.2:9000", "127.0.0.3:9000"]);
        assert_eq!(members[0].name, "127.0.0.2");
        assert!(a_members(&reply(), 9000).is_empty());
    }

    #[test]
    fn odd_targets_and_runaway_answers_are_bounded() {
        assert_eq!(replica_name(&Name::root()), None);
        assert_eq!(replica_name(&name("a_b.example.")), Some("a_b".into()));
        let mut m = reply();
        for i in 0..(MAX_REPLICAS as u32 + 50) {
            m.add_answer(srv(&format!("pod-{i}.example."), 80));
        }
        assert_eq!(srv_targets(&m).len(), MAX_REPLICAS);
    }

    #[test]
    fn decoded_garbage_never_panics() {
        // Every prefix and a few bit flips of a real answer: decode errors or odd
        // records, but the readers above never panic on what decodes.
        let mut m = reply();
        m.add_answer(srv("llm-engine-0.llm-engine.test.", 8000));
        m.add_additional(a("llm-engine-0.llm-engine.test.", [127, 0, 0, 2]));
        let bytes = m.to_vec().unwrap();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for cut in 0..=bytes.len() {
            for flip in 0..8 {
                let mut b = bytes[..cut].to_vec();
                if !b.is_empty() && flip > 0 {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let i = (seed >> 33) as usize % b.len();
                    b[i] ^= 1 << (flip - 1);
                }
                if let Ok(decoded) = Message::from_vec(&b) {
                    for t in srv_targets(&decoded) {
                        let _ = addresses_of(&decoded, &t.target);
                        let _ = replica_name(&t.target);
                    }
                    let _ = a_members(&decoded, 1);
                }
            }
        }
    }
}
