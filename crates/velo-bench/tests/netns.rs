//! The netns topology: two frontends and three worker processes, each in its own network
//! namespace, joined by veth pairs of MTU 1500. Connections must be lanes x worker processes x
//! frontends, and the bench removes its namespaces afterwards. Where namespaces cannot be
//! made (not root, no `ip`), the bench must say so clearly, and the test says why it stops,
//! or fails where `VELO_REQUIRE_NETNS=1` (CI).

use std::process::{Command, Stdio};

/// Lanes per connection, the velo plane's default.
const LANES: u64 = 4;

/// Set (to `1`) where namespaces must be made, as on CI (`.ci/run`): a test that cannot make
/// them then fails instead of saying why it stops.
const REQUIRE_VAR: &str = "VELO_REQUIRE_NETNS";

/// Namespaces cannot be made here (`why`): the test stops, saying so, or fails where they are
/// required.
fn unavailable(why: &str) {
    let required = std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1");
    assert!(!required, "{REQUIRE_VAR}=1 but {why}");
    eprintln!("skipped ({REQUIRE_VAR} is not 1): {why}");
}

#[test]
fn two_frontends_and_three_worker_processes_hold_lanes_times_processes_times_frontends_connections()
{
    let dir = std::env::temp_dir().join(format!("velo-bench-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let child = Command::new(env!("CARGO_BIN_EXE_velo-bench"))
        .args([
            "--arms",
            "velo-tcp-5ms",
            "--tables",
            "closed",
            "--topology",
            "netns",
        ])
        .args([
            "--frontends",
            "2",
            "--worker-processes",
            "3",
            "--workers",
            "3",
        ])
        .args([
            "--concurrency",
            "6",
            "--duration",
            "1",
            "--warmup",
            "0.5",
            "--repeats",
            "1",
        ])
        .args(["--osl", "16", "--isl", "64", "--json"])
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run velo-bench");
    let pid = child.id();
    let out = child.wait_with_output().expect("velo-bench ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("network namespaces cannot be made here") {
        unavailable(&stderr);
        return;
    }
    assert!(out.status.success(), "velo-bench failed: {stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let arm = &doc["arms"][0];
    assert_eq!(arm["config"]["topology"], "netns");
    assert_eq!(
        arm["connections"].as_f64(),
        Some((LANES * 3 * 2) as f64),
        "{arm}"
    );
    assert!(arm["output_tokens_per_s"].as_f64().unwrap() > 0.0, "{arm}");
    assert_eq!(arm["errors"].as_f64(), Some(0.0), "{arm}");
    assert!(
        arm["tx_segments_per_token"].as_f64().unwrap() > 0.0,
        "{arm}"
    );
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    let ours = format!("velo-bench-{pid}-");
    assert!(
        !left.lines().any(|l| l.starts_with(&ours)),
        "namespaces left behind: {left}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A veth left with its offloads passes a UDP GSO send of many datagrams as one packet while
/// TCP's counters count segments, so packets per token would not compare across planes: every
/// host's device takes one segment per packet, and its packet counter counts wire packets.
#[test]
fn every_hosts_device_takes_one_segment_per_packet() {
    let topology = match velo_bench::netns::Netns::create(2) {
        Ok(t) => t,
        Err(e) if e.contains("network namespaces cannot be made here") => {
            unavailable(&e);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    for host in 0..2 {
        let ns = topology.namespace(host);
        let out = Command::new("ip")
            .args(["-n", &ns, "-d", "link", "show", velo_bench::netns::DEVICE])
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("gso_max_segs 1 "),
            "host {host}'s device: {shown}"
        );
    }
}
