//! Packet loss between two network namespaces: a veth pair, one end in each, and an nftables
//! rule in each namespace dropping a share of its outgoing packets (`numgen random mod 100 <
//! N drop`); `tc netem` is not available everywhere, nftables is.
//!
//! [`LossyLink::create`] makes the namespaces and [`Drop`] removes them (removing a namespace
//! removes its end of the veth pair, and with it the pair), on every path out, errors and
//! panics included. Namespaces left by a harness that was killed are removed by the next
//! [`LossyLink::create`].

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};

/// Prefix of every namespace this module makes.
const PREFIX: &str = "velo-faults-";
/// The address of namespace A's end (a /30 that exists only inside the two namespaces).
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
/// The address of namespace B's end.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
/// Prefix length of the link.
const PREFIX_LEN: u8 = 30;

/// Why the namespaces cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// Making namespaces needs root.
    #[error("network namespaces need root (running as uid {0})")]
    NotRoot(u32),
    /// A tool is missing.
    #[error("`{0}` is not installed (apt-get install -y iproute2 nftables)")]
    Missing(&'static str),
    /// A command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed.
        stderr: String,
    },
}

/// Two namespaces joined by a veth pair whose packets are dropped at a given rate.
#[derive(Debug)]
pub struct LossyLink {
    ns_a: String,
    ns_b: String,
}

impl LossyLink {
    /// Makes namespaces A and B (unique to this process), joins them with a veth pair
    /// ([`ADDR_A`], [`ADDR_B`]) and drops `loss_percent` of the packets each sends.
    ///
    /// # Errors
    ///
    /// [`NetnsError`]: not root, `ip` or `nft` missing, or a command failed (whatever was
    /// made is removed again).
    pub fn create(loss_percent: u8) -> Result<Self, NetnsError> {
        preflight()?;
        remove_stale();
        let pid = std::process::id();
        let link = Self {
            ns_a: format!("{PREFIX}{pid}-a"),
            ns_b: format!("{PREFIX}{pid}-b"),
        };
        // From here on, `link`'s Drop removes whatever was made if a step fails.
        ip(&["netns", "add", &link.ns_a])?;
        ip(&["netns", "add", &link.ns_b])?;
        let (veth_a, veth_b) = (format!("vfa{pid}"), format!("vfb{pid}"));
        ip(&[
            "link", "add", &veth_a, "type", "veth", "peer", "name", &veth_b,
        ])?;
        ip(&["link", "set", &veth_a, "netns", &link.ns_a])?;
        ip(&["link", "set", &veth_b, "netns", &link.ns_b])?;
        for (ns, dev, addr) in [(&link.ns_a, &veth_a, ADDR_A), (&link.ns_b, &veth_b, ADDR_B)] {
            let cidr = format!("{addr}/{PREFIX_LEN}");
            ip(&["-n", ns, "addr", "add", &cidr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            drop_share(ns, loss_percent)?;
        }
        Ok(link)
    }

    /// The command prefix that runs a program in namespace A (`ip netns exec NAME`).
    pub fn exec_a(&self) -> Vec<String> {
        exec_prefix(&self.ns_a)
    }

    /// The command prefix that runs a program in namespace B.
    pub fn exec_b(&self) -> Vec<String> {
        exec_prefix(&self.ns_b)
    }

    /// Drops `loss_percent` of the packets each namespace sends from now on (100: a
    /// blackholed link, which the kernels' keepalives and retransmissions can notice, unlike
    /// a stalled proxy whose kernel still answers).
    ///
    /// # Errors
    ///
    /// [`NetnsError::Command`] when a rule cannot be replaced.
    pub fn set_loss(&self, loss_percent: u8) -> Result<(), NetnsError> {
        for ns in [&self.ns_a, &self.ns_b] {
            run(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "nft",
                    "flush",
                    "chain",
                    "inet",
                    "velo_faults",
                    "out",
                ],
            )?;
            let rule = drop_rule(loss_percent);
            run(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "nft",
                    "add",
                    "rule",
                    "inet",
                    "velo_faults",
                    "out",
                    &rule,
                ],
            )?;
        }
        Ok(())
    }

    /// Packets the loss rules dropped so far, both namespaces together.
    pub fn dropped_packets(&self) -> u64 {
        [&self.ns_a, &self.ns_b]
            .iter()
            .map(|ns| {
                let out = Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        ns,
                        "nft",
                        "list",
                        "table",
                        "inet",
                        "velo_faults",
                    ])
                    .output();
                let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
                counter_packets(&text.unwrap_or_default())
            })
            .sum()
    }

    /// Namespace A's address.
    pub fn addr_a(&self) -> IpAddr {
        IpAddr::V4(ADDR_A)
    }
}

impl Drop for LossyLink {
    fn drop(&mut self) {
        for ns in [&self.ns_a, &self.ns_b] {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("velo-faults: removing namespace {ns}: {e}");
            }
        }
    }
}

/// Why namespaces cannot be made here, checked without making any.
///
/// # Errors
///
/// [`NetnsError::NotRoot`] or [`NetnsError::Missing`].
pub fn preflight() -> Result<(), NetnsError> {
    let uid = effective_uid();
    if uid != 0 {
        return Err(NetnsError::NotRoot(uid));
    }
    for tool in ["ip", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Err(NetnsError::Missing(tool));
        }
    }
    Ok(())
}

fn exec_prefix(ns: &str) -> Vec<String> {
    ["ip", "netns", "exec", ns]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

/// Drops `percent` of the packets namespace `ns` sends.
fn drop_share(ns: &str, percent: u8) -> Result<(), NetnsError> {
    let rules = format!(
        "table inet velo_faults {{ chain out {{ type filter hook output priority 0; \
         policy accept; {}; }}; }}",
        drop_rule(percent)
    );
    run("ip", &["netns", "exec", ns, "nft", &rules])
}

/// The nftables rule dropping `percent` of the packets sent on the link (not on loopback,
/// where processes in the same namespace talk; `numgen` takes shares below 100).
fn drop_rule(percent: u8) -> String {
    if percent >= 100 {
        "oifname != \"lo\" counter drop".to_owned()
    } else {
        format!("oifname != \"lo\" numgen random mod 100 < {percent} counter drop")
    }
}

/// The packets of the first `counter packets N bytes M` in nft's listing.
fn counter_packets(listing: &str) -> u64 {
    let mut words = listing.split_whitespace();
    while let Some(w) = words.next() {
        if w == "counter" && words.next() == Some("packets") {
            return words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        }
    }
    0
}

/// Removes namespaces of harness processes that no longer run.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let list = String::from_utf8_lossy(&out.stdout);
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetnsError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetnsError::Command {
        command: format!("{program} {}", args.join(" ")),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// The effective uid, from `/proc/self/status` (no libc call needed).
fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(2)?.parse().ok()
        })
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_packets_are_read_from_the_counter() {
        let listing = "table inet velo_faults {\n\tchain out {\n\t\tnumgen random mod 100 < 2 \
                       counter packets 17 bytes 2040 drop\n\t}\n}";
        assert_eq!(counter_packets(listing), 17);
        assert_eq!(counter_packets("table inet velo_faults {}"), 0);
    }
}
