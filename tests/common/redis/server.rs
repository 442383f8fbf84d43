//! One redis-server (standalone or sentinel) under its watchdog: starting it on a free port,
//! waiting until it is ready, killing and restarting it, and `redis-cli` against it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cli::{parse_bulk, resp_command, run_cli};
use super::{pick_port, require, server_binary, POLL, READY_TIMEOUT};

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
pub(super) struct TlsFiles {
    pub(super) ca_cert: PathBuf,
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    /// A client certificate and key the CA signed: set, the server requires client
    /// certificates (`--tls-auth-clients yes`) and `cli` presents this one.
    pub(super) client: Option<(PathBuf, PathBuf)>,
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

    pub(super) fn start_in(
        dir: tempfile::TempDir,
        tls: Option<TlsFiles>,
        extra: Vec<String>,
    ) -> RedisServer {
        server_binary();
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
        server_binary();
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
        server_binary();
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
            .arg(server_binary())
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
