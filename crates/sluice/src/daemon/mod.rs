//! `sluice run`: load and attach the gate, keep per-CPU shares in step with
//! arrivals, serve statistics (Unix socket + Prometheus), reload on SIGHUP,
//! detach and print totals on SIGINT/SIGTERM.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::classify;
use crate::client::default_socket;
use crate::config::{self, Config, NapiSched, XdpMode};
use crate::discover::{self, Discovery};
use crate::gate::{self, Clock, Gate};
use crate::known;
use crate::log;
use crate::remap::ClassRemap;
use crate::sched::{apply_napi, check_napi, realtime_thread};
use crate::stats::{class_snapshots, GlobalTotals, Snapshot, SNAPSHOT_VERSION};
use crate::steer::{self, Steer};
use crate::syn_guard;
use crate::tick::Ticker;
use crate::trace::{self, DropBook, Tracer};
use known_store::KnownStore;
use protect::Protection;
use publish::{bind_metrics, serve_metrics, Publisher, SocketFile};
use source_scan::SourceTables;

mod known_store;
mod protect;
mod publish;
pub mod source_scan;

/// Where `sluice run --iface IFACE` looks for IFACE.toml when no --config is given.
pub const CONFIG_DIR: &str = "/etc/sluice";
/// How often the daemon runs the auto controller and re-splits limited
/// classes' rates over CPUs: traffic that moves to another CPU (a migrating
/// sender on veth, an RSS change) finds only a small share there for up to
/// one tick.
pub const TICK: Duration = crate::controller::TICK;
/// Statistics are refreshed every this many ticks (100 ms).
const STATS_EVERY: u64 = 10;
/// The napi kthreads' policy is re-applied this often (re-attaching XDP or
/// toggling threaded mode re-creates them).
const NAPI_EVERY: u64 = 100;
/// The listening services are looked for again this often (1 s).
const DISCOVER_EVERY: u64 = 100;

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

/// Resolve the config the daemon runs, with the command line's overrides.
fn resolve_config(opts: &RunOpts) -> Result<Config> {
    let mut cfg = config::resolve(config_file(opts).as_deref(), &opts.classes)?;
    if let Some(m) = opts.xdp_mode {
        cfg.xdp_mode = m;
    }
    if let Some(m) = opts.metrics {
        cfg.metrics = m;
    }
    cfg.discover &= !opts.no_discover;
    cfg.observe |= opts.observe;
    Ok(cfg)
}

/// The config file the daemon reads now, if any.
fn config_file(opts: &RunOpts) -> Option<PathBuf> {
    opts.config.clone().or_else(|| opts.config_if_present.clone().filter(|p| p.exists()))
}

/// The reader steering, or None with a log line saying why not.
fn load_steer(ifindex: u32) -> Option<(Steer, steer::Finder)> {
    match Steer::load().and_then(|s| Ok((s, steer::Finder::new(ifindex)?))) {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn(format_args!("steer: reader steering is off, the kernel's hash stays: {e:#}"));
            None
        }
    }
}

/// The drop counter (kfree_skb) for the per-reason drops in status, or None
/// with a log line saying why not.
fn load_tracer(ifindex: u32, gate: &Gate) -> Option<(Tracer, DropBook)> {
    let start = || {
        let opts =
            trace::Options { ifindex, netns: crate::netns::current_inode()?, default_class: 0, drops_only: true };
        Tracer::start(&opts, trace::Tables::Gate(gate.shared_maps()?))
    };
    match start() {
        Ok(t) => Some((t, DropBook::default())),
        Err(e) => {
            log::warn(format_args!("trace: drops after the gate are not counted: {e:#}"));
            None
        }
    }
}

/// Look for the services and merge a class for each into `base`; log what
/// merging had to do.
fn discovered(base: &Config, d: &mut Discovery) -> Result<Config> {
    let (cfg, note) = discover::merge(base, &d.poll()?);
    if note.grouped {
        log::info(format_args!(
            "discover: more services than free class slots; services share classes (see `sluice status`)"
        ));
    }
    if note.unplaced > 0 {
        log::warn(format_args!(
            "discover: {} services have no class slot left and go to the default class",
            note.unplaced
        ));
    }
    Ok(cfg)
}

pub struct Daemon {
    opts: RunOpts,
    /// The config as resolved from the file and flags, before discovery.
    base: Config,
    /// The config in force: `base` plus a class per discovered service.
    cfg: Config,
    discovery: Option<Discovery>,
    /// Polls of the services that failed.
    discover_errors: u64,
    iface: String,
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
    /// The kernel's drops after the gate (kfree_skb), booked by class name.
    tracer: Option<(Tracer, DropBook)>,
    /// Which rate and class changes get a log line (rate-limited).
    decisions: log::Decisions,
    /// SIGHUP, SIGINT and SIGTERM, caught from before the statistics socket
    /// answers (a signal sent as soon as it does stops the daemon cleanly).
    signals: Option<signal_hook::iterator::Signals>,
}

/// The known sources are written to their state file this often (60 s), and on exit.
const SAVE_EVERY: u64 = 6000;

/// When the tick after one due at `last` runs: a TICK later, or `now` if
/// the loop fell a whole tick behind (a stall, an overrun). Missed ticks are
/// skipped, not run back to back: the controller, the budget and fairness
/// all take a tick to be TICK long.
fn next_tick(last: Instant, now: Instant) -> Instant {
    let next = last + TICK;
    if now >= next + TICK {
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
        let base = resolve_config(&opts)?;
        let iface = opts
            .iface
            .clone()
            .or_else(|| base.interface.clone())
            .context("no interface: pass --iface IFACE or set interface = \"...\" in the config file")?;
        gate::check_privileges()?;
        let ifindex = gate::ifindex(&iface)?;
        let mut discovery = if base.discover { Some(Discovery::new(ifindex)?) } else { None };
        let cfg = match &mut discovery {
            Some(d) => discovered(&base, d)?,
            None => base.clone(),
        };
        let tables = classify::compile(&cfg)?;
        let mut gate = Gate::load()?;
        gate.apply(&cfg, &tables)?;
        gate.check_attachable(&iface, opts.replace)?;
        // The configured auto classes' sockets must be there.
        let ticker = Ticker::new(&cfg, None, true)?;
        check_napi(&iface, cfg.auto.napi)?;
        let socket = opts.socket.clone().or_else(|| cfg.socket.clone()).unwrap_or_else(|| default_socket(&iface));
        // Caught from before the socket is bound: a client may connect (and
        // signal) as soon as it listens.
        let signals = Some(signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM])?);
        let listener = SocketFile::bind(&socket)?;
        let metrics = cfg.metrics.map(bind_metrics).transpose()?;

        gate.attach(&iface, cfg.xdp_mode, opts.replace)?;
        let cfg_napi_idle = cfg.auto.napi == NapiSched::Idle;
        if cfg_napi_idle {
            let n = apply_napi(&iface, cfg.auto.napi)?;
            log::info(format_args!("napi = {:?}: {n} napi kthread(s) of {iface} set to SCHED_IDLE", cfg.auto.napi));
        }
        let snapshot = Snapshot {
            version: SNAPSHOT_VERSION,
            interface: iface.clone(),
            ifindex,
            xdp_mode: format!("{:?}", cfg.xdp_mode).to_lowercase(),
            prog_id: gate.prog_id(),
            pid: std::process::id(),
            uptime_secs: 0.0,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            config_file: config_file(&opts).map(|p| p.display().to_string()),
            reloads: 0,
            last_reload_error: None,
            classes: class_snapshots(&cfg),
            global: GlobalTotals::default(),
            daemon_cpu_secs: 0.0,
            daemon_cpu_pct: 0.0,
            daemon_rss_bytes: None,
            discover: cfg.discover,
            observe: cfg.observe,
            distress: None,
            signals_unreadable: None,
            sources: Default::default(),
            readers: vec![],
            cpu_away: None,
            attached: true,
        };
        let publish = Publisher::new(snapshot, cfg.classes.len());
        let socket = listener.serve(publish.shared.clone());
        if let Some(server) = metrics {
            serve_metrics(server, publish.shared.clone());
        }
        log::info(format_args!(
            "gate attached to {iface} ({:?} mode, prog id {}), {} classes; stats on {}{}",
            cfg.xdp_mode,
            gate.prog_id(),
            cfg.classes.len(),
            socket.display(),
            cfg.metrics.map(|a| format!(", metrics on http://{a}/metrics")).unwrap_or_default()
        ));
        log::info(match (config_file(&opts), &opts.config_if_present) {
            (Some(f), _) => format!("config file: {}", f.display()),
            (None, Some(f)) => format!("config file: none ({} does not exist)", f.display()),
            (None, None) => "config file: none".into(),
        });
        if cfg.observe {
            log::info(format_args!("observe mode: every verdict is counted, nothing is dropped"));
        }
        let mut decisions = log::Decisions::default();
        log_classes(&mut decisions, &cfg, &[]);
        if let Some(a) = &ticker.auto {
            log::info(format_args!(
                "auto ({}) controls {:?} every {} ms",
                a.algo().name(),
                a.class_names(),
                TICK.as_millis()
            ));
        }
        let known_file = known::path(opts.state_dir.as_deref().unwrap_or(Path::new(known::STATE_DIR)), &iface);
        let tracer = load_tracer(ifindex, &gate);
        let sources = SourceTables::start(&gate, &cfg)?;
        let mut daemon = Daemon {
            opts,
            base,
            cfg,
            discovery,
            discover_errors: 0,
            iface,
            gate,
            publish,
            socket,
            ticker,
            known: KnownStore::open(known_file),
            sources,
            steer: load_steer(ifindex),
            protect: Protection::new(cfg_napi_idle),
            tracer,
            decisions,
            signals,
        };
        daemon.resteer();
        daemon.restore_known(None);
        Ok(daemon)
    }

    /// The class names in force, by id.
    fn names(&self) -> Vec<String> {
        self.cfg.classes.iter().map(|c| c.name.clone()).collect()
    }

    /// Put the known sources in the gate's map for the classes in force
    /// (`old_names`: the class list before a switch).
    fn restore_known(&mut self, old_names: Option<&[String]>) {
        let names = self.names();
        self.known.restore(&self.gate, &names, old_names, self.sources.shape());
    }

    /// Every SAVE_EVERY ticks: the last scan's read of the known map (or a
    /// read now, before the first) to the saver's thread.
    fn offer_known(&mut self) {
        let read = match self.sources.known_map() {
            Some(m) => Ok(m.to_vec()),
            None => self.gate.known(),
        };
        match read {
            Ok(map) => self.known.offer(&map, &self.names()),
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
        let looped = self.run_loop(&rx);
        handle.close();
        if let Err(e) = &looped {
            log::error(format_args!("the control loop stopped: {e:#}; detaching"));
        }
        self.stop();
        let snap = self.publish.snapshot().snapshot.lock().unwrap().clone();
        log::info(format_args!("detached from {}", self.iface));
        looped.map(|()| snap)
    }

    /// The tick loop, until SIGINT/SIGTERM (Ok) or a failure (Err).
    fn run_loop(&mut self, rx: &mpsc::Receiver<i32>) -> Result<()> {
        let mut next = Instant::now();
        let mut ticks = 0u64;
        loop {
            next = next_tick(next, Instant::now());
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(SIGHUP) => self.reload(),
                Ok(_) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            self.ticker.tick(&mut self.gate, |m| log::warn(m))?;
            self.log_decisions();
            if let Some((s, _)) = &mut self.steer {
                s.keep_alive(Clock::now_ns());
            }
            let distress = self.ticker.budget_status().0.is_some();
            self.protect.step(ticks, distress, &self.cfg, &self.gate, &self.iface);
            ticks += 1;
            if ticks.is_multiple_of(DISCOVER_EVERY) {
                self.rediscover();
                self.resteer();
            }
            self.sources.take(&self.gate)?;
            if ticks.is_multiple_of(STATS_EVERY) {
                self.refresh_stats()?;
            }
            if ticks.is_multiple_of(SAVE_EVERY) {
                self.offer_known();
            }
            if ticks.is_multiple_of(NAPI_EVERY) {
                self.protect.sync_napi(&self.cfg, &self.iface);
            }
        }
        Ok(())
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

    /// A line for each limit the tick changed, as `log::Decisions` allows.
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

    /// Steer the reuseport groups the config in force asks for (see `steer`).
    fn resteer(&mut self) {
        let Some((steer, finder)) = &mut self.steer else { return };
        steer.keep_alive(Clock::now_ns());
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

    /// Look for the services again; if the class list changed, switch to it.
    fn rediscover(&mut self) {
        let Some(d) = &mut self.discovery else { return };
        let cfg = match discovered(&self.base, d) {
            Ok(cfg) => cfg,
            Err(e) => {
                self.discover_errors += 1;
                if self.discover_errors.is_power_of_two() {
                    log::warn(format_args!(
                        "discover: looking for services failed ({} times so far): {e:#}",
                        self.discover_errors
                    ));
                }
                return;
            }
        };
        if cfg.classes == self.cfg.classes {
            return;
        }
        let result = classify::compile(&cfg).map_err(anyhow::Error::from).and_then(|t| self.switch_to(cfg, &t, false));
        if let Err(e) = result {
            log::warn(format_args!("discover: the new class list was refused, the previous one stays: {e:#}"));
        }
    }

    /// Put `cfg` in force: the gate's tables (class state kept by name), the
    /// tick (control state kept by name), the statistics. What can fail comes
    /// before the gate's apply (which rolls itself back): once the gate has
    /// the new config, so does the daemon.
    fn switch_to(&mut self, cfg: Config, tables: &classify::Tables, require_sockets: bool) -> Result<()> {
        // The new auto classes' sockets must be found before anything changes.
        let mut ticker = Ticker::new(&cfg, None, require_sockets)?;
        // Class ids move with the list: take every class back first; the
        // next tick sends away again (a refused apply then costs only that).
        self.protect.take_back(&self.gate)?;
        self.gate.apply(&cfg, tables)?;
        let old = std::mem::replace(&mut self.cfg, cfg);
        let remap = ClassRemap::of(&old, &self.cfg);
        log_classes(&mut self.decisions, &self.cfg, &old.classes);
        let old_names: Vec<String> = old.classes.iter().map(|c| c.name.clone()).collect();
        self.sources.follow(&self.cfg, &self.gate);
        self.restore_known(Some(&old_names));
        ticker.carry_from(std::mem::replace(&mut self.ticker, Ticker::idle()), &remap);
        self.ticker = ticker;
        self.publish.follow(&remap, class_snapshots(&self.cfg));
        self.publish.snapshot().snapshot.lock().unwrap().observe = self.cfg.observe;
        Ok(())
    }

    /// Read the counters into the served snapshot.
    fn refresh_stats(&mut self) -> Result<()> {
        self.publish.counters(&self.gate)?;
        let shared = self.publish.snapshot();
        let mut snap = shared.snapshot.lock().unwrap();
        if let Some(a) = &self.ticker.auto {
            for (id, st) in a.status() {
                snap.classes[id].auto = Some(st);
            }
        }
        let (distress, throttles) = self.ticker.budget_status();
        snap.distress = distress.map(|(p, why)| format!("priority {p}: {why}"));
        let w = &self.ticker.signals;
        snap.signals_unreadable = w.stale_secs().zip(w.last_error.clone());
        for (c, t) in snap.classes.iter_mut().zip(throttles.iter().chain(std::iter::repeat(&None))) {
            c.throttle_pps = *t;
        }
        for ((c, d), h) in snap.classes.iter_mut().zip(self.ticker.distress_secs()).zip(self.ticker.dropped_with_room())
        {
            (c.distress_secs, c.dropped_with_room_pkts) = (d, h);
        }
        for (c, g) in snap.classes.iter_mut().zip(self.ticker.syn.status(self.gate.answers_syns())) {
            c.syn_guard = g;
        }
        let attached = gate::attached_prog_id(snap.ifindex as i32) == Some(snap.prog_id);
        if snap.attached && !attached {
            log::error(format_args!(
                "the gate (prog id {}) is no longer attached to {}: nothing is protected; restart sluice",
                snap.prog_id, self.iface
            ));
        }
        snap.attached = attached;
        self.sources.fill(&mut snap, &self.ticker.fair_status(), self.gate.sources_capacity());
        snap.readers = self.steer.as_ref().map(|(s, _)| s.status()).unwrap_or_default();
        snap.cpu_away = self.protect.describe(&self.cfg, &self.iface);
        if let Some((t, book)) = &mut self.tracer {
            let names: Vec<String> = self.cfg.classes.iter().map(|c| c.name.clone()).collect();
            book.update(t, &names)?;
            let mut strays = Vec::new();
            for c in snap.classes.iter_mut() {
                c.kernel_drops = book.of(t, &c.name);
                let stray = c.kernel_drops.iter().filter(|d| syn_guard::STRAY_REASONS.contains(&d.reason.as_str()));
                strays.push((c.name.clone(), stray.map(|d| d.packets).sum()));
            }
            self.ticker.syn.kernel_strays(&strays, std::time::Instant::now());
        }
        Ok(())
    }

    /// SIGHUP: re-read the config; a bad one is refused and the old one stays.
    fn reload(&mut self) {
        let result = (|| -> Result<(Config, classify::Tables)> {
            let cfg = resolve_config(&self.opts)?;
            if let Some(i) = &cfg.interface {
                if self.opts.iface.is_none() && i != &self.iface {
                    bail!(
                        "the config moves the gate from {} to {i}; restart sluice to change the interface",
                        self.iface
                    );
                }
            }
            if cfg.xdp_mode != self.cfg.xdp_mode {
                bail!("xdp_mode changed; restart sluice to change the attach mode");
            }
            let tables = classify::compile(&cfg)?;
            Ok((cfg, tables))
        })();
        let mut snap_err = None;
        match result.and_then(|(base, tables)| {
            // Discovery follows the new config only once it is in force: a
            // refused reload leaves it as it was.
            let mut fresh = match (base.discover, &self.discovery) {
                (true, None) => Some(Discovery::new(gate::ifindex(&self.iface)?)?),
                _ => None,
            };
            let cfg = match fresh.as_mut().or(self.discovery.as_mut()) {
                Some(d) if base.discover => discovered(&base, d)?,
                _ => base.clone(),
            };
            let tables = if cfg.classes == base.classes { tables } else { classify::compile(&cfg)? };
            self.switch_to(cfg, &tables, true)?;
            if !base.discover {
                self.discovery = None;
            } else if fresh.is_some() {
                self.discovery = fresh;
            }
            self.base = base;
            Ok(())
        }) {
            Ok(()) => {
                log::info(format_args!("reloaded the config: {} classes", self.cfg.classes.len()));
            }
            Err(e) => {
                // Only a rollback that failed too leaves anything but the previous config.
                if matches!(e.downcast_ref::<gate::GateError>(), Some(gate::GateError::RollbackFailed { .. })) {
                    log::warn(format_args!("reload failed: {e:#}"));
                } else {
                    log::warn(format_args!("reload refused, the previous config stays active: {e:#}"));
                }
                snap_err = Some(format!("{e:#}"));
            }
        }
        let shared = self.publish.snapshot();
        let mut snap = shared.snapshot.lock().unwrap();
        if snap_err.is_none() {
            snap.reloads += 1;
            // /etc/sluice/IFACE.toml may have appeared or gone since the start.
            snap.config_file = config_file(&self.opts).map(|p| p.display().to_string());
        }
        snap.last_reload_error = snap_err;
    }
}

/// Log the classes that `cfg` adds to `old` and those it removes (decision
/// lines: a churning service cannot flood the log).
fn log_classes(decisions: &mut log::Decisions, cfg: &Config, old: &[config::Class]) {
    let now = Instant::now();
    let mut lines = Vec::new();
    for c in cfg.classes.iter().filter(|c| !old.iter().any(|o| o.name == c.name)) {
        let (what, msg) = match &c.discovered {
            Some(why) => ("discovered", format!("class {} (priority {}): discovered; {why}", c.name, c.priority)),
            None if !old.is_empty() => ("added", format!("class {} (priority {}) added", c.name, c.priority)),
            None => continue,
        };
        if old.is_empty() {
            // The classes at start: all of them, unlimited.
            log::info(msg);
        } else {
            lines.extend(decisions.class(now, &c.name, what, msg));
        }
    }
    for o in old.iter().filter(|o| !cfg.classes.iter().any(|c| c.name == o.name)) {
        lines.extend(decisions.class(now, &o.name, "removed", format!("class {} removed", o.name)));
    }
    lines.iter().for_each(log::write);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_an_overrun_the_tick_resynchronises_instead_of_catching_up() {
        let t0 = Instant::now();
        assert_eq!(next_tick(t0, t0), t0 + TICK, "on time: a tick later");
        assert_eq!(next_tick(t0, t0 + TICK / 2), t0 + TICK, "a little late: the schedule holds");
        let late = t0 + 5 * TICK;
        assert_eq!(next_tick(t0, late), late, "four ticks missed: one tick now, not five back to back");
        assert_eq!(next_tick(late, late), late + TICK);
    }
}
