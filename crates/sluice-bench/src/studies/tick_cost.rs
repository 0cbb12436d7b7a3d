//! `sluice bench tick`: what the daemon's own loop costs, read by read.
//!
//! In a namespace of its own with `services` UDP sockets and as many TCP
//! listeners (this process holds them; half IPv4, half IPv6), it builds the zero-config class list
//! the daemon would (discovery + merge), attaches the gate, and times, in
//! interleaved rounds, the daemon's whole 10 ms tick and each read it makes:
//! the sock_diag reads (each socket alone, and the dumps that read many),
//! the /proc files, the gate's counters, and discovery
//! (once a second in the daemon). Cost is the calling thread's CPU time
//! (CLOCK_THREAD_CPUTIME_ID: steal time and waiting do not count), reported
//! as µs per call and as % of one core at the daemon's call rates.
use std::fmt::Write as _;
use std::net::{TcpListener, UdpSocket};

use anyhow::{Context, Result};
use serde::Serialize;

use sluice::daemon::auto::thread_cpu_ns;
use sluice::daemon::tick::Ticker;
use sluice::dataplane::gate::{self, Gate};
use sluice::policy::config::{self, XdpMode};
use sluice::signals::discover::{self, Discovery, Listeners};
use sluice::signals::health::HealthReader;
use sluice::signals::procfs::{softnet, NsFile};
use sluice::signals::sock_diag::{SockDiag, SockKey, TCP_LISTEN};
use sluice::{base::netns, dataplane::classify};
use sluice_testkit::testbed::{Testbed, TestbedOpts, IF_B};

use crate::testbed::victim::NS_PREFIX;

/// One timed read.
#[derive(Debug, Clone, Serialize)]
pub struct Part {
    pub name: &'static str,
    /// Calls per second in the daemon.
    pub per_sec: f64,
    /// Median over rounds of the mean CPU µs per call, and the lowest round's.
    pub us: f64,
    pub min_us: f64,
}

impl Part {
    /// % of one core at the daemon's call rate.
    pub fn core_pct(&self) -> f64 {
        self.us * self.per_sec / 1e4
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub services: u32,
    pub classes: usize,
    pub rounds: usize,
    pub calls: u32,
    pub parts: Vec<Part>,
    pub counters: CounterRead,
}

/// What the tick's read of the gate's counters copies: the entries (a
/// class on a CPU) marked since its last read (`CounterReads`), at most
/// the classes times the possible CPUs.
#[derive(Debug, Clone, Serialize)]
pub struct CounterRead {
    pub classes: usize,
    pub possible_cpus: usize,
    pub bytes_per_entry: usize,
    /// Entries a read copied with nothing marked, and with every class
    /// marked on every CPU.
    pub copied_quiet: usize,
    pub copied_marked: usize,
}

/// Mean CPU µs of `calls` calls of `f`.
fn time(calls: u32, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t0 = thread_cpu_ns();
    for _ in 0..calls {
        f()?;
    }
    Ok((thread_cpu_ns() - t0) as f64 / 1e3 / calls as f64)
}

/// Run in a fresh testbed; `rounds` rounds of `calls` calls per read.
pub fn run(services: u32, rounds: usize, calls: u32) -> Result<Report> {
    gate::check_privileges()?;
    let tb = Testbed::create(
        TestbedOpts { prefix: NS_PREFIX, ipv6: true, queues: 1 },
        &format!("{}-tick", std::process::id()),
    )?;
    let b = tb.b.clone();
    std::thread::spawn(move || -> Result<Report> {
        netns::enter(&b)?;
        measure(services, rounds, calls)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the measuring thread panicked"))?
}

/// Inside the namespace: the services, the config, the gate, the timings.
fn measure(services: u32, rounds: usize, calls: u32) -> Result<Report> {
    let mut held = (vec![], vec![]);
    // Half IPv4, half IPv6 (dual-stack): both families have sockets to dump.
    for i in 0..services as u16 {
        let any = if i % 2 == 0 { "0.0.0.0" } else { "::" };
        held.0.push(UdpSocket::bind((any, 7000 + i)).context("a UDP service socket")?);
        held.1.push(TcpListener::bind((any, 8000 + i)).context("a TCP listener")?);
    }
    let ifindex = gate::ifindex(IF_B)?;
    let mut discovery = Discovery::sharing(Listeners::fresh_for(ifindex, std::time::Duration::ZERO)?);
    let base = config::from_flags(&[])?;
    let (cfg, _) = discover::merge(&base, &discovery.poll()?);
    let mut gate = Gate::load()?;
    gate.apply(&cfg, &classify::compile(&cfg)?)?;
    gate.attach(IF_B, XdpMode::Native, false)?;
    // The daemon's tick as it runs while packets arrive (every signal read),
    // and as it runs calm with none (the UDP read carried 9 ticks in 10).
    let mut ticker = Ticker::new(&cfg, None, false)?;
    ticker.read_every_tick();
    let mut calm = Ticker::new(&cfg, None, false)?;
    // The same classes each at a static rate: every tick re-splits each
    // one's rate over the possible CPUs (`Gate::rebalance_from`).
    let mut limited_cfg = cfg.clone();
    limited_cfg.classes.iter_mut().for_each(|c| c.limit = config::Limit::Rate { pps: 1_000_000, burst: 10_000 });
    let mut limited = Ticker::new(&limited_cfg, None, false)?;
    limited.read_every_tick();
    let mut health = HealthReader::new(&cfg, None)?;
    let mut diag = SockDiag::open(None)?;
    let mut netstat = NsFile::open_here("netstat")?;
    let (mut snmp, mut snmp6) = (NsFile::open_here("snmp")?, NsFile::open_here("snmp6")?);
    let families = [libc::AF_INET as u8, libc::AF_INET6 as u8];
    // The services' sockets as the health reader keys them, to read alone.
    let n = services as u16;
    let keys = |diag: &mut SockDiag, proto: i32, states: u32, lo: u16| -> Result<Vec<SockKey>> {
        let mut keys = vec![];
        for &f in &families {
            diag.dump_ports(f, proto as u8, states, &[(lo, lo + n.max(1) - 1)], &mut |s| {
                keys.push(s.key(proto as u8))
            })?;
        }
        Ok(keys)
    };
    let udp_keys = keys(&mut diag, libc::IPPROTO_UDP, u32::MAX, 7000)?;
    let tcp_keys = keys(&mut diag, libc::IPPROTO_TCP, 1 << TCP_LISTEN, 8000)?;
    // The TCP signals are read every TCP_TICKS ticks; the UDP counters only
    // while an auto class is near its knee (then every tick). The sockets
    // are read alone while there are few (both families hold some here).
    let tcp_per_sec = 100.0 / sluice::signals::health::TCP_TICKS as f64;
    let alone = |keys: &[SockKey]| keys.len() <= sluice::signals::health::ALONE_PER_DUMP * families.len();
    let (udp_alone, tcp_alone) = (alone(&udp_keys), alone(&tcp_keys));
    let either = |yes: bool, rate: f64| if yes { rate } else { 0.0 };
    // The tick's read of the counters: nothing marked (no packet since the
    // last read), and every class marked on every CPU (each saw packets
    // everywhere: the most a read copies).
    let mut reads = sluice::dataplane::gate::CounterReads::default();
    let (mut copied_quiet, mut copied_marked) = (0, 0);
    let names: [(&'static str, f64); 17] = [
        ("the whole tick (health, auto, budget, limits)", 100.0),
        ("the whole tick, calm, no packet (UDP carried)", 2.0),
        ("the whole tick, every class limited (not summed)", 0.0),
        ("  health: every signal below, once", 100.0),
        ("  sock_diag UDP, each socket read alone", either(udp_alone, 100.0)),
        ("  sock_diag UDP dump, IPv4 + IPv6", either(!udp_alone, 100.0)),
        ("  sock_diag TCP listeners, each read alone", either(tcp_alone, tcp_per_sec)),
        ("  sock_diag TCP LISTEN dump, IPv4 + IPv6", either(!tcp_alone, tcp_per_sec)),
        ("  /proc/net/netstat (TcpExt)", tcp_per_sec),
        ("  /proc/net/softnet_stat", 100.0),
        ("  /proc/net/snmp + snmp6 (only near a knee)", 100.0),
        ("  gate counters, the tick's read, none marked", 100.0),
        ("  the same, every class marked on every CPU", 0.0),
        ("  gate counters, the statistics' read, none marked", 10.0),
        ("  gate counters, every entry read (not made now)", 0.0),
        ("  the same, one class at a time (not made now)", 0.0),
        ("discovery (once a second)", 1.0),
    ];
    let mut samples: Vec<Vec<f64>> = vec![vec![]; names.len()];
    for _ in 0..rounds {
        let s = [
            time(calls, || ticker.tick(&mut gate, |_| {}))?,
            time(calls, || calm.tick(&mut gate, |_| {}))?,
            time(calls, || limited.tick(&mut gate, |_| {}))?,
            time(calls, || health.read(false).map(drop))?,
            time(calls, || diag.read_each(&udp_keys, &mut |_| {}).map(drop))?,
            time(calls, || {
                families.iter().try_for_each(|&f| diag.dump(f, libc::IPPROTO_UDP as u8, u32::MAX, &mut |_| {}))
            })?,
            time(calls, || diag.read_each(&tcp_keys, &mut |_| {}).map(drop))?,
            time(calls, || {
                families.iter().try_for_each(|&f| diag.dump(f, libc::IPPROTO_TCP as u8, 1 << TCP_LISTEN, &mut |_| {}))
            })?,
            time(calls, || {
                netstat.read().map(|t| {
                    let _ = sluice::signals::health::parse_tcpext(&t);
                })
            })?,
            time(calls, || softnet().map(drop))?,
            time(calls, || {
                let (a, b) = (snmp.read()?, snmp6.read()?);
                let _ = sluice::signals::procfs::udp_counters(&a, &b);
                Ok(())
            })?,
            time(calls, || {
                reads.read(&gate, cfg.classes.len());
                copied_quiet = reads.copied;
                Ok(())
            })?,
            time(calls, || {
                gate.mark_every_class();
                reads.read(&gate, cfg.classes.len());
                copied_marked = reads.copied;
                Ok(())
            })?,
            time(calls, || {
                reads.read_between(&gate, cfg.classes.len());
                std::hint::black_box(reads.totals());
                Ok(())
            })?,
            time(calls, || Ok(gate.all_class_counters(cfg.classes.len()).map(drop)?))?,
            time(calls, || Ok((0..cfg.classes.len()).try_for_each(|i| gate.class_counters(i).map(drop))?))?,
            time((calls / 10).max(1), || discovery.poll().map(drop))?,
        ];
        for (v, x) in samples.iter_mut().zip(s) {
            v.push(x);
        }
    }
    let parts = names
        .iter()
        .zip(&samples)
        .map(|(&(name, per_sec), v)| Part {
            name,
            per_sec,
            us: sluice_testkit::summary::median(v).unwrap_or(f64::NAN),
            min_us: v.iter().copied().fold(f64::INFINITY, f64::min),
        })
        .collect();
    drop(held);
    let counters = CounterRead {
        classes: cfg.classes.len(),
        possible_cpus: gate.ncpus(),
        bytes_per_entry: std::mem::size_of::<sluice::bpf_intf::sluice_class_state>(),
        copied_quiet,
        copied_marked,
    };
    Ok(Report { services, classes: cfg.classes.len(), rounds, calls, parts, counters })
}

/// The table.
pub fn render(r: &Report) -> String {
    let mut s = format!(
        "the daemon's loop with {} UDP services and {} TCP listeners ({} classes), {} rounds x {} calls, thread CPU time\n",
        r.services, r.services, r.classes, r.rounds, r.calls
    );
    let _ = writeln!(s, "{:<48} {:>10} {:>10} {:>8} {:>12}", "read", "us/call", "min us", "calls/s", "% of a core");
    for p in &r.parts {
        let _ =
            writeln!(s, "{:<48} {:>10.1} {:>10.1} {:>8} {:>11.2}%", p.name, p.us, p.min_us, p.per_sec, p.core_pct());
    }
    // The 10 ms tick (the first row) and discovery; the calm tick replaces the first while nothing arrives.
    let total = r.parts.iter().filter(|p| p.name.starts_with("the whole tick (") || p.name.starts_with("discovery"));
    let total: f64 = total.map(Part::core_pct).sum();
    let _ = writeln!(s, "daemon loop total (tick + discovery): {total:.2}% of one core (target of issue 8: <= 1%)");
    let c = &r.counters;
    let us = |what: &str| r.parts.iter().find(|p| p.name.contains(what)).map_or(f64::NAN, |p| p.us);
    let (quiet, marked) = (us("none marked"), us("every class marked"));
    let _ = writeln!(
        s,
        "the tick's read of the gate counters copies the entries marked since its last read: \
         {} with none marked ({quiet:.1} us: the marks of {} classes, a word per 64 possible CPUs each), \
         {} of {} classes x {} possible CPUs with all marked ({:.1} KiB, {marked:.1} us, {:.2} us an entry); \
         it grows with the (class, CPU) pairs that saw packets, not with the possible CPUs",
        c.copied_quiet,
        c.classes,
        c.copied_marked,
        c.classes,
        c.possible_cpus,
        (c.copied_marked * c.bytes_per_entry) as f64 / 1024.0,
        (marked - quiet) / c.copied_marked.max(1) as f64
    );
    s
}
