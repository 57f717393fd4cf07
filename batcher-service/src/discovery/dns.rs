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

impl DnsError {
    /// Whether asking again may help: the server was not reached or did not answer in
    /// time (a datagram lost, a server restarting), not an answer it gave.
    pub fn is_transient(&self) -> bool {
        matches!(self, DnsError::Io { .. } | DnsError::Timeout(_))
    }
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

    /// A UDP server on loopback that answers each question with `reply(question)`
    /// (`None`: no answer), and a TCP server on the same port that answers properly.
    async fn server(reply: fn(&Message) -> Option<Vec<u8>>) -> SocketAddr {
        // The same port for both: a TCP port first, then UDP on it (another if taken).
        let (udp, tcp, addr) = loop {
            let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = tcp.local_addr().unwrap();
            if let Ok(udp) = tokio::net::UdpSocket::bind(addr).await {
                break (udp, tcp, addr);
            }
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let Ok(question) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                if let Some(bytes) = reply(&question) {
                    let _ = udp.send_to(&bytes, from).await;
                }
            }
        });
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = tcp.accept().await {
                let mut len = [0u8; 2];
                let _ = stream.read_exact(&mut len).await;
                let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                let _ = stream.read_exact(&mut buf).await;
                let question = Message::from_vec(&buf).unwrap();
                let mut answer = Message::response(question.metadata.id, question.metadata.op_code);
                answer.add_queries(question.queries.clone());
                answer.add_answer(hickory_proto::rr::Record::from_rdata(
                    question.queries[0].name().clone(),
                    5,
                    hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A::new(127, 0, 0, 9)),
                ));
                let bytes = answer.to_vec().unwrap();
                let _ = stream.write_all(&(bytes.len() as u16).to_be_bytes()).await;
                let _ = stream.write_all(&bytes).await;
            }
        });
        addr
    }

    const WAIT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn malformed_stray_refused_and_truncated_answers() {
        // Garbage with the question's id: malformed, an error.
        let garbage = server(|q| {
            let mut bytes = q.metadata.id.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 5, 0, 0, 0, 0, 7, 7, 7]);
            Some(bytes)
        })
        .await;
        let e = ask(garbage, "svc.test", RecordType::A, WAIT)
            .await
            .unwrap_err();
        assert!(matches!(e, DnsError::Malformed { .. }), "{e}");

        // An answer to another question is ignored: nothing else comes, a timeout.
        let stray = server(|q| {
            let answer = Message::response(q.metadata.id.wrapping_add(1), q.metadata.op_code);
            Some(answer.to_vec().unwrap())
        })
        .await;
        let e = ask(stray, "svc.test", RecordType::A, WAIT)
            .await
            .unwrap_err();
        assert!(matches!(e, DnsError::Timeout(_)), "{e}");

        // REFUSED (dnsmasq's answer for a name it does not know) is an error; NXDOMAIN an
        // answer with no records.
        let refused = server(|q| {
            Some(
                Message::error_msg(q.metadata.id, q.metadata.op_code, ResponseCode::Refused)
                    .to_vec()
                    .unwrap(),
            )
        })
        .await;
        let e = ask(refused, "svc.test", RecordType::A, WAIT)
            .await
            .unwrap_err();
        assert!(matches!(e, DnsError::Refused { .. }), "{e}");
        let missing = server(|q| {
            Some(
                Message::error_msg(q.metadata.id, q.metadata.op_code, ResponseCode::NXDomain)
                    .to_vec()
                    .unwrap(),
            )
        })
        .await;
        let reply = ask(missing, "svc.test", RecordType::A, WAIT).await.unwrap();
        assert!(reply.answers.is_empty());

        // Truncated over UDP: asked again over TCP.
        let truncated = server(|q| {
            let mut answer = Message::response(q.metadata.id, q.metadata.op_code);
            answer.metadata.truncation = true;
            Some(answer.to_vec().unwrap())
        })
        .await;
        let reply = ask(truncated, "svc.test", RecordType::A, WAIT)
            .await
            .unwrap();
        assert_eq!(reply.answers.len(), 1);

        // Nobody there, or not a name: errors.
        assert!(ask(garbage, "bad..name", RecordType::A, WAIT)
            .await
            .is_err());
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
