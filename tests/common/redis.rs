//! Real Redis servers for integration tests: standalone (optionally with a password or ACL
//! users), TLS-only, and Redis Cluster. Blocking std code, usable from sync and async tests.
//!
//! This file reads the wall clock (banned elsewhere by `.clippy.toml`): it waits for external
//! processes with real timeouts, which have nothing to do with the limiter's time.
//!
//! - Every server binds 127.0.0.1 on a free port from 10000..22000 (so that port + 10000, the
//!   cluster bus port, is free too, and both stay below Linux's ephemeral range 32768+, which
//!   outgoing connections use).
//! - Nothing is persisted: `--save '' --appendonly no`, with `dir` in the server's tempdir.
//! - Ready means: our own redis-server logged "Ready to accept connections" (so a stranger on
//!   the same port is never mistaken for ours) and the port answers PING.
//! - Each redis-server runs under a tiny `sh` watchdog that holds a pipe from this process:
//!   dropping the handle closes the pipe and the watchdog SIGKILLs the server; if the test
//!   process dies without unwinding (SIGKILL, Ctrl-C, abort) the pipe closes too, so no
//!   redis-server outlives its test.
//! - A missing `redis-server`, `redis-cli` or `openssl` fails the test with an install hint.
#![allow(clippy::disallowed_methods)] // see above: real timeouts for external processes

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server may take to answer PING after being started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a new cluster may take to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// Ports are picked from PORT_LO..PORT_LO + PORT_SPAN; the cluster bus uses port + BUS_OFFSET.
const PORT_LO: u16 = 10_000;
const PORT_SPAN: u16 = 12_000;
const BUS_OFFSET: u16 = 10_000;
const CLUSTER_SLOTS: u32 = 16_384;

/// Looks `bin` up on PATH; panics with an install hint when it is missing.
pub fn require(bin: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(bin);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return candidate;
            }
        }
    }
    let hint = match bin {
        "redis-server" | "redis-cli" => "apt-get install -y redis-server",
        "openssl" => "apt-get install -y openssl",
        _ => "install it with your package manager",
    };
    panic!("`{bin}` is not on PATH; this test needs it. Install it with: {hint}")
}

/// Ports handed out by this process; never handed out twice (the range is large enough).
static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A port P such that 127.0.0.1:P and 127.0.0.1:P+10000 (cluster bus) can both be bound now
/// and P was not handed out before by this process. Another process may still take it before
/// redis-server binds it; starting retries with a new port in that case.
fn pick_port() -> u16 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    hasher.write_u32(std::process::id());
    let start = (hasher.finish() % PORT_SPAN as u64) as u16;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..PORT_SPAN {
        let port = PORT_LO + (start + i) % PORT_SPAN;
        if handed_out.contains(&port) {
            continue;
        }
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        if free(port) && free(port + BUS_OFFSET) {
            handed_out.push(port);
            return port;
        }
    }
    panic!(
        "no free port pair (P, P+{BUS_OFFSET}) on 127.0.0.1 with P in {PORT_LO}..{}",
        PORT_LO + PORT_SPAN
    )
}

/// Runs "$@" (redis-server ...) in the background and SIGKILLs it as soon as our stdin pipe
/// closes (handle dropped, or this process died). Exits with the server's exit status, so an
/// early exit (e.g. port taken) is visible through the shell's own status.
const WATCHDOG: &str = r#"exec 3<&0
"$@" </dev/null 3<&- &
pid=$!
( read -r _ <&3; kill -9 "$pid" 2>/dev/null ) &
watcher=$!
exec 3<&-
wait "$pid"
rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
"#;

#[derive(Clone, Debug)]
struct TlsFiles {
    ca_cert: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// A client certificate and key the CA signed: set, the server requires client
    /// certificates (`--tls-auth-clients yes`) and `cli` presents this one.
    client: Option<(PathBuf, PathBuf)>,
}

enum LaunchError {
    /// redis-server could not bind its port (or the cluster bus port).
    PortTaken(String),
    Failed(String),
}

/// One redis-server process bound to 127.0.0.1. Killed (SIGKILL) when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// Arguments after the harness's own (so they can override them).
    extra: Vec<String>,
    /// Arguments before the harness's own: a sentinel's config file and `--sentinel`.
    leading: Vec<String>,
    tls: Option<TlsFiles>,
    user: Option<String>,
    password: Option<String>,
}

impl RedisServer {
    /// A standalone server: free port, `--save '' --appendonly no`, dir in a tempdir.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like `start`, with extra redis-server arguments appended (they win over the defaults),
    /// e.g. `["--requirepass", "pw"]` or `["--user", "alice", "on", ">pw", "~*", "+@all"]`.
    /// `--requirepass X` makes `cli` authenticate as the default user; for ACL users call
    /// `set_cli_auth`.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("sluice-redis-")
            .tempdir()
            .expect("create tempdir for redis-server");
        Self::start_in(dir, None, args.iter().map(|s| s.to_string()).collect())
    }

    fn start_in(dir: tempfile::TempDir, tls: Option<TlsFiles>, extra: Vec<String>) -> RedisServer {
        require("redis-server");
        require("redis-cli");
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .cloned();
        Self::start_full(dir, tls, Vec::new(), extra, password)
    }

    /// A Redis Sentinel watching `master` as `name` with quorum 1 (so one sentinel can fail
    /// it over alone), judging it down after 1 s without answers; `extra` as for `start_with`
    /// (`--requirepass` protects the sentinel itself). The master's password, if it has one,
    /// becomes the sentinel's `auth-pass`.
    pub fn start_sentinel(name: &str, master: &RedisServer, extra: &[&str]) -> RedisServer {
        require("redis-server");
        let dir = tempfile::Builder::new()
            .prefix("sluice-sentinel-")
            .tempdir()
            .expect("create tempdir for redis-server --sentinel");
        let mut conf = format!(
            "sentinel monitor {name} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {name} 1000\nsentinel failover-timeout {name} 10000\n",
            master.port()
        );
        if let Some(pw) = master.password() {
            conf.push_str(&format!("sentinel auth-pass {name} {pw}\n"));
        }
        // Sentinel rewrites its config file (what it learns), so it lives in the tempdir.
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf).expect("write sentinel.conf");
        let leading = vec![
            path.to_str().expect("tempdir path is UTF-8").to_string(),
            "--sentinel".to_string(),
        ];
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .cloned();
        Self::start_full(dir, None, leading, extra, password)
    }

    /// Like `start_sentinel`, for a TLS `master` (started by `RedisTls`): the sentinel serves
    /// TLS only with the master's CA and certificates (requiring client certificates when the
    /// master does) and dials the master over TLS, presenting the client certificate.
    pub fn start_sentinel_tls(name: &str, master: &RedisServer) -> RedisServer {
        require("redis-server");
        let files = master.tls.clone().expect("a TLS master");
        let dir = tempfile::Builder::new()
            .prefix("sluice-sentinel-tls-")
            .tempdir()
            .expect("create tempdir for redis-server --sentinel");
        let conf = format!(
            "sentinel monitor {name} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {name} 1000\nsentinel failover-timeout {name} 10000\n",
            master.port()
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf).expect("write sentinel.conf");
        let leading = vec![
            path.to_str().expect("tempdir path is UTF-8").to_string(),
            "--sentinel".to_string(),
        ];
        let mut extra = vec!["--tls-replication".to_string(), "yes".to_string()];
        if let Some((cert, key)) = &files.client {
            // The server certificate is for serverAuth only: the master would refuse it.
            extra.extend([
                "--tls-client-cert-file".to_string(),
                cert.display().to_string(),
                "--tls-client-key-file".to_string(),
                key.display().to_string(),
            ]);
        }
        Self::start_full(dir, Some(files), leading, extra, None)
    }

    fn start_full(
        dir: tempfile::TempDir,
        tls: Option<TlsFiles>,
        leading: Vec<String>,
        extra: Vec<String>,
        password: Option<String>,
    ) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port: pick_port(),
            dir,
            leading,
            extra,
            tls,
            user: None,
            password,
        };
        const ATTEMPTS: usize = 10;
        for attempt in 1..=ATTEMPTS {
            match server.launch() {
                Ok(()) => return server,
                Err(LaunchError::PortTaken(_)) if attempt < ATTEMPTS => server.port = pick_port(),
                Err(LaunchError::PortTaken(log)) => {
                    panic!("redis-server could not bind a free port after {ATTEMPTS} attempts; last log:\n{log}")
                }
                Err(LaunchError::Failed(msg)) => panic!("{msg}"),
            }
        }
        unreachable!()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:PORT` for a TLS server. No credentials.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's tempdir (its `dir`, log file `redis.log`, TLS files, cluster `nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything redis-server has logged so far (across restarts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// The password `cli` authenticates with, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// Makes `cli` authenticate as `user` (None: the default user) with `password` (None: no AUTH).
    pub fn set_cli_auth(&mut self, user: Option<&str>, password: Option<&str>) {
        self.user = user.map(str::to_string);
        self.password = password.map(str::to_string);
    }

    /// SIGKILLs the server and waits until it is gone; its port then refuses connections.
    /// Does nothing if it is not running.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Closing the watchdog's stdin makes it SIGKILL redis-server; the watchdog exits only
        // after redis-server has been reaped, so the port is free once `wait` returns.
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() > deadline => {
                    // Should never happen; do not leave the watchdog behind at least.
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Starts the server again on the same port with the same arguments and waits for PING.
    /// Data is gone (nothing is persisted); a cluster node keeps its `nodes.conf`.
    pub fn restart(&mut self) {
        self.kill();
        let mut last = String::new();
        // The port should be free at once; allow a few seconds in case a stray client grabbed it.
        for _ in 0..20 {
            match self.launch() {
                Ok(()) => return,
                Err(LaunchError::PortTaken(log)) => {
                    last = log;
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(LaunchError::Failed(msg)) => panic!("restart on port {}: {msg}", self.port),
            }
        }
        panic!(
            "restart: port {} stayed taken by another process; last log:\n{last}",
            self.port
        )
    }

    /// Whether the redis-server process is still alive.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Runs `redis-cli -e -h 127.0.0.1 -p PORT [--tls --cacert CA] [--user U] [--pass P] args...`
    /// and returns its trimmed stdout (raw output: `PONG`, `OK`, `1`, an empty line for nil).
    /// Panics with stderr when redis-cli fails, including on an error reply. Leading redis-cli
    /// options may go first in `args` (e.g. `["-c", "SET", "k", "v"]`, `["--no-raw", ...]`).
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|e| panic!("redis-cli {args:?} against 127.0.0.1:{}: {e}", self.port))
    }

    /// Like `cli`, but returns redis-cli's failure (error reply, refused connection) as `Err`.
    pub fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = self.cli_command();
        cmd.args(args);
        run_cli(cmd)
    }

    /// A `redis-cli` command with connection, TLS and auth options set; add the rest.
    pub fn cli_command(&self) -> Command {
        let mut cmd = Command::new(require("redis-cli"));
        cmd.args(["-e", "-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string());
        if let Some(tls) = &self.tls {
            cmd.arg("--tls").arg("--cacert").arg(&tls.ca_cert);
            if let Some((cert, key)) = &tls.client {
                cmd.arg("--cert").arg(cert).arg("--key").arg(key);
            }
        }
        if let Some(password) = &self.password {
            if let Some(user) = &self.user {
                cmd.args(["--user", user]);
            }
            cmd.args(["--pass", password, "--no-auth-warning"]);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    /// A TLS server's CA file and, when it requires client certificates, the client's
    /// certificate and key files.
    pub fn tls_files(&self) -> Option<(PathBuf, Option<(PathBuf, PathBuf)>)> {
        self.tls
            .as_ref()
            .map(|t| (t.ca_cert.clone(), t.client.clone()))
    }

    /// GET on this server (no cluster redirection): `None` for nil.
    pub fn get(&self, key: &str) -> Option<String> {
        parse_bulk(&self.cli(&["--no-raw", "GET", key]))
    }

    // ---- internals ----

    fn full_args(&self) -> Vec<String> {
        let dir = self
            .dir
            .path()
            .to_str()
            .expect("tempdir path is UTF-8")
            .to_string();
        let mut args: Vec<String> = self.leading.clone();
        args.extend(
            [
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.push(dir);
        match &self.tls {
            None => args.extend(["--port".to_string(), self.port.to_string()]),
            Some(tls) => {
                args.extend(["--port", "0", "--tls-port"].map(String::from));
                args.push(self.port.to_string());
                for (flag, path) in [
                    ("--tls-cert-file", &tls.cert),
                    ("--tls-key-file", &tls.key),
                    ("--tls-ca-cert-file", &tls.ca_cert),
                ] {
                    args.push(flag.to_string());
                    args.push(path.to_str().expect("tempdir path is UTF-8").to_string());
                }
                let auth = if tls.client.is_some() { "yes" } else { "no" };
                args.extend(["--tls-auth-clients", auth].map(String::from));
            }
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Spawns redis-server on `self.port` and waits until it is ready.
    fn launch(&mut self) -> Result<(), LaunchError> {
        assert!(self.child.is_none(), "launch while running");
        let args = self.full_args();
        let log_path = self.dir.path().join("redis.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open redis.log");
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(require("redis-server"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn sh + redis-server: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = self
                .child
                .as_mut()
                .unwrap()
                .try_wait()
                .expect("try_wait redis-server");
            if let Some(status) = exited {
                self.child = None;
                let log = read_from(&log_path, log_start);
                if log.contains("Address already in use") {
                    return Err(LaunchError::PortTaken(log));
                }
                let hint = if self.tls.is_some() {
                    "\n(if the log complains about tls-* options, this redis-server was built without TLS)"
                } else {
                    ""
                };
                return Err(LaunchError::Failed(format!(
                    "redis-server exited ({status}) before it was ready; args {args:?}; log:\n{log}{hint}"
                )));
            }
            // A sentinel never logs "Ready"; it names its master once it watches it.
            let log = read_from(&log_path, log_start);
            if (log.contains("Ready to accept connections") || log.contains("+monitor master"))
                && self.answers_ping()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                let log = read_from(&log_path, log_start);
                return Err(LaunchError::Failed(format!(
                    "redis-server on port {} did not answer PING within {READY_TIMEOUT:?}; args {args:?}; log:\n{log}",
                    self.port
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Whether the port answers PING (any RESP answer but LOADING counts: NOAUTH means up).
    fn answers_ping(&self) -> bool {
        if let Some(tls) = &self.tls {
            // std has no TLS: ask redis-cli, without credentials.
            if TcpStream::connect_timeout(&self.addr(), Duration::from_secs(1)).is_err() {
                return false;
            }
            let mut cmd = Command::new(require("redis-cli"));
            cmd.args(["-e", "-h", "127.0.0.1", "-p"])
                .arg(self.port.to_string());
            cmd.arg("--tls").arg("--cacert").arg(&tls.ca_cert);
            if let Some((cert, key)) = &tls.client {
                cmd.arg("--cert").arg(cert).arg("--key").arg(key);
            }
            cmd.arg("PING");
            cmd.stdin(Stdio::null());
            return match run_cli(cmd) {
                Ok(out) => out == "PONG",
                Err(e) => e.contains("NOAUTH"),
            };
        }
        match resp_command(self.addr(), &["PING"]) {
            Some(line) => {
                (line.starts_with('+') || line.starts_with('-')) && !line.starts_with("-LOADING")
            }
            None => false,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// GET on a standalone server: `None` for nil.
pub fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.get(key)
}

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

fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

fn run_cli(mut cmd: Command) -> Result<String, String> {
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
fn parse_bulk(out: &str) -> Option<String> {
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

/// A TLS-only redis-server (`--port 0 --tls-port P`) with a throwaway CA and a server
/// certificate for 127.0.0.1 / localhost. Clients need no certificate (`--tls-auth-clients no`)
/// unless started with `start_mtls`.
pub struct RedisTls {
    pub server: RedisServer,
    /// PEM file of the CA that signed the server certificate; trust it in clients.
    pub ca_cert: PathBuf,
    /// With `start_mtls`: PEM files of a client certificate the CA signed, and its key.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl RedisTls {
    pub fn start() -> RedisTls {
        Self::start_with(&[])
    }

    /// Like `start`, with extra redis-server arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(args: &[&str]) -> RedisTls {
        Self::start_full(false, args)
    }

    /// A server that requires a client certificate signed by its CA (`--tls-auth-clients
    /// yes`); `client` holds one, which `cli` presents.
    pub fn start_mtls(args: &[&str]) -> RedisTls {
        Self::start_full(true, args)
    }

    /// Like `start`, the server certificate naming only `san` (openssl's subjectAltName form,
    /// e.g. `DNS:redis.invalid`), not the address clients dial.
    pub fn start_named(san: &str) -> RedisTls {
        Self::start_full_for(false, &[], san)
    }

    fn start_full(mtls: bool, args: &[&str]) -> RedisTls {
        Self::start_full_for(mtls, args, "IP:127.0.0.1,DNS:localhost")
    }

    fn start_full_for(mtls: bool, args: &[&str], san: &str) -> RedisTls {
        let dir = tempfile::Builder::new()
            .prefix("sluice-redis-tls-")
            .tempdir()
            .expect("create tempdir for redis-server");
        let mut files = make_tls_files_for(dir.path(), san);
        if mtls {
            files.client = Some(make_client_cert(dir.path()));
        }
        let ca_cert = files.ca_cert.clone();
        let client = files.client.clone();
        let server = RedisServer::start_in(
            dir,
            Some(files),
            args.iter().map(|s| s.to_string()).collect(),
        );
        RedisTls {
            server,
            ca_cert,
            client,
        }
    }

    /// `rediss://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// redis-cli over TLS; see `RedisServer::cli`.
    pub fn cli(&self, args: &[&str]) -> String {
        self.server.cli(args)
    }
}

/// Generates ca.crt/ca.key and server.crt/server.key (ECDSA P-256, v3 extensions that strict
/// verifiers such as rustls/webpki accept) in `dir` with the openssl CLI.
fn make_tls_files(dir: &Path) -> TlsFiles {
    make_tls_files_for(dir, "IP:127.0.0.1,DNS:localhost")
}

/// Like `make_tls_files`, the server certificate naming `san` (openssl's subjectAltName form).
fn make_tls_files_for(dir: &Path, san: &str) -> TlsFiles {
    let openssl = require("openssl");
    let run = |args: &[&str]| {
        let out = Command::new(&openssl)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run openssl: {e}"));
        if !out.status.success() {
            panic!(
                "openssl {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-new"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "7",
        "-subj",
        "/CN=sluice test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&ca);
    let mut csr = vec!["req", "-new"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run(&csr);
    std::fs::write(
        dir.join("server.ext"),
        format!(
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName={san}\n"
        ),
    )
    .expect("write server.ext");
    let serial = format!("0x{:x}", RandomState::new().build_hasher().finish() >> 1);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-set_serial",
        &serial,
        "-out",
        "server.crt",
        "-days",
        "7",
        "-extfile",
        "server.ext",
    ]);
    TlsFiles {
        ca_cert: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        client: None,
    }
}

/// A client certificate (clientAuth) signed by the CA `make_tls_files` left in `dir`:
/// `client.crt` and `client.key`.
fn make_client_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = super::certs::Pair {
        cert: dir.join("ca.crt"),
        key: dir.join("ca.key"),
    };
    let p = super::certs::leaf(dir, "client", &ca, "clientAuth", "DNS:sluice-test-client");
    (p.cert, p.key)
}

/// A Redis Cluster of masters only (no replicas), every node on 127.0.0.1.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// A cluster-enabled node in `dir` (`--cluster-enabled yes --cluster-config-file
/// <dir>/nodes.conf --cluster-node-timeout 2000`, then `more`).
fn cluster_node(dir: tempfile::TempDir, tls: Option<TlsFiles>, more: &[&str]) -> RedisServer {
    let conf = dir.path().join("nodes.conf").display().to_string();
    let args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &conf,
        "--cluster-node-timeout",
        "2000",
    ];
    let args = args.iter().chain(more).map(|s| s.to_string()).collect();
    RedisServer::start_in(dir, tls, args)
}

impl RedisCluster {
    /// Starts `masters` nodes (`--cluster-enabled yes --cluster-config-file <tempdir>/nodes.conf
    /// --cluster-node-timeout 2000`), joins them with `redis-cli --cluster create ...
    /// --cluster-replicas 0 --cluster-yes` (fewer than 3 masters, which that refuses: ADDSLOTSRANGE
    /// and MEET by hand) and waits until every node reports cluster_state:ok, knows every node, and
    /// all nodes agree on the slot map.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs at least one master");
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                let dir = tempfile::Builder::new()
                    .prefix("sluice-redis-node-")
                    .tempdir()
                    .expect("create tempdir");
                cluster_node(dir, None, &[])
            })
            .collect();
        let cluster = RedisCluster { nodes };
        if masters >= 3 {
            let mut cmd = Command::new(require("redis-cli"));
            cmd.args(["--cluster", "create"]);
            cmd.args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port())),
            );
            cmd.args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null());
            let out = cmd.output().expect("run redis-cli --cluster create");
            if !out.status.success() {
                panic!(
                    "redis-cli --cluster create failed ({}):\n{}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        } else {
            cluster.assign_slots_by_hand();
        }
        cluster.wait_ok();
        cluster
    }

    /// A cluster of one master over TLS only (`--tls-cluster yes`, so CLUSTER SLOTS gives the
    /// TLS port) that requires client certificates; see `RedisServer::tls_files` for the CA
    /// and the client certificate.
    pub fn start_one_mtls() -> RedisCluster {
        let dir = tempfile::Builder::new()
            .prefix("sluice-redis-node-tls-")
            .tempdir()
            .expect("create tempdir");
        let mut files = make_tls_files(dir.path());
        files.client = Some(make_client_cert(dir.path()));
        let node = cluster_node(dir, Some(files), &["--tls-cluster", "yes"]);
        let cluster = RedisCluster { nodes: vec![node] };
        cluster.assign_slots_by_hand();
        cluster.wait_ok();
        cluster
    }

    /// The slots split evenly over the nodes and the nodes joined by hand (SET-CONFIG-EPOCH,
    /// ADDSLOTSRANGE, MEET): `redis-cli --cluster create` refuses fewer than 3 masters.
    fn assign_slots_by_hand(&self) {
        let n = self.nodes.len() as u32;
        for (i, node) in self.nodes.iter().enumerate() {
            let i = i as u32;
            let (lo, hi) = (CLUSTER_SLOTS * i / n, CLUSTER_SLOTS * (i + 1) / n - 1);
            node.cli(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
            node.cli(&["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()]);
        }
        for node in &self.nodes[1..] {
            self.nodes[0].cli(&["CLUSTER", "MEET", "127.0.0.1", &node.port().to_string()]);
        }
    }

    /// Waits until every node reports cluster_state:ok with all slots assigned and all nodes
    /// known, and every node has the same slot map. Also useful after restarting a node.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let n = self.nodes.len();
        let mut last = String::new();
        loop {
            let mut ok = true;
            let mut maps = Vec::new();
            for node in &self.nodes {
                let info = node.try_cli(&["CLUSTER", "INFO"]).unwrap_or_else(|e| e);
                let healthy = info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_slots_assigned:{CLUSTER_SLOTS}"))
                    && info.contains(&format!("cluster_known_nodes:{n}"));
                if !healthy {
                    ok = false;
                    last = format!("node {}: {info}", node.port());
                    break;
                }
                match node.try_cli(&["CLUSTER", "NODES"]) {
                    Ok(nodes) => maps.push(parse_slot_map(&nodes)),
                    Err(e) => {
                        ok = false;
                        last = e;
                        break;
                    }
                }
            }
            if ok && maps.windows(2).all(|w| w[0] == w[1]) {
                return;
            }
            if ok {
                last = format!("nodes disagree on the slot map: {maps:?}");
            }
            if Instant::now() > deadline {
                panic!("cluster not ok within {CLUSTER_TIMEOUT:?}; last: {last}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://127.0.0.1:PORT` of every node.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// The hash slot of `key` (CLUSTER KEYSLOT).
    pub fn slot(&self, key: &str) -> u16 {
        let out = self.any_node(&["CLUSTER", "KEYSLOT", key]);
        out.parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key:?} answered {out:?}"))
    }

    /// Port of the master that owns `key`'s slot (CLUSTER KEYSLOT + CLUSTER NODES).
    pub fn node_for_key(&self, key: &str) -> u16 {
        let slot = self.slot(key);
        let map = parse_slot_map(&self.any_node(&["CLUSTER", "NODES"]));
        map.iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, port)| *port)
            .unwrap_or_else(|| panic!("no master owns slot {slot} (key {key:?}); map {map:?}"))
    }

    /// `redis-cli -c` (follows MOVED/ASK) through the first node that answers.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut full = vec!["-c"];
        full.extend_from_slice(args);
        self.any_node(&full)
    }

    /// GET through the owning node (`redis-cli -c`); None for nil.
    pub fn get(&self, key: &str) -> Option<String> {
        parse_bulk(&self.cli(&["--no-raw", "GET", key]))
    }

    fn any_node(&self, args: &[&str]) -> String {
        let mut errors = Vec::new();
        for node in &self.nodes {
            match node.try_cli(args) {
                Ok(out) => return out,
                Err(e) => errors.push(format!("{}: {e}", node.port())),
            }
        }
        panic!("redis-cli {args:?} failed on every cluster node: {errors:?}")
    }
}

/// (first slot, last slot, master port) ranges from CLUSTER NODES output, sorted.
fn parse_slot_map(nodes: &str) -> Vec<(u16, u16, u16)> {
    let mut map = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 || !fields[2].split(',').any(|f| f == "master") {
            continue;
        }
        // ip:port@cport[,hostname]
        let port: u16 = fields[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("bad address in CLUSTER NODES line {line:?}"));
        for range in &fields[8..] {
            if range.starts_with('[') {
                continue; // importing/migrating
            }
            let (lo, hi) = match range.split_once('-') {
                Some((lo, hi)) => (lo.parse().unwrap(), hi.parse().unwrap()),
                None => {
                    let s = range.parse().unwrap();
                    (s, s)
                }
            };
            map.push((lo, hi, port));
        }
    }
    map.sort();
    map
}

/// Settings for global mode on `urls` (standalone shards, or a cluster's seeds), with
/// `pool_size` connections per shard and a fast sync (50 ms tick, 100 ms base interval) so
/// tests see hits reach Redis quickly.
pub fn global_mode(
    urls: Vec<String>,
    cluster: bool,
    pool_size: usize,
) -> impl FnOnce(&mut sluice::settings::Settings) {
    move |s| {
        s.redis = Some(sluice::settings::RedisSettings {
            urls,
            cluster,
            sentinel: None,
            options: sluice::global::redis::RedisOptions {
                pool_size,
                ..sluice::global::redis::RedisOptions::default()
            },
        });
        s.sync.policy = sluice::core::SyncPolicy {
            tick_ms: 50,
            base_ms: 100,
        };
        s.sync.timeout = std::time::Duration::from_millis(500);
    }
}
