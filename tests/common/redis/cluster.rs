//! Redis Cluster of masters only: nodes started and joined, waiting for `cluster_state:ok`
//! and one slot map, and finding the node that owns a key.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cli::parse_bulk;
use super::server::{RedisServer, TlsFiles};
use super::tls::{make_client_cert, make_tls_files};
use super::{require, CLUSTER_SLOTS, CLUSTER_TIMEOUT};

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
