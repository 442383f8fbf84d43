//! A small client of Chromium's DevTools protocol, enough for the status page's test: a
//! headless `chromium` on a free port, one page target, commands and their answers over a
//! WebSocket (RFC 6455, written here: text frames only, masked as a client must), and the
//! events that came meanwhile, kept for the test to read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{free_port, require_tool, wait_until};

/// A headless Chromium, killed when dropped.
pub struct Chromium {
    child: Child,
    port: u16,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Chromium {
    /// Starts headless Chromium with a fresh profile in `profile` (its stderr goes to
    /// `log`), and waits for its DevTools endpoint. Fails the test when `chromium` is not
    /// installed.
    pub fn start(profile: &Path, log: &Path) -> Chromium {
        let bin = require_tool("chromium", "apt-get install -y chromium");
        let port = free_port();
        let child = Command::new(bin)
            .args([
                "--headless",
                // Tests run as root, where Chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--window-size=1280,1000",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--remote-debugging-port={port}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let c = Chromium { child, port };
        wait_until(60, "Chromium's DevTools endpoint", || {
            get(c.addr(), "/json/version").is_ok()
        });
        c
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A connection to the first page target (the `about:blank` tab it started with).
    pub fn page(&self) -> Page {
        let body = get(self.addr(), "/json/list").unwrap();
        let targets: Value = serde_json::from_str(&body).unwrap();
        let url = targets
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("Chromium lists no page target: {body}"))
            .to_string();
        let path = url
            .split_once(&format!("127.0.0.1:{}", self.port))
            .map(|(_, p)| p.to_string())
            .unwrap_or_else(|| panic!("unexpected DevTools address {url}"));
        Page::connect(self.addr(), &path)
    }
}

/// The body of a GET of DevTools' HTTP endpoint. Read by its `Content-Length`: the
/// endpoint keeps the connection open after answering (so `common::http`, which reads to
/// the end, would wait for its timeout).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(status));
    }
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().map_err(std::io::Error::other)?;
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    String::from_utf8(body).map_err(std::io::Error::other)
}

/// One page target's DevTools session.
pub struct Page {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    next_id: u64,
    /// Every event received so far (method and params), in order.
    pub events: Vec<Value>,
}

impl Page {
    fn connect(addr: SocketAddr, path: &str) -> Page {
        let stream = TcpStream::connect(addr).unwrap();
        // A bound on a hang, not a measure: a command's answer comes in milliseconds.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut writer = stream.try_clone().unwrap();
        write!(
            writer,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(
            status.starts_with("HTTP/1.1 101"),
            "DevTools refused the WebSocket: {status}"
        );
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        Page {
            reader,
            writer,
            next_id: 1,
            events: Vec::new(),
        }
    }

    fn send(&mut self, text: &str) {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8]; // FIN, text
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        // A client's frames must be masked; any key will do.
        let mask = [0x5a, 0x17, 0xc3, 0x88];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.writer.write_all(&frame).unwrap();
    }

    /// The next whole message (continuation frames joined).
    fn receive(&mut self) -> Value {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.reader.read_exact(&mut head).unwrap();
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.reader.read_exact(&mut b).unwrap();
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.reader.read_exact(&mut b).unwrap();
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let mut payload = vec![0u8; usize::try_from(len).unwrap()];
            self.reader.read_exact(&mut payload).unwrap();
            assert_ne!(opcode, 0x8, "DevTools closed the WebSocket");
            if opcode == 0x9 || opcode == 0xa {
                continue; // ping, pong: not messages
            }
            message.extend_from_slice(&payload);
            if fin {
                return serde_json::from_slice(&message).unwrap();
            }
        }
    }

    /// Sends a command and returns its `result`, keeping the events that come first. A
    /// command the browser refuses fails the test.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"id": id, "method": method, "params": params}).to_string());
        loop {
            let msg = self.receive();
            if msg["id"] == id {
                assert!(msg.get("error").is_none(), "{method}: {msg}");
                return msg["result"].clone();
            }
            if msg.get("method").is_some() {
                self.events.push(msg);
            }
        }
    }

    /// The value of a JavaScript expression in the page (awaited when it is a promise).
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expression} threw: {r}"
        );
        r["result"]["value"].clone()
    }

    /// What the page reported as an error so far: console errors, uncaught exceptions, and
    /// the browser's own error entries (a refused resource, a policy violation).
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| {
                let p = &e["params"];
                match e["method"].as_str()? {
                    "Runtime.consoleAPICalled" if p["type"] == "error" => {
                        Some(format!("console.error: {}", p["args"]))
                    }
                    "Runtime.exceptionThrown" => {
                        Some(format!("exception: {}", p["exceptionDetails"]))
                    }
                    "Log.entryAdded" if p["entry"]["level"] == "error" => {
                        Some(format!("log: {}", p["entry"]))
                    }
                    _ => None,
                }
            })
            .collect()
    }
}
