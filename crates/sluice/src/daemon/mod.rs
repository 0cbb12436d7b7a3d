//! `sluice run`: load and attach the gate, keep per-CPU shares in step with
//! arrivals, serve statistics (Unix socket + Prometheus), reload on SIGHUP,
//! detach and print totals on SIGINT/SIGTERM.
//!
//! The daemon's parts: [`tick`] (what runs every tick: shares, wakes, the
//! auto loop), [`auto`] (signals, controller, gate for the auto classes),
//! [`sched`] (SCHED_FIFO, napi kthread policy), and the private parts that
//! own their state: `generation` (the config in force, discovery, reload),
//! `publish` (snapshot, socket, metrics), [`source_scan`] (the sources
//! tables on their own thread), `known_store`, `protect` (CPU protection),
//! `pace` (the tick's period), `setup` (the tracer, steering and the start's
//! log lines beside the gate) and [`privileges`] (down to the unit's
//! capabilities once attached).
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Result;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::base::iface::Iface;
use crate::base::log;
use crate::daemon::sched::{apply_napi, check_napi, realtime_thread};
use crate::daemon::tick::Ticker;
use crate::dataplane::classify;
use crate::dataplane::gate::{self, Gate};
use crate::dataplane::steer::{self, Steer};
use crate::dataplane::trace::{self, Tracer};
use crate::policy::config::{Config, NapiSched, XdpMode};
use crate::policy::fair::LEARN_HOLD_AFTER_RESTART_SECS;
use crate::signals::discover::Listeners;
use crate::signals::known;
use crate::signals::service_cpus::{ServiceCpus, BUSY_MIN_SPAN_SECS};
use crate::signals::syn_peers::SynPeers;
use crate::surface::client::default_socket;
use crate::surface::stats::Snapshot;
use drop_book::DropBook;
use generation::{log_classes, ConfigSource};
use known_store::KnownStore;
use pace::Pace;
use protect::Protection;
use publish::{bind_metrics, serve_metrics, Publisher, SocketFile};
use source_scan::SourceTables;
use status::first_snapshot;

pub mod auto;
mod decisions;
mod drop_book;
mod generation;
pub mod known_store;
mod pace;
pub mod privileges;
mod protect;
mod publish;
pub mod sched;
mod setup;
pub mod source_scan;
mod status;
pub mod tick;

use setup::{load_steer, load_tracer, log_start, NapiUndo};

/// Where `sluice run --iface IFACE` looks for IFACE.toml when no --config is given.
pub const CONFIG_DIR: &str = "/etc/sluice";
/// How often the daemon runs the auto controller and re-splits limited
/// classes' rates over CPUs: traffic that moves to another CPU (a migrating
/// sender on veth, an RSS change) finds only a small share there for up to
/// one tick.
pub const TICK: Duration = crate::policy::controller::TICK;
/// Set in the environment, the daemon's start fails right after the gate
/// is attached (tests check that such a failure leaves the interface as it was).
pub const FAIL_AFTER_ATTACH: &str = "SLUICE_TEST_FAIL_AFTER_ATTACH";

/// What the control loop does besides the tick itself, and how often:
/// the daemon is this table over its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Duty {
    /// Take the source scan's result, if its thread has one.
    TakeScan,
    /// Look for the listening services (a changed class list is switched to).
    Rediscover,
    /// Follow the reuseport groups with the steering program.
    Resteer,
    /// Read the counters into the served snapshot.
    Publish,
    /// Hand the known sources to the saver's thread.
    OfferKnown,
    /// Re-apply the napi kthreads' policy (re-attaching XDP or toggling
    /// threaded mode re-creates them).
    Napi,
    /// Read the CPUs' and the services' processes' times, for the look
    /// a flood wakes to judge how busy each service is from a second ago.
    ServiceTimes,
    /// Look where each class's service runs (the CPU signal's CPUs) and
    /// how busy it keeps them.
    ServiceCpus,
    /// Read the namespace's settings the gate depends on again: TCP's for
    /// a gate cookie, the ephemeral port range for the host's replies.
    TcpSettings,
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Each duty's period while the loop ticks fast, and while it is calm (see
/// `pace`), in the order they run when due at the same tick. A woken loop
/// runs the duties calm slows down at once, and every duty at its fast
/// period from the wake on: the CPU signal's CPUs and the TCP settings a
/// gate cookie offers are fresh for the ticks that need them.
///
/// Calm, where the services run is looked at every 10 s, not every second:
/// the CPU signal it feeds judges receive work on a service's CPU, which
/// needs a tick that is not calm, and the look reads every thread's
/// /proc stat of every service (with 20 idle services it was 43% of the
/// idle daemon's CPU, `perf record` for 30 s). The TCP settings matter only
/// to a SYN guard that answers, which a calm loop has none of: read every
/// 10 s while calm (4-5% of that profile at once a second), and at a wake.
/// The times busy is judged from are read every second (a file, and one a
/// service process: `ServiceCpus::mark`; a look that ran since is enough),
/// and only while some class is judged on its answers (a TCP auto class).
const CADENCE: [(Duration, Duration, Duty); 9] = [
    (ms(1000), ms(1000), Duty::Rediscover),
    (ms(1000), ms(1000), Duty::Resteer),
    (ms(0), ms(0), Duty::TakeScan),
    (ms(100), ms(1000), Duty::Publish),
    (ms(60_000), ms(60_000), Duty::OfferKnown),
    (ms(1000), ms(1000), Duty::Napi),
    (ms(1000), ms(1000), Duty::ServiceTimes),
    (ms(250), ms(10_000), Duty::ServiceCpus),
    (ms(1000), ms(10_000), Duty::TcpSettings),
];

/// What `sluice run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOpts {
    pub iface: Option<String>,
    /// The config file; it must exist.
    pub config: Option<PathBuf>,
    /// Without `config`: a file read if it exists (`sluice run --iface eth0`
    /// reads /etc/sluice/eth0.toml), looked for again on every reload; absent
    /// means zero-config.
    pub config_if_present: Option<PathBuf>,
    pub classes: Vec<String>,
    pub replace: bool,
    pub xdp_mode: Option<XdpMode>,
    pub socket: Option<PathBuf>,
    /// Overrides the config's metrics address: Some(None) turns metrics off.
    pub metrics: Option<Option<SocketAddr>>,
    /// --no-discover: no classes for the listening services.
    pub no_discover: bool,
    /// Where the known sources are kept across restarts (None: known::STATE_DIR).
    pub state_dir: Option<PathBuf>,
    /// --observe: count what would be dropped, drop nothing (whatever the file says).
    pub observe: bool,
}

pub struct Daemon {
    /// Where configs come from: the file and flags, and discovery.
    source: ConfigSource,
    /// The config in force: the resolved one plus a class per discovered service.
    cfg: Config,
    iface: Iface,
    gate: Gate,
    /// The served snapshot, its rates' history and the daemon's CPU account.
    publish: Publisher,
    socket: PathBuf,
    /// The per-CPU splits and the auto controller, run every tick.
    ticker: Ticker,
    /// The known sources: the state file and each class's part of the map.
    known: KnownStore,
    /// The scan of the gate's source maps (its own thread) and its last result.
    sources: SourceTables,
    /// Reader steering and the finder of reuseport groups; None if the
    /// kernel refused the program (said once in the log).
    steer: Option<(Steer, steer::Finder)>,
    /// CPU protection and the napi kthreads' policy.
    protect: Protection,
    /// Where each class's service runs, for the CPU signal; and whether the
    /// last look failed (said once in the log until one works again).
    service_cpus: ServiceCpus,
    service_cpus_failing: bool,
    /// The tracer's softirq pair could not be attached at the last try (said once until it can).
    softirq_failing: bool,
    /// The tick's pace: 10 ms, or slow while all is calm (woken by the gate).
    pace: Pace,
    /// The kernel's drops after the gate (kfree_skb), booked by class name.
    tracer: Option<(Tracer, DropBook)>,
    /// Which rate and class changes get a log line (rate-limited).
    decisions: decisions::Decisions,
    /// SIGHUP, SIGINT and SIGTERM, caught from before the statistics socket
    /// answers (a signal sent as soon as it does stops the daemon cleanly).
    signals: Option<signal_hook::iterator::Signals>,
    /// systemd's watchdog (WatchdogSec= in the unit): how often to ping it,
    /// and when it was last pinged. None: not run by systemd with one.
    watchdog: Option<(Duration, Instant)>,
}

/// When the tick after one due at `last` runs: `every` later, or `now` if
/// the loop fell a whole tick behind (a stall, an overrun). Missed ticks are
/// skipped, not run back to back: the controller, the budget and fairness
/// take a tick's length from the clock, not from a count.
fn next_tick(last: Instant, now: Instant, every: Duration) -> Instant {
    let next = last + every;
    if now >= next + every {
        now
    } else {
        next
    }
}

impl Daemon {
    /// Check everything that can fail, then attach, then serve statistics.
    /// Nothing touches the interface before the last check passed, so a start
    /// that fails (even with --replace) leaves the interface as it was.
    pub fn start(opts: RunOpts) -> Result<Daemon> {
        let (mut source, name) = ConfigSource::new(opts)?;
        gate::check_privileges()?;
        // Resolved once: every part is handed this, none looks the name up again.
        let iface = gate::iface(&name)?;
        let ifindex = iface.index;
        let listeners = Listeners::new(ifindex)?;
        let cfg = source.discover_first(&listeners)?;
        let opts = source.opts.clone();
        let tables = classify::compile(&cfg)?;
        let mut gate = Gate::load()?;
        gate.apply(&cfg, &tables)?;
        if gate.refresh_ephemeral().is_none() {
            log::info(format_args!(
                "the ephemeral port range is unreadable: the default class looks for replies to the host's connections on every port"
            ));
        }
        gate.check_attachable(&iface.name, opts.replace)?;
        // The configured auto classes' sockets must be there.
        let mut ticker = Ticker::new(&cfg, None, true)?;
        ticker.syn_peers = Some(SynPeers::new(listeners.clone())?);
        check_napi(&iface, cfg.auto.napi)?;
        let socket = opts.socket.clone().or_else(|| cfg.socket.clone()).unwrap_or_else(|| default_socket(&iface.name));
        // Caught from before the socket is bound: a client may connect (and
        // signal) as soon as it listens.
        let signals = Some(signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM])?);
        let listener = SocketFile::bind(&socket)?;
        let metrics = cfg.metrics.map(bind_metrics).transpose()?;

        gate.attach(&iface.name, cfg.xdp_mode, opts.replace)?;
        // From here the interface is changed: a start that fails puts it back
        // as it was. Dropped, the gate detaches and puts back the program
        // --replace took off (`Gate::keep_replaced` below, once started);
        // the napi policy goes back with `napi_undo`.
        if std::env::var_os(FAIL_AFTER_ATTACH).is_some() {
            anyhow::bail!("{FAIL_AFTER_ATTACH} is set: failing after the attach (a test's fault injection)");
        }
        let cfg_napi_idle = cfg.auto.napi == NapiSched::Idle;
        let mut napi_undo = NapiUndo(None);
        if cfg_napi_idle {
            napi_undo.0 = Some(iface.clone());
            let n = apply_napi(&iface, cfg.auto.napi)?;
            log::info(format_args!("napi = {:?}: {n} napi kthread(s) of {iface} set to SCHED_IDLE", cfg.auto.napi));
        }
        // Attached: from here on the unit's capabilities are all it needs
        // (naming or taking over another XDP program, before, may need
        // CAP_SYS_ADMIN). No thread is running yet: each one started below
        // holds no more.
        let dropped = privileges::drop_to_kept()?;
        if !dropped.is_empty() {
            let kept: Vec<&str> = privileges::KEPT.iter().map(|(_, n)| *n).collect();
            log::info(format_args!(
                "privileges: kept {} (as sluice@.service grants), dropped {} others",
                kept.join(" "),
                dropped.len()
            ));
        }
        let snapshot = first_snapshot(&iface, &cfg, &gate, source.config_file());
        let publish = Publisher::new(snapshot, cfg.classes.len());
        let socket = listener.serve(publish.shared.clone());
        if let Some(server) = metrics {
            serve_metrics(server, publish.shared.clone());
        }
        log_start(&iface, &cfg, &gate, &socket, (source.config_file(), &opts.config_if_present));
        let mut decisions = decisions::Decisions::default();
        log_classes(&mut decisions, &cfg, &[]);
        if let Some(a) = &ticker.auto {
            log::info(format_args!(
                "auto ({}) controls {:?} every {} ms",
                a.algo().name(),
                a.class_names(),
                TICK.as_millis()
            ));
            if let Some(m) = a.missing() {
                log::warn(format_args!("{m}"));
            }
        }
        let known_file = known::path(opts.state_dir.as_deref().unwrap_or(Path::new(known::STATE_DIR)), &iface.name);
        let tracer = load_tracer(ifindex, &gate);
        match tracer.as_ref().map(|(t, _)| t.cpu_rx_reader()) {
            Some(Ok(r)) => ticker.read_rx_from(r),
            Some(Err(e)) => log::warn(format_args!("trace: receive work per CPU is not read: {e:#}")),
            None => log::warn(format_args!(
                "without the tracer, backlog drops and receive work on the services' CPUs are not seen: a service's own queues and drops throttle the classes below it, whatever filled them"
            )),
        }
        let sources = SourceTables::start(&gate, &cfg)?;
        let pace = Pace::new(&gate);
        let known = KnownStore::open(known_file);
        if known.pending_len() > 0 {
            // A restart: what it answers at once may be what brought it about.
            ticker.hold_learning(LEARN_HOLD_AFTER_RESTART_SECS);
            log::info(format_args!(
                "known sources kept from the last run: no class learns new clients for the first {LEARN_HOLD_AFTER_RESTART_SECS} s"
            ));
        }
        let mut daemon = Daemon {
            source,
            cfg,
            iface,
            gate,
            publish,
            socket,
            ticker,
            known,
            sources,
            steer: load_steer(&listeners),
            protect: Protection::new(cfg_napi_idle),
            service_cpus: ServiceCpus::new(listeners),
            service_cpus_failing: false,
            softirq_failing: false,
            pace,
            tracer,
            decisions,
            signals,
            watchdog: sd_notify::watchdog_enabled().map(|every| (every / 2, Instant::now())),
        };
        // Started: the program --replace took off stays off, and the napi
        // policy is Protection's to put back at the stop.
        daemon.gate.keep_replaced();
        napi_undo.0 = None;
        daemon.resteer();
        daemon.look_service_cpus();
        daemon.restore_known();
        Ok(daemon)
    }

    /// The class names in force, by class index.
    fn names(&self) -> Vec<String> {
        self.cfg.names().into_iter().map(String::from).collect()
    }

    /// Put the known sources in the gate's map for the classes in force
    /// (at start, and after a switch: see `KnownStore::restore`).
    fn restore_known(&mut self) {
        let names = self.names();
        self.known.restore(&mut self.gate, &names, self.sources.shape());
    }

    /// Every minute: the last scan's read of the known map (or a
    /// read now, before the first) to the saver's thread.
    fn offer_known(&mut self) {
        let names = self.names();
        if let Some(map) = self.sources.known_map() {
            return self.known.offer(map, &names);
        }
        match self.gate.known() {
            Ok(map) => self.known.offer(&map, &names),
            Err(e) => log::warn(format_args!("known sources: the gate's map was not read: {e:#}")),
        }
    }

    /// Run until SIGINT/SIGTERM; returns the final snapshot after detaching.
    pub fn run(mut self) -> Result<Snapshot> {
        let (tx, rx) = mpsc::channel();
        let mut signals = self.signals.take().expect("run once");
        let handle = signals.handle();
        std::thread::spawn(move || {
            for sig in signals.forever() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
        self.realtime();
        // Attached and serving: systemd's Type=notify start is done (without
        // $NOTIFY_SOCKET, nothing is sent).
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
        let looped = self.run_loop(&rx);
        handle.close();
        if let Err(e) = &looped {
            log::error(format_args!("the control loop stopped: {e:#}; detaching"));
        }
        self.stop();
        let snap = self.publish.snap.clone();
        log::info(format_args!("detached from {}", self.iface));
        looped.map(|()| snap)
    }

    /// The tick loop, until SIGINT/SIGTERM (Ok) or a failure (Err). A
    /// signal is seen within a tick (10 ms, or CALM while all is calm).
    fn run_loop(&mut self, rx: &mpsc::Receiver<i32>) -> Result<()> {
        let start = Instant::now();
        let mut next = start + TICK;
        let mut due = CADENCE.map(|(every, _, _)| start + every);
        let mut ticks = 0u64;
        loop {
            let woke = self.pace.wait(next.saturating_duration_since(Instant::now()));
            match rx.try_recv() {
                Ok(SIGHUP) => self.reload(),
                Ok(_) | Err(mpsc::TryRecvError::Disconnected) => break,
                Err(mpsc::TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            if !woke && now < next {
                continue;
            }
            self.tick(ticks)?;
            ticks += 1;
            self.pace.after_tick(&self.ticker, self.protect.holding(), &self.gate)?;
            next = next_tick(if woke { now } else { next }, Instant::now(), self.pace.interval());
            for ((fast, slow, duty), at) in CADENCE.iter().zip(due.iter_mut()) {
                if woke {
                    // Woken from calm: a duty calm slows runs now, the others at their fast period from now.
                    *at = if slow > fast { now } else { (*at).min(now + *fast) };
                }
                if now >= *at {
                    self.duty(*duty)?;
                    *at = now + if self.pace.is_calm() { *slow } else { *fast };
                    if woke && *duty == Duty::ServiceCpus {
                        // The look a wake runs judges how busy each service is from a
                        // reading that is mostly calm: the next one comes as soon as a
                        // span of the flood says something (under `conns-calm-v4` the
                        // class engaged a look later than with threads caught runnable).
                        *at = now + Duration::from_secs_f64(BUSY_MIN_SPAN_SECS);
                    }
                }
            }
        }
        Ok(())
    }

    /// Every tick: the gate's deadline, the ticker (signals, controller,
    /// budget, limits), its log lines, the steering program's heartbeat, CPU
    /// protection.
    fn tick(&mut self, tick: u64) -> Result<()> {
        let now_ns = crate::base::clock::now_ns();
        self.gate.keep_alive(now_ns);
        if let Some((every, last)) = &mut self.watchdog {
            if last.elapsed() >= *every {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                *last = Instant::now();
            }
        }
        self.ticker.tick(&mut self.gate, |m| log::warn(m))?;
        if let Some((t, _)) = &mut self.tracer {
            match t.set_softirq(self.ticker.wants_rx_cpu()) {
                Ok(()) => self.softirq_failing = false,
                Err(e) if !std::mem::replace(&mut self.softirq_failing, true) => {
                    log::warn(format_args!("trace: the receive work per CPU is not measured: {e:#}"))
                }
                Err(_) => {}
            }
        }
        self.log_decisions();
        self.publish.retry();
        if let Some((s, _)) = &mut self.steer {
            s.keep_alive(now_ns);
        }
        let distress = self.ticker.budget_status().0.is_some();
        self.protect.step(tick, distress, &self.cfg, &self.gate, &self.iface);
        Ok(())
    }

    /// One duty of the cadence table.
    fn duty(&mut self, duty: Duty) -> Result<()> {
        match duty {
            Duty::TakeScan => self.sources.take(&self.gate, self.ticker.counts_sources())?,
            Duty::Rediscover => self.rediscover(),
            Duty::Resteer => self.resteer(),
            Duty::Publish => self.refresh_stats()?,
            Duty::OfferKnown => self.offer_known(),
            Duty::Napi => self.protect.sync_napi(&self.cfg, &self.iface),
            Duty::ServiceTimes if self.ticker.judges_answers() => self.service_cpus.mark(),
            Duty::ServiceTimes => {}
            Duty::ServiceCpus => self.look_service_cpus(),
            Duty::TcpSettings => self.reread_tcp_settings(),
        }
        Ok(())
    }

    /// The namespace's TCP settings changed (an operator's sysctl): the
    /// gate's SYN-ACKs offer what they allow from now on, and it looks for
    /// replies to the host's connections in the ephemeral range now set;
    /// said once per change.
    fn reread_tcp_settings(&mut self) {
        let range = self.gate.ephemeral();
        if self.gate.refresh_ephemeral() != range {
            log::info(format_args!("the ephemeral port range is now {:?}", self.gate.ephemeral()));
        }
        if !self.gate.answers_syns() {
            return;
        }
        if let Some(allow) = self.gate.refresh_syn_allow() {
            log::info(format_args!(
                "what the gate's SYN cookies may carry changed (the namespace's TCP settings, the interface's forwarding or VLANs): {}",
                gate::describe_syn_allow(allow, self.gate.why_no_cookies())
            ));
        }
    }

    /// Everything a stop puts back, whatever ended the loop: the last
    /// statistics and known clients saved, steering detached, the napi
    /// kthreads as they were, the gate detached, the socket removed.
    fn stop(&mut self) {
        if let Err(e) = self.refresh_stats() {
            log::warn(format_args!("the last statistics were not read: {e:#}"));
        }
        let names = self.names();
        self.known.save(&self.gate, &names);
        if let Some((s, _)) = &mut self.steer {
            s.detach_all();
        }
        self.protect.restore(&self.iface);
        self.gate.detach();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// A line for each limit the tick changed, as `decisions::Decisions` allows.
    fn log_decisions(&mut self) {
        let now = Instant::now();
        for &(id, change) in &self.ticker.changes {
            let Some(c) = self.cfg.classes.get(id) else { continue };
            self.decisions.rate(now, &c.name, change).iter().for_each(log::write);
        }
        self.decisions.flush(now).iter().for_each(log::write);
    }

    /// Run the tick loop at SCHED_FIFO 1 (see `sched::realtime_thread`): a
    /// sample cut by a pre-emption would mix counters read milliseconds apart.
    fn realtime(&self) {
        if realtime_thread() {
            log::info("the control loop runs at SCHED_FIFO priority 1 (its CPU use is in `sluice status`)");
        } else {
            log::warn("could not run the control loop at SCHED_FIFO; pre-emptions may skew its samples");
        }
    }

    /// Where each class's service runs now, handed to the ticker. A failed
    /// look leaves no CPU known (the CPU signal then says nothing, the queues still do).
    pub(super) fn look_service_cpus(&mut self) {
        match self.service_cpus.look(&self.cfg, self.ticker.judges_answers()) {
            Ok(loads) => {
                self.ticker.set_service_loads(loads);
                self.service_cpus_failing = false;
            }
            Err(e) => {
                self.ticker.set_service_loads(vec![]);
                if !std::mem::replace(&mut self.service_cpus_failing, true) {
                    log::warn(format_args!("where the services run is not known (the CPU signal is off): {e:#}"));
                }
            }
        }
    }

    /// Steer the reuseport groups the config in force asks for (see `steer`).
    fn resteer(&mut self) {
        let Some((steer, finder)) = &mut self.steer else { return };
        steer.keep_alive(crate::base::clock::now_ns());
        match finder.groups(&self.cfg) {
            Ok(groups) => {
                for line in steer.sync(&groups) {
                    if line.contains("not steered") {
                        finder.rescan();
                    }
                    log::info(format_args!("{line}"));
                }
            }
            Err(e) => log::warn(format_args!("steer: looking for reuseport groups failed: {e:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_an_overrun_the_tick_resynchronises_instead_of_catching_up() {
        let t0 = Instant::now();
        assert_eq!(next_tick(t0, t0, TICK), t0 + TICK, "on time: a tick later");
        assert_eq!(next_tick(t0, t0 + TICK / 2, TICK), t0 + TICK, "a little late: the schedule holds");
        let late = t0 + 5 * TICK;
        assert_eq!(next_tick(t0, late, TICK), late, "four ticks missed: one tick now, not five back to back");
        assert_eq!(next_tick(late, late, TICK), late + TICK);
    }
}
