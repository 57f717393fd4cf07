//! What the simulator's tests share: one HTTP/1.0 exchange with a replica.
#![allow(dead_code)]

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A replica's answer: the status, the head (status line and headers) and the body.
pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    /// The body as JSON (panics, with the body, when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// A header's value, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// One HTTP/1.0 exchange (the server closes the connection to end any body, streamed or
/// not), within 10 s.
pub async fn call(port: u16, method: &str, path: &str, body: &str) -> Reply {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let request = format!(
            "{method} {path} HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        Reply {
            status,
            headers: head.to_owned(),
            body: body.to_owned(),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("no answer in 10 s")
}
