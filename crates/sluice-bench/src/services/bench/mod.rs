//! The running testbed of one scenario: the service, the generator, and
//! each cell (a flood, a configuration, a repeat) measured in it.
use super::*;
use sluice::policy::delay::Delays;
use sluice::surface::stats::Snapshot;

mod clients;
mod readings;

pub(super) use clients::add_clients_of_their_own;
pub(crate) use clients::attach_client_filter;
use clients::{add_heavy_sources, heavy_sources};
pub(crate) use readings::service_drops;
use readings::*;

/// The running testbed of one scenario.
pub(super) struct Bench<'a> {
    svc: Service,
    o: &'a ServiceOpts,
    bed: &'a VictimBed,
    dir: &'a Path,
    service: Proc,
    /// php-fpm behind nginx (`--php`), stopped after it.
    _backend: Option<Proc>,
    gen: GenWorker,
    capacity: Option<f64>,
    _filter: Gate,
}

/// One cell of a repeat.
#[derive(Debug, Clone, Copy)]
pub(super) enum Item<'a> {
    /// No flood: dnsperf at a share of NSD's capacity, a neighbour beside it or not.
    Calm(f64, Option<Neighbour>, Setup),
    /// A flood (None: the unflooded baseline) in one configuration.
    Flood(Option<&'a Flood>, Setup),
}

impl Item<'_> {
    fn name(&self) -> String {
        match self {
            Item::Calm(load, n, s) => {
                let beside = n.map_or(String::new(), |n| format!(" beside {}", n.name()));
                format!("calm at {:.0}% of capacity{beside}, {}", load * 100.0, s.name())
            }
            Item::Flood(f, s) => format!("{} {}", f.map_or("none", |f| f.name), s.name()),
        }
    }
}

/// What carries the configuration during a cell.
pub(super) enum Installed {
    /// The pass-through gate, attached while held.
    Pass {
        gate: Box<Gate>,
    },
    Daemon(Proc, PathBuf),
}

impl<'a> Bench<'a> {
    pub(super) fn start(svc: Service, o: &'a ServiceOpts, bed: &'a VictimBed, dir: &'a Path) -> Result<Bench<'a>> {
        add_flood_neighbours(bed, 64)?;
        add_clients_of_their_own(bed)?;
        if o.floods.iter().any(|f| f.heavy_srcs > 0) {
            add_heavy_sources(bed)?;
        }
        let filter = attach_client_filter(bed)?;
        let backend =
            if svc == Service::Http && o.php { Some(http::start_php(dir, &bed.net.b, bed.victim_cpu)?) } else { None };
        // The nic model's receive side: the stack on the victim CPU (RPS), beside the service.
        bed.steer_rps()?;
        let (a, b) = (&bed.net.a, &bed.net.b);
        let service = match svc {
            Service::Dns => {
                let addrs = [bed.net.ip_b.to_string(), bed.net.ip6_b.to_string()];
                dns::start_nsd(dir, b, bed.victim_cpu, &addrs, (a, bed.gen_cpu))?
            }
            Service::Http => http::start_nginx(dir, b, bed.victim_cpu, a, bed.net.ip_b, o.php)?,
        };
        // At nice 19: the clients on its CPU send what they ask; the flood takes the rest.
        let gen = GenWorker::start(a, &o.gen_cpus, bed.net.ifindex_a, 19)?;
        eprintln!(
            "== {}: namespaces {a} (clients: CPU {}, generator: CPU {}) and {b} ({}, CPU {}, nic model; daemon: {}; {} veth queue(s))",
            svc.name(),
            o.clients_cpu,
            crate::testbed::cpu_plan::cpu_list(&o.gen_cpus),
            match (svc, o.php) {
                (Service::Dns, _) => "NSD",
                (Service::Http, false) => "nginx",
                (Service::Http, true) => "nginx and php-fpm",
            },
            bed.victim_cpu,
            bed.control_cpu.map_or("any CPU".into(), |c| format!("CPU {c}")),
            bed.queues
        );
        let mut bench = Bench { svc, o, bed, dir, service, _backend: backend, gen, capacity: None, _filter: filter };
        if svc == Service::Dns {
            bench.capacity = Some(bench.dns_capacity()?);
        }
        Ok(bench)
    }

    /// NSD's answered queries/s with dnsperf unpaced for 2 s (dnsperf's own
    /// CPU may be the limit: then this is below NSD's true capacity, and the
    /// static cap only safer).
    pub(super) fn dns_capacity(&self) -> Result<f64> {
        let p =
            dns::spawn_dnsperf(&self.bed.net.a, self.bed.gen_cpu, self.dir, &self.bed.net.ip_b.to_string(), None, 2.0)?;
        let perf = dns::finish_dnsperf(p, self.dir, 2.0)?;
        let cap = perf.completed as f64 / 2.0;
        eprintln!(
            "== NSD capacity (dnsperf unpaced, 2 s): {}/s answered; the static cap",
            sluice::base::fmt::human(cap)
        );
        Ok(cap)
    }

    /// The cells of one repeat: calm ones (loads, then neighbours), each
    /// `off` and `zero` side by side, then every flood (and none) in each
    /// of its configurations.
    fn plan(&self) -> Vec<Item<'a>> {
        let neighbours: &[Option<Neighbour>] =
            if self.o.neighbours { &[None, Some(Neighbour::FullSocket), Some(Neighbour::Churn)] } else { &[None] };
        let calm = self.o.calm_loads.iter().map(|&l| (l, None));
        let beside = neighbours.iter().flatten().map(|&n| (NEIGHBOUR_LOAD, Some(n)));
        let calm = calm.chain(beside).flat_map(|(l, n)| [Setup::Off, Setup::Zero].map(|s| Item::Calm(l, n, s)));
        let floods = std::iter::once(None).chain(self.o.floods.iter().map(Some));
        let flooded = floods.flat_map(|f| Setup::for_flood(f).iter().map(move |&s| Item::Flood(f, s)));
        calm.chain(flooded).collect()
    }

    pub(super) fn run_all(&self, out: &Path) -> Result<ServiceRun> {
        let scenario = if self.o.sources { "sources" } else { self.svc.name() };
        let head = ServiceHead {
            service: self.svc,
            secs: self.o.secs,
            repeats: self.o.repeats,
            capacity: self.capacity,
            keep_alive: self.o.keep_alive,
            php: self.o.php,
            cpus: Some(CpuPlan {
                generator: self.o.gen_cpus[0],
                service: self.bed.victim_cpu,
                clients: self.o.clients_cpu,
                generators: self.o.gen_cpus.clone(),
                control: self.bed.control_cpu,
                queues: Some(self.bed.queues),
            }),
        };
        let mut r = ServiceRun::new(scenario, head);
        let plan = interleave(&self.plan(), self.o.repeats);
        let mut runner = Runner::new(plan.len(), &self.o.interrupted, false);
        let mut shown_status = false;
        let label =
            |i: &Item, rep: u32| format!("{}: repeat {}/{}: {}", self.svc.name(), rep + 1, self.o.repeats, i.name());
        let cells = runner.run(
            &plan,
            label,
            |item, repeat| {
                // A SYN flood's half-open connections outlive its cell.
                if self.svc == Service::Http {
                    http::settle_listener(&self.bed.net.b)?;
                }
                let cell = match *item {
                    Item::Calm(load, neighbour, setup) => self.calm_cell(load, neighbour, setup, repeat)?,
                    Item::Flood(flood, setup) => {
                        // The status of the first flooded zero-config cell (what a user would look at).
                        let show = !shown_status && setup == Setup::Zero && flood.is_some();
                        shown_status |= show;
                        self.cell(flood, setup, repeat, show)?
                    }
                };
                eprintln!("[{}/{}] {}", repeat + 1, self.o.repeats, cell_line(self.svc, &cell));
                self.keep_log(out, &cell)?;
                Ok(cell)
            },
            |cells| {
                r.cells = cells.to_vec();
                write_all(&r, out)
            },
        )?;
        runner.finish();
        r.cells = cells;
        Ok(r)
    }

    /// Move the daemon's log of the cell just run (if it ran one) to
    /// OUT/logs/FLOOD-CONFIG-rREPEAT.log: its decisions, each limit with the
    /// rule that set it, and its status at exit, for a cell whose figures
    /// want explaining.
    fn keep_log(&self, out: &Path, cell: &Cell) -> Result<()> {
        let log = self.dir.join("sluice-run.log");
        if !log.exists() {
            return Ok(());
        }
        let dir = out.join("logs");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let to = dir.join(format!("{}-{}-r{}.log", cell.flood, cell.config.name(), cell.repeat + 1));
        std::fs::copy(&log, &to).with_context(|| format!("copying the daemon's log to {}", to.display()))?;
        std::fs::remove_file(&log).with_context(|| format!("removing {}", log.display()))?;
        Ok(())
    }

    /// A calm cell (do no harm): no flood, dnsperf at `load` times NSD's
    /// measured capacity, a misbehaving neighbour beside NSD if asked, and
    /// what the gate dropped of the service's classes.
    pub(super) fn calm_cell(&self, load: f64, neighbour: Option<Neighbour>, setup: Setup, repeat: u32) -> Result<Cell> {
        let qps = (load * self.capacity.unwrap_or(self.o.qps as f64)).round().max(1.0) as u64;
        // Before the daemon, as a service already running would be (discovery finds it at start).
        let _neighbour = neighbour.map(|n| n.start(&self.bed.net.b, self.o.secs + 5.0)).transpose()?;
        std::thread::sleep(Duration::from_millis(300));
        let installed = self.install(setup)?;
        let daemon = match &installed {
            Installed::Daemon(p, _) => Some((p.id(), tree_cpu_secs(p.id()))),
            Installed::Pass { .. } => None,
        };
        let softirq0 = self.softirq_secs(&installed);
        let (cpu0, t0) = (tree_cpu_secs(self.service.id()), Instant::now());
        let mut cell = self.dns_clients_at(false, self.o.secs, qps)?;
        let secs_run = t0.elapsed().as_secs_f64();
        cell.service_cpu = 100.0 * (tree_cpu_secs(self.service.id()) - cpu0) / secs_run;
        cell.daemon_cpu = daemon.map(|(pid, c0)| 100.0 * (tree_cpu_secs(pid) - c0) / secs_run);
        cell.daemon_softirq = softirq0.zip(self.softirq_secs(&installed)).map(|(a, b)| 100.0 * (b - a) / secs_run);
        if let Installed::Daemon(_, sock) = &installed {
            let snap = daemon_status(&self.o.exe, &self.bed.net.b, sock)?;
            (cell.gate_drops, cell.dropped_with_room) = (Some(dropped_of(&snap)), dropped_with_room_of(&snap));
            cell.room_drops = Some(room_drops_of(&snap));
        }
        self.uninstall(installed)?;
        cell.flood =
            format!("calm-{:.0}{}", load * 100.0, neighbour.map_or(String::new(), |n| format!("+{}", n.name())));
        (cell.config, cell.repeat, cell.load) = (setup, repeat, Some(load));
        Ok(cell)
    }

    /// One cell: the configuration, the flood from ONSET_SECS before the
    /// clients to their end (a `calm` flood: after the clients ran alone
    /// for CALM_SECS, CALM_SECS_HTTP for http, and on through its first
    /// ONSET_SECS, timed by a probe of their own), the clients for `secs`.
    pub(super) fn cell(&self, flood: Option<&Flood>, setup: Setup, repeat: u32, show_status: bool) -> Result<Cell> {
        let installed = self.install(setup)?;
        let secs = self.o.secs;
        let calm = match flood {
            Some(f) if f.pulses > 0 => {
                self.pulses(f)?;
                None
            }
            Some(f) if f.calm => {
                let calm = if self.svc == Service::Http { CALM_SECS_HTTP } else { CALM_SECS };
                let t = self.calm_clients_spawn(f.v6, calm + ONSET_SECS);
                std::thread::sleep(Duration::from_secs_f64(calm));
                Some(t)
            }
            _ => None,
        };
        let (gen, onset) = match flood {
            Some(f) if f.heavy_srcs > 0 => {
                let net = &self.bed.net;
                let how = if f.new_conns { http::Heaviness::NewConns } else { http::Heaviness::KeepAlive };
                let heavy = http::start_heavy(
                    &net.a,
                    (self.bed.gen_cpu, 19),
                    (&heavy_sources(f.heavy_srcs), how),
                    net.ip_b,
                    secs + ONSET_SECS,
                );
                std::thread::sleep(Duration::from_secs_f64(ONSET_SECS));
                (Some(Flooding::Conns(heavy)), None)
            }
            Some(f) => {
                let v = self.flood_values(f)?;
                self.gen.set_streams(&v)?;
                let rx = self.gen.send_for(Duration::from_secs_f64(secs + 1.5), crate::load::gen::DEFAULT_BATCH);
                let onset = calm.is_some().then(|| self.probe_spawn(f.v6, None, ONSET_SECS));
                std::thread::sleep(Duration::from_secs_f64(ONSET_SECS));
                (Some(Flooding::Frames(rx)), onset)
            }
            None => (None, None),
        };
        let status = match (&installed, show_status) {
            (Installed::Daemon(_, sock), true) => {
                Some(status_after(&self.o.exe, &self.bed.net.b, sock, Duration::from_secs_f64(secs / 2.0)))
            }
            _ => None,
        };
        let v6 = flood.is_some_and(|f| f.v6);
        let ring0 = link_stats(&self.bed.net.a, IF_A)?.tx_dropped;
        let mut netstat = NsFile::open(&self.bed.net.b, "netstat")?;
        let cookies0 = proc_counter(&netstat.read()?, "TcpExt:", "SyncookiesSent");
        let mut snmp = NsFile::open(&self.bed.net.b, "snmp")?;
        let read0 = proc_counter(&snmp.read()?, "Udp:", "InDatagrams");
        let daemon = match &installed {
            Installed::Daemon(p, _) => Some(p.id()),
            Installed::Pass { .. } => None,
        };
        let daemon0 = daemon.map(tree_cpu_secs);
        let softirq0 = self.softirq_secs(&installed);
        let (cpu0, t0) = (tree_cpu_secs(self.service.id()), Instant::now());
        let newcomer = (self.o.sources && flood.is_some()).then(|| self.new_client(v6));
        let start = self.status_of(&installed)?;
        let admitted0 = start.as_ref().map(admitted_of);
        let answers0 = self.answer_delays(&installed, start.as_ref())?;
        let mut cell = match self.svc {
            Service::Dns => self.dns_clients(v6, secs)?,
            Service::Http => self.http_clients(v6)?,
        };
        if let Some(t) = newcomer {
            let probe = t.join().map_err(|_| anyhow::anyhow!("the new client's probe panicked"))??;
            cell.new_client = probe.answered_share();
        }
        if let Some(t) = onset {
            let probe = t.join().map_err(|_| anyhow::anyhow!("the onset's probe panicked"))??;
            cell.onset_answered = probe.answered_share();
        }
        if let Some(t) = calm {
            t.join().map_err(|_| anyhow::anyhow!("the calm clients' thread panicked"))??;
        }
        let secs_run = t0.elapsed().as_secs_f64();
        cell.service_cpu = 100.0 * (tree_cpu_secs(self.service.id()) - cpu0) / secs_run;
        cell.daemon_cpu = daemon.zip(daemon0).map(|(pid, c0)| 100.0 * (tree_cpu_secs(pid) - c0) / secs_run);
        cell.daemon_softirq = softirq0.zip(self.softirq_secs(&installed)).map(|(a, b)| 100.0 * (b - a) / secs_run);
        cell.ring_drops = link_stats(&self.bed.net.a, IF_A)?.tx_dropped.saturating_sub(ring0) as f64 / secs_run;
        let cookies = proc_counter(&netstat.read()?, "TcpExt:", "SyncookiesSent").saturating_sub(cookies0);
        cell.syn_cookies = cookies as f64 / secs_run;
        let read = proc_counter(&snmp.read()?, "Udp:", "InDatagrams").saturating_sub(read0);
        cell.read_pps = Some(read as f64 / secs_run);
        if let Some(st) = status.and_then(|t| t.join().ok()).transpose()? {
            eprintln!("== sluice status during the {} flood (zero config):\n{st}", flood.map_or("", |f| f.name));
        }
        match gen {
            Some(Flooding::Frames(rx)) => {
                let (counts, gsecs) = rx.recv().context("the generator thread ended")??;
                let sent: u64 = counts.iter().map(|c| c.sent).sum();
                cell.flood_pps = Some(sent as f64 / gsecs.max(1e-9));
            }
            Some(Flooding::Conns(t)) => {
                let h = t.join().map_err(|_| anyhow::anyhow!("the heavy clients' thread panicked"))??;
                // A connection flood's rate: the requests nginx answered it.
                cell.flood_pps = Some(h.answered as f64 / h.secs.max(1e-9));
            }
            None => {}
        }
        // One read of the daemon's status serves the cell's figures.
        let end = self.status_of(&installed)?;
        if let Some(snap) = &end {
            cell.cpu_taken_max = cpu_taken_max(snap);
            cell.admitted_pps = admitted0.map(|a0| admitted_of(snap).saturating_sub(a0) as f64 / secs_run);
            cell.known = snap.sources.known;
            cell.known_lost = known_lost_of(snap);
            cell.late = snap.classes.iter().find_map(|c| c.late.clone());
            if self.svc == Service::Http {
                cell.gate_synacks = Some(synacks_of(snap) as f64 / secs_run);
            }
            if flood.is_some_and(|f| !f.own_port) || (flood.is_none() && self.svc == Service::Http) {
                // The flood goes to another class, or there is none: every
                // drop of the service's classes is a client's.
                cell.gate_drops = Some(dropped_of(snap));
            }
        }
        let (all, known) = self.answer_delays(&installed, end.as_ref())?;
        let (answers, known) = (all.since(&answers0.0), known.since(&answers0.1));
        (cell.answer_p50_ms, cell.answer_p99_ms) = (answers.quantile_ms(0.5), answers.quantile_ms(0.99));
        cell.known_answer_p99_ms = known.quantile_ms(0.99);
        let state = match &installed {
            Installed::Daemon(_, sock) => Some(sluice::signals::known::path(&sock.with_extension("state"), IF_B)),
            Installed::Pass { .. } => None,
        };
        self.uninstall(installed)?;
        if let (Some(f), Some(file)) = (flood.filter(|f| f.pulses > 0), state) {
            // The daemon saved its known clients as it stopped.
            let src: std::net::IpAddr = if f.v6 { FLOOD_SRC_V6 } else { FLOOD_SRC_V4 }.parse().expect("an address");
            let known = sluice::signals::known::load(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            // Known as the gate takes it: a candidate (a span short of a
            // second, say one answer in a tick before learning stopped) is not.
            cell.attacker_known = Some(known.iter().any(|k| k.addr == src && k.is_known()));
        }
        cell.flood = flood.map_or("none", |f| f.name).into();
        cell.config = setup;
        cell.repeat = repeat;
        Ok(cell)
    }

    /// The daemon's status now (None: no daemon, the pass-through gate).
    fn status_of(&self, installed: &Installed) -> Result<Option<Snapshot>> {
        match installed {
            Installed::Daemon(_, sock) => Ok(Some(daemon_status(&self.o.exe, &self.bed.net.b, sock)?)),
            Installed::Pass { .. } => Ok(None),
        }
    }

    /// The answer delays the gate timed so far for the service's classes,
    /// all answers and the known clients' alone: every class but the
    /// default one (the daemon's, from its status `snap` read now), or the
    /// pass-through gate's `svc` class (which knows nobody).
    fn answer_delays(&self, installed: &Installed, snap: Option<&Snapshot>) -> Result<(Delays, Delays)> {
        Ok(match (installed, snap) {
            (Installed::Pass { gate }, _) => {
                let t = sluice::dataplane::gate::counters::ClassTotals::from(gate.class_counters(0)?);
                (t.answer_delays, t.answer_delays_known)
            }
            (Installed::Daemon(..), Some(s)) => {
                let service = s.classes.iter().filter(|c| !c.is_default);
                service.fold((Delays::default(), Delays::default()), |(all, known), c| {
                    (all.plus(&c.totals.answer_delays), known.plus(&c.totals.answer_delays_known))
                })
            }
            (Installed::Daemon(..), None) => bail!("the daemon's answer delays need its status"),
        })
    }

    /// A pulsing flood's pulses (PULSE_ON_SECS each, PULSE_OFF_SECS apart),
    /// the clients running beside them throughout.
    fn pulses(&self, f: &Flood) -> Result<()> {
        let v = self.flood_values(f)?;
        let secs = f64::from(f.pulses) * (PULSE_ON_SECS + PULSE_OFF_SECS);
        std::thread::scope(|s| {
            let clients = s.spawn(|| self.dns_clients(f.v6, secs));
            let pulsed = (0..f.pulses).try_for_each(|_| -> Result<()> {
                self.gen.set_streams(&v)?;
                let rx = self.gen.send_for(Duration::from_secs_f64(PULSE_ON_SECS), crate::load::gen::DEFAULT_BATCH);
                rx.recv().context("the generator thread ended")??;
                std::thread::sleep(Duration::from_secs_f64(PULSE_OFF_SECS));
                Ok(())
            });
            clients.join().map_err(|_| anyhow::anyhow!("the clients panicked"))??;
            pulsed
        })
    }

    /// The generator's streams for `f` at the asked rate: its own, or with
    /// `with_closed` its own and `closed-v4`'s (or `closed-v6`'s), half each.
    fn flood_streams(&self, f: &Flood) -> Vec<StreamSpec> {
        let mut streams = vec![flood_stream(&self.bed.net, self.svc, f)];
        if f.with_closed {
            let closed = FLOODS.iter().find(|c| !c.own_port && c.v6 == f.v6).expect("a closed-port flood per family");
            streams.push(flood_stream(&self.bed.net, self.svc, closed));
        }
        let rate = self.o.flood_pps / streams.len() as f64;
        streams.into_iter().map(|s| StreamSpec { rate, ..s }).collect()
    }

    /// The same as the generator's map takes them.
    fn flood_values(&self, f: &Flood) -> Result<Vec<crate::gen_intf::sluice_gen_stream>> {
        let (mac_b, mac_a) = (self.bed.net.mac_b, self.bed.net.mac_a);
        self.flood_streams(f).iter().map(|s| stream_value(s, mac_b, mac_a)).collect()
    }

    /// Put `setup` in place on vb.
    pub(super) fn install(&self, setup: Setup) -> Result<Installed> {
        let svc_class = format!("svc:priority=0,{}", self.svc.matches());
        let args: Vec<String> = match setup {
            Setup::Off => {
                let g = attach_gate(&self.bed.net.b, IF_B, vec![svc_class])?;
                return Ok(Installed::Pass { gate: Box::new(g) });
            }
            Setup::Zero => vec![],
            Setup::Observe => vec!["--observe".into()],
            Setup::Static => {
                let cap = self.capacity.map(|c| format!("rate={},", c.round().max(1.0) as u64)).unwrap_or_default();
                let svc = format!("svc:priority=1,{cap}{}", self.svc.matches());
                let mut args: Vec<String> = vec!["--no-discover".into()];
                if self.o.sources {
                    // The hand-tuned best against an own-port flood: the
                    // resolver's address in a class of its own, first (the
                    // first matching rule decides: after svc's udp:53 it
                    // matched nothing, and the resolver shared svc's buckets).
                    let (a4, a6) = (self.bed.net.ip_a, self.bed.net.ip6_a);
                    args.push("--class".into());
                    args.push(format!("resolver:priority=0,match=udp:53@{a4}/32,match=udp:53@{a6}/128"));
                }
                args.extend(["--class", &svc, "--class", "default:rate=1k"].map(String::from));
                args
            }
            Setup::Blocked => {
                ["--no-discover", "--class", &svc_class, "--class", "default:rate=blocked"].map(String::from).to_vec()
            }
        };
        let sock = self.dir.join("sluice.sock");
        let p = start_daemon(
            &self.o.exe,
            (&self.bed.net.b, self.bed.control_cpu),
            IF_B,
            &sock,
            &args,
            &self.dir.join("sluice-run.log"),
        )?;
        // Zero config: the first discovery is at start; a tick or two for the first rates.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Installed::Daemon(p, sock))
    }

    /// The daemon's softirq time so far, if a daemon runs and reports it.
    fn softirq_secs(&self, i: &Installed) -> Option<f64> {
        match i {
            Installed::Daemon(_, sock) => daemon_softirq_secs(&self.o.exe, &self.bed.net.b, sock),
            Installed::Pass { .. } => None,
        }
    }

    pub(super) fn uninstall(&self, i: Installed) -> Result<()> {
        if let Installed::Daemon(p, _) = i {
            if let Err(e) = p.terminate("sluice run").map(drop) {
                let log = std::fs::read_to_string(self.dir.join("sluice-run.log")).unwrap_or_default();
                bail!("{e:#}\n{log}");
            }
        }
        Ok(())
    }
}

/// A flood's stream: UDP to the closed port or NSD's port, or SYNs to nginx's.
pub(crate) fn flood_stream(net: &sluice_testkit::testbed::Testbed, svc: Service, f: &Flood) -> StreamSpec {
    let (src, dst) = if f.v6 {
        (FLOOD_SRC_V6.parse().expect("an address"), net.ip6_b)
    } else {
        (FLOOD_SRC_V4.parse().expect("an address"), net.ip_b)
    };
    // TCP to nginx's port: SYNs, or the flood's own flags (ACK, RST).
    let syn = f.own_port && svc == Service::Http;
    let dport = match (f.own_port, svc) {
        (false, _) => CLOSED_PORT,
        (true, Service::Dns) => 53,
        (true, Service::Http) => http::PORT,
    };
    // Many source ports and addresses for SYNs (distinct connections), below the clients' ports.
    let (sport, flows, srcs) = if syn { (1024, 30_000, SYN_SRCS) } else { (20_000, 64, f.srcs) };
    let payload =
        (f.queries && f.own_port && !f.v6 && svc == Service::Dns).then(|| crate::services::dns::query(0x5eed));
    StreamSpec {
        name: f.name.into(),
        rate: FLOOD_PPS,
        frame_len: match &payload {
            Some(q) => (14 + 20 + 8 + q.len()) as u32,
            None if syn && f.v6 => 80,
            None => 64,
        },
        src: std::net::SocketAddr::new(src, sport),
        flows,
        srcs,
        random_srcs: srcs > 16,
        dst: std::net::SocketAddr::new(dst, dport),
        dports: 1,
        stamp: false,
        syn,
        tcp_flags: Some(f.tcp_flags).filter(|&t| t != 0),
        payload,
    }
}

/// A running flood: the generator's frames, or the heavy clients' connections.
enum Flooding {
    Frames(std::sync::mpsc::Receiver<crate::load::workers::GenDone>),
    Conns(std::thread::JoinHandle<Result<http::Heavy>>),
}
