//! What `sluice explain` and `sluice reset` share: their flags naming the admin port, the
//! domain and the descriptors; the body they send (`POST /json`'s shape); and one call to the
//! admin port. The port speaks plain HTTP/1.1 and one request needs no client library: the
//! call is written by hand on a TCP stream (`Connection: close`, read to the end).

use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{parse_descriptor, QueryError};

/// How long a call may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an answer read: answers about `MAX_DESCRIPTORS` descriptors are far less.
const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// The flags naming what an admin call is about.
#[derive(Debug, Clone, Args)]
pub struct AdminRequestArgs {
    /// The service's HTTP (admin) address.
    #[arg(
        long,
        env = "SLUICE_HTTP_ADDR",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    pub addr: String,
    /// The domain.
    #[arg(long)]
    pub domain: String,
    /// Descriptors, each `key=value[,key2=value2...]`.
    #[arg(required = true)]
    pub descriptors: Vec<String>,
}

/// Why an admin call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminCallError {
    /// `--addr` is not `http://host:port`.
    #[error("bad address '{0}': expected http://host:port (the HTTP port, not gRPC's)")]
    BadAddress(String),
    /// The connection or the exchange failed.
    #[error("cannot reach {addr}: {source}. Is `sluice serve` running? Name its HTTP address with --addr")]
    Io {
        /// The address given.
        addr: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The answer is not HTTP.
    #[error("unexpected answer: {0}")]
    Answer(String),
}

impl AdminRequestArgs {
    /// The request's body as `POST /json` takes it, each descriptor with its own
    /// `hitsAddend` when `hits` is given.
    ///
    /// # Errors
    /// A descriptor that is not `key=value[,...]`.
    pub fn body(&self, hits: Option<u64>) -> Result<Value, QueryError> {
        let descriptors = self
            .descriptors
            .iter()
            .map(|d| {
                let d = parse_descriptor(d)?;
                let entries: Vec<Value> = d
                    .entries
                    .iter()
                    .map(|e| json!({"key": e.key, "value": e.value}))
                    .collect();
                let mut v = json!({ "entries": entries });
                if let Some(h) = hits {
                    v["hitsAddend"] = json!(h);
                }
                Ok(v)
            })
            .collect::<Result<Vec<_>, QueryError>>()?;
        Ok(json!({ "domain": self.domain, "descriptors": descriptors }))
    }

    /// Posts `body` to `path` on the admin port, with `bearer` as the token when given;
    /// returns the answer's status and body.
    ///
    /// # Errors
    /// A bad address, no answer within [`TIMEOUT`], or an answer that is not HTTP.
    pub async fn post(
        &self,
        path: &str,
        body: &Value,
        bearer: Option<&str>,
    ) -> Result<(u16, String), AdminCallError> {
        let body = body.to_string();
        let host = authority(&self.addr)?;
        let io = |source| AdminCallError::Io {
            addr: self.addr.clone(),
            source,
        };
        let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let exchange = async {
            let mut stream = TcpStream::connect(host).await?;
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.take(MAX_ANSWER_BYTES).read_to_end(&mut raw).await?;
            Ok::<_, std::io::Error>(raw)
        };
        let raw = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
            .map_err(io)?;
        parse_answer(&raw)
    }
}

/// `host:port` of an `http://host:port[/]` address.
fn authority(addr: &str) -> Result<&str, AdminCallError> {
    addr.strip_prefix("http://")
        .map(|r| r.trim_end_matches('/'))
        .filter(|r| !r.is_empty() && !r.contains('/'))
        .ok_or_else(|| AdminCallError::BadAddress(addr.to_string()))
}

/// The status and body of an HTTP/1.1 answer (a `Content-Length` or chunked body, or to the
/// end of the stream).
fn parse_answer(raw: &[u8]) -> Result<(u16, String), AdminCallError> {
    let bad = || AdminCallError::Answer(String::from_utf8_lossy(raw).chars().take(200).collect());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(bad)?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| bad())?;
    let mut payload = &raw[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let end = payload
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or_else(bad)?;
            let size = std::str::from_utf8(&payload[..end]).map_err(|_| bad())?;
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad())?;
            payload = &payload[end + 2..];
            if size == 0 {
                break;
            }
            body.extend_from_slice(payload.get(..size).ok_or_else(bad)?);
            payload = payload.get(size + 2..).ok_or_else(bad)?;
        }
    } else if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.extend_from_slice(payload.get(..n).ok_or_else(bad)?);
    } else {
        body.extend_from_slice(payload);
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_whole_in_either_framing() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_answer(plain).unwrap(), (200, "{}".into()));
        let chunked =
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbad\r\n2\r\n!\n\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked).unwrap(), (400, "bad!\n".into()));
        assert!(parse_answer(b"garbage").is_err());
        assert_eq!(
            authority("http://127.0.0.1:8080/").unwrap(),
            "127.0.0.1:8080"
        );
        assert!(authority("https://h:1").is_err());
        assert!(authority("http://h:1/x").is_err());
    }

    #[test]
    fn the_body_is_the_json_shape_with_each_descriptors_hits_when_given() {
        let a = AdminRequestArgs {
            addr: "http://127.0.0.1:8080".into(),
            domain: "d".into(),
            descriptors: vec!["k=a,j=b".into(), "u=1".into()],
        };
        let v = a.body(None).unwrap();
        assert_eq!(v["domain"], "d");
        assert_eq!(v["descriptors"][0]["entries"][1]["key"], "j");
        assert_eq!(v["descriptors"][1]["entries"][0]["value"], "1");
        assert!(v["descriptors"][0].get("hitsAddend").is_none());
        assert_eq!(a.body(Some(3)).unwrap()["descriptors"][1]["hitsAddend"], 3);
    }
}
