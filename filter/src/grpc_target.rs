//! What the filter hands Envoy as the target of its gRPC calls to a batcher shard (`Assign`,
//! `Observe`): a cluster name, or a serialized `envoy.config.core.v3.GrpcService` when the
//! name alone would make Envoy send an invalid request.
//!
//! Given a bare cluster name, Envoy's Wasm host uses it as the call's `:authority` too. An
//! Istio sidecar names a Service's cluster `outbound|<port>|<subset>|<host>`, and `|` is not
//! allowed in an authority: the HTTP/2 codec refuses the request ("protocol error") and every
//! call fails before it leaves the proxy. For such a name the filter passes a `GrpcService`
//! whose `envoy_grpc` names the same cluster with the authority `<service>:<port>` (the
//! host's first label), which Envoy's host call accepts in place of a name (it tries to
//! parse the target as that message first). Any other name is passed as it is.

use prost::Message;

/// `envoy.config.core.v3.GrpcService`, the one field the filter sets.
#[derive(Clone, PartialEq, Message)]
struct GrpcService {
    #[prost(message, optional, tag = "1")]
    envoy_grpc: Option<EnvoyGrpc>,
}

/// `envoy.config.core.v3.GrpcService.EnvoyGrpc`.
#[derive(Clone, PartialEq, Message)]
struct EnvoyGrpc {
    #[prost(string, tag = "1")]
    cluster_name: String,
    #[prost(string, tag = "2")]
    authority: String,
}

/// The authority for an Istio cluster name: the Service's short name and the port
/// (`outbound|50051||cohort-batcher-0.llm.svc.cluster.local` → `cohort-batcher-0:50051`);
/// `None` for any other name. Short, so that the whole target stays within the one-byte
/// lengths that keep it ASCII (see [`grpc_target`]).
pub fn istio_authority(cluster: &str) -> Option<String> {
    let mut parts = cluster.split('|');
    let (direction, port, _subset, host) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let valid = matches!(direction, "outbound" | "inbound")
        && parts.next().is_none()
        && port.parse::<u16>().is_ok()
        && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let service = host.split('.').next().filter(|s| !s.is_empty())?;
    valid.then(|| format!("{service}:{port}"))
}

/// An Istio cluster name too long to be passed with an authority (see [`grpc_target`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("batcher cluster {0:?} is too long for its gRPC authority to be set: at most {max} bytes, with the authority", max = MAX_MESSAGE)]
pub struct TargetTooLong(pub String);

/// The longest `EnvoyGrpc` message whose length, and its fields' lengths, fit one varint
/// byte: the encoded target is then plain ASCII, as the proxy-wasm SDK's `&str` requires.
const MAX_MESSAGE: usize = 127;

/// The gRPC call's target for `cluster` (see the module doc): the name itself, or for an
/// Istio name a `GrpcService` naming the cluster with an authority. The encoding is ASCII
/// (field tags and one-byte lengths below 128, ASCII names), so it is a `String`; a name
/// too long for that is refused (the filter's configuration says so at load).
pub fn grpc_target(cluster: &str) -> Result<String, TargetTooLong> {
    let Some(authority) = istio_authority(cluster) else {
        return Ok(cluster.to_owned());
    };
    let message_len = 2 + cluster.len() + 2 + authority.len();
    if message_len > MAX_MESSAGE {
        return Err(TargetTooLong(cluster.to_owned()));
    }
    let bytes = GrpcService {
        envoy_grpc: Some(EnvoyGrpc {
            cluster_name: cluster.to_owned(),
            authority,
        }),
    }
    .encode_to_vec();
    String::from_utf8(bytes).map_err(|_| TargetTooLong(cluster.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISTIO: &str = "outbound|50051||cohort-batcher-0.llm.svc.cluster.local";

    #[test]
    fn an_istio_cluster_gets_its_service_as_the_authority() {
        let target = grpc_target(ISTIO).unwrap();
        let service = GrpcService::decode(target.as_bytes()).unwrap();
        let envoy = service.envoy_grpc.unwrap();
        assert_eq!(envoy.cluster_name, ISTIO);
        assert_eq!(envoy.authority, "cohort-batcher-0:50051");
    }

    #[test]
    fn a_plain_cluster_name_is_passed_as_it_is() {
        for name in [
            "cohort-batcher-0",
            "batcher.example",
            "outbound|x||host",
            "a|b",
        ] {
            assert_eq!(grpc_target(name).unwrap(), name, "{name}");
        }
    }

    #[test]
    fn only_well_formed_istio_names_are_rewritten() {
        assert_eq!(
            istio_authority("outbound|8000|v1|llm-engine.llm.svc.cluster.local").as_deref(),
            Some("llm-engine:8000")
        );
        for name in [
            "outbound|50051||",
            "outbound|port||host",
            "sideways|50051||host",
            "outbound|50051||host|extra",
            "outbound|50051||ho st",
        ] {
            assert_eq!(istio_authority(name), None, "{name}");
        }
    }

    #[test]
    fn the_shipped_names_fit_a_namespace_of_up_to_fifty_characters() {
        let name = |namespace: usize| {
            format!(
                "outbound|50051||cohort-batcher-0.{}.svc.cluster.local",
                "n".repeat(namespace)
            )
        };
        // 2 + 111 + 2 + 22 ("cohort-batcher-0:50051") = 127 bytes of EnvoyGrpc.
        let fits = grpc_target(&name(50)).unwrap();
        assert!(fits.is_ascii());
        let service = GrpcService::decode(fits.as_bytes()).unwrap();
        assert_eq!(service.envoy_grpc.unwrap().cluster_name, name(50));
        assert_eq!(grpc_target(&name(51)), Err(TargetTooLong(name(51))));
    }
}
