//! One DNS question to one server: the query over UDP (with EDNS, 4096-byte answers), and
//! over TCP when the UDP answer comes back truncated. The server is a setting (or the
//! first `nameserver` of `/etc/resolv.conf`), never the system resolver: the batcher asks
//! exactly the server it was told, and tests point it at their own.
//!
//! Bytes from the network are untrusted: an answer that does not decode, or does not
//! match the question's id, is an error or is ignored, never a panic.

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest UDP answer asked for (EDNS).
const UDP_PAYLOAD: u16 = 4096;

/// Why a question got no usable answer.
#[derive(Debug, Error)]
pub enum DnsError {
    #[error("{0:?} is not a DNS name")]
    BadName(String),
    #[error("cannot ask {server}: {source}")]
    Io {
        server: SocketAddr,
        source: std::io::Error,
    },
    #[error("no answer from {0} in time")]
    Timeout(SocketAddr),
    #[error("malformed answer from {server}: {why}")]
    Malformed { server: SocketAddr, why: String },
    #[error("{server} answered {code}")]
    Refused {
        server: SocketAddr,
        code: ResponseCode,
    },
}

/// Asks `server` for the `kind` records of `name` within `timeout`. A name that does not
/// exist (NXDOMAIN) is an answer with no records.
pub async fn ask(
    server: SocketAddr,
    name: &str,
    kind: RecordType,
    timeout: Duration,
) -> Result<Message, DnsError> {
    let mut qname = Name::from_ascii(name).map_err(|_| DnsError::BadName(name.to_owned()))?;
    qname.set_fqdn(true);
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(qname, kind));
    let mut edns = Edns::new();
    edns.set_max_payload(UDP_PAYLOAD);
    query.set_edns(edns);
    let id = query.metadata.id;
    let bytes = query.to_vec().map_err(|e| DnsError::Malformed {
        server,
        why: e.to_string(),
    })?;
    let exchange = async {
        let reply = udp(server, &bytes, id).await?;
        if reply.metadata.truncation {
            tcp(server, &bytes, id).await
        } else {
            Ok(reply)
        }
    };
    let reply = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| DnsError::Timeout(server))??;
    match reply.metadata.response_code {
        ResponseCode::NoError | ResponseCode::NXDomain => Ok(reply),
        code => Err(DnsError::Refused { server, code }),
    }
}

fn io(server: SocketAddr) -> impl Fn(std::io::Error) -> DnsError {
    move |source| DnsError::Io { server, source }
}

/// Decodes an answer to question `id`; `None` for an answer to another question.
fn decode(server: SocketAddr, bytes: &[u8], id: u16) -> Result<Option<Message>, DnsError> {
    let reply = Message::from_vec(bytes).map_err(|e| DnsError::Malformed {
        server,
        why: e.to_string(),
    })?;
    if reply.metadata.id != id || reply.metadata.message_type != MessageType::Response {
        return Ok(None);
    }
    Ok(Some(reply))
}

async fn udp(server: SocketAddr, query: &[u8], id: u16) -> Result<Message, DnsError> {
    let local: SocketAddr = match server.ip() {
        IpAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(local)
        .await
        .map_err(io(server))?;
    socket.connect(server).await.map_err(io(server))?;
    socket.send(query).await.map_err(io(server))?;
    let mut buf = vec![0u8; usize::from(UDP_PAYLOAD)];
    loop {
        let n = socket.recv(&mut buf).await.map_err(io(server))?;
        // A stray datagram for another id is ignored (the caller's timeout bounds the wait).
        if let Some(reply) = decode(server, &buf[..n], id)? {
            return Ok(reply);
        }
    }
}

async fn tcp(server: SocketAddr, query: &[u8], id: u16) -> Result<Message, DnsError> {
    let mut stream = tokio::net::TcpStream::connect(server)
        .await
        .map_err(io(server))?;
    let len = u16::try_from(query.len()).map_err(|_| DnsError::Malformed {
        server,
        why: "query too long".into(),
    })?;
    stream
        .write_all(&len.to_be_bytes())
        .await
        .map_err(io(server))?;
    stream.write_all(query).await.map_err(io(server))?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.map_err(io(server))?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await.map_err(io(server))?;
    decode(server, &buf, id)?.ok_or_else(|| DnsError::Malformed {
        server,
        why: "the answer is for another question".into(),
    })
}

/// The first `nameserver` of a resolv.conf text, on port 53.
pub fn first_nameserver(resolv_conf: &str) -> Option<SocketAddr> {
    resolv_conf.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == "nameserver")
            .then(|| words.next()?.parse::<IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_nameserver_is_read_from_resolv_conf() {
        let text = "# k8s\nsearch llm.svc.cluster.local\nnameserver bogus\nnameserver 10.96.0.10\nnameserver 1.1.1.1\n";
        assert_eq!(
            first_nameserver(text),
            Some("10.96.0.10:53".parse().unwrap())
        );
        assert_eq!(
            first_nameserver("nameserver fd00::a"),
            Some("[fd00::a]:53".parse().unwrap())
        );
        assert_eq!(first_nameserver("options ndots:5\n"), None);
    }

    #[test]
    fn garbage_bytes_are_an_error_not_a_panic() {
        let server: SocketAddr = "127.0.0.1:53".parse().unwrap();
        for bytes in [
            &b""[..],
            &[0u8; 3],
            &[0xff; 12],
            &[0x12, 0x34, 0x81, 0x80, 0, 1, 0, 9, 0, 0, 0, 0, 5],
        ] {
            assert!(decode(server, bytes, 0x1234).is_err(), "{bytes:?}");
        }
    }
}
