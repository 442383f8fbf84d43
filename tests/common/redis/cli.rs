//! Talking to a server from outside: running `redis-cli` and parsing its bulk replies, and
//! one raw RESP command over TCP (what PING readiness and the harness tests use).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output};
use std::time::Duration;

/// Sends one command over plain TCP (RESP) and returns the first reply line (e.g. `+PONG`,
/// `-NOAUTH ...`, `$3`), or None if the connection failed or closed without a line.
pub fn resp_command(addr: SocketAddr, args: &[&str]) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok()?;
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    stream.write_all(&req).ok()?;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
        if buf.len() > 64 * 1024 {
            break;
        }
    }
    Some(String::from_utf8_lossy(&buf).trim_end().to_string())
}

pub(super) fn run_cli(mut cmd: Command) -> Result<String, String> {
    let out: Output = cmd
        .output()
        .map_err(|e| format!("could not run redis-cli: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(format!(
            "redis-cli failed ({}): stderr: {stderr:?}; stdout: {stdout:?}",
            out.status
        ))
    }
}

/// Parses a `--no-raw` bulk-string reply: `(nil)` → None, `"a\"b"` → Some(a"b). Takes the last
/// line, so a preceding `-> Redirected ...` line from `redis-cli -c` is ignored.
pub(super) fn parse_bulk(out: &str) -> Option<String> {
    let line = out.lines().last().unwrap_or("").trim();
    if line == "(nil)" {
        return None;
    }
    let inner = line
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or_else(|| panic!("unexpected redis-cli --no-raw reply to GET: {out:?}"));
    let b = inner.as_bytes();
    let mut bytes = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let c = b[i + 1];
            i += 2;
            match c {
                b'n' => bytes.push(b'\n'),
                b'r' => bytes.push(b'\r'),
                b't' => bytes.push(b'\t'),
                b'a' => bytes.push(7),
                b'b' => bytes.push(8),
                b'x' if i + 2 <= b.len() => {
                    let hex = std::str::from_utf8(&b[i..i + 2]).unwrap_or("");
                    bytes.push(
                        u8::from_str_radix(hex, 16)
                            .unwrap_or_else(|_| panic!("bad escape in {out:?}")),
                    );
                    i += 2;
                }
                other => bytes.push(other),
            }
        } else {
            bytes.push(b[i]);
            i += 1;
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}
