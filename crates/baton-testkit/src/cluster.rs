//! A private Redis Cluster on loopback: `redis-server --cluster-enabled yes`
//! nodes joined by `redis-cli --cluster create` (both from Debian's
//! packages), with a short `cluster-node-timeout` so that a killed master's
//! replica takes over within seconds. Tests kill and restart nodes, move
//! slots between masters under load and read the topology.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, start_redis_server, wait_until};

/// How long a node may be unreachable before the others call it failed:
/// short, so failovers in tests take a few seconds, not fifteen.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One `redis-server` of a [`RedisCluster`].
pub struct ClusterNode {
    pub port: u16,
    /// The cluster bus port: set, not the default port + 10000, which
    /// for a port above 55535 does not exist.
    bus_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl ClusterNode {
    fn start() -> Self {
        let mut node = Self {
            port: free_port(),
            bus_port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args(["--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &self.bus_port.to_string()])
            // The other masters keep serving while one has failed and its
            // replica is not yet in charge (the default stops them all).
            .args(["--cluster-require-full-coverage", "no"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            // A node learns its own address from the nodes it meets: a lone
            // master would otherwise announce an empty host.
            .args(["--cluster-announce-ip", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path());
        self.child = Some(start_redis_server(command, self.port, "a cluster node"));
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The node's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master and the slot ranges it serves, as `CLUSTER SHARDS` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub master_port: u16,
    pub master_id: String,
    pub slots: Vec<(u16, u16)>,
    pub replica_ports: Vec<u16>,
}

impl Shard {
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// A Redis Cluster of `masters` masters with `replicas_per_master`
/// replicas each. Every node is killed when dropped.
pub struct RedisCluster {
    pub nodes: Vec<ClusterNode>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster (slots split evenly among the
    /// masters) and waits until every node sees it whole and healthy.
    pub fn start(masters: usize, replicas_per_master: usize) -> Self {
        assert!(masters >= 1, "a cluster needs a master");
        let count = masters * (1 + replicas_per_master);
        let nodes: Vec<ClusterNode> = (0..count).map(|_| ClusterNode::start()).collect();
        let cluster = Self { nodes };
        // `redis-cli --cluster create` refuses fewer than three masters:
        // smaller clusters are assembled by hand, as it would.
        if masters >= 3 {
            let output = Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(cluster.nodes.iter().map(ClusterNode::address))
                .args(["--cluster-replicas", &replicas_per_master.to_string()])
                .arg("--cluster-yes")
                .stdin(Stdio::null())
                .output()
                .expect("redis-cli runs (apt-get install redis-tools)");
            assert!(
                output.status.success(),
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        } else {
            cluster.assemble(masters, replicas_per_master);
        }
        cluster.wait_healthy(count);
        cluster
    }

    /// What `--cluster create` does, for one or two masters: slots split
    /// evenly, every node met, replicas attached in turn.
    fn assemble(&self, masters: usize, replicas_per_master: usize) {
        let first = &self.nodes[0];
        for node in &self.nodes[1..] {
            // The bus port too: it is not the default port + 10000 here.
            let () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(first.port)
                .arg(first.bus_port)
                .query(&mut self.connection(node.port))
                .expect("CLUSTER MEET");
        }
        let per_master = 16384 / masters;
        for (i, master) in self.nodes[..masters].iter().enumerate() {
            let start = i * per_master;
            let end = if i + 1 == masters {
                16383
            } else {
                start + per_master - 1
            };
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("ADDSLOTSRANGE").arg(start).arg(end);
            let () = cmd
                .query(&mut self.connection(master.port))
                .expect("CLUSTER ADDSLOTSRANGE");
        }
        wait_until(
            Duration::from_secs(30),
            "every node to know every other",
            || {
                self.nodes.iter().all(|n| {
                    cluster_info(&mut self.connection(n.port), "cluster_known_nodes")
                        == Some(self.nodes.len().to_string())
                })
            },
        );
        for (i, replica) in self.nodes[masters..].iter().enumerate() {
            let master = &self.nodes[i / replicas_per_master.max(1) % masters];
            let id = self.node_id(master.port);
            let () = redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(&id)
                .query(&mut self.connection(replica.port))
                .expect("CLUSTER REPLICATE");
        }
    }

    fn connection(&self, port: u16) -> redis::Connection {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
        client
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("a connection to a cluster node")
    }

    /// Waits until `expected` nodes run, every running node says the
    /// cluster is ok with all 16384 slots served, and every running master
    /// has as many replicas as the topology asks.
    pub fn wait_healthy(&self, expected: usize) {
        wait_until(
            Duration::from_secs(60),
            "the Redis Cluster to be whole and healthy",
            || {
                let running: Vec<&ClusterNode> =
                    self.nodes.iter().filter(|n| n.is_running()).collect();
                running.len() >= expected
                    && running.iter().all(|n| {
                        let Ok(mut conn) =
                            redis::Client::open(format!("redis://127.0.0.1:{}/", n.port)).and_then(
                                |c| c.get_connection_with_timeout(Duration::from_secs(1)),
                            )
                        else {
                            return false;
                        };
                        cluster_info(&mut conn, "cluster_state").as_deref() == Some("ok")
                            && cluster_info(&mut conn, "cluster_slots_ok").as_deref()
                                == Some("16384")
                            && cluster_info(&mut conn, "cluster_known_nodes")
                                == Some(self.nodes.len().to_string())
                    })
                    && self.shards_from_any().is_some_and(|shards| {
                        shards
                            .iter()
                            .map(|s| 1 + s.replica_ports.len())
                            .sum::<usize>()
                            >= expected
                    })
            },
        );
    }

    /// Seed addresses, every node: `127.0.0.1:p1,127.0.0.1:p2,…`.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(ClusterNode::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The cluster as Baton's `--redis-url` takes it.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}/", self.seeds())
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.connection(port))
            .expect("CLUSTER MYID")
    }

    /// The masters and their slots, as the first running node that
    /// answers says.
    pub fn shards(&self) -> Vec<Shard> {
        self.shards_from_any()
            .expect("a running node answers CLUSTER SHARDS")
    }

    fn shards_from_any(&self) -> Option<Vec<Shard>> {
        self.nodes.iter().filter(|n| n.is_running()).find_map(|n| {
            let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}/", n.port))
                .ok()?
                .get_connection_with_timeout(Duration::from_secs(1))
                .ok()?;
            let value: redis::Value = redis::cmd("CLUSTER").arg("SHARDS").query(&mut conn).ok()?;
            parse_shards(&value)
        })
    }

    /// The master serving `slot` now.
    pub fn master_of(&self, slot: u16) -> Shard {
        self.shards()
            .into_iter()
            .find(|s| s.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The running node on `port`.
    pub fn node(&self, port: u16) -> &ClusterNode {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// Starts a killed node again on its port and data directory: it
    /// rejoins with the identity its `nodes.conf` holds.
    pub fn start_again(&mut self, port: u16) {
        let node = self.node_mut(port);
        node.kill();
        node.spawn();
    }

    fn node_mut(&mut self, port: u16) -> &mut ClusterNode {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// Waits until a master other than `old_master_port` serves `slot`
    /// (a replica took over after the old master was killed).
    pub fn wait_failover(&self, slot: u16, old_master_port: u16) -> Shard {
        let mut new = None;
        wait_until(
            Duration::from_secs(30),
            "a replica to take over the killed master's slots",
            || {
                new = self
                    .shards_from_any()
                    .and_then(|shards| shards.into_iter().find(|s| s.serves(slot)))
                    .filter(|s| {
                        s.master_port != old_master_port && self.node(s.master_port).is_running()
                    });
                new.is_some()
            },
        );
        new.expect("checked above")
    }

    /// Moves `slot` to the master on `to_port` the way `redis-cli
    /// --cluster reshard` does, key batch by key batch: the slot is
    /// IMPORTING on the target and MIGRATING on the source while its keys
    /// move with MIGRATE, so clients meanwhile get ASK and TRYAGAIN
    /// redirections; then every master is told the slot's new owner.
    pub fn move_slot(&self, slot: u16, to_port: u16) {
        let from = self.master_of(slot);
        if from.master_port == to_port {
            return;
        }
        let to_id = self.node_id(to_port);
        self.start_slot_move(slot, to_port);
        let mut source = self.connection(from.master_port);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(10)
                .query(&mut source)
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            self.migrate_keys(from.master_port, to_port, &keys);
        }
        setslot(&mut self.connection(to_port), slot, "NODE", &to_id);
        setslot(&mut source, slot, "NODE", &to_id);
        for shard in self.shards() {
            if shard.master_port != from.master_port && shard.master_port != to_port {
                setslot(
                    &mut self.connection(shard.master_port),
                    slot,
                    "NODE",
                    &to_id,
                );
            }
        }
    }

    /// The first step of [`Self::move_slot`]: `slot` IMPORTING on the
    /// master on `to_port`, MIGRATING on its master, no key moved yet.
    pub fn start_slot_move(&self, slot: u16, to_port: u16) {
        let from = self.master_of(slot);
        let to_id = self.node_id(to_port);
        setslot(
            &mut self.connection(to_port),
            slot,
            "IMPORTING",
            &from.master_id,
        );
        setslot(
            &mut self.connection(from.master_port),
            slot,
            "MIGRATING",
            &to_id,
        );
    }

    /// Moves `keys` (of one slot) from the master on `from_port` to the one
    /// on `to_port` with MIGRATE, as a slot move does batch by batch.
    pub fn migrate_keys(&self, from_port: u16, to_port: u16, keys: &[String]) {
        let () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to_port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("REPLACE")
            .arg("KEYS")
            .arg(keys)
            .query(&mut self.connection(from_port))
            .expect("MIGRATE");
    }

    /// `redis-cli --cluster reshard`: moves `count` slots from the master
    /// on `from_port` to the one on `to_port`.
    pub fn reshard(&self, from_port: u16, to_port: u16, count: u16) {
        let output = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from_port}")])
            .args(["--cluster-from", &self.node_id(from_port)])
            .args(["--cluster-to", &self.node_id(to_port)])
            .args(["--cluster-slots", &count.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            output.status.success(),
            "redis-cli --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// One field of `CLUSTER INFO`.
fn cluster_info(conn: &mut redis::Connection, field: &str) -> Option<String> {
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(conn).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// `CLUSTER SHARDS`: per shard a map with `slots` (flat start/end pairs)
/// and `nodes` (maps with `port`, `id`, `role`, `health`).
fn parse_shards(value: &redis::Value) -> Option<Vec<Shard>> {
    let redis::Value::Array(shards) = value else {
        return None;
    };
    let mut out = Vec::new();
    for shard in shards {
        let fields = pairs(shard)?;
        let slots: Vec<i64> = match fields.iter().find(|(k, _)| k == "slots")?.1 {
            redis::Value::Array(v) => v.iter().filter_map(int).collect(),
            _ => return None,
        };
        let nodes = match fields.iter().find(|(k, _)| k == "nodes")?.1 {
            redis::Value::Array(v) => v,
            _ => return None,
        };
        let mut master = None;
        let mut replica_ports = Vec::new();
        for node in nodes {
            let node = pairs(node)?;
            let text = |name: &str| {
                node.iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| text(v))
            };
            let port = node
                .iter()
                .find(|(k, _)| k == "port")
                .and_then(|(_, v)| int(v))? as u16;
            if text("health").as_deref() != Some("online") {
                continue;
            }
            match text("role").as_deref() {
                Some("master") => master = Some((port, text("id")?)),
                _ => replica_ports.push(port),
            }
        }
        let Some((master_port, master_id)) = master else {
            continue;
        };
        if slots.is_empty() {
            continue;
        }
        out.push(Shard {
            master_port,
            master_id,
            slots: slots
                .chunks(2)
                .map(|p| (p[0] as u16, p[1] as u16))
                .collect(),
            replica_ports,
        });
    }
    Some(out)
}

fn pairs(value: &redis::Value) -> Option<Vec<(String, &redis::Value)>> {
    match value {
        redis::Value::Array(items) => items
            .chunks(2)
            .map(|p| Some((text(&p[0])?, p.get(1)?)))
            .collect(),
        redis::Value::Map(items) => items.iter().map(|(k, v)| Some((text(k)?, v))).collect(),
        _ => None,
    }
}

fn text(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(value: &redis::Value) -> Option<i64> {
    match value {
        redis::Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

/// `CLUSTER SETSLOT slot state id` on `conn`.
fn setslot(conn: &mut redis::Connection, slot: u16, state: &str, id: &str) {
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(id)
        .query(conn)
        .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {state}: {e}"));
}
