//! Where the daemon's config comes from, and how a new one comes into force.
//!
//! `ConfigSource` owns the command line's options, the config resolved from
//! the file and flags (the base) and discovery: at the start, every second
//! (`rediscover`) and at SIGHUP (`reload`) it says what the config should be.
//! `Daemon::switch_to` puts one in force: the gate first (which switches to
//! it in one write, or not at all), then every part that keeps state per
//! class index, through one `ClassRemap`. A reload that is refused leaves everything as it was,
//! discovery included.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::base::iface::Iface;
use crate::base::log;
use crate::daemon::tick::Ticker;
use crate::dataplane::classify::{self, Tables};
use crate::dataplane::gate;
use crate::policy::config::{self, Config};
use crate::policy::remap::ClassRemap;
use crate::signals::discover::{self, Discovery, Listeners};

use super::{Daemon, RunOpts};

/// The command line's options, the resolved config before discovery, and discovery.
pub(super) struct ConfigSource {
    pub opts: RunOpts,
    base: Config,
    discovery: Option<Discovery>,
    /// The listeners' reading the daemon's parts share (set by `discover_first`).
    listeners: Option<Listeners>,
    /// Polls of the services that failed (logged at the 1st, 2nd, 4th, ...).
    errors: u64,
}

/// A reload read and checked, not in force yet.
pub(super) struct Candidate {
    base: Config,
    /// Discovery turned on by the reload (kept only once the reload is in force).
    fresh: Option<Discovery>,
    pub cfg: Config,
    pub tables: Tables,
}

impl ConfigSource {
    /// Resolve the config (file, flags) and the interface it is for.
    pub fn new(opts: RunOpts) -> Result<(ConfigSource, String)> {
        let base = resolve(&opts)?;
        let iface = opts
            .iface
            .clone()
            .or_else(|| base.interface.clone())
            .context("no interface: pass --iface IFACE or set interface = \"...\" in the config file")?;
        Ok((ConfigSource { opts, base, discovery: None, listeners: None, errors: 0 }, iface))
    }

    /// The config to start with: the base, plus the services `listeners`
    /// finds (kept: a reload that turns discovery on reads them too).
    pub fn discover_first(&mut self, listeners: &Listeners) -> Result<Config> {
        self.listeners = Some(listeners.clone());
        if !self.base.discover {
            return Ok(self.base.clone());
        }
        let d = self.discovery.insert(Discovery::sharing(listeners.clone()));
        discovered(&self.base, d)
    }

    /// The config file read now, if any.
    pub fn config_file(&self) -> Option<PathBuf> {
        config_file(&self.opts)
    }

    /// Look for the services again: the config if its class list differs
    /// from `current`'s (None: the same, or the look failed, said in the log).
    pub fn rediscover(&mut self, current: &Config) -> Option<Config> {
        let d = self.discovery.as_mut()?;
        match discovered(&self.base, d) {
            Ok(cfg) if cfg.classes != current.classes => Some(cfg),
            Ok(_) => None,
            Err(e) => {
                self.errors += 1;
                if self.errors.is_power_of_two() {
                    log::warn(format_args!(
                        "discover: looking for services failed ({} times so far): {e:#}",
                        self.errors
                    ));
                }
                None
            }
        }
    }

    /// Read the config again for a reload of the gate on `iface` running `current`.
    pub fn reload(&mut self, iface: &Iface, current: &Config) -> Result<Candidate> {
        let base = resolve(&self.opts)?;
        if let Some(i) = &base.interface {
            if self.opts.iface.is_none() && *i != iface.name {
                bail!("the config moves the gate from {iface} to {i}; restart sluice to change the interface");
            }
        }
        if base.xdp_mode != current.xdp_mode {
            bail!("xdp_mode changed; restart sluice to change the attach mode");
        }
        let tables = classify::compile(&base)?;
        // Discovery follows the new config only once it is in force: a
        // refused reload leaves it as it was.
        let mut fresh = match (base.discover, &self.discovery) {
            (true, None) => Some(match &self.listeners {
                Some(l) => Discovery::sharing(l.clone()),
                None => Discovery::new(iface.index)?,
            }),
            _ => None,
        };
        let cfg = match fresh.as_mut().or(self.discovery.as_mut()) {
            Some(d) if base.discover => discovered(&base, d)?,
            _ => base.clone(),
        };
        let tables = if cfg.classes == base.classes { tables } else { classify::compile(&cfg)? };
        Ok(Candidate { base, fresh, cfg, tables })
    }

    /// The reload `c` is in force: keep its base and discovery.
    pub fn commit(&mut self, c: Candidate) {
        if !c.base.discover {
            self.discovery = None;
        } else if c.fresh.is_some() {
            self.discovery = c.fresh;
        }
        self.base = c.base;
    }
}

impl Daemon {
    /// Look for the services again; if the class list changed, switch to it.
    pub(super) fn rediscover(&mut self) {
        let Some(cfg) = self.source.rediscover(&self.cfg) else { return };
        let result = classify::compile(&cfg).map_err(anyhow::Error::from).and_then(|t| self.switch_to(cfg, &t, false));
        if let Err(e) = result {
            log::warn(format_args!("discover: the new class list was refused, the previous one stays: {e:#}"));
        }
    }

    /// SIGHUP: re-read the config; a bad one is refused and the old one stays.
    pub(super) fn reload(&mut self) {
        let result = self.source.reload(&self.iface, &self.cfg).and_then(|c| {
            self.switch_to(c.cfg.clone(), &c.tables, true)?;
            Ok(c)
        });
        let error = match result {
            Ok(c) => {
                self.source.commit(c);
                log::info(format_args!("reloaded the config: {} classes", self.cfg.classes.len()));
                None
            }
            Err(e) => {
                // Only a failure after the switch leaves the new config in force.
                if matches!(e.downcast_ref::<gate::GateError>(), Some(gate::GateError::AfterSwitch(_))) {
                    log::warn(format_args!("reload failed: {e:#}"));
                } else {
                    log::warn(format_args!("reload refused, the previous config stays active: {e:#}"));
                }
                Some(format!("{e:#}"))
            }
        };
        let snap = &mut self.publish.snap;
        if error.is_none() {
            snap.reloads += 1;
            // /etc/sluice/IFACE.toml may have appeared or gone since the start.
            snap.config_file = self.source.config_file().map(|p| p.display().to_string());
        }
        snap.last_reload_error = error;
        self.publish.publish();
    }

    /// Put `cfg` in force: the gate's tables (a class keeps its gate id, and
    /// so its state, by name), the tick (control state kept by name), the
    /// statistics. What can fail comes before the gate's apply (which leaves
    /// the previous config in force when it fails before its switch): once
    /// the gate has the new config, so does the daemon.
    pub(super) fn switch_to(&mut self, cfg: Config, tables: &Tables, require_sockets: bool) -> Result<()> {
        // The new auto classes' sockets must be found before anything changes.
        let mut ticker = Ticker::new(&cfg, None, require_sockets)?;
        // Class indexes move with the list: take every class back first; the
        // next tick sends away again (a refused apply then costs only that).
        self.protect.take_back(&self.gate)?;
        self.gate.apply(&cfg, tables)?;
        let old = std::mem::replace(&mut self.cfg, cfg);
        let remap = ClassRemap::of(&old, &self.cfg);
        log_classes(&mut self.decisions, &self.cfg, &old.classes);
        self.sources.follow(&self.cfg, &self.gate);
        self.pace.fast();
        self.restore_known();
        ticker.carry_from(std::mem::replace(&mut self.ticker, Ticker::idle()), &remap);
        self.ticker = ticker;
        // Class indexes moved: where the services run is looked up again now, not a second later.
        self.look_service_cpus();
        self.publish.follow(&remap, super::status::gate_snapshots(&self.cfg, &self.gate));
        self.publish.snap.observe = self.cfg.observe;
        Ok(())
    }
}

/// Resolve the config the daemon runs, with the command line's overrides.
fn resolve(opts: &RunOpts) -> Result<Config> {
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

/// Log the classes that `cfg` adds to `old` and those it removes (decision
/// lines: a churning service cannot flood the log).
pub(super) fn log_classes(decisions: &mut super::decisions::Decisions, cfg: &Config, old: &[config::Class]) {
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
