//! A data-centre-like network on one machine: every process of a run in its own network
//! namespace, all joined by veth pairs (MTU 1500) to a bridge in a switch namespace.
//!
//! Loopback has a 64 KiB MTU and no per-packet device cost, which hides what a plane saves in
//! packets. On this topology a TCP segment is at most 1448 bytes of payload and every packet
//! crosses two veth devices and a bridge, as on a real network. Every veth takes one segment
//! per packet (`gso_max_segs 1`): the kernel segments TCP and UDP (a QUIC sender's GSO
//! batches) before the device, as a NIC without segmentation offload would, so a device's
//! packet counter counts wire packets whatever the protocol
//! ([`procfs::device_tx_packets_of`](crate::procfs::device_tx_packets_of)). A veth left with its
//! offloads would pass a UDP GSO batch of up to 64 datagrams as one packet, while TCP's
//! counters count segments: packets per token would not compare. The bench creates the namespaces before a run and removes
//! them when the [`Netns`] is dropped; it needs root (or `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`)
//! and iproute2's `ip`.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

/// The MTU of every veth device.
pub const MTU: u32 = 1500;
/// Each host's device, in its own namespace.
pub const DEVICE: &str = "eth0";
/// Hosts at most (addresses `10.213.0.1` to `10.213.0.250` of a /24).
pub const MAX_HOSTS: usize = 250;
/// The hosts' subnet: `10.213.0.0/24`.
const SUBNET: [u8; 3] = [10, 213, 0];

/// Network namespaces of one run: `hosts` hosts and a switch, removed on drop.
#[derive(Debug)]
pub struct Netns {
    prefix: String,
    /// Host namespaces made so far (removed on drop).
    hosts: usize,
    /// Whether the switch namespace was made.
    switch: bool,
}

impl Netns {
    /// Creates a switch namespace with a bridge and `hosts` host namespaces, each with one
    /// veth device (`eth0`, MTU [`MTU`], one segment per packet, address `10.213.0.<i+1>/24`)
    /// plugged into the bridge.
    ///
    /// # Errors
    ///
    /// Namespaces cannot be made here (not root, no `ip`, a kernel without network
    /// namespaces or veth): the message says which command failed and what it said.
    pub fn create(hosts: usize) -> Result<Self, String> {
        if hosts == 0 || hosts > MAX_HOSTS {
            return Err(format!(
                "a topology has 1 to {MAX_HOSTS} hosts, not {hosts}"
            ));
        }
        let mut me = Self {
            prefix: format!("velo-bench-{}", std::process::id()),
            hosts: 0,
            switch: false,
        };
        let sw = me.switch_name();
        ip(None, &format!("netns add {sw}"))?;
        me.switch = true;
        let mut switch = "link add br0 type bridge\nlink set br0 up\nlink set lo up\n".to_owned();
        let mut links = String::new();
        for i in 0..hosts {
            let ns = me.namespace(i);
            ip(None, &format!("netns add {ns}"))?;
            me.hosts = i + 1;
            links.push_str(&format!(
                "link add {DEVICE} netns {ns} mtu {MTU} type veth peer name p{i} netns {sw} mtu {MTU}\n"
            ));
            switch.push_str(&format!(
                "link set dev p{i} gso_max_segs 1\nlink set p{i} master br0 up\n"
            ));
        }
        ip_batch(None, &links)?;
        ip_batch(Some(&sw), &switch)?;
        for i in 0..hosts {
            let script = format!(
                "addr add {}/24 dev {DEVICE}\nlink set dev {DEVICE} gso_max_segs 1\n\
                 link set {DEVICE} up\nlink set lo up\n",
                me.address(i)
            );
            ip_batch(Some(&me.namespace(i)), &script)?;
        }
        Ok(me)
    }

    /// The namespace of host `i`.
    pub fn namespace(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn address(&self, i: usize) -> IpAddr {
        let last = u8::try_from(i + 1).unwrap_or(u8::MAX);
        IpAddr::V4(Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], last))
    }

    /// The command line that runs `argv` inside host `i`'s namespace (`ip netns exec`, which
    /// execs the program: the process keeps its pid).
    pub fn wrap(&self, i: usize, argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
        let mut line: Vec<std::ffi::OsString> =
            vec!["netns".into(), "exec".into(), self.namespace(i).into()];
        line.extend(argv);
        line
    }

    fn switch_name(&self) -> String {
        format!("{}-sw", self.prefix)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its devices, and with them their veth peers.
        for i in 0..self.hosts {
            let _ = ip(None, &format!("netns delete {}", self.namespace(i)));
        }
        if self.switch {
            let _ = ip(None, &format!("netns delete {}", self.switch_name()));
        }
    }
}

/// Runs `ip [-n ns] <args>`.
fn ip(ns: Option<&str>, args: &str) -> Result<(), String> {
    run_ip(ns, args.split_whitespace(), None)
}

/// Runs `ip [-n ns] -batch -` on `script`, which stops at its first failing line.
fn ip_batch(ns: Option<&str>, script: &str) -> Result<(), String> {
    run_ip(ns, ["-batch", "-"], Some(script))
}

fn run_ip<'a>(
    ns: Option<&str>,
    args: impl IntoIterator<Item = &'a str>,
    stdin: Option<&str>,
) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    cmd.args(args);
    let shown = format!("{cmd:?}").replace('"', "");
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| cannot(&shown, &e.to_string()))?;
    if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(script.as_bytes())
            .map_err(|e| cannot(&shown, &e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| cannot(&shown, &e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(cannot(&shown, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn cannot(command: &str, said: &str) -> String {
    format!(
        "network namespaces cannot be made here (`{command}` failed: {said}); the netns \
         topology needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN, iproute2's `ip`, and a kernel \
         with network namespaces and veth; run without --topology netns"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_get_consecutive_addresses_and_their_own_namespaces() {
        let n = Netns {
            prefix: "velo-bench-1".into(),
            hosts: 0,
            switch: false,
        };
        assert_eq!(n.address(0).to_string(), "10.213.0.1");
        assert_eq!(n.address(11).to_string(), "10.213.0.12");
        assert_eq!(n.namespace(3), "velo-bench-1-h3");
        let line = n.wrap(3, vec!["/bin/true".into()]);
        assert_eq!(line, ["netns", "exec", "velo-bench-1-h3", "/bin/true"]);
    }

    #[test]
    fn a_topology_without_hosts_or_with_too_many_is_refused_before_anything_is_made() {
        assert!(Netns::create(0).unwrap_err().contains("1 to 250 hosts"));
        assert!(
            Netns::create(MAX_HOSTS + 1)
                .unwrap_err()
                .contains("not 251")
        );
    }
}
