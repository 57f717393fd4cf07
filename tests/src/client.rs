//! A minimal HTTP/1.1 client over a raw socket: tests decide every byte they send
//! (duplicate headers, odd framing) and read status, headers and body back.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A response: status, headers (names lowercase) and the de-chunked body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::header_value(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `raw` as is on a new connection and reads one response.
pub fn send_raw(port: u16, raw: &[u8]) -> std::io::Result<Response> {
    send_paced(port, &[raw], Duration::ZERO)
}

/// Sends `pieces` on a new connection with `pause` between them (a slow client), then
/// reads one response.
pub fn send_paced(port: u16, pieces: &[&[u8]], pause: Duration) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(pause);
        }
        stream.write_all(piece)?;
    }
    read_response(&mut BufReader::new(stream))
}

/// A keep-alive connection for load runs: requests go one after another on one socket,
/// which is opened when needed and dropped after an error or a `connection: close`
/// answer. A request that fails is not retried: the caller counts it.
pub struct Connection {
    port: u16,
    stream: Option<BufReader<TcpStream>>,
    /// Sockets opened so far.
    pub opened: usize,
}

impl Connection {
    pub fn new(port: u16) -> Connection {
        Connection {
            port,
            stream: None,
            opened: 0,
        }
    }

    /// POSTs a JSON body with extra headers and reads the whole response.
    pub fn post_json(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(("127.0.0.1", self.port))?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(30)))?;
            self.stream = Some(BufReader::new(stream));
            self.opened += 1;
        }
        let mut raw = format!(
            "POST {path} HTTP/1.1\r\nhost: cohort.test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            raw.push_str(&format!("{name}: {value}\r\n"));
        }
        raw.push_str("\r\n");
        let mut bytes = raw.into_bytes();
        bytes.extend_from_slice(body);
        let reader = self.stream.as_mut().expect("connected above");
        let result = reader
            .get_mut()
            .write_all(&bytes)
            .and_then(|()| read_response(reader));
        let keep = result.as_ref().is_ok_and(|r| {
            !r.header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        });
        if !keep {
            self.stream = None;
        }
        result
    }
}

/// A request with `content-length` and `connection: close` (and `host: cohort.test`
/// unless `headers` name another host).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut raw = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        raw.push_str("host: cohort.test\r\n");
    }
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        raw.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    raw.push_str("\r\n");
    let mut bytes = raw.into_bytes();
    bytes.extend_from_slice(body);
    send_raw(port, &bytes)
}

/// POST of a JSON body.
pub fn post_json(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request(port, "POST", path, &all, body).expect("request completes")
}

/// A streamed (SSE) response being read event by event; dropping it closes the
/// connection, which is how a test cancels a request mid-stream.
pub struct EventStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
}

impl EventStream {
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::header_value(&self.headers, name)
    }

    /// The next `data:` payload, or `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                return Some(data.trim().to_owned());
            }
        }
    }
}

/// POSTs a JSON body and returns once the response headers are read, leaving the body
/// to be read as server-sent events.
pub fn post_stream(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> EventStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nhost: cohort.test\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    raw.push_str("\r\n");
    stream.write_all(raw.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader).expect("response head");
    EventStream {
        status,
        headers,
        reader,
    }
}

fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    Ok((status, headers))
}

fn read_response(reader: &mut impl BufRead) -> std::io::Result<Response> {
    // Interim responses (`100 Continue` to `Expect: 100-continue`) precede the real one.
    let (status, headers) = loop {
        let (status, headers) = read_head(reader)?;
        if !(100..200).contains(&status) {
            break (status, headers);
        }
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line)?;
            let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(std::io::Error::other)?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// What the `x-cohort` response header says of a request: `routed` when Cohort routed it,
/// the bypass reason when it passed through (`holdout`, `breaker_open`, ...), else
/// `unknown: …`.
pub fn verdict(header: Option<&str>) -> String {
    let header = header.unwrap_or("");
    match header.split("bypass=").nth(1) {
        Some(reason) => reason.trim().to_owned(),
        None if header.contains("cluster=") => "routed".to_owned(),
        None => format!("unknown: {header:?}"),
    }
}
