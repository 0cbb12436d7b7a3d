//! The table `sluice status` prints, and `sluice sources --class NAME`.
use std::fmt::Write as _;

use super::*;

/// The table `sluice status` prints.
pub fn render_table(s: &Snapshot) -> String {
    let mut o = String::new();
    render_header(&mut o, s);
    render_classes(&mut o, &s.classes);
    render_answers(&mut o, &s.classes);
    render_late(&mut o, &s.classes);
    render_auto(&mut o, &s.classes);
    for c in s.classes.iter().filter(|c| c.dropped_with_room_pkts.is_some_and(|n| n > 0)) {
        let _ = writeln!(
            o,
            "SELF-INFLICTED: the gate dropped {} packets of {} while its service had room (no distress)",
            c.dropped_with_room_pkts.unwrap_or(0),
            c.name
        );
    }
    render_no_signal(&mut o, &s.classes);
    render_syn_guards(&mut o, &s.classes);
    render_budget(&mut o, s);
    render_sources(&mut o, s);
    crate::dataplane::steer::render_status(&mut o, &s.readers);
    render_kernel_drops(&mut o, &s.classes);
    let rss = s.daemon_rss_bytes.map_or("not read".into(), |b| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64));
    let tick = match s.tick_ms {
        Some(t) if t > 10.0 => format!("tick {t:.0} ms (calm; the gate woke it {} times{})", s.wakes, woke_in(s)),
        Some(t) => format!(
            "tick {t:.0} ms{}",
            if s.wakes > 0 { format!(" (woken {} times{})", s.wakes, woke_in(s)) } else { String::new() }
        ),
        None => "tick not reported".into(),
    };
    let _ = writeln!(
        o,
        "daemon CPU {:.1}% of one CPU ({:.1} s in total{}), resident memory {rss}, {tick}",
        s.daemon_cpu_pct,
        s.daemon_cpu_secs,
        softirq_part(s)
    );
    let g = &s.global;
    let _ = writeln!(
        o,
        "(* = default class)  non-IP passed {}  non-IP dropped {}  malformed dropped {}  malformed passed {}  depth exceeded {}  fragments {}",
        g.non_ip_pass, g.non_ip_drop, g.malformed_drop, g.malformed_pass, g.depth_exceeded, g.fragments
    );
    o
}

/// The first lines: the daemon, and what is wrong with it (detached, a
/// refused reload, observe mode).
fn render_header(o: &mut String, s: &Snapshot) {
    let up = s.uptime_secs as u64;
    let _ = writeln!(
        o,
        "sluice on {} (ifindex {}, {} XDP, prog id {}), pid {}, up {}h{:02}m{:02}s, reloads {}",
        s.interface,
        s.ifindex,
        s.xdp_mode,
        s.prog_id,
        s.pid,
        up / 3600,
        up / 60 % 60,
        up % 60,
        s.reloads
    );
    if !s.attached {
        let _ = writeln!(
            o,
            "GATE DETACHED: program {} is no longer attached to {} (link detached or interface re-created): nothing is protected; restart sluice",
            s.prog_id, s.interface
        );
    }
    if let Some(e) = &s.last_reload_error {
        let _ = writeln!(o, "LAST RELOAD REFUSED (old config still active): {e}");
    }
    if s.global.stale_pass > 0 {
        let _ = writeln!(
            o,
            "STALE PASSES: {} packets passed past the daemon's deadline (it stalled for over {} s: the gate failed open)",
            s.global.stale_pass,
            crate::dataplane::ALIVE_NS / 1_000_000_000
        );
    }
    if s.observe {
        let _ = writeln!(
            o,
            "OBSERVE MODE: nothing is dropped; the DROP figures are what enforcing would have dropped ({} packets passed so far)",
            s.global.observed_pass
        );
    }
}

/// One line per class: its limit, rates (over the last second) and totals
/// (packets since start), each column's header saying which.
fn render_classes(o: &mut String, classes: &[ClassSnapshot]) {
    let _ = writeln!(
        o,
        "{:<24} {:>4} {:>14} {:>10} {:>10} {:>10} {:>14} {:>14} {:>14}",
        "CLASS", "PRIO", "LIMIT", "SEEN/s", "ADMIT/s", "DROP/s", "SEEN TOTAL", "ADMIT TOTAL", "DROP TOTAL"
    );
    for c in classes {
        let name = if c.is_default { format!("{}*", c.name) } else { c.name.clone() };
        let _ = writeln!(
            o,
            "{:<24} {:>4} {:>14} {:>10} {:>10} {:>10} {:>14} {:>14} {:>14}",
            name,
            c.priority,
            c.limit,
            human(c.rates.seen_pps),
            human(c.rates.admitted_pps),
            human(c.rates.dropped_pps),
            c.totals.seen_pkts,
            c.totals.admitted_pkts,
            c.totals.dropped_pkts()
        );
    }
}

/// How long each class's service took to answer over the rate window (the
/// gate times a request it admitted to the answer leaving: bpf/gate/delay.h),
/// for the classes with an answer timed since the gate was loaded.
fn render_answers(o: &mut String, classes: &[ClassSnapshot]) {
    let timed: Vec<&ClassSnapshot> = classes.iter().filter(|c| c.totals.answer_delays.samples > 0).collect();
    if timed.is_empty() {
        return;
    }
    let _ = writeln!(o, "{:<24} {:>10} {:>14} {:>14}", "ANSWERED IN", "ANSWERS/s", "p50", "p99");
    for c in timed {
        let r = &c.rates;
        let _ = writeln!(
            o,
            "{:<24} {:>10} {:>14} {:>14}",
            c.name,
            human(r.answers_ps),
            delay_ms(r.answer_p50_ms),
            delay_ms(r.answer_p99_ms)
        );
    }
}

/// The TCP auto classes whose answers are slow (or late) or that are
/// limited for them (`policy::late`), a line each.
fn render_late(o: &mut String, classes: &[ClassSnapshot]) {
    for c in classes {
        let Some(l) = c.late.as_ref().filter(|l| l.slow || l.rate_pps.is_some()) else { continue };
        let (now, calm) = (delay_ms(l.window_p90_ms), delay_ms(l.calm_p90_ms));
        let (known_now, known_calm) = (delay_ms(l.known_window_p90_ms), delay_ms(l.known_calm_p90_ms));
        let lane = crate::policy::fair::ROOM_KNOWN;
        let has_lane = l.known_share.is_some_and(|k| k >= lane);
        // As policy::late judges it: a load to shed for someone.
        let sheds = l.busy.unwrap_or(has_lane);
        let first = if has_lane { "known clients first" } else { "nobody known, each source to its share of the work" };
        // Why a service read not busy: idle CPUs, or CPUs a neighbour fills.
        let not_busy = match (l.cpus_busy, l.own_share) {
            (Some(cpus), Some(own)) if cpus >= crate::policy::late::BUSY_SHARE => format!(
                "its CPUs are full ({:.0}% busy), {:.0}% of that its own work: a neighbour's load, not its own",
                cpus * 100.0,
                own * 100.0
            ),
            (Some(cpus), _) => {
                format!(
                    "its service is idle (its CPUs {:.0}% busy; late for something else, not for its load)",
                    cpus * 100.0
                )
            }
            _ => "its service is idle (late for something else, not for its load)".into(),
        };
        let what = match (l.rate_pps, l.late) {
            (Some(r), true) if sheds => format!(
                "limited at {}/s, {first}; its unknown sources' tier is cut while the answers are late",
                human(r)
            ),
            (Some(r), true) => format!(
                "limited at {}/s, {first}; not cut: {not_busy}; let go after {} s of it",
                human(r),
                crate::policy::late::RELEASE_SECS
            ),
            (Some(r), false) => {
                format!(
                    "limited at {}/s, {first}; answers in time again, its unknown sources' tier grows back",
                    human(r)
                )
            }
            (None, true) if sheds => {
                format!("not limited yet: {} late windows in a row engage it", crate::policy::late::LATE_RUN)
            }
            (None, true) if l.busy == Some(false) => format!("not limited: {not_busy}"),
            (None, true) => {
                let why = match l.known_share {
                    Some(k) => format!(
                        "too few known clients to serve first ({:.0}% of its calm arrivals, under {:.0}%)",
                        k * 100.0,
                        lane * 100.0
                    ),
                    None => "no known client to serve first (none answered while calm)".into(),
                };
                format!("not limited: {why}, and its service's load was not read")
            }
            (None, false) => "slower than usual, not late: learning no client meanwhile".into(),
        };
        let _ = writeln!(
            o,
            "LATE ANSWERS: {}: p90 {now} (calm: {calm}), its known clients' p90 {known_now} (calm: {known_calm}): {what}",
            c.name
        );
    }
}

/// A quantile of the answer delay: its bucket's upper edge, as "under X",
/// or the last bucket's lower edge as "over X"; "-" with none timed.
fn delay_ms(v: Option<f64>) -> String {
    let Some(v) = v else { return "-".into() };
    let last = crate::policy::delay::edge_ms(crate::policy::delay::BUCKETS - 1);
    let n = if v < 1.0 { format!("{v:.2}") } else { format!("{v:.0}") };
    if v >= last {
        format!("over {n} ms")
    } else {
        format!("under {n} ms")
    }
}

/// The auto classes' controllers, if any.
fn render_auto(o: &mut String, classes: &[ClassSnapshot]) {
    if !classes.iter().any(|c| c.auto.is_some()) {
        return;
    }
    let _ = writeln!(
        o,
        "{:<24} {:>5} {:>9} {:>10} {:>10} {:>10} {:>5} {:>7} {:>12}",
        "AUTO CLASS", "ALGO", "STATE", "CAPACITY", "TARGET", "RATE", "SOCKS", "QUEUE", "SIGNALS LOST"
    );
    for c in classes {
        let Some(a) = &c.auto else { continue };
        let _ = writeln!(
            o,
            "{:<24} {:>5} {:>9} {:>10} {:>10} {:>10} {:>5} {:>6}% {:>11.1}s",
            c.name,
            a.algo,
            a.state,
            human(a.capacity_pps),
            human(a.target_pps),
            a.rate_pps.map_or("unlimited".into(), human),
            a.sockets,
            (100 * a.queued_bytes).checked_div(a.rcvbuf_bytes).unwrap_or(0),
            a.lost_secs
        );
    }
}

/// Classes whose SYNs the gate answers or answered (SYN cookies at the
/// driver), and one line if this kernel cannot complete connections from
/// gate cookies while some class has TCP ports.
fn render_syn_guards(o: &mut String, classes: &[ClassSnapshot]) {
    let guarded: Vec<(&ClassSnapshot, &SynGuardStatus)> =
        classes.iter().filter_map(|c| c.syn_guard.as_ref().map(|g| (c, g))).collect();
    if let Some((_, g)) = guarded.iter().find(|(_, g)| !g.available) {
        let why = g.why_unavailable.as_deref().unwrap_or("the kernel lacks bpf_sk_assign_tcp_reqsk, Linux 6.9");
        let _ = writeln!(o, "SYN COOKIES: unavailable ({why}): the kernel answers every SYN");
    }
    for (c, g) in guarded.iter().filter(|(c, g)| g.answering || c.totals.synack_pkts > 0) {
        let t = &c.totals;
        let now = if g.answering { "answers its SYNs now" } else { "answered SYNs earlier" };
        let refused = match t.cookies_refused {
            0 => String::new(),
            n => format!(", valid cookies the kernel refused {n}"),
        };
        let direct = match t.synack_direct {
            0 => String::new(),
            n => format!("; {n} of the SYN-ACKs sent without a socket lookup"),
        };
        let early = match t.synack_early {
            0 => String::new(),
            n => format!("; {n} sent before the guard engaged, a listener's SYN queue half full"),
        };
        let _ = writeln!(
            o,
            "SYN COOKIES: the gate {now} for {} (syn_cookies = {}); totals since start: SYN-ACKs sent {}, \
             valid cookies back {}{refused}, ACKs without one {}, ACKs and RSTs of no connection dropped {}{direct}{early}",
            c.name, g.policy, t.synack_pkts, t.cookies_valid, t.cookies_invalid, t.dropped_noconn_pkts
        );
    }
}

/// Auto classes with no socket of their own to read (the service stopped,
/// is restarting, or its sockets could not be dumped): what their rate is
/// then. A class is never limited for lack of a signal unless it already was.
fn render_no_signal(o: &mut String, classes: &[ClassSnapshot]) {
    for c in classes {
        let Some(a) = c.auto.as_ref().filter(|a| a.sockets == 0) else { continue };
        let rate = a.rate_pps.map_or("unlimited".into(), |r| format!("{}/s", human(r)));
        let what = match a.state.as_str() {
            "holding" => format!("its last rate ({rate}) is held for auto.hold, then its fallback applies"),
            "fallback" => format!("its fallback applies ({rate})"),
            _ => format!("not limited on what it cannot see ({rate})"),
        };
        let _ = writeln!(
            o,
            "NO SIGNAL: {} has no socket to read for {:.1} s (its service stopped or is restarting, or its sockets could not be read): {what}",
            c.name, a.lost_secs
        );
    }
}

/// Where the kernel dropped what the gate admitted (since start).
fn render_kernel_drops(o: &mut String, classes: &[ClassSnapshot]) {
    if classes.iter().all(|c| c.kernel_drops.is_empty()) {
        return;
    }
    let _ = writeln!(o, "{:<24} {:<10} {:<24} {:>12}", "DROPPED AFTER THE GATE", "STAGE", "REASON", "PACKETS");
    for c in classes {
        for d in &c.kernel_drops {
            let _ = writeln!(o, "{:<24} {:<10} {:<24} {:>12}", c.name, d.stage, d.reason, d.packets);
        }
    }
    for c in classes.iter().filter(|c| c.known_lost_pkts.is_some_and(|n| n > 0)) {
        let n = c.known_lost_pkts.unwrap_or(0);
        let _ = writeln!(
            o,
            "KNOWN LOST: {n} packets of {}'s known clients were dropped after the gate admitted them",
            c.name
        );
    }
}

/// The budget's throttles and the discovered classes' priorities.
fn render_budget(o: &mut String, s: &Snapshot) {
    if let Some((secs, e)) = &s.signals_unreadable {
        let what =
            if *secs >= crate::policy::controller::STALE_TICKS as f64 * crate::policy::controller::TICK.as_secs_f64() {
                "stale: throttles released, auto classes unlimited until they can be read"
            } else {
                "the last limits are kept for now"
            };
        _ = writeln!(o, "SIGNALS UNREADABLE for {secs:.1} s ({e}): {what}");
    }
    match &s.distress {
        Some(d) => _ = writeln!(o, "budget: a service is in distress ({d}); classes below it are throttled"),
        None => match &s.last_distress {
            Some((d, ago)) => _ = writeln!(o, "budget: no service in distress now (last: {d}, {ago:.1} s ago)"),
            None => _ = writeln!(o, "budget: no service in distress"),
        },
    }
    for c in s.classes.iter().filter(|c| c.throttle_pps.is_some()) {
        _ = writeln!(o, "  {} throttled to {}/s", c.name, human(c.throttle_pps.unwrap_or(0.0)));
    }
    if !s.rx_measured {
        _ = writeln!(o, "receive work per CPU: not measured (no tracer): distress is read from queues only");
    }
    for c in s.classes.iter() {
        if let Some(t) = c.rx_cpu_taken.filter(|&t| t >= 0.01) {
            let pct = 100.0 * t;
            _ = writeln!(o, "  {}: receive work for lower classes took {pct:.0}% of its busiest CPU", c.name);
        }
    }
    if let Some(a) = &s.cpu_away {
        _ = writeln!(o, "cpu away: {a}");
    }
    if !s.discover {
        _ = writeln!(o, "discovery off (discover = false or --no-discover)");
    } else if s.classes.iter().all(|c| c.discovered.is_none()) {
        _ = writeln!(o, "discovery on: no listening service without a configured class was found");
    }
    for c in s.classes.iter() {
        if let Some(why) = &c.discovered {
            _ = writeln!(o, "  discovered {}: {why}", c.name);
        }
    }
}

/// The lines `sluice status` adds for classes that count sources or learn.
fn render_sources(o: &mut String, s: &Snapshot) {
    let shown: Vec<_> = s.classes.iter().filter_map(|c| c.sources.as_ref().map(|x| (c, x))).collect();
    if shown.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "{:<24} {:>8} {:>8} {:>9} {:>9} {:>10} {:>8} {:>15} {:>8}",
        "SOURCES", "LEARNING", "QUOTA", "COUNT AT", "ACTIVE", "SHARE DROP/s", "KNOWN", "HELD/PART", "TRACKED"
    );
    for (c, x) in shown {
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        let _ = writeln!(
            o,
            "{:<24} {:>8} {:>8} {:>9} {:>9} {:>12} {:>8} {:>15} {:>8}",
            c.name,
            if x.learning { "yes" } else { "no" },
            x.quota.map_or("-".into(), |q| q.to_string()),
            format!("/{} /{}", x.plen4, x.plen6),
            human(x.active_per_epoch),
            human(x.share_dropped_pps),
            opt(x.known),
            format!("{}/{}", opt(x.known_held), opt(x.known_part)),
            opt(x.tracked)
        );
    }
    let m = &s.sources;
    let _ = match m.entries {
        None => writeln!(o, "sources map: {} entries, not scanned yet", m.capacity),
        Some(entries) => {
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            writeln!(
                o,
                "sources map: {entries} of {} entries, {} evicted, {} known sources",
                m.capacity,
                opt(m.evictions),
                opt(m.known)
            )
        }
    };
}

/// `sluice sources --class NAME`: one class's fairness and its heaviest droppers.
pub fn render_sources_class(s: &Snapshot, class: &str) -> Result<String, String> {
    let c = s.classes.iter().find(|c| c.name == class).ok_or_else(|| {
        let names: Vec<&str> = s.classes.iter().map(|c| c.name.as_str()).collect();
        format!("no class named \"{class}\"; classes: {names:?}")
    })?;
    let mut o = String::new();
    let Some(x) = &c.sources else {
        let _ = writeln!(o, "{}: no source state (the class is not limited and does not learn)", c.name);
        return Ok(o);
    };
    let _ = writeln!(
        o,
        "{}: quota {} per 10 ms epoch (paced), counted at /{} /{}; {} active sources per epoch; learning {}",
        c.name,
        x.quota.map_or("- (not limited, or one source: nobody to share with)".into(), |q| q.to_string()),
        x.plen4,
        x.plen6,
        human(x.active_per_epoch),
        if x.learning { "yes" } else { "no" }
    );
    let _ = writeln!(
        o,
        "known sources {}, tracked sources {} (last scan; scanned every {} s)",
        x.known.map_or("-".into(), |v| v.to_string()),
        x.tracked.map_or("-".into(), |v| v.to_string()),
        crate::signals::source_tables::SCAN_EVERY.as_secs()
    );
    if x.top.is_empty() {
        let _ = writeln!(o, "no source was dropped over its quota");
        return Ok(o);
    }
    let _ = writeln!(o, "{:<44} {:>14} {:>12} {:>10}", "SOURCE", "DROPPED", "LAST EPOCH", "EPOCH");
    for t in &x.top {
        let _ = writeln!(o, "{:<44} {:>14} {:>12} {:>10}", t.prefix, t.drops, t.pkts, t.epoch);
    }
    Ok(o)
}
/// "; of it, softirq while its threads ran: X%": the receive work this kernel
/// charges to whatever thread is current (none shown where not counted).
fn softirq_part(s: &Snapshot) -> String {
    match (s.daemon_softirq_pct, s.daemon_softirq_secs) {
        (Some(p), Some(t)) => format!("; of it, softirq run while its threads were on the CPU: {p:.1}%, {t:.1} s"),
        (None, Some(t)) => format!("; of it, softirq run while its threads were on the CPU: {t:.1} s"),
        _ => String::new(),
    }
}

/// ", the last in X ms (longest Y ms)": how long the gate's wakes took to reach the loop.
fn woke_in(s: &Snapshot) -> String {
    match (s.wake_ms, s.wake_max_ms) {
        (Some(l), Some(m)) => format!(", the last in {l:.2} ms, longest {m:.2} ms"),
        _ => String::new(),
    }
}
