//! A Redis Cluster of N masters (no replicas) made of [`RedisServer`]s.

use std::time::{Duration, Instant};

use crate::server::{RedisServer, ensure_redis_installed};

/// How long the nodes get to agree on a healthy cluster after creation.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// A running cluster; dropping it kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// `(first slot, last slot, index into nodes)`, sorted by first slot.
    slots: Vec<(u16, u16, usize)>,
    /// The `redis-server` arguments of every node.
    args: Vec<String>,
}

impl RedisCluster {
    /// Starts `masters` (at least 3) cluster-enabled servers, joins them as
    /// `redis-cli --cluster create --cluster-replicas 0` would (even slot split, distinct
    /// config epochs, `CLUSTER MEET`), and waits until every node reports `cluster_state:ok`
    /// and all nodes agree on which node serves every slot.
    ///
    /// # Panics
    /// When `masters < 3`, or the cluster does not form within the bounded waits.
    pub fn start(masters: usize) -> Self {
        Self::start_with_args(masters, &[])
    }

    /// [`start`](Self::start) with extra `redis-server` arguments for every node (say
    /// `["--cluster-require-full-coverage", "no"]`).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with_args(masters: usize, args: &[&str]) -> Self {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, asked for {masters}"
        );
        ensure_redis_installed();
        let args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        ]
        .iter()
        .chain(args)
        .map(|&arg| arg.to_owned())
        .collect();
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_with_args(&args))
            .collect();
        create(&nodes);
        let slots = wait_converged(&nodes);
        Self { nodes, slots, args }
    }

    /// Starts a replica of node `master`, waits until it is in sync and every node knows it,
    /// and returns its index among the nodes.
    ///
    /// # Panics
    /// When that does not happen within the bounded waits.
    pub fn add_replica(&mut self, master: usize) -> usize {
        let replica = RedisServer::start_with_args(&self.args);
        run(
            &self.nodes[0],
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(replica.port()),
        );
        self.nodes.push(replica);
        wait_met(&self.nodes);
        let master_id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[master].connection())
            .expect("CLUSTER MYID");
        let index = self.nodes.len() - 1;
        run(
            &self.nodes[index],
            redis::cmd("CLUSTER").arg("REPLICATE").arg(&master_id),
        );
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut self.nodes[index].connection())
                .expect("INFO replication");
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not sync within {CONVERGE_TIMEOUT:?}:\n{info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_healthy();
        index
    }

    /// Promotes replica `replica` in its master's place without the master's agreement
    /// (`CLUSTER FAILOVER TAKEOVER`, as when the master is unreachable), and waits until every
    /// node agrees on the new slot map.
    ///
    /// # Panics
    /// When that does not happen within the bounded waits.
    pub fn fail_over(&mut self, replica: usize) {
        run(
            &self.nodes[replica],
            redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
        );
        self.wait_promoted(replica);
    }

    /// Waits until every running node agrees on a slot map in which `replica` serves slots
    /// (say, after its primary was [stopped](RedisServer::stop) and it was elected in its
    /// place), and takes that map as the cluster's. A stopped node is not asked.
    ///
    /// # Panics
    /// When that does not happen within the bounded wait.
    pub fn wait_promoted(&mut self, replica: usize) {
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            match observe(&self.nodes) {
                Ok(slots) if slots.iter().any(|&(_, _, node)| node == replica) => {
                    self.slots = slots;
                    return;
                }
                observed => assert!(
                    Instant::now() < deadline,
                    "the cluster did not agree on node {replica}'s promotion within \
                     {CONVERGE_TIMEOUT:?}: {observed:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:PORT` of every node, usable as cluster seeds.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to the nodes, to stop or restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Waits until the cluster is healthy again with the same slot map, e.g. after
    /// [`RedisServer::restart`] of a node: a restarted master keeps its `nodes.conf`, so it
    /// rejoins with its slots, empty, after Redis' 2 s writable delay. A master down for
    /// longer than the node timeout (5 s) is marked FAIL, and the others only clear that
    /// 10 s (2 × node timeout) after marking it.
    ///
    /// # Panics
    /// When that does not happen within 30 s, or the slot map changed.
    pub fn wait_healthy(&self) {
        let slots = wait_converged(&self.nodes);
        assert_eq!(slots, self.slots, "the cluster's slot map changed");
    }

    /// A synchronous cluster client over all nodes.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.seed_urls()).unwrap_or_else(|e| {
            panic!(
                "cannot build a cluster client for {:?}: {e}",
                self.seed_urls()
            )
        })
    }

    /// The node owning `key`'s slot, per the slot map agreed on at start (no replicas, so
    /// it never moves unless a test reshards).
    pub fn node_for_key(&self, key: impl AsRef<[u8]>) -> &RedisServer {
        let slot = key_slot(key.as_ref());
        let (_, _, index) = self
            .slots
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} is not covered by {:?}", self.slots));
        &self.nodes[*index]
    }

    /// A direct (non-cluster) connection to the master owning `key`'s slot.
    pub fn connection_for_key(&self, key: impl AsRef<[u8]>) -> redis::Connection {
        self.node_for_key(key).connection()
    }
}

/// The cluster hash slot of `key`: CRC16/XMODEM mod 16384, hashing only the first non-empty
/// `{hash tag}` when there is one.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16_xmodem(hashed) % SLOTS
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Does what `redis-cli --cluster create --cluster-replicas 0` does, without its one-second
/// polling: gives each node a distinct config epoch, has every pair of nodes meet directly
/// (no waiting on gossip), waits until every node knows every other, then splits the slots
/// evenly. Assigning slots
/// only once all nodes know each other avoids the rejoin delay (up to the node timeout) a
/// master with slots takes when it briefly believes it is in a minority.
fn create(nodes: &[RedisServer]) {
    for (index, node) in nodes.iter().enumerate() {
        run(
            node,
            redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(index + 1),
        );
    }
    for (index, node) in nodes.iter().enumerate().skip(1) {
        for earlier in &nodes[..index] {
            run(
                earlier,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.port()),
            );
        }
    }
    wait_met(nodes);
    let count = nodes.len();
    let slots = usize::from(SLOTS);
    for (index, node) in nodes.iter().enumerate() {
        let (first, last) = (index * slots / count, (index + 1) * slots / count - 1);
        run(
            node,
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last),
        );
    }
}

/// Waits until every node knows every other (no handshake pending).
fn wait_met(nodes: &[RedisServer]) {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let pending: Vec<String> = nodes
            .iter()
            .filter_map(|node| {
                let view: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                let joined = view
                    .lines()
                    .filter(|line| {
                        let flags = line.split(' ').nth(2).unwrap_or("");
                        !flags.contains("handshake") && !flags.contains("noaddr")
                    })
                    .count();
                (joined != nodes.len())
                    .then(|| format!("node {} knows {joined}:\n{view}", node.port()))
            })
            .collect();
        if pending.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cluster nodes did not all meet within {CONVERGE_TIMEOUT:?}, want {} each:\n{}",
            nodes.len(),
            pending.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs one setup command on `node`, panicking with its log tail on failure.
fn run(node: &RedisServer, cmd: &redis::Cmd) {
    cmd.query::<()>(&mut node.connection()).unwrap_or_else(|e| {
        panic!(
            "cluster setup: `{}` on node {} failed: {e}\n{}",
            String::from_utf8_lossy(&cmd.get_packed_command()).replace("\r\n", " "),
            node.port(),
            node.log_tail(20)
        )
    });
}

/// Waits until every node is `cluster_state:ok`, knows all the others, and reports the same
/// slot map; returns that map.
fn wait_converged(nodes: &[RedisServer]) -> Vec<(u16, u16, usize)> {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let last = match observe(nodes) {
            Ok(slots) => return slots,
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            panic!("cluster did not converge within {CONVERGE_TIMEOUT:?}: {last}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One look at every running node: `Ok(slot map)` when all agree and are healthy. A stopped
/// node is not asked: while the others still count it as a primary, the map they agree on
/// names it, and they are not healthy once they have found it failed, until a replica takes
/// its place.
fn observe(nodes: &[RedisServer]) -> Result<Vec<(u16, u16, usize)>, String> {
    let mut agreed: Option<Vec<(u16, u16, usize)>> = None;
    for node in nodes.iter().filter(|node| node.pid().is_some()) {
        let port = node.port();
        let client = node.client();
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .map_err(|e| format!("node {port}: cannot connect: {e}"))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut conn)
            .map_err(|e| format!("node {port}: CLUSTER INFO failed: {e}"))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .unwrap_or("?")
                .to_owned()
        };
        let (state, known) = (field("cluster_state"), field("cluster_known_nodes"));
        if state != "ok" || known != nodes.len().to_string() {
            return Err(format!(
                "node {port}: cluster_state:{state} cluster_known_nodes:{known} (want ok, {})",
                nodes.len()
            ));
        }
        let reply: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .map_err(|e| format!("node {port}: CLUSTER SLOTS failed: {e}"))?;
        let mut slots = Vec::with_capacity(reply.len());
        for entry in &reply {
            use redis::Value::{Array, Int};
            let Array(parts) = entry else {
                return Err(format!("node {port}: odd CLUSTER SLOTS entry {entry:?}"));
            };
            let [Int(first), Int(last), Array(master), ..] = parts.as_slice() else {
                return Err(format!("node {port}: odd CLUSTER SLOTS entry {entry:?}"));
            };
            let Some(Int(master_port)) = master.get(1) else {
                return Err(format!("node {port}: no master port in {entry:?}"));
            };
            let index = nodes
                .iter()
                .position(|n| i64::from(n.port()) == *master_port)
                .ok_or_else(|| {
                    format!("node {port}: slots {first}-{last} on unknown port {master_port}")
                })?;
            let slot = |v: i64| u16::try_from(v).map_err(|_| format!("bad slot {v}"));
            slots.push((slot(*first)?, slot(*last)?, index));
        }
        slots.sort_unstable();
        let covered: u32 = slots.iter().map(|(f, l, _)| u32::from(l - f) + 1).sum();
        if covered != u32::from(SLOTS) {
            return Err(format!(
                "node {port}: only {covered} of {SLOTS} slots covered"
            ));
        }
        match &agreed {
            None => agreed = Some(slots),
            Some(first) if *first == slots => {}
            Some(first) => {
                return Err(format!(
                    "node {port} sees slots {slots:?}, node {} sees {first:?}",
                    nodes[0].port()
                ));
            }
        }
    }
    agreed.ok_or_else(|| "no nodes".to_owned())
}
