//! `sluice reset`: one `POST /reset` to the admin port with the admin token, printing what
//! was cleared. A few lines of HTTP/1.1 over a socket rather than an HTTP client crate: the
//! admin port speaks plain HTTP/1.1, and the request is one call.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;

use super::args::ResetArgs;
use super::{parse_descriptor, QueryError};

/// How long the call may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why `sluice reset` could not make its call.
#[derive(Debug, thiserror::Error)]
pub enum ResetCliError {
    /// A descriptor is malformed.
    #[error(transparent)]
    Descriptor(#[from] QueryError),
    /// No token given.
    #[error("no admin token: give --token-file or set SLUICE_ADMIN_TOKEN")]
    NoToken,
    /// The token file cannot be read or is empty.
    #[error("{0}")]
    Token(#[from] crate::server::admin_token::TokenError),
    /// The address is not `http://host:port`.
    #[error("--addr {0}: expected http://host:port")]
    BadAddress(String),
    /// The call failed.
    #[error("{addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The answer is not HTTP.
    #[error("{0}: not an HTTP answer")]
    BadAnswer(String),
}

/// The token from `--token-file`, `--token` or `SLUICE_ADMIN_TOKEN`, trimmed.
fn token(args: &ResetArgs) -> Result<String, ResetCliError> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path).map_err(|source| {
            crate::server::admin_token::TokenError::Read {
                path: path.display().to_string(),
                source,
            }
        })?;
        let t = text.trim();
        if t.is_empty() {
            return Err(
                crate::server::admin_token::TokenError::Empty(path.display().to_string()).into(),
            );
        }
        return Ok(t.to_string());
    }
    args.token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or(ResetCliError::NoToken)
}

/// `host:port` of an `http://` address (no path).
fn host_port(addr: &str) -> Result<&str, ResetCliError> {
    addr.strip_prefix("http://")
        .map(|r| r.trim_end_matches('/'))
        .filter(|r| !r.is_empty() && !r.contains('/'))
        .ok_or_else(|| ResetCliError::BadAddress(addr.to_string()))
}

/// The request body: the `/json` shape, domain and descriptors.
fn body(args: &ResetArgs) -> Result<String, ResetCliError> {
    let mut descriptors = Vec::new();
    for d in &args.descriptors {
        let d = parse_descriptor(d)?;
        let entries: Vec<_> = d
            .entries
            .iter()
            .map(|e| json!({"key": e.key, "value": e.value}))
            .collect();
        descriptors.push(json!({ "entries": entries }));
    }
    Ok(json!({"domain": args.domain, "descriptors": descriptors}).to_string())
}

/// Sends the call; the status and the body.
fn call(args: &ResetArgs) -> Result<(u16, String), ResetCliError> {
    let token = token(args)?;
    let hp = host_port(&args.addr)?;
    let body = body(args)?;
    let io = |source| ResetCliError::Io {
        addr: args.addr.clone(),
        source,
    };
    let sock = hp
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| ResetCliError::BadAddress(args.addr.clone()))?;
    let mut s = TcpStream::connect_timeout(&sock, TIMEOUT).map_err(io)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let req = format!(
        "POST /reset HTTP/1.1\r\nHost: {hp}\r\nConnection: close\r\nContent-Type: application/json\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| ResetCliError::BadAnswer(args.addr.clone()))?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| ResetCliError::BadAnswer(args.addr.clone()))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((
        status,
        if chunked {
            dechunk(rest)
        } else {
            rest.to_string()
        },
    ))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// `sluice reset`: prints what was cleared (pretty JSON); exit 1 when refused or failed.
pub fn reset(args: &ResetArgs) -> ExitCode {
    match call(args) {
        Ok((200, body)) => {
            let shown = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or(body);
            println!("{shown}");
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!("sluice reset: {status}: {}", body.trim_end());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sluice reset: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(descriptors: &[&str]) -> ResetArgs {
        ResetArgs {
            addr: "http://127.0.0.1:8080".into(),
            domain: "d".into(),
            descriptors: descriptors.iter().map(|d| d.to_string()).collect(),
            token_file: None,
            token: Some(" t\n".into()),
        }
    }

    #[test]
    fn the_body_is_the_json_shape_and_the_token_is_trimmed() {
        let a = args(&["k=a,j=b", "u=1"]);
        let v: serde_json::Value = serde_json::from_str(&body(&a).unwrap()).unwrap();
        assert_eq!(v["domain"], "d");
        assert_eq!(v["descriptors"][0]["entries"][1]["key"], "j");
        assert_eq!(v["descriptors"][1]["entries"][0]["value"], "1");
        assert_eq!(token(&a).unwrap(), "t");
        assert!(matches!(
            token(&ResetArgs { token: None, ..a }),
            Err(ResetCliError::NoToken)
        ));
        assert_eq!(host_port("http://h:1/").unwrap(), "h:1");
        assert!(host_port("https://h:1").is_err());
        assert!(host_port("http://h:1/x").is_err());
    }
}
