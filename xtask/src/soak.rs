//! `soak`: a long run of the service under random stream fates (runtime-glue's `soak`
//! example), with RSS sampling and an end-of-run oracle; writes a JSON summary and fails
//! when the oracle does.

use crate::cmd::Cmd;
use crate::{Result, flags};

/// Where the summary goes unless `--summary` says otherwise.
const DEFAULT_SUMMARY: &str = "target/soak-summary.json";
/// The bare flag that turns fault injection on (it takes no value).
const FAULTS_FLAG: &str = "--faults";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    secs: u64,
    plane: String,
    concurrency: u64,
    summary: String,
    /// Inject faults through `velo-faults`' proxy.
    faults: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let faults = args.iter().any(|a| a == FAULTS_FLAG);
        let args: Vec<String> = args.iter().filter(|a| *a != FAULTS_FLAG).cloned().collect();
        let flags = flags::parse(&args, &["duration", "plane", "concurrency", "summary"])?;
        let secs = match flags.get("duration") {
            None => 600,
            Some(d) => duration_secs(d)?,
        };
        let plane = flags.get("plane").copied().unwrap_or("velo").to_owned();
        if plane != "velo" && plane != "tcp" {
            return Err(format!("--plane must be `velo` or `tcp`, not `{plane}`").into());
        }
        let concurrency = match flags.get("concurrency") {
            None => 256,
            Some(c) => c
                .parse()
                .map_err(|_| format!("--concurrency must be a number, not `{c}`"))?,
        };
        let summary = flags
            .get("summary")
            .copied()
            .unwrap_or(DEFAULT_SUMMARY)
            .to_owned();
        Ok(Self {
            secs,
            plane,
            concurrency,
            summary,
            faults,
        })
    }
}

/// Where cargo builds: `$CARGO_TARGET_DIR`, else `target/` under the repository root.
pub(crate) fn target_dir() -> std::path::PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => crate::cmd::project_root().join(dir),
        None => crate::cmd::project_root().join("target"),
    }
}

/// `90`, `90s`, `10m` or `2h`, in seconds.
fn duration_secs(d: &str) -> Result<u64> {
    let (num, unit) = match d.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => d.split_at(i),
        None => (d, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("--duration `{d}`: expected e.g. 90s, 10m or 2h"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("--duration `{d}`: the unit must be s, m or h").into()),
    };
    Ok(n * scale)
}

pub(crate) fn run(opts: &Options) -> Result {
    let mut extra = Vec::new();
    if opts.faults {
        // The proxy is velo-faults' binary, a separate process: runtime-glue sits below it.
        Cmd::cargo()
            .args(["build", "--release", "-p", "velo-faults"])
            .run()?;
        let bin = target_dir().join("release").join("velo-faults");
        extra = vec![
            FAULTS_FLAG.to_owned(),
            "--proxy-bin".to_owned(),
            bin.display().to_string(),
        ];
    }
    Cmd::cargo()
        .args([
            "run",
            "--release",
            "-p",
            "runtime-glue",
            "--example",
            "soak",
            "--",
        ])
        .args(["--duration", &opts.secs.to_string(), "--plane", &opts.plane])
        .args([
            "--concurrency",
            &opts.concurrency.to_string(),
            "--summary",
            &opts.summary,
        ])
        .args(extra)
        .run()?;
    println!("soak: summary in {}", opts.summary);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(duration_secs("90").unwrap(), 90);
        assert_eq!(duration_secs("90s").unwrap(), 90);
        assert_eq!(duration_secs("10m").unwrap(), 600);
        assert_eq!(duration_secs("2h").unwrap(), 7200);
        assert!(duration_secs("10x").is_err());
        assert!(duration_secs("m").is_err());
    }

    #[test]
    fn options_default_to_ten_minutes_on_velo() {
        let o = Options::parse(&[]).unwrap();
        assert_eq!(
            (o.secs, o.plane.as_str(), o.concurrency),
            (600, "velo", 256)
        );
        let args: Vec<String> = ["--plane", "quic"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert!(Options::parse(&args).is_err());
        assert!(!o.faults);
        let args: Vec<String> = ["--faults", "--duration", "2m"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let o = Options::parse(&args).unwrap();
        assert!(o.faults && o.secs == 120);
    }
}
