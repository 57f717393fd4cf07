//! `cohort audit <request_id>`: asks a batcher for one request's cost record
//! (`GET /v1/audit/{request_id}` on its HTTP port, [`crate::audit`]) and prints it.
//!
//! The record is tenant-scoped: pass the tenant the mesh established for the request
//! (`--tenant`, sent in the batcher's tenant header); without it, the request must have
//! had no tenant. Exit status 1 when the batcher has no such record for that tenant.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The request's id (Envoy's `x-request-id`).
    request_id: String,
    /// The batcher's HTTP address (its `--http-listen`).
    #[arg(long, default_value = "127.0.0.1:9464")]
    batcher: String,
    /// The tenant the request was made for.
    #[arg(long, default_value = "")]
    tenant: String,
    /// The batcher's tenant header name (its `tenant_header`).
    #[arg(long, default_value = cohort_fingerprint::headers::TENANT)]
    tenant_header: String,
}

pub fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    if !args
        .request_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
    {
        bail!(
            "request id {:?}: only letters, digits and -_.~ are allowed",
            args.request_id
        );
    }
    let address = args.batcher.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address)
        .with_context(|| format!("cannot reach the batcher at {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = format!(
        "GET /v1/audit/{} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n",
        args.request_id
    );
    if !args.tenant.is_empty() {
        request.push_str(&format!("{}: {}\r\n", args.tenant_header, args.tenant));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {status_line:?}"))?;
    // Headers, then the body to the end (connection: close).
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    let mut body = String::new();
    reader.read_to_string(&mut body)?;
    let json: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("the batcher answered {status} with {body:?}"))?;
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(if status == 200 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}
