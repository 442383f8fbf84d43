//! `sluice explain`: sends a request to the HTTP port's `POST /explain` and prints what it
//! would be answered, and why, for a person (`--json`: the answer as the server sent it).
//!
//! The admin port speaks plain HTTP/1.1, and one request needs no client library: the call
//! is written by hand on a TCP stream (`Connection: close`, read to the end).

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{parse_descriptor, ExplainArgs, QueryError};

/// The most of an answer read: explanations of `MAX_DESCRIPTORS` descriptors are far less.
const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// Why `sluice explain` got no explanation.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// A descriptor that is not `key=value[,...]`.
    #[error(transparent)]
    Descriptor(#[from] QueryError),
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
    /// The server answered with an error status.
    #[error("the server answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// Its text.
        body: String,
    },
    /// The answer is not what `/explain` sends.
    #[error("unexpected answer: {0}")]
    Answer(String),
}

/// `sluice explain`: prints the explanation, or why there is none (exit 64 for a malformed
/// descriptor, 1 otherwise).
pub async fn explain(args: ExplainArgs) -> ExitCode {
    match fetch(&args).await {
        Ok(v) if args.json => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!("{}", render(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice explain: {e}");
            if matches!(e, ExplainError::Descriptor(_)) {
                ExitCode::from(64)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The request's body, as `POST /json` takes it.
fn body(args: &ExplainArgs) -> Result<Value, ExplainError> {
    let descriptors = args
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
            if let Some(h) = args.hits {
                v["hitsAddend"] = json!(h);
            }
            Ok(v)
        })
        .collect::<Result<Vec<_>, QueryError>>()?;
    Ok(json!({
        "domain": args.domain,
        "descriptors": descriptors,
        "hitsAddend": args.hits_addend,
    }))
}

/// `host:port` of an `http://host:port[/]` address.
fn authority(addr: &str) -> Result<&str, ExplainError> {
    let rest = addr
        .strip_prefix("http://")
        .ok_or_else(|| ExplainError::BadAddress(addr.to_string()))?;
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') {
        return Err(ExplainError::BadAddress(addr.to_string()));
    }
    Ok(host)
}

/// Posts the body to `/explain` and returns the answer's JSON.
async fn fetch(args: &ExplainArgs) -> Result<Value, ExplainError> {
    let body = body(args)?.to_string();
    let host = authority(&args.addr)?;
    let io = |source| ExplainError::Io {
        addr: args.addr.clone(),
        source,
    };
    let exchange = async {
        let mut stream = TcpStream::connect(host).await?;
        let head = format!(
            "POST /explain HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.take(MAX_ANSWER_BYTES).read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
        .map_err(io)?;
    let (status, body) = parse_answer(&raw)?;
    if status != 200 {
        return Err(ExplainError::Status {
            status,
            body: body.trim_end().to_string(),
        });
    }
    serde_json::from_str(&body).map_err(|e| ExplainError::Answer(e.to_string()))
}

/// The status and body of an HTTP/1.1 answer (a `Content-Length` or chunked body, or to the
/// end of the stream).
fn parse_answer(raw: &[u8]) -> Result<(u16, String), ExplainError> {
    let bad = || ExplainError::Answer(String::from_utf8_lossy(raw).chars().take(200).collect());
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

/// The explanation for a person.
pub fn render(v: &Value) -> String {
    use std::fmt::Write as _;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = String::new();
    let _ = write!(
        out,
        "domain {}: overall {} (nothing was counted)",
        s(&v["domain"]),
        s(&v["overall_code"])
    );
    if v["shadow_mode"].as_bool() == Some(true) {
        out.push_str("; SHADOW_MODE is on: an overall OVER_LIMIT is answered OK");
    }
    out.push('\n');
    let empty = Vec::new();
    for (i, d) in v["descriptors"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .enumerate()
    {
        let entries: Vec<String> = d["entries"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(|e| format!("{}={}", s(&e["key"]), s(&e["value"])))
            .collect();
        let _ = write!(
            out,
            "\ndescriptor {}: {} ({} hit(s)",
            i + 1,
            entries.join(", "),
            d["hits"]
        );
        if d["refund"].as_bool() == Some(true) {
            out.push_str(", given back");
        }
        out.push_str(")\n");
        if let Some(m) = d.get("no_match") {
            let _ = writeln!(out, "  no rule: {}", s(&m["message"]));
            continue;
        }
        let r = &d["rule"];
        let name = match s(&r["name"]) {
            n if n.is_empty() => String::new(),
            n => format!(" \"{n}\""),
        };
        let source = &r["source"];
        let from = if let Some(x) = source.get("xds") {
            format!("xDS resource {}", s(x))
        } else if source.get("request").is_some() {
            "a limit the request supplied".to_string()
        } else {
            match source["line"].as_u64() {
                Some(line) => format!("{}, line {line}", s(&source["file"])),
                None => s(&source["file"]),
            }
        };
        let _ = writeln!(out, "  rule {}{name} ({from})", s(&r["full_key"]));
        if let Some(parent) = r.get("override_of") {
            let _ = writeln!(out, "  an override of {}", s(parent));
        }
        if let Some(exact) = r.get("exact") {
            let _ = writeln!(out, "  exact: counts from {}", s(exact));
        }
        if let Some(by) = d.get("replaced_by") {
            let _ = writeln!(out, "  replaced by {} in this request: not counted", s(by));
            continue;
        }
        if r["unlimited"].as_bool() == Some(true) {
            out.push_str("  unlimited: never counted or denied\n");
            continue;
        }
        for (j, l) in d["limits"].as_array().unwrap_or(&empty).iter().enumerate() {
            let per = match l.get("unit_multiplier") {
                Some(m) => format!("{m} {}", s(&l["unit"])),
                None => s(&l["unit"]),
            };
            let mut what = format!("{} per {per}", l["requests_per_unit"]);
            if let Some(b) = l.get("burst") {
                let _ = write!(what, ", burst {b}");
            }
            let _ = writeln!(
                out,
                "  limit {}: {} {what}: count {}, remaining {}, resets in {}s -> {}",
                j + 1,
                s(&l["algorithm"]),
                l["count"],
                l["remaining"],
                l["reset_seconds"],
                s(&l["decision"])
            );
        }
        let _ = write!(out, "  decision {}", s(&d["decision"]));
        if r["shadow_mode"].as_bool() == Some(true) && s(&d["decision"]) == "OVER_LIMIT" {
            out.push_str(", answered OK (shadow_mode)");
        }
        out.push('\n');
    }
    out
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
    }
}
