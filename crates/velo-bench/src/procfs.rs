//! What the kernel says about a run: CPU time per process, packets sent, connections.

/// CPU time (user + system) of process `pid`, in seconds, or 0 if it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// CPU time (user + system) of the calling thread, in seconds.
pub fn thread_cpu_seconds() -> f64 {
    stat_cpu_seconds("/proc/thread-self/stat")
}

fn stat_cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start at field 3.
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15: 11 and 12 after the ")".
    (ticks(11) + ticks(12)) / clock_ticks()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Context switches of every thread of process `pid` (voluntary: a thread blocked and was
/// woken later; involuntary: preempted), or zeros if it is gone. Threads that have exited are
/// not counted.
pub fn context_switches(pid: u32) -> ContextSwitches {
    let mut total = ContextSwitches::default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return total;
    };
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let one = switches_in(&status);
        total.voluntary += one.voluntary;
        total.involuntary += one.involuntary;
    }
    total
}

/// Time the threads of process `pid` spent runnable but waiting for a CPU, seconds
/// (`/proc/<pid>/task/*/schedstat`, second field; threads that have exited are not counted).
pub fn run_queue_wait_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// The context switches a thread's `status` file gives.
fn switches_in(status: &str) -> ContextSwitches {
    let mut n = ContextSwitches::default();
    for line in status.lines() {
        let value = |prefix: &str| {
            line.strip_prefix(prefix)
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let Some(v) = value("voluntary_ctxt_switches:") {
            n.voluntary += v;
        } else if let Some(v) = value("nonvoluntary_ctxt_switches:") {
            n.involuntary += v;
        }
    }
    n
}

/// Context switches of a process's threads, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextSwitches {
    /// The thread blocked (each is one sleep and one wake-up).
    pub voluntary: u64,
    /// The thread was preempted.
    pub involuntary: u64,
}

/// Time the machine's CPUs spent in soft interrupts (network receive, among others), seconds.
pub fn softirq_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // cpu  user nice system idle iowait irq softirq ...: softirq is the seventh number.
    let softirq = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    softirq / clock_ticks()
}

/// Packets the host has sent: TCP `OutSegs` plus UDP `OutDatagrams` (`/proc/net/snmp`), so
/// a QUIC plane's traffic counts too. A UDP datagram sent with segmentation offload (GSO)
/// counts once, however many wire packets it becomes; a TCP segment counts as the MSS-sized
/// segments it becomes on the wire.
pub fn sent_packets() -> u64 {
    packets_in("/proc/net/snmp")
}

/// Packets device `dev` has sent in the network namespace of process `pid` (its
/// `/proc/<pid>/net/dev` row), or 0 if the process or the device is gone. On the netns
/// topology, whose devices take one segment per packet, these are wire packets.
pub fn device_tx_packets_of(pid: u32, dev: &str) -> u64 {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
    tx_packets_in(&table, dev)
}

/// The transmitted-packets column of device `dev`'s row in a `/proc/net/dev` table.
fn tx_packets_in(table: &str, dev: &str) -> u64 {
    table
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim() == dev)
        // Receive: bytes packets errs drop fifo frame compressed multicast; then transmit:
        // bytes packets ...
        .and_then(|(_, counters)| counters.split_whitespace().nth(9)?.parse().ok())
        .unwrap_or(0)
}

fn packets_in(path: &str) -> u64 {
    let snmp = std::fs::read_to_string(path).unwrap_or_default();
    snmp_counter(&snmp, "Tcp:", "OutSegs") + snmp_counter(&snmp, "Udp:", "OutDatagrams")
}

/// Counter `name` of the `/proc/net/snmp` table whose lines start with `table`.
fn snmp_counter(snmp: &str, table: &str, name: &str) -> u64 {
    let mut rows = snmp.lines().filter(|l| l.starts_with(table));
    let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// UDP sockets held by processes `pids` (a QUIC client endpoint is one socket per
/// connection in Dynamo's pool).
pub fn udp_sockets_of(pids: &[u32]) -> u64 {
    let mut udp_inodes = std::collections::HashSet::new();
    // Each process's own network namespace's tables (the same tables on loopback).
    let tables = pids
        .iter()
        .flat_map(|p| [format!("/proc/{p}/net/udp"), format!("/proc/{p}/net/udp6")]);
    for table in tables {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            // The inode is the tenth field.
            if let Some(inode) = line.split_whitespace().nth(9) {
                udp_inodes.insert(inode.to_owned());
            }
        }
    }
    let mut n = 0;
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let link = link.to_string_lossy();
            let inode = link
                .strip_prefix("socket:[")
                .and_then(|l| l.strip_suffix(']'));
            if inode.is_some_and(|i| udp_inodes.contains(i)) {
                n += 1;
            }
        }
    }
    n
}

/// Established TCP connections whose local port is `port` (the frontend's side of each), in
/// the network namespace of process `pid`.
pub fn established_on_port(pid: u32, port: u16) -> u64 {
    tcp_on_port(&format!("/proc/{pid}/net"), port, |state| state == "01")
}

/// TCP sockets in `net_dir`'s `tcp` and `tcp6` tables whose local port is `port` and whose
/// state (the hex code of `/proc/net/tcp`: `01` established, `0A` listening) `keep` accepts.
pub fn tcp_on_port(net_dir: &str, port: u16, keep: impl Fn(&str) -> bool) -> u64 {
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("{net_dir}/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && f.get(3).is_some_and(|s| keep(s)) {
                n += 1;
            }
        }
    }
    n
}

/// Pins the calling process to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only
    // read and write the set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_devices_sent_packets_are_read_from_its_net_dev_row() {
        let table = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     840      12    0    0    0     0          0         0      840      12    0    0    0     0       0          0
  eth0: 1532117    4210    0    0    0     0          0         0  9876543    7351    0    0    0     0       0          0
";
        assert_eq!(tx_packets_in(table, "eth0"), 7351);
        assert_eq!(tx_packets_in(table, "lo"), 12);
        assert_eq!(tx_packets_in(table, "eth1"), 0);
        assert_eq!(tx_packets_in("garbage", "eth0"), 0);
    }

    #[test]
    fn context_switches_are_read_from_each_threads_status() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n";
        let n = switches_in(status);
        assert_eq!((n.voluntary, n.involuntary), (120, 7));
        assert_eq!(switches_in("garbage"), ContextSwitches::default());
        assert_eq!(context_switches(u32::MAX), ContextSwitches::default());
        assert_eq!(device_tx_packets_of(u32::MAX, "eth0"), 0);
        assert_eq!(run_queue_wait_seconds(u32::MAX), 0.0);
        assert!(run_queue_wait_seconds(std::process::id()) >= 0.0);
        assert!(softirq_seconds() >= 0.0);
    }
}
