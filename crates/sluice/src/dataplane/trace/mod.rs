//! The tracer: where every packet of a class goes after the gate, and how
//! long each receive stage holds it (the capture-cost study), from
//! tracepoints only.
//!
//! The BPF side is `bpf/trace.bpf.c` (its top comment lists the stages and
//! tracepoints). This module loads it, shares the gate's class tables when a
//! gate is attached (so a packet has the same class at every stage) and
//! reads its counts. `sluice trace` (`surface::trace`) makes the ledger and
//! latency figures of them; the daemon uses [`Tracer`] too, with only the
//! drop counter attached, for the per-reason drops in `sluice status` and
//! /metrics (`daemon/drop_book.rs`).

use std::collections::BTreeMap;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle};

use crate::bpf_intf::{
    sluice_class_state, sluice_cpu_rx, sluice_latency, SLUICE_CLASS_IDS, SLUICE_HIST_BUCKETS, SLUICE_IV_NR,
    SLUICE_STAGE_NR, SLUICE_TRACE_CLASSES,
};
use crate::dataplane::gate::counters::ClassTotals;
use crate::dataplane::gate::{bytes_of, from_bytes, Owned};
use crate::trace_skel::{TraceSkel, TraceSkelBuilder};

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
        // A reason this kernel lacks is 0, which nothing counts under.
        let reason_value = |name: &str| reasons.iter().position(|r| r == name).map_or(0, |v| v as u32);
        let backlog_reason = reason_value("CPU_BACKLOG");
        let skel = Owned::new(|storage| -> Result<TraceSkel<'static>> {
            let mut open = TraceSkelBuilder::default().open(storage).context("opening the tracer (bpf/trace.bpf.c)")?;
            if let Some(maps) = &gate {
                for (name, map) in [
                    ("cells", &mut open.maps.cells),
                    ("tables_gen", &mut open.maps.tables_gen),
                    ("prefix_v4", &mut open.maps.prefix_v4),
                    ("prefix_v6", &mut open.maps.prefix_v6),
                    ("known", &mut open.maps.known),
                    ("known_part", &mut open.maps.known_part),
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
                data.settings.rcvbuf_reason = reason_value("SOCKET_RCVBUFF");
                data.settings.proto_mem_reason = reason_value("PROTO_MEM");
            }
            if !softirq {
                open.progs.trace_softirq_entry.set_autoload(false);
                open.progs.trace_softirq_exit.set_autoload(false);
                open.progs.trace_cpu_pkts.set_autoload(false);
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

    /// Attach (or detach) the softirq pair and the stack's intake count
    /// (`trace_cpu_pkts`): the receive work per CPU (`cpu_rx`), the gate's
    /// interface's share of it and the daemon's softirq time are counted
    /// only while they are attached. The pair runs at every softirq of
    /// every CPU (about 2% of a busy web server's CPU in `perf`), the count
    /// at every packet the stack takes in, so the daemon attaches them only
    /// while a lower class sends enough to matter (`Ticker::wants_rx_cpu`).
    /// Loaded only with `Options::drops_only`.
    pub fn set_softirq(&mut self, on: bool) -> Result<()> {
        match (on, self.softirq_links.is_some()) {
            (true, false) => {
                let p = &self.skel.progs;
                let mut links = Vec::with_capacity(3);
                let progs = [
                    ("softirq_entry", &p.trace_softirq_entry),
                    ("softirq_exit", &p.trace_softirq_exit),
                    ("netif_receive_skb", &p.trace_cpu_pkts),
                ];
                for (tp, prog) in progs {
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

    /// For each of `ids`: packets of the class's known clients the receive
    /// path dropped for want of room so far (bpf/sluice.h, `known_lost`).
    /// Counted only where the tracer shares the gate's known map
    /// (`Tables::Gate`, the daemon's); zeros otherwise.
    pub fn known_lost(&self, ids: impl Iterator<Item = u32>) -> Result<Vec<(u32, u64)>> {
        ids.filter(|&id| id < SLUICE_CLASS_IDS).map(|id| Ok((id, sum_u64(&self.skel.maps.known_lost, id)?))).collect()
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
        reason_name(&self.reasons, value)
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
        let ncpus = libbpf_rs::num_possible_cpus()?;
        let totals = (0..n as u32)
            .map(|class| {
                let mut per_cpu = Vec::with_capacity(ncpus);
                for cpu in 0..ncpus {
                    let key = crate::dataplane::gate::state_key(cpu, class);
                    if let Some(v) = state.lookup(&key.to_ne_bytes(), MapFlags::ANY)? {
                        per_cpu.push(from_bytes::<sluice_class_state>(&v).cnt);
                    }
                }
                Ok(ClassTotals::from(crate::dataplane::gate::sum_cpus(per_cpu)))
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

/// A drop reason's name from the kernel's `enum skb_drop_reason` names
/// (index = value), without the prefix; a value past them gets its number.
pub fn reason_name(names: &[String], value: u32) -> String {
    names.get(value as usize).cloned().unwrap_or_else(|| format!("REASON_{value}"))
}

/// What the kernel counted for one (class, interval): `struct sluice_latency`.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencySums {
    pub count: u64,
    pub sum_ns: u64,
    /// Sum of (d >> SLUICE_SQ_SHIFT)^2.
    pub sum_sq: u64,
    pub hist: Vec<u64>,
}

impl LatencySums {
    pub fn empty() -> LatencySums {
        LatencySums { count: 0, sum_ns: 0, sum_sq: 0, hist: vec![0; SLUICE_HIST_BUCKETS as usize] }
    }

    /// Add another CPU's sums.
    pub fn add(&mut self, other: &LatencySums) {
        self.count += other.count;
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
        self.sum_sq = self.sum_sq.wrapping_add(other.sum_sq);
        for (a, b) in self.hist.iter_mut().zip(&other.hist) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_past_the_kernels_names_gets_its_number() {
        assert_eq!(reason_name(&["A".into(), "B".into()], 1), "B");
        assert_eq!(reason_name(&[], 255), "REASON_255");
    }
}
