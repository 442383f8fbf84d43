//! The `sluice` binary's file descriptors: the open-files soft limit raised to the hard one
//! at start, and idle admin connections that cannot starve gRPC of descriptors.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::common::{free_port, http, wait_until};
use crate::process::sluice;

/// A `sluice serve` started through `sh` after `ulimit <limits>` (so the test controls the
/// open-files limits it starts with); killed when dropped.
struct Limited {
    child: std::process::Child,
    grpc: u16,
    http: SocketAddr,
    log: tempfile::NamedTempFile,
    _rules: tempfile::TempDir,
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_with_ulimit(limits: &str, args: &[&str]) -> Limited {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("r.yaml"),
        "domain: load\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
    )
    .unwrap();
    let (grpc, port) = (free_port(), free_port());
    let log = tempfile::NamedTempFile::new().unwrap();
    // `exec` keeps the pid: the child is sluice itself, with the limits the shell set.
    let child = Command::new("sh")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .arg("-c")
        .arg(format!("ulimit {limits} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(rules.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{port}")])
        .args(args)
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .unwrap();
    let http_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(20, "ready", || {
        matches!(http(http_addr, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
    Limited {
        child,
        grpc,
        http: http_addr,
        log,
        _rules: rules,
    }
}

/// (soft, hard) "Max open files" of a process, from /proc.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-files line in\n{limits}"));
    let mut fields = line["Max open files".len()..].split_whitespace();
    let (soft, hard) = (fields.next().unwrap(), fields.next().unwrap());
    (soft.to_string(), hard.to_string())
}

#[test]
fn serve_raises_the_open_files_soft_limit_to_the_hard_limit() {
    let p = serve_with_ulimit("-S -n 256", &[]);
    let (soft, hard) = open_files_limits(p.child.id());
    assert_eq!(soft, hard, "soft open-files limit not raised");
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(
        log.contains("open-files limit raised") && log.contains("old_soft=256"),
        "{log}"
    );
}

/// Runs `cmd` and returns its output, failing the test if it has not exited within `secs`
/// (a gRPC call to a starved server would otherwise hang the test).
fn output_within(mut cmd: Command, secs: u64) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut exited = false;
    wait_until(secs, "the command to exit", || {
        exited = child.try_wait().unwrap().is_some();
        exited
    });
    child.wait_with_output().unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn idle_admin_connections_cannot_starve_grpc() {
    // Hard and soft limit 320: without a cap on the admin port, 380 idle connections would
    // use up every descriptor and new gRPC connections could not be accepted. With the cap
    // (256), sluice holds 256 of them and the rest wait in the listen backlog (128 here),
    // which costs sluice no descriptor.
    let p = serve_with_ulimit("-n 320", &[]);
    let base = open_fds(p.child.id());
    let idle: Vec<std::net::TcpStream> = (0..380)
        .map(|_| std::net::TcpStream::connect(p.http).unwrap())
        .collect();

    let addr = format!("http://127.0.0.1:{}", p.grpc);
    let mut query = sluice();
    query.args(["query", "--addr", &addr, "--domain", "load", "user=q"]);
    let out = output_within(query, 30);
    assert!(
        out.status.success(),
        "gRPC did not answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["overallCode"], "OK");

    // At most the cap of admin connections are held (a few more for connections closing).
    let fds = open_fds(p.child.id());
    assert!(
        fds <= base + 256 + 8,
        "sluice holds {fds} descriptors ({base} at start)"
    );

    // The idle clients leave: the admin port answers again.
    drop(idle);
    wait_until(30, "the admin port to answer", || {
        matches!(http(p.http, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
}

#[test]
fn idle_grpc_connections_cannot_exhaust_descriptors() {
    // Open-files limit 1024: the gRPC cap is lowered to 1024 less room for the admin port and
    // the rest (512). 700 silent clients: sluice holds at most 512, the rest wait in the
    // listen backlog; each is closed at the handshake timeout (1 s here), so honest clients
    // get slots again, and the admin port answers throughout.
    let p = serve_with_ulimit("-n 1024", &["--grpc-handshake-timeout", "1s"]);
    let base = open_fds(p.child.id());
    let grpc: SocketAddr = format!("127.0.0.1:{}", p.grpc).parse().unwrap();
    let idle: Vec<std::net::TcpStream> = (0..700)
        .map(|_| std::net::TcpStream::connect(grpc).unwrap())
        .collect();
    assert!(
        matches!(http(p.http, "GET", "/readyz", "", &[]), Ok((200, ..))),
        "the admin port answers"
    );
    let fds = open_fds(p.child.id());
    assert!(
        fds <= base + 512 + 8,
        "sluice holds {fds} descriptors ({base} at start)"
    );
    let addr = format!("http://127.0.0.1:{}", p.grpc);
    let mut query = sluice();
    query.args(["query", "--addr", &addr, "--domain", "load", "user=q"]);
    let out = output_within(query, 60);
    assert!(
        out.status.success(),
        "gRPC did not answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(
        log.contains("gRPC connection cap lowered") && log.contains("cap=512"),
        "{log}"
    );
    drop(idle);
}
