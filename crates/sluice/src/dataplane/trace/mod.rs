//! `sluice trace`: where every packet of a class goes after the gate, and how
//! long each receive stage holds it (the capture-cost study), from tracepoints only.
//!
//! The BPF side is `bpf/trace.bpf.c` (its top comment lists the stages and
//! tracepoints). This module loads it, shares the gate's class tables when a
//! gate is attached (so a packet has the same class at every stage), reads the
//! counts, and hands them to [`fate`] for the ledger and latency figures. The
//! daemon uses [`Tracer`] too, with only the drop counter attached, for the
//! per-reason drops in `sluice status` and /metrics.
pub mod fate;

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle};

use crate::bpf_intf::{
    sluice_class_state, sluice_cpu_rx, sluice_latency, SLUICE_CLASS_IDS, SLUICE_IV_NR, SLUICE_STAGE_NR,
    SLUICE_TRACE_CLASSES, SLUICE_TRACE_UNCLASSIFIED,
};
use crate::dataplane::gate::counters::ClassTotals;
use crate::dataplane::gate::{bytes_of, from_bytes, Owned};
use crate::trace_skel::{TraceSkel, TraceSkelBuilder};
use fate::{ClassFate, Drop, GateCounts, Interval, LatencySums, Report, StageCounts, INTERVALS, REPORT_VERSION};

/// The class tables the tracer looks packets up in.
pub enum Tables<'a> {
    /// The maps of an attached gate, by name (`gate_maps` finds them from the
    /// program's id; the daemon passes its own, which needs no CAP_SYS_ADMIN).
    Gate(BTreeMap<String, MapHandle>),
    /// A copy compiled here (no gate attached): classes as the daemon would make them.
    Own(&'a crate::dataplane::classify::Tables),
}

/// What to trace.
pub struct Options {
    /// The traced interface, and the inode of its network namespace.
    pub ifindex: u32,
    pub netns: u64,
    /// Default class (the config's), for packets no cell names.
    pub default_class: u32,
    /// Attach only the drop counter (the daemon), not the stages and latency.
    pub drops_only: bool,
    /// With `drops_only`: the daemon's process id in the root PID namespace,
    /// whose softirq time to count (`softirq_secs`); None: not counted. The
    /// receive work per CPU (`cpu_rx`) is counted with `drops_only` either way.
    pub tgid: Option<u32>,
}

/// Raw counts since the tracer started, summed over CPUs.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// Per class id (0..=SLUICE_CLASS_IDS, the last = unclassified): packets in per stage.
    pub stage_in: Vec<[u64; SLUICE_STAGE_NR as usize]>,
    /// (class, drop reason value) -> packets.
    pub drops: BTreeMap<(u32, u32), u64>,
    /// Per class: sums per interval.
    pub latency: Vec<Vec<LatencySums>>,
}

/// The loaded tracer; its programs detach when it is dropped.
pub struct Tracer {
    skel: Owned<TraceSkel<'static>>,
    links: Vec<Link>,
    /// The softirq pair's links while attached (`set_softirq`).
    softirq_links: Option<Vec<Link>>,
    /// The gate's maps by name, when the tracer shares them (Tables::Gate).
    gate: Option<BTreeMap<String, MapHandle>>,
    /// `enum skb_drop_reason` names by value, prefix removed.
    reasons: Vec<String>,
}

/// The kernel's drop reason names (`enum skb_drop_reason` in its BTF), by value,
/// without the SKB_DROP_REASON_ / SKB_ prefix.
pub fn drop_reason_names() -> Result<Vec<String>> {
    use libbpf_rs::btf::{types::Enum, Btf};
    let btf = Btf::from_vmlinux().context("reading the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
    let e: Enum = btf.type_by_name("skb_drop_reason").context("this kernel's BTF has no enum skb_drop_reason")?;
    let mut names = Vec::new();
    for m in e.iter() {
        let (Some(name), Ok(v)) = (m.name, usize::try_from(m.value)) else { continue };
        let name = name.to_string_lossy();
        let short = name.strip_prefix("SKB_DROP_REASON_").or_else(|| name.strip_prefix("SKB_")).unwrap_or(&name);
        if v < 4096 {
            if names.len() <= v {
                names.resize(v + 1, String::new());
            }
            names[v] = short.to_string();
        }
    }
    Ok(names)
}

/// The gate program's maps, by name (cells, tables_gen, prefix_v4, prefix_v6, class_state).
/// Opening a map by id needs CAP_SYS_ADMIN.
pub fn gate_maps(prog_id: u32) -> Result<BTreeMap<String, MapHandle>> {
    use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
    let opts = ProgInfoQueryOptions::default().include_map_ids(true);
    let Some(info) = ProgInfoIter::with_query_opts(opts).find(|p| p.id == prog_id) else {
        bail!("the gate program (id {prog_id}) is gone: is the daemon still running?")
    };
    let mut maps = BTreeMap::new();
    for id in info.map_ids {
        let m = MapHandle::from_map_id(id).with_context(|| format!("opening map id {id} of the gate"))?;
        maps.insert(m.name().to_string_lossy().into_owned(), m);
    }
    Ok(maps)
}

impl Tracer {
    /// Load and attach. Fails plainly without root or without tp_btf support.
    pub fn start(opts: &Options, tables: Tables) -> Result<Tracer> {
        let (gate, own) = match tables {
            Tables::Gate(maps) => (Some(maps), None),
            Tables::Own(t) => (None, Some(t)),
        };
        // The softirq pair is the daemon's (drops only); its own part needs its pid.
        let softirq = opts.drops_only;
        let reasons = drop_reason_names()?;
        let backlog_reason = reasons.iter().position(|r| r == "CPU_BACKLOG").map_or(0, |v| v as u32);
        let skel = Owned::new(|storage| -> Result<TraceSkel<'static>> {
            let mut open = TraceSkelBuilder::default().open(storage).context("opening the tracer (bpf/trace.bpf.c)")?;
            if let Some(maps) = &gate {
                for (name, map) in [
                    ("cells", &mut open.maps.cells),
                    ("tables_gen", &mut open.maps.tables_gen),
                    ("prefix_v4", &mut open.maps.prefix_v4),
                    ("prefix_v6", &mut open.maps.prefix_v6),
                ] {
                    let m = maps.get(name).with_context(|| format!("the gate program has no map {name}"))?;
                    map.reuse_fd(m.as_fd()).with_context(|| format!("sharing the gate's {name} map"))?;
                }
            }
            {
                let data = open.maps.data_data.as_deref_mut().expect(".data is mmap'ed before load");
                data.settings.netns = opts.netns;
                data.settings.ifindex = opts.ifindex;
                data.settings.default_class = opts.default_class;
                data.settings.sample_every = 0;
                data.settings.tgid = opts.tgid.filter(|_| softirq).unwrap_or(0);
                data.settings.backlog_reason = backlog_reason;
            }
            if !softirq {
                open.progs.trace_softirq_entry.set_autoload(false);
                open.progs.trace_softirq_exit.set_autoload(false);
            }
            if opts.drops_only {
                let p = &mut open.progs;
                for prog in [
                    &mut p.trace_gro,
                    &mut p.trace_rx_entry,
                    &mut p.trace_list_entry,
                    &mut p.trace_netif_rx,
                    &mut p.trace_stack,
                    &mut p.trace_queued,
                    &mut p.trace_read,
                ] {
                    prog.set_autoload(false);
                }
            }
            open.load().context("loading the tracer (needs root and tp_btf tracepoints)")
        })?;
        if let Some(t) = own {
            write_tables(&skel, t)?;
        }
        let mut tracer = Tracer { skel, links: Vec::new(), softirq_links: None, gate, reasons };
        tracer.attach(opts.drops_only)?;
        // Attached from the start only for a daemon that counts its own
        // softirq time; either way the daemon's tick attaches it on demand.
        if softirq && opts.tgid.is_some() {
            tracer.set_softirq(true)?;
        }
        Ok(tracer)
    }

    fn attach(&mut self, drops_only: bool) -> Result<()> {
        let p = &self.skel.progs;
        let mut progs = vec![("kfree_skb", &p.trace_drop)];
        if !drops_only {
            progs.extend([
                ("napi_gro_receive_entry", &p.trace_gro),
                ("netif_receive_skb_entry", &p.trace_rx_entry),
                ("netif_receive_skb_list_entry", &p.trace_list_entry),
                ("netif_rx_entry", &p.trace_netif_rx),
                ("netif_receive_skb", &p.trace_stack),
                ("sk_data_ready", &p.trace_queued),
                ("sock_recv_length", &p.trace_read),
            ]);
        }
        for (tp, prog) in progs {
            let link = prog.attach().with_context(|| format!("attaching to tracepoint {tp}"))?;
            self.links.push(link);
        }
        Ok(())
    }

    /// Attach (or detach) the softirq pair: the receive work per CPU
    /// (`cpu_rx`) and the daemon's softirq time are counted only while it
    /// is attached. It runs at every softirq of every CPU (about 2% of a
    /// busy web server's CPU in `perf`), so the daemon attaches it only
    /// while a lower class sends enough to matter (`Ticker::wants_rx_cpu`).
    /// Loaded only with `Options::drops_only`.
    pub fn set_softirq(&mut self, on: bool) -> Result<()> {
        match (on, self.softirq_links.is_some()) {
            (true, false) => {
                let p = &self.skel.progs;
                let mut links = Vec::with_capacity(2);
                for (tp, prog) in [("softirq_entry", &p.trace_softirq_entry), ("softirq_exit", &p.trace_softirq_exit)] {
                    links.push(prog.attach().with_context(|| format!("attaching to tracepoint {tp}"))?);
                }
                self.softirq_links = Some(links);
            }
            (false, true) => self.softirq_links = None,
            _ => {}
        }
        Ok(())
    }

    /// Softirq time run while one of the daemon's threads was current, s
    /// (None: not counted; see `Options::tgid`).
    pub fn softirq_secs(&self) -> Result<Option<f64>> {
        let data = self.skel.maps.data_data.as_deref().expect(".data is mmap'ed after load");
        if data.settings.tgid == 0 {
            return Ok(None);
        }
        let ns: u64 = self.cpu_rx()?.iter().map(|c| c.daemon_ns).sum();
        Ok(Some(ns as f64 / 1e9))
    }

    /// Each CPU's receive work so far (by CPU number): NET_RX softirq
    /// time and the traced interface's backlog drops. Counted by the
    /// daemon's tracer (`drops_only`); zeros otherwise.
    pub fn cpu_rx(&self) -> Result<Vec<sluice_cpu_rx>> {
        Ok(crate::dataplane::gate::maps::percpu(&self.skel.maps.cpu_rx, "cpu_rx", 0)?)
    }

    /// A reader of `cpu_rx` that another thread can own (the control loop's).
    pub fn cpu_rx_reader(&self) -> Result<CpuRxReader> {
        let map = MapHandle::try_from(&self.skel.maps.cpu_rx).context("sharing the tracer's cpu_rx map")?;
        Ok(CpuRxReader(map))
    }

    /// Time one skb in `n` at the driver stage (0: none).
    pub fn set_sample_every(&mut self, n: u32) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.sample_every = n;
    }

    pub fn sample_every(&self) -> u32 {
        self.skel.maps.data_data.as_deref().expect(".data is mmap'ed after load").settings.sample_every
    }

    pub fn reason_name(&self, value: u32) -> String {
        fate::reason_name(&self.reasons, value)
    }

    /// The counts so far.
    pub fn counts(&self) -> Result<Counts> {
        let maps = &self.skel.maps;
        let mut c = Counts::default();
        for class in 0..SLUICE_TRACE_CLASSES {
            let mut row = [0u64; SLUICE_STAGE_NR as usize];
            for (stage, v) in row.iter_mut().enumerate() {
                *v = sum_u64(&maps.stage_in, class * SLUICE_STAGE_NR + stage as u32)?;
            }
            c.stage_in.push(row);
        }
        c.drops = self.drop_counts()?;
        for class in 0..SLUICE_CLASS_IDS {
            let mut per = Vec::new();
            for iv in 0..SLUICE_IV_NR {
                let key = (class * SLUICE_IV_NR + iv).to_ne_bytes();
                let mut sums = LatencySums::empty();
                for v in maps.latency.lookup_percpu(&key, MapFlags::ANY)?.unwrap_or_default() {
                    let l: sluice_latency = from_bytes(&v);
                    sums.add(&LatencySums {
                        count: l.count,
                        sum_ns: l.sum_ns,
                        sum_sq: l.sum_sq,
                        hist: l.hist.to_vec(),
                    });
                }
                per.push(sums);
            }
            c.latency.push(per);
        }
        Ok(c)
    }

    /// The gate's counters of classes 0..n, read from its class_state map;
    /// None when the tracer does not share a gate's maps.
    pub fn gate_totals(&self, n: usize) -> Result<Option<Vec<ClassTotals>>> {
        let Some(maps) = &self.gate else { return Ok(None) };
        let state = maps.get("class_state").context("the gate program has no class_state map")?;
        let totals = (0..n as u32)
            .map(|class| {
                let per_cpu = state.lookup_percpu(&class.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
                let mut sum = [0u64; crate::bpf_intf::SLUICE_CS_NR as usize];
                for v in per_cpu {
                    let s: sluice_class_state = from_bytes(&v);
                    for (a, b) in sum.iter_mut().zip(s.cnt) {
                        *a += b;
                    }
                }
                Ok(ClassTotals::from(sum))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(totals))
    }

    /// (class, drop reason value) -> packets, since load.
    pub fn drop_counts(&self) -> Result<BTreeMap<(u32, u32), u64>> {
        let drops = &self.skel.maps.drops;
        let mut out = BTreeMap::new();
        for key in drops.keys() {
            let k = u32::from_ne_bytes(key[..4].try_into().expect("4-byte key"));
            let n = drops.lookup_percpu(&key, MapFlags::ANY)?.unwrap_or_default();
            out.insert((k >> 16, k & 0xffff), n.iter().map(|v| from_bytes::<u64>(v)).sum());
        }
        Ok(out)
    }

    /// Packets in at the driver stage, all classes (to pace the sampling).
    pub fn driver_total(&self) -> Result<u64> {
        let mut total = 0;
        for class in 0..SLUICE_TRACE_CLASSES {
            total += sum_u64(&self.skel.maps.stage_in, class * SLUICE_STAGE_NR + crate::bpf_intf::SLUICE_STAGE_DRIVER)?;
        }
        Ok(total)
    }

    /// A class's drops as (stage, reason, packets).
    pub fn drops_of(&self, counts: &Counts, class: u32) -> Vec<Drop> {
        counts
            .drops
            .iter()
            .filter(|((c, _), n)| *c == class && **n > 0)
            .map(|((_, r), n)| Drop::new(self.reason_name(*r), *n))
            .collect()
    }
}

/// The tracer's per-CPU receive work, read from any thread (the map stays
/// open while a reader holds it; it counts while the tracer is attached).
pub struct CpuRxReader(MapHandle);

impl CpuRxReader {
    /// Each CPU's receive work so far, by CPU number.
    pub fn read(&self) -> Result<Vec<sluice_cpu_rx>> {
        Ok(crate::dataplane::gate::maps::percpu(&self.0, "cpu_rx", 0)?)
    }
}

/// The daemon's running totals of kernel drops by class name: each read's
/// increase is booked under the names the gate's ids have at that read (an
/// id no class holds: under "", which no class is named).
#[derive(Default)]
pub struct DropBook {
    last: BTreeMap<(u32, u32), u64>,
    totals: BTreeMap<(String, u32), u64>,
}

impl DropBook {
    /// Book what the tracer counted since the last call under `names` (by class id).
    pub fn update(&mut self, tracer: &Tracer, names: &[String]) -> Result<()> {
        let now = tracer.drop_counts()?;
        for (&(class, reason), &n) in &now {
            let grew = n.saturating_sub(self.last.get(&(class, reason)).copied().unwrap_or(0));
            let name = names.get(class as usize).cloned().unwrap_or_else(|| "unclassified".to_string());
            if grew > 0 {
                *self.totals.entry((name, reason)).or_default() += grew;
            }
        }
        self.last = now;
        Ok(())
    }

    /// A class's drops so far, largest first.
    pub fn of(&self, tracer: &Tracer, name: &str) -> Vec<Drop> {
        let mut v: Vec<Drop> = self
            .totals
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, r), &packets)| Drop::new(tracer.reason_name(*r), packets))
            .collect();
        v.sort_by_key(|d| std::cmp::Reverse(d.packets));
        v
    }
}

fn sum_u64(map: &libbpf_rs::Map, idx: u32) -> Result<u64> {
    Ok(crate::dataplane::gate::maps::percpu_sum(map, "trace counters", idx)?)
}

/// Fill the tracer's own copy of the class tables (no gate to share them with).
fn write_tables(skel: &TraceSkel, t: &crate::dataplane::classify::Tables) -> Result<()> {
    let m = &skel.maps;
    for (k, class) in &t.v4 {
        m.prefix_v4.update(bytes_of(k), &class.to_ne_bytes(), MapFlags::ANY)?;
    }
    for (k, class) in &t.v6 {
        m.prefix_v6.update(bytes_of(k), &class.to_ne_bytes(), MapFlags::ANY)?;
    }
    let n = t.cells.len() as u32;
    let keys: Vec<u8> = (0..n).flat_map(u32::to_ne_bytes).collect();
    let values: Vec<u8> = t.cells.iter().flat_map(|c| bytes_of(c).to_vec()).collect();
    m.cells
        .update_batch(&keys, &values, n, MapFlags::ANY, MapFlags::ANY)
        .context("writing the tracer's class table")?;
    Ok(())
}

/// `sluice trace` options.
pub struct TraceOpts {
    pub iface: String,
    /// The daemon's statistics socket (default: /run/sluice/IFACE.sock).
    pub socket: Option<PathBuf>,
    /// Only this class in the report.
    pub class: Option<String>,
    pub duration: Duration,
    /// Time about this many packets per second (1 in N, N from the rate); 0 = no latency.
    pub samples_per_sec: u32,
    /// Without a daemon: the config the classes come from, and whether to discover services.
    pub config: Option<PathBuf>,
    pub class_flags: Vec<String>,
    pub discover: bool,
    /// Print a line a second to stderr.
    pub progress: bool,
}

/// Where the class names and the gate's counters come from.
struct Source {
    names: Vec<String>,
    default_class: u32,
    gate: Option<(u32, String)>,
    own: Option<crate::dataplane::classify::Tables>,
}

/// The snapshot of a daemon on this interface, if one runs.
fn daemon_snapshot(o: &TraceOpts, ifindex: u32) -> Option<crate::surface::stats::Snapshot> {
    crate::surface::client::find_socket(o.socket.as_deref(), Some(&o.iface))
        .ok()
        .and_then(|p| crate::surface::client::fetch_snapshot(&p).ok())
        .filter(|s| s.ifindex == ifindex)
}

fn daemon_names(o: &TraceOpts, ifindex: u32) -> Option<Vec<String>> {
    daemon_snapshot(o, ifindex).map(|s| names_by_gate_id(&s.classes))
}

/// A daemon's class names by the gate's id ("" where no class holds the
/// id): the gate's maps and the tracer count by id.
fn names_by_gate_id(classes: &[crate::surface::stats::ClassSnapshot]) -> Vec<String> {
    let mut names = Vec::new();
    for c in classes {
        let id = c.gate_id.map_or(c.id, |g| g as usize);
        if names.len() <= id {
            names.resize(id + 1, String::new());
        }
        names[id] = c.name.clone();
    }
    names
}

fn find_source(o: &TraceOpts, ifindex: u32) -> Result<Source> {
    if let Some(s) = daemon_snapshot(o, ifindex) {
        let names = names_by_gate_id(&s.classes);
        let default_class = s.classes.iter().find(|c| c.is_default).map_or(0, |c| c.gate_id.unwrap_or(c.id as u32));
        return Ok(Source {
            names,
            default_class,
            gate: Some((s.prog_id, format!("daemon pid {}", s.pid))),
            own: None,
        });
    }
    let mut cfg = crate::policy::config::resolve(o.config.as_deref(), &o.class_flags)?;
    if o.discover && cfg.discover {
        let mut d = crate::signals::discover::Discovery::new(ifindex)?;
        cfg = crate::signals::discover::merge(&cfg, &d.poll()?).0;
    }
    let tables = crate::dataplane::classify::compile(&cfg)?;
    let names = cfg.classes.iter().map(|c| c.name.clone()).collect();
    Ok(Source { names, default_class: cfg.default_class as u32, gate: None, own: Some(tables) })
}

/// 1 in N so that about `per_sec` packets a second are timed at `rate` packets/s.
pub fn sample_every_for(rate: f64, per_sec: u32) -> u32 {
    if per_sec == 0 {
        return 0;
    }
    (rate / per_sec as f64).ceil().clamp(1.0, 1e6) as u32
}

/// Run a trace for `o.duration` (or until SIGINT/SIGTERM) and report.
pub fn run(o: &TraceOpts) -> Result<Report> {
    crate::dataplane::gate::check_privileges()?;
    let ifindex = crate::dataplane::gate::ifindex(&o.iface)?;
    let src = find_source(o, ifindex)?;
    if let Some(want) = &o.class {
        if !src.names.iter().any(|n| n == want) {
            bail!("--class {want}: no such class on {} (classes: {})", o.iface, src.names.join(", "));
        }
    }
    let tables = match (&src.gate, &src.own) {
        (Some((id, _)), _) => Tables::Gate(gate_maps(*id)?),
        (None, Some(t)) => Tables::Own(t),
        (None, None) => unreachable!("find_source gives a gate or tables"),
    };
    let opts = Options {
        ifindex,
        netns: crate::tools::netns::current_inode()?,
        default_class: src.default_class,
        drops_only: false,
        tgid: None,
    };
    let mut tracer = Tracer::start(&opts, tables)?;
    let gate_before = tracer.gate_totals(src.names.len())?;
    let stop = crate::surface::cli::stop_flag()?;
    let started = Instant::now();
    let mut last = (Instant::now(), 0u64);
    let mut progress_at = Instant::now();
    // Start timing at a low rate; adjusted each second from the driver stage's rate.
    tracer.set_sample_every(if o.samples_per_sec == 0 { 0 } else { 64 });
    while started.elapsed() < o.duration && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100).min(o.duration.saturating_sub(started.elapsed())));
        let driver = tracer.driver_total()?;
        let rate = (driver - last.1) as f64 / last.0.elapsed().as_secs_f64();
        tracer.set_sample_every(sample_every_for(rate, o.samples_per_sec));
        last = (Instant::now(), driver);
        if progress_at.elapsed() >= Duration::from_secs(1) {
            progress_at = Instant::now();
            let c = tracer.counts()?;
            if o.progress {
                let dropped: u64 = c.drops.values().sum();
                eprintln!(
                    "trace {:>4.0} s: {:.0} pkt/s at the driver, {} dropped after the gate so far",
                    started.elapsed().as_secs_f64(),
                    rate,
                    dropped
                );
            }
        }
    }
    let counts = tracer.counts()?;
    let gate_after = tracer.gate_totals(src.names.len())?;
    let mut notes = Vec::new();
    let gate_counts = match gate_before.zip(gate_after) {
        Some(g) if src.gate.is_some() && daemon_names(o, ifindex).as_ref() != Some(&src.names) => {
            notes.push(format!(
                "the daemon's classes changed during the trace (a reload, or discovery found or lost a service): \
                 gate counts left out, and packets may be counted under the class that had their id before ({g_len} classes at the start)",
                g_len = g.0.len()
            ));
            None
        }
        g => g,
    };
    let duration_secs = started.elapsed().as_secs_f64();
    let sample_every = tracer.sample_every();
    let mut report = build_report(&tracer, &counts, &src, gate_counts, o, duration_secs, sample_every);
    report.notes = notes;
    drop(tracer);
    Ok(report)
}

fn build_report(
    tracer: &Tracer,
    counts: &Counts,
    src: &Source,
    gate: Option<(Vec<ClassTotals>, Vec<ClassTotals>)>,
    o: &TraceOpts,
    duration_secs: f64,
    sample_every: u32,
) -> Report {
    let mut classes = Vec::new();
    for (id, name) in src.names.iter().enumerate() {
        if name.is_empty() || o.class.as_ref().is_some_and(|c| c != name) {
            continue;
        }
        let g = gate.as_ref().map(|(before, after)| GateCounts::between(&before[id], &after[id]));
        let stages = StageCounts::from_array(counts.stage_in[id]);
        let mut fate = ClassFate::new(id, name.clone(), g, stages, tracer.drops_of(counts, id as u32));
        fate.latency = INTERVALS.iter().enumerate().map(|(i, n)| Interval::of(n, &counts.latency[id][i])).collect();
        if o.class.is_some() || !fate.is_empty() {
            classes.push(fate);
        }
    }
    Report {
        version: REPORT_VERSION,
        interface: o.iface.clone(),
        duration_secs,
        gate: src.gate.as_ref().map(|(_, who)| who.clone()),
        sample_every,
        classes,
        unclassified_drops: tracer.drops_of(counts, SLUICE_TRACE_UNCLASSIFIED),
        notes: Vec::new(),
    }
}
