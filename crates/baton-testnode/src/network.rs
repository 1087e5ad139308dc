//! Pod networking with iproute2: one Linux bridge per node in the root
//! network namespace (`btbrN`, address 10.244.N.1/24) and one network
//! namespace per pod (`btN-K`) with its own loopback and a veth into the
//! bridge (pod IP 10.244.N.K). The root namespace reaches every pod at its
//! IP through the bridge's route; pods of one node reach each other on the
//! bridge. N is unique among the nodes running on this machine, across
//! processes: it is taken under a lock file, and the bridge's owner (a pid)
//! is written next to it so a crashed test's leftovers are reclaimed.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{Context, bail};

/// Where nodes of every process coordinate their subnet numbers.
const STATE_DIR: &str = "/run/baton-testnode";

/// The per-node part: the bridge and the pool of pod addresses.
pub(crate) struct NodeNetwork {
    index: u8,
    free: Mutex<AddressPool>,
    watcher: Mutex<Option<std::process::Child>>,
}

/// One pod's network namespace.
#[derive(Clone, Debug)]
pub(crate) struct Sandbox {
    pub netns: String,
    pub ip: Ipv4Addr,
    host_octet: u8,
}

impl Sandbox {
    /// A short directory for the pod's Unix sockets: a socket path may not
    /// exceed 107 bytes, which paths under a temporary work_dir do.
    pub fn run_dir(&self) -> PathBuf {
        Path::new(STATE_DIR).join(&self.netns)
    }
}

impl NodeNetwork {
    /// Takes a free subnet number, creates the bridge and arranges for
    /// everything to be removed when this process exits.
    pub fn create() -> anyhow::Result<Self> {
        std::fs::create_dir_all(STATE_DIR).with_context(|| format!("creating {STATE_DIR}"))?;
        let lock = File::create(Path::new(STATE_DIR).join("alloc.lock"))?;
        lock.lock().context("locking the subnet table")?;
        let index = (1..=254u8)
            .find(|&n| claim(n).unwrap_or(false))
            .context("no free 10.244.N.0/24 subnet for a test node")?;
        drop(lock);
        let network = Self {
            index,
            free: Mutex::new(AddressPool::default()),
            watcher: Mutex::new(None),
        };
        *network.watcher.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(network.watch_process_exit()?);
        Ok(network)
    }

    fn bridge(&self) -> String {
        bridge_name(self.index)
    }

    /// The node's address on the bridge (its InternalIP, the pods' gateway).
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.index, 1)
    }

    /// `10.244.N.0/24`
    pub fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index)
    }

    /// Creates a pod's network namespace with an address from the pool.
    pub async fn create_sandbox(&self) -> anyhow::Result<Sandbox> {
        let octet = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .context("no free pod address on this node")?;
        let sandbox = Sandbox {
            netns: format!("bt{}-{octet}", self.index),
            ip: Ipv4Addr::new(10, 244, self.index, octet),
            host_octet: octet,
        };
        if let Err(e) = self.setup(&sandbox).await {
            self.destroy_sandbox(&sandbox).await;
            return Err(e);
        }
        Ok(sandbox)
    }

    fn veth(&self, s: &Sandbox) -> String {
        format!("btv{}-{}", self.index, s.host_octet)
    }

    async fn setup(&self, s: &Sandbox) -> anyhow::Result<()> {
        let veth = self.veth(s);
        let ns = s.netns.as_str();
        let ip = format!("{}/24", s.ip);
        let gateway = self.host_ip().to_string();
        // Leftovers of an earlier sandbox with this address would make
        // `add` fail.
        let _ = ip_cmd(&["link", "del", &veth]).await;
        let _ = ip_cmd(&["netns", "del", ns]).await;
        ip_cmd(&["netns", "add", ns]).await?;
        ip_cmd(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])
        .await?;
        ip_cmd(&["link", "set", &veth, "master", &self.bridge(), "up"]).await?;
        ip_cmd(&["-n", ns, "addr", "add", &ip, "dev", "eth0"]).await?;
        ip_cmd(&["-n", ns, "link", "set", "eth0", "up"]).await?;
        ip_cmd(&["-n", ns, "link", "set", "lo", "up"]).await?;
        ip_cmd(&["-n", ns, "route", "add", "default", "via", &gateway]).await?;
        let etc = netns_etc(ns);
        tokio::fs::create_dir_all(&etc).await?;
        // Names not in the hosts file fail at once instead of waiting for a
        // DNS server that the namespace cannot reach.
        tokio::fs::write(
            etc.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )
        .await?;
        write_in_place(&etc.join("hosts"), &base_hosts())?;
        let _ = tokio::fs::remove_dir_all(s.run_dir()).await;
        tokio::fs::create_dir_all(s.run_dir()).await?;
        Ok(())
    }

    /// Removes the namespace (its processes must be gone) and returns the
    /// address to the pool.
    pub async fn destroy_sandbox(&self, s: &Sandbox) {
        kill_netns_processes(&s.netns);
        // The kernel removes a namespace's devices asynchronously once the
        // namespace is gone; deleting the veth pair now frees its name for
        // the next sandbox at once.
        let _ = ip_cmd(&["link", "del", &self.veth(s)]).await;
        if let Err(e) = ip_cmd(&["netns", "del", &s.netns]).await {
            tracing::debug!(netns = %s.netns, "netns del: {e:#}");
        }
        let _ = tokio::fs::remove_dir_all(netns_etc(&s.netns)).await;
        let _ = tokio::fs::remove_dir_all(s.run_dir()).await;
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .give_back(s.host_octet);
    }

    /// Shell commands that remove every namespace, process and the bridge
    /// of this node.
    fn cleanup_script(&self) -> String {
        cleanup_script(self.index)
    }

    /// A watcher that cleans up after this process is gone, however it
    /// ended (a `static` node is never dropped, a test may be killed).
    fn watch_process_exit(&self) -> anyhow::Result<std::process::Child> {
        let script = format!(
            "while kill -0 {} 2>/dev/null; do sleep 0.5; done; {}",
            std::process::id(),
            self.cleanup_script()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the exit watcher")
    }

    /// Kills every pod process and removes every namespace and the bridge,
    /// synchronously (also from `Drop`).
    pub fn destroy_all(&self) {
        let _ = Command::new("sh")
            .args(["-c", &self.cleanup_script()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut watcher) = self
            .watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = watcher.kill();
            let _ = watcher.wait();
        }
    }
}

/// Pod addresses 10.244.N.2 to .254, handed out round-robin: an address
/// is reused as late as possible, so a deleted pod's address does not turn
/// up at once in another pod (and in stale hosts entries).
struct AddressPool {
    free: BTreeSet<u8>,
    next: u8,
}

impl Default for AddressPool {
    fn default() -> Self {
        Self {
            free: (2..=254).collect(),
            next: 2,
        }
    }
}

impl AddressPool {
    fn take(&mut self) -> Option<u8> {
        let octet = self
            .free
            .range(self.next..)
            .next()
            .or_else(|| self.free.iter().next())
            .copied()?;
        self.free.remove(&octet);
        self.next = octet.wrapping_add(1).max(2);
        Some(octet)
    }

    fn give_back(&mut self, octet: u8) {
        self.free.insert(octet);
    }
}

fn bridge_name(index: u8) -> String {
    format!("btbr{index}")
}

fn owner_file(index: u8) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{}.owner", bridge_name(index)))
}

fn cleanup_script(index: u8) -> String {
    format!(
        "for ns in $(ip netns list | awk '{{print $1}}' | grep '^bt{index}-'); do \
           pids=$(ip netns pids \"$ns\"); [ -n \"$pids\" ] && kill -9 $pids; \
           ip netns del \"$ns\"; rm -rf \"/etc/netns/$ns\" \"{state}/$ns\"; \
         done; ip link del {bridge} 2>/dev/null; rm -f {owner}; true",
        bridge = bridge_name(index),
        owner = owner_file(index).display(),
        state = STATE_DIR,
    )
}

/// Takes subnet `n` if its bridge does not exist or its owner is dead.
/// Called under the allocation lock.
fn claim(n: u8) -> anyhow::Result<bool> {
    let bridge = bridge_name(n);
    let exists = Command::new("ip")
        .args(["link", "show", &bridge])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?
        .success();
    if exists {
        let owner_alive = std::fs::read_to_string(owner_file(n))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if owner_alive {
            return Ok(false);
        }
        tracing::info!(
            bridge,
            "reclaiming the subnet of a test node whose process is gone"
        );
        Command::new("sh")
            .args(["-c", &cleanup_script(n)])
            .status()?;
    }
    let address = format!("10.244.{n}.1/24");
    let created = Command::new("ip")
        .args(["link", "add", &bridge, "type", "bridge"])
        .stderr(Stdio::null())
        .status()?
        .success();
    if !created {
        return Ok(false);
    }
    std::fs::write(owner_file(n), std::process::id().to_string())?;
    for args in [
        vec!["addr", "add", address.as_str(), "dev", bridge.as_str()],
        vec!["link", "set", bridge.as_str(), "up"],
    ] {
        let out = Command::new("ip").args(&args).output()?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(true)
}

async fn ip_cmd(args: &[&str]) -> anyhow::Result<()> {
    let out = tokio::process::Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// SIGKILLs whatever still runs inside namespace `netns`.
pub(crate) fn kill_netns_processes(netns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// `/etc/netns/<ns>`: `ip netns exec` bind-mounts each file in it over the
/// file of the same name in `/etc`.
pub(crate) fn netns_etc(netns: &str) -> PathBuf {
    Path::new("/etc/netns").join(netns)
}

/// The hosts file's fixed lines.
pub(crate) fn base_hosts() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_owned()
}

/// Rewrites a file in place: `ip netns exec` bind-mounted this inode over
/// `/etc/hosts` of the processes already running, so a rename would go
/// unseen. Writing over the old bytes before cutting the tail means a
/// concurrent reader never finds the file empty.
pub(crate) fn write_in_place(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(contents.as_bytes())?;
    file.set_len(contents.len() as u64)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_reused_as_late_as_possible() {
        let mut pool = AddressPool::default();
        assert_eq!(pool.take(), Some(2));
        assert_eq!(pool.take(), Some(3));
        pool.give_back(2);
        assert_eq!(pool.take(), Some(4));
        let rest: Vec<u8> = std::iter::from_fn(|| pool.take()).collect();
        assert_eq!(rest.first(), Some(&5));
        assert_eq!(rest.last(), Some(&2), "the returned address comes last");
        assert_eq!(rest.len(), 251);
    }
}
