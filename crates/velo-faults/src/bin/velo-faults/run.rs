//! Runs one scenario on one plane: fresh processes (in namespaces where the scenario wants
//! packet loss), the streams, the fault at the end of the warm-up, then waiting, bounded,
//! for every victim to end and every sibling to finish.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use velo_faults::netns::LossyLink;
use velo_faults::protocol::Command;
use velo_faults::proxy::{FaultProxy, ProxyConfig};

use crate::children::{EVENT_QUEUE, ProcId, Spawner};
use crate::scenarios::{Bound, Inject, Observe, Phase, Place, Role, Scenario};
use crate::service::RoleArgs;
use crate::verdict::{self, Baseline, Row};
use crate::world::World;

/// How long a process has to say it is ready.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// Time past its bound before a victim that has not ended counts as hanging.
const HANG_MARGIN: Duration = Duration::from_secs(2);
/// Time past their own length that streams meant to finish get after the fault.
const FINISH_MARGIN: Duration = Duration::from_secs(3);
/// The service's default teardown timeout, the second half of its shutdown bound.
const SHUTDOWN_TEARDOWN: Duration = runtime_glue::DEFAULT_TEARDOWN_TIMEOUT;
/// How long a flood waits for its template registration.
const TEMPLATE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of every run.
#[derive(Debug, Clone)]
pub(crate) struct RunOpts {
    /// The velo plane's idle timeout.
    pub(crate) idle: Duration,
    /// Slack on top of the idle timeout in the detection bound.
    pub(crate) slack: Duration,
    /// The frontends' shutdown grace.
    pub(crate) grace: Duration,
    /// Where the processes' logs go.
    pub(crate) log_dir: PathBuf,
}

impl RunOpts {
    /// The detection bound of `bound`.
    pub(crate) fn bound(&self, bound: Bound) -> Option<Duration> {
        match bound {
            Bound::Idle => Some(self.idle + self.slack),
            Bound::Grace => Some(self.grace),
            Bound::None => None,
        }
    }
}

/// Runs `sc` on `plane` and judges it.
pub(crate) async fn run(
    sc: &Scenario,
    plane: &str,
    opts: &RunOpts,
    base: Option<&Baseline>,
) -> Row {
    let link = match sc.loss_percent.map(LossyLink::create) {
        None => None,
        Some(Ok(link)) => Some(link),
        Some(Err(e)) => return Row::skipped(sc, plane, format!("namespaces unavailable: {e}")),
    };
    let outcome = run_in(sc, plane, opts, link.as_ref()).await;
    let dropped = link.as_ref().map(LossyLink::dropped_packets);
    // The processes are gone (torn down or killed on drop) before the namespaces go.
    drop(link);
    let mut row = match outcome {
        Ok((world, t_fault)) => verdict::judge(sc, plane, &world, t_fault, opts, base),
        Err(e) => Row::broken(sc, plane, e),
    };
    if let Some(n) = dropped {
        row.notes
            .push(format!("the loss rules dropped {n} packets during the run"));
    }
    row
}

async fn run_in(
    sc: &Scenario,
    plane: &str,
    opts: &RunOpts,
    link: Option<&LossyLink>,
) -> Result<(World, Instant), String> {
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let logs = opts.log_dir.join(format!("{plane}-{}", sc.name));
    let mut world = World::new(Spawner::new(logs, tx)?, rx, sc);
    start(&mut world, sc, plane, opts, link).await?;
    let t_fault = timeline(&mut world, sc, plane, opts, link).await;
    world.teardown().await;
    Ok((world, t_fault?))
}

/// Starts the frontends, the proxy (in front of frontend 0) and the workers.
async fn start(
    w: &mut World,
    sc: &Scenario,
    plane: &str,
    opts: &RunOpts,
    link: Option<&LossyLink>,
) -> Result<(), String> {
    for (i, place) in sc.frontends.iter().enumerate() {
        let p = spawn_role(w, ProcId::Frontend(i), *place, plane, opts, link)?;
        w.frontends.push(Some(p));
    }
    wait_ready(w, sc.frontends.len(), ProcId::Frontend).await?;
    if sc.groups.iter().any(|g| g.proxied) {
        let upstream = *w.addrs.get(&0).ok_or("frontend 0 has no address")?;
        let proxy = FaultProxy::bind(upstream, ProxyConfig::default())
            .await
            .map_err(|e| e.to_string())?;
        w.proxy = Some(proxy);
    }
    for (i, place) in sc.workers.iter().enumerate() {
        let p = spawn_role(w, ProcId::Worker(i), *place, plane, opts, link)?;
        w.workers.push(p);
    }
    wait_ready(w, sc.workers.len(), ProcId::Worker).await
}

fn spawn_role(
    w: &World,
    id: ProcId,
    place: Place,
    plane: &str,
    opts: &RunOpts,
    link: Option<&LossyLink>,
) -> Result<crate::children::RoleProc, String> {
    let (prefix, host) = match (place, link) {
        (Place::Host, _) => (Vec::new(), IpAddr::V4(Ipv4Addr::LOCALHOST)),
        (Place::NsA, Some(l)) => (l.exec_a(), l.addr_a()),
        (Place::NsB, Some(l)) => (l.exec_b(), l.addr_a()),
        (_, None) => return Err("a namespace placement without namespaces".into()),
    };
    let args = RoleArgs {
        plane: plane.to_owned(),
        idle_ms: u64::try_from(opts.idle.as_millis()).unwrap_or(u64::MAX),
        grace_ms: u64::try_from(opts.grace.as_millis()).unwrap_or(u64::MAX),
        host,
    };
    let (role, name) = match id {
        ProcId::Frontend(i) => ("frontend", format!("frontend{i}")),
        ProcId::Worker(i) => ("worker", format!("worker{i}")),
    };
    let mut argv = vec![role.to_owned()];
    argv.extend(args.to_args());
    let restarts = w.ready.iter().filter(|r| **r == id).count();
    w.spawner
        .spawn(id, &prefix, &argv, &format!("{name}-{restarts}"))
}

async fn wait_ready(w: &mut World, n: usize, id: fn(usize) -> ProcId) -> Result<(), String> {
    let all = |w: &World| (0..n).all(|i| w.ready.contains(&id(i)));
    if w.pump_until(Instant::now() + STARTUP_TIMEOUT, all).await {
        Ok(())
    } else {
        Err(format!(
            "processes did not start within {STARTUP_TIMEOUT:?}"
        ))
    }
}

/// Streams, warm-up, fault, waits. Returns when the fault was injected.
async fn timeline(
    w: &mut World,
    sc: &Scenario,
    plane: &str,
    opts: &RunOpts,
    link: Option<&LossyLink>,
) -> Result<Instant, String> {
    w.open_groups(Phase::Start).await;
    w.pump_for(sc.warmup).await;
    let t_fault = inject(w, sc, plane, opts, link).await?;
    w.open_groups(Phase::AfterFault).await;
    let bound = opts.bound(sc.bound).unwrap_or(Duration::ZERO);
    let observe = sc.observe;
    let hang_deadline = t_fault + bound + HANG_MARGIN;
    w.pump_until(hang_deadline, |w| victims_ended(w, observe))
        .await;
    let finish_deadline = (t_fault + finishing_span(sc) + FINISH_MARGIN).max(hang_deadline);
    w.pump_until(finish_deadline, |w| {
        victims_ended(w, observe) && finishers_ended(w)
    })
    .await;
    if sc.inject == Inject::Shutdown {
        // Shutdown returns within grace + teardown timeout, whatever the streams did.
        let returned = t_fault + opts.grace + SHUTDOWN_TEARDOWN + FINISH_MARGIN;
        w.pump_until(returned, |w| w.shutdown_done.is_some()).await;
    }
    Ok(t_fault)
}

/// Injects the scenario's fault; returns when it took effect.
async fn inject(
    w: &mut World,
    sc: &Scenario,
    plane: &str,
    opts: &RunOpts,
    link: Option<&LossyLink>,
) -> Result<Instant, String> {
    w.sample_rss();
    match sc.inject {
        Inject::Nothing => {}
        Inject::KillWorker(n) => w.workers.get_mut(n).ok_or("no such worker")?.kill(),
        Inject::KillFrontend(n) => {
            if let Some(Some(p)) = w.frontends.get_mut(n) {
                p.kill();
            }
        }
        Inject::Proxy(faults) => w.proxy.as_ref().ok_or("no proxy")?.set_both(faults),
        Inject::DropVictims => {
            let t = Instant::now();
            let victims: Vec<(u64, usize)> = w
                .streams
                .iter()
                .filter(|(_, s)| w.groups[s.group].role == Role::Victim)
                .map(|(sid, s)| (*sid, w.groups[s.group].frontend))
                .collect();
            for (sid, f) in victims {
                w.send_frontend(f, &Command::Kill { sid }).await;
            }
            return Ok(t);
        }
        Inject::Flood {
            worker,
            concurrency,
        } => return flood(w, worker, concurrency).await,
        Inject::RestartFrontend => return restart(w, sc, plane, opts).await,
        Inject::Shutdown => w.send_frontend(0, &Command::Shutdown).await,
        Inject::Loss(percent) => link
            .ok_or("a loss fault without namespaces")?
            .set_loss(percent)
            .map_err(|e| e.to_string())?,
    }
    Ok(Instant::now())
}

/// Worker `worker` opens the forged group's streams with tickets frontend 0 never issued.
async fn flood(w: &mut World, worker: usize, concurrency: u64) -> Result<Instant, String> {
    let template = w.open_template(0).await;
    let got = |w: &World| w.templates.contains_key(&template);
    w.pump_until(Instant::now() + TEMPLATE_TIMEOUT, got).await;
    let info = w
        .templates
        .get(&template)
        .cloned()
        .ok_or("frontend 0 gave no connection info for the flood's template")?;
    let g = w
        .groups
        .iter()
        .position(|g| g.forged)
        .ok_or("no forged group")?;
    let count = w.groups[g].count;
    let first_sid = w.sid();
    w.streams.insert(
        first_sid,
        crate::world::Stream {
            group: g,
            ..Default::default()
        },
    );
    for _ in 1..count {
        let sid = w.sid();
        w.streams.insert(
            sid,
            crate::world::Stream {
                group: g,
                ..Default::default()
            },
        );
    }
    let cmd = Command::Flood {
        first_sid,
        count,
        concurrency,
        info,
    };
    let t = Instant::now();
    w.workers
        .get_mut(worker)
        .ok_or("no such worker")?
        .send(&cmd)
        .await;
    Ok(t)
}

/// Kills frontend 0 and starts a new instance behind the same proxy address.
async fn restart(
    w: &mut World,
    sc: &Scenario,
    plane: &str,
    opts: &RunOpts,
) -> Result<Instant, String> {
    if let Some(Some(p)) = w.frontends.get_mut(0) {
        p.kill();
    }
    let t = Instant::now();
    w.addrs.remove(&0);
    let place = sc.frontends.first().copied().unwrap_or(Place::Host);
    let p = spawn_role(w, ProcId::Frontend(0), place, plane, opts, None)?;
    w.frontends[0] = Some(p);
    let has_addr = |w: &World| w.addrs.contains_key(&0);
    if !w
        .pump_until(Instant::now() + STARTUP_TIMEOUT, has_addr)
        .await
    {
        return Err("the restarted frontend did not start".into());
    }
    let addr = w.addrs[&0];
    w.proxy
        .as_ref()
        .ok_or("no proxy")?
        .set_upstream(addr)
        .map_err(|e| e.to_string())?;
    Ok(t)
}

/// Whether every victim has ended on every observed side.
fn victims_ended(w: &World, observe: Observe) -> bool {
    w.of_role(Role::Victim).all(|s| {
        (!observe.frontend || !s.frontend.is_empty()) && (!observe.worker || !s.worker.is_empty())
    })
}

/// Whether every stream meant to finish (siblings, complete victims) ended on both sides.
fn finishers_ended(w: &World) -> bool {
    w.streams
        .values()
        .filter(|s| w.groups[s.group].complete)
        .all(|s| !s.frontend.is_empty() && !s.worker.is_empty())
}

/// How long the streams meant to finish last, from the fault on (at most their length).
fn finishing_span(sc: &Scenario) -> Duration {
    sc.groups
        .iter()
        .filter(|g| g.complete)
        .map(|g| Duration::from_millis(g.items * g.interval_ms + g.delay_ms))
        .max()
        .unwrap_or(Duration::ZERO)
}
