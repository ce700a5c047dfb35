//! What the kernel says about a run: CPU time per process, packets sent, connections.

/// CPU time (user + system) of process `pid`, in seconds, or 0 if it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
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

/// Packets the host has sent: TCP `OutSegs` plus UDP `OutDatagrams` (`/proc/net/snmp`), so
/// a QUIC plane's traffic counts too. A UDP datagram sent with segmentation offload (GSO)
/// counts once, however many wire packets it becomes.
pub fn sent_packets() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
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
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
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

/// Established TCP connections whose local port is `port` (the frontend's side of each).
pub fn established_on_port(port: u16) -> u64 {
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if f.get(3) == Some(&"01") && local_port == Some(port) {
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
