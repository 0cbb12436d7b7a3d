//! What a start sets up beside the gate and the tick: the drop counter
//! (the tracer), reader steering, the undo of the napi policy if the start
//! fails, and the start's log lines. Each part the kernel refuses is said
//! in the log and left off; the daemon runs without it.
use super::*;

/// The napi kthreads of an interface a start put at SCHED_IDLE: put back
/// if the start fails after all (dropped while it still names one).
pub(super) struct NapiUndo(pub(super) Option<Iface>);

impl Drop for NapiUndo {
    fn drop(&mut self) {
        if let Some(iface) = self.0.take() {
            Protection::new(true).restore(&iface);
        }
    }
}

/// The reader steering, or None with a log line saying why not.
pub(super) fn load_steer(listeners: &Listeners) -> Option<(Steer, steer::Finder)> {
    match Steer::load().map(|s| (s, steer::Finder::new(listeners.clone()))) {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn(format_args!("steer: reader steering is off, the kernel's hash stays: {e:#}"));
            None
        }
    }
}

/// This process's id as the kernel's BPF helpers see it (the root PID
/// namespace): None inside a PID namespace of its own (NSpid lists more than
/// one id), where the softirq time it is charged is then not separated.
fn root_pid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let ids: Vec<&str> = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().collect();
    match ids[..] {
        [one] => one.parse().ok(),
        _ => None,
    }
}

/// The drop counter (kfree_skb) for the per-reason drops in status, or None
/// with a log line saying why not.
pub(super) fn load_tracer(ifindex: u32, gate: &Gate) -> Option<(Tracer, DropBook)> {
    let start = || {
        let opts = trace::Options {
            ifindex,
            netns: crate::base::netns::current_inode()?,
            default_class: 0,
            drops_only: true,
            tgid: root_pid(),
        };
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

/// The start's log lines: where the gate is attached, the config file, observe mode.
pub(super) fn log_start(
    iface: &Iface,
    cfg: &Config,
    gate: &Gate,
    socket: &Path,
    file: (Option<PathBuf>, &Option<PathBuf>),
) {
    log::info(format_args!(
        "gate attached to {iface} ({:?} mode, prog id {}), {} classes; stats on {}{}",
        cfg.xdp_mode,
        gate.prog_id(),
        cfg.classes.len(),
        socket.display(),
        cfg.metrics.map(|a| format!(", metrics on http://{a}/metrics")).unwrap_or_default()
    ));
    log::info(match file {
        (Some(f), _) => format!("config file: {}", f.display()),
        (None, Some(f)) => format!("config file: none ({} does not exist)", f.display()),
        (None, None) => "config file: none".into(),
    });
    if cfg.observe {
        log::info(format_args!("observe mode: every verdict is counted, nothing is dropped"));
    }
    if gate.answers_syns() && gate.syn_allow() != gate::syn_allow_all() {
        log::info(format_args!("SYN cookies: {}", gate::describe_syn_allow(gate.syn_allow(), gate.why_no_cookies())));
    }
}
