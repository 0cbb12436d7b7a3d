use super::*;

const DT: f64 = 0.01;

fn tick(rate: f64, counts: FairCounts) -> FairTick {
    FairTick {
        rate,
        dt: DT,
        epoch: DT,
        counts,
        distress: false,
        dropped: false,
        late: false,
        by_answers: false,
        slow: false,
        held: true,
        queue: None,
        capacity: 1 << 18,
    }
}

/// One epoch of the gate for unknown sources with these demands (packets per
/// epoch): each gets min(demand, quota), what is within quota is capped by
/// the unknown tier's budget. Returns what each source got and the counts.
fn epoch(demands: &[u64], out: &FairOut) -> (Vec<u64>, FairCounts) {
    let q = out.quota as u64;
    let within: Vec<u64> = demands.iter().map(|&d| d.min(q)).collect();
    let under: u64 = within.iter().sum();
    let budget = (out.unknown_pps * DT) as u64;
    // The bucket admits `budget` of the within-quota packets, spread evenly.
    let got = within.iter().map(|&w| if under <= budget { w } else { w * budget / under }).collect();
    let counts = FairCounts {
        unknown: demands.iter().sum(),
        under,
        active: demands.iter().filter(|&&d| d > 0).count() as u64,
        over: demands.iter().filter(|&&d| d > q).count() as u64,
        ..Default::default()
    };
    (got, counts)
}

/// Run `ticks` epochs of a class at `rate` with these unknown demands.
fn run(rate: f64, demands: &[u64], ticks: usize) -> (Fair, FairOut, Vec<u64>) {
    let mut f = Fair::default();
    let first = FairCounts { active: demands.len() as u64, ..Default::default() };
    let mut out = f.step(&tick(rate, first));
    let mut got = vec![];
    for _ in 0..ticks {
        let (g, counts) = epoch(demands, &out);
        got = g;
        out = f.step(&tick(rate, counts));
    }
    (f, out, got)
}

#[test]
fn one_heavy_source_is_cut_to_what_the_light_ones_leave() {
    // 100k/s class: 90k/s for the unknown tier, 900 per epoch. Three light
    // clients of 50 per epoch, one flood of 50,000.
    let (_, out, got) = run(100_000.0, &[50, 50, 50, 50_000], 20);
    assert_eq!(&got[..3], &[50, 50, 50], "light sources are never cut: {got:?}");
    let budget = out.unknown_pps * DT;
    assert!((got[3] as f64) > 0.8 * (budget - 150.0), "the flood gets the rest: {got:?} of {budget}");
    assert!(got.iter().sum::<u64>() as f64 <= budget * 1.01);
}

#[test]
fn sixteen_heavy_sources_share_equally_and_light_ones_keep_theirs() {
    let mut demands = vec![20_000u64; 16];
    demands.extend([30, 30, 30, 30]);
    let (_, out, got) = run(100_000.0, &demands, 30);
    assert!(got[16..].iter().all(|&g| g == 30), "{got:?}");
    let share = (out.unknown_pps * DT - 120.0) / 16.0;
    for g in &got[..16] {
        assert!((*g as f64 - share).abs() <= share * 0.1 + 1.0, "max-min share {share}: {got:?}");
    }
}

#[test]
fn a_lone_source_has_no_quota() {
    let mut f = Fair::default();
    let out = f.step(&tick(10_000.0, FairCounts { unknown: 300, under: 99, active: 1, over: 1, ..Default::default() }));
    assert_eq!(out.quota, UNPACED);
}

#[test]
fn under_the_limit_nobody_is_cut() {
    let (_, out, got) = run(100_000.0, &[100, 200, 300], 10);
    assert_eq!(got, vec![100, 200, 300]);
    assert!(out.quota >= 300, "quota {}", out.quota);
}

#[test]
fn a_spoofed_flood_of_single_packets_moves_counting_to_shorter_prefixes() {
    let mut f = Fair::default();
    // 16 heavy sources at a tiny budget are never aggregated.
    let few = FairCounts { unknown: 16_000, under: 16, active: 16, over: 16, ..Default::default() };
    for _ in 0..2 * AGG_TICKS {
        f.step(&tick(500.0, few));
    }
    assert_eq!(f.plens(), (32, 64));
    let mut f = Fair::default();
    // 60,000 sources of one packet each per epoch against a 900-packet budget.
    let counts = FairCounts { unknown: 60_000, under: 60_000, active: 60_000, over: 0, ..Default::default() };
    for _ in 0..AGG_TICKS + 5 {
        f.step(&tick(100_000.0, counts));
    }
    assert_eq!(f.plens(), (24, 48));
    for _ in 0..AGG_TICKS + 5 {
        f.step(&tick(100_000.0, counts));
    }
    assert_eq!(f.plens(), (16, 32), "one more step, no further");
    for _ in 0..OFF_TICKS {
        f.idle();
    }
    assert_eq!(f.plens(), (32, 64), "back to addresses once the class is no longer limited");
}

#[test]
fn churn_of_the_sources_map_aggregates_too() {
    let mut f = Fair::default();
    let mut t = tick(100_000.0, FairCounts { inserts: 1_000, under: 10, ..Default::default() });
    t.capacity = 100_000; // 1000 per 10 ms = 100k/s: the whole map every second
    for _ in 0..AGG_TICKS + 1 {
        f.step(&t);
    }
    assert_eq!(f.plens(), (24, 48));
}

#[test]
fn known_sources_get_headroom_and_unknown_ones_keep_a_minimum() {
    let mut f = Fair::default();
    let out = f.step(&tick(100_000.0, FairCounts { known: 100, ..Default::default() }));
    assert_eq!(out.known_pps, 100.0 / DT * KNOWN_HEADROOM);
    assert!((out.known_pps + out.unknown_pps - 100_000.0).abs() < 1e-6);
    let out = f.step(&tick(100_000.0, FairCounts { known: 5_000, ..Default::default() }));
    assert_eq!(out.known_pps, 90_000.0, "known sources cannot take the unknown minimum");
    assert_eq!(out.unknown_pps, 10_000.0);
}

/// Issue 48: the gate counts known sources only while the class is
/// limited, so its first limited tick has no count. That tick gives both
/// tiers the whole rate (sized by no count, the known tier was 0 and the
/// gate's bucket let 1 packet/s through); from the next, the counts size it.
#[test]
fn the_first_limited_tick_holds_no_known_client_back() {
    let mut f = Fair::default();
    let out = f.step(&tick(100_000.0, FairCounts::default()));
    assert_eq!((out.known_pps, out.unknown_pps), (100_000.0, 100_000.0));
    let out = f.step(&tick(100_000.0, FairCounts { known: 50, ..Default::default() }));
    assert_eq!(out.known_pps, 50.0 / DT * KNOWN_HEADROOM, "counted: sized by the count");
    let mut none = Fair::default();
    none.step(&tick(100_000.0, FairCounts::default()));
    let out = none.step(&tick(100_000.0, FairCounts::default()));
    assert_eq!(out.known_pps, 0.0, "no known client came: no room kept after the first tick");
}

/// Do no harm (issue 21): the known tier is sized over seconds. Known
/// clients that sent 30k/s a tick ago and then paused for a tick still
/// find room for that rate when they come back (sized by the last tick
/// alone, the tier fell to nothing).
#[test]
fn the_known_tier_remembers_the_known_clients_rate_over_seconds() {
    let mut f = Fair::default();
    f.step(&tick(100_000.0, FairCounts { known: 300, ..Default::default() }));
    for _ in 0..100 {
        f.step(&tick(100_000.0, FairCounts::default()));
    }
    let out = f.step(&tick(100_000.0, FairCounts::default()));
    let remembered = 300.0 / DT * KNOWN_HEADROOM * KNOWN_DECAY.powi(101);
    assert!((out.known_pps - remembered).abs() < 1.0, "{} vs {remembered}", out.known_pps);
    assert!(out.known_pps > 0.8 * 300.0 / DT * KNOWN_HEADROOM, "a second later: {}", out.known_pps);
}

/// The unknown tier counts TCP data in work (`FairOut::by_work`) only while
/// it runs at a rate of its own beside known clients; with nobody known it
/// follows what the known tier leaves, in packets, as the class's limit.
#[test]
fn the_unknown_tier_counts_in_work_only_while_it_has_a_rate_of_its_own() {
    let mut f = Fair::default();
    let alone = tick(100_000.0, FairCounts { unknown: 5_000, under: 900, ..Default::default() });
    assert!(!f.step(&alone).by_work, "no known client: packets");
    let shared = tick(100_000.0, FairCounts { known: 10, ..alone.counts });
    assert!(f.step(&shared).by_work, "known clients beside it: work");
}

/// The unknown tier's bucket holds a millisecond of its rate while it runs
/// beside known clients (what it admits at once waits ahead of their next
/// request), and a class's usual depth otherwise.
#[test]
fn the_unknown_tier_beside_known_clients_holds_a_millisecond_of_its_rate() {
    let mut f = Fair::default();
    let alone = tick(100_000.0, FairCounts { unknown: 5_000, under: 900, ..Default::default() });
    assert_eq!(f.step(&alone).unknown_depth(), None, "no known client: the class's depth");
    let out = f.step(&tick(100_000.0, FairCounts { known: 10, ..alone.counts }));
    let ms = (out.unknown_pps * UNKNOWN_DEPTH_SECS).ceil() as u64;
    assert!(ms > UNKNOWN_DEPTH_MIN, "{}", out.unknown_pps);
    assert_eq!(out.unknown_depth(), Some(ms));
    assert!(ms * 5 < crate::policy::config::default_burst(out.unknown_pps as u64), "shallower than 10 ms of the rate");
    let slow = FairOut { unknown_pps: 500.0, ..out };
    assert_eq!(slow.unknown_depth(), Some(UNKNOWN_DEPTH_MIN), "at least a few packets");
}

#[test]
fn socket_distress_halves_the_unknown_tier_down_to_its_floor_and_it_grows_back() {
    let mut f = Fair::default();
    let mut t = tick(100_000.0, FairCounts { known: 10, unknown: 5_000, under: 900, ..Default::default() });
    let first = f.step(&t).unknown_pps;
    t.distress = true;
    let cut = f.step(&t).unknown_pps;
    assert!((cut - first * CUT).abs() < 1.0, "{first} -> {cut}");
    assert_eq!(f.step(&t).unknown_pps, cut, "no second cut within COOL_TICKS");
    for _ in 0..100 {
        f.step(&t);
    }
    assert_eq!(f.step(&t).unknown_pps, CUT_FLOOR * 100_000.0);
    t.distress = false;
    for _ in 0..300 {
        f.step(&t);
    }
    assert!((f.step(&t).unknown_pps - first).abs() < 1.0, "grown back");
    t.counts.known = 0;
    let before = f.step(&t).unknown_pps;
    t.distress = true;
    // No cut; the tier grows by what the known tier's fading memory frees.
    let after = f.step(&t).unknown_pps;
    assert!((before..before * 1.001).contains(&after), "no known client to protect: no cut ({before} -> {after})");
    // Late answers cut with no known packet in the tick: a known client
    // seen lately waits for its answers and sends nothing meanwhile.
    (t.late, t.counts.known) = (true, 0);
    for _ in 0..COOL_TICKS {
        f.step(&t);
    }
    let late = f.step(&t).unknown_pps;
    assert!(late <= after * CUT + 1.0, "late answers cut: {after} -> {late}");
    // Slow answers, not late: cut by SOFT_CUT every COOL_TICKS, never grown.
    (t.late, t.slow) = (false, true);
    let mut was = late;
    for i in 0..4 * COOL_TICKS {
        let now = f.step(&t).unknown_pps;
        assert!(now <= was, "tick {i}: slow answers never grow the tier ({was} -> {now})");
        was = now;
    }
    assert!(was <= late * SOFT_CUT * SOFT_CUT + 1.0, "cut by a tenth at least twice: {late} -> {was}");
    // In time again: it grows back.
    t.slow = false;
    assert!(f.step(&t).unknown_pps > was);
}

/// The unknown tier grows only in a tick where the gate held some of the
/// class back: through the silences between a bursting flood's rounds it
/// holds where the last cut left it, and a cut while slow still comes.
#[test]
fn the_unknown_tier_grows_only_while_the_gate_holds_some_of_the_class_back() {
    let mut f = Fair::default();
    let t = tick(100_000.0, FairCounts { known: 10, unknown: 5_000, under: 900, ..Default::default() });
    let first = f.step(&t).unknown_pps;
    let slow = FairTick { slow: true, ..t };
    for _ in 0..COOL_TICKS {
        f.step(&slow);
    }
    let cut = f.step(&slow).unknown_pps;
    assert!(cut < first, "slow answers cut: {first} -> {cut}");
    let silent = FairTick { held: false, counts: FairCounts { unknown: 0, under: 0, ..t.counts }, ..t };
    for i in 0..100 {
        assert_eq!(f.step(&silent).unknown_pps, cut, "tick {i}: nothing held back, nothing grown");
    }
    assert!(f.step(&t).unknown_pps > cut, "held back and in time: grown");
}

/// Socket drops without a standing queue (a probe's overflow) cut the
/// unknown tier by a tenth while known clients share the socket, and only
/// then; a tick without drops grows it back.
#[test]
fn socket_drops_alone_cut_the_unknown_tier_by_a_tenth() {
    let mut f = Fair::default();
    let mut t = tick(100_000.0, FairCounts { known: 10, unknown: 5_000, under: 900, ..Default::default() });
    let first = f.step(&t).unknown_pps;
    t.dropped = true;
    let cut = f.step(&t).unknown_pps;
    assert!((cut - first * SOFT_CUT).abs() < 1.0, "{first} -> {cut}");
    t.dropped = false;
    let grown = f.step(&t).unknown_pps;
    assert!(grown > cut && grown < first, "{cut} -> {grown}");
    let mut alone = Fair::default();
    let t = FairTick { dropped: true, counts: FairCounts { known: 0, ..t.counts }, ..t };
    let before = alone.step(&t).unknown_pps;
    assert!(alone.step(&t).unknown_pps >= before, "no known client to protect: no cut");
}

/// Limited for its late answers with nobody known (a busy service flooded
/// by real connections from new sources), the unknown tier is the whole
/// class, at a rate of its own counted in work: cut while late, as beside
/// known clients.
#[test]
fn limited_for_late_answers_with_nobody_known_the_unknown_tier_is_cut_while_late() {
    let counts = FairCounts { known: 0, unknown: 5_000, under: 900, active: 5, over: 4, ..Default::default() };
    let t = FairTick { by_answers: true, ..tick(100_000.0, counts) };
    let mut f = Fair::default();
    let first = f.step(&t);
    assert!(first.by_work, "counted in work: {first:?}");
    // (The tick hands a class whose answers are late `distress`: behind.)
    let late = FairTick { late: true, slow: true, distress: true, ..t };
    let mut cut = first.unknown_pps;
    for _ in 0..=COOL_TICKS {
        cut = f.step(&late).unknown_pps;
    }
    assert!(cut <= first.unknown_pps * CUT + 1.0, "cut while late: {} -> {cut}", first.unknown_pps);
    // Not limited for its answers: the tier is what the known tier leaves, in packets.
    let mut plain = Fair::default();
    let out = plain.step(&FairTick { late: true, slow: true, ..tick(100_000.0, counts) });
    assert!(!out.by_work && out.unknown_pps == 100_000.0, "{out:?}");
}

#[test]
fn learning_needs_a_calm_second_and_stops_at_a_surge() {
    let mut f = Fair::default();
    let dt = 0.01;
    let calm = (LEARN_CALM_SECS / dt).round() as usize;
    assert!(!f.learn(true, 0.0, dt), "the first tick has no rate yet");
    assert!(!(0..calm - 2).any(|_| f.learn(true, 5_000.0, dt)));
    assert!(f.learn(true, 5_000.0, dt));
    assert!(!f.learn(false, 5_000.0, dt), "one bad tick stops it");
    assert!(!(0..calm - 1).any(|_| f.learn(true, 6_000.0, dt)));
    assert!(f.learn(true, 6_000.0, dt), "a slow rise is no surge");
    assert!(!f.learn(true, 3_000_000.0, dt), "a flood starting, not limited yet, stops it at once");
    let learnt =
        (0..3000).position(|_| f.learn(true, 3_000_000.0, dt)).expect("a lasting healthy rise is learnt again");
    assert!(learnt > 200, "after seconds, not ticks: {learnt}");
}

/// The daemon ticks every 500 ms while all is calm: a calm second is two
/// such ticks, not a hundred. And a class idle for seconds before its first
/// client is still warming up when the client comes: its load is its usual,
/// not a surge (before, a client that came 2 s after the daemon started was
/// learnt only 3-4 s later, after a flood had begun).
#[test]
fn learning_counts_seconds_whatever_the_tick() {
    let mut f = Fair::default();
    assert!(!f.learn(true, 5_000.0, 0.5));
    assert!(f.learn(true, 5_000.0, 0.5), "a calm second of slow ticks");
    assert!(!f.learn(true, 100_000.0, 0.5), "a surge at the slow tick");
    let mut idle = Fair::default();
    for _ in 0..4 {
        idle.learn(true, 0.0, 0.5);
    }
    assert!(idle.learn(true, 5_000.0, 0.5), "the first load after 2 s idle is no surge");
}

/// Issue 49 item 3: after a restart (held) a class learns nothing for
/// LEARN_HOLD_AFTER_RESTART_SECS, then only after a calm second more,
/// whatever arrives; a first start learns after its calm second.
#[test]
fn no_class_learns_in_the_first_seconds_after_a_restart() {
    let dt = 0.01;
    let ticks = |secs: f64| (secs / dt).round() as usize;
    let mut first = Fair::default();
    assert!((0..ticks(LEARN_CALM_SECS) + 1).any(|_| first.learn(true, 5_000.0, dt)), "a first start learns");
    let mut f = Fair::default();
    f.hold_learning(LEARN_HOLD_AFTER_RESTART_SECS);
    let held = ticks(LEARN_HOLD_AFTER_RESTART_SECS);
    assert!(!(0..held).any(|_| f.learn(true, 5_000.0, dt)), "held for the hold");
    let after = (0..ticks(5.0)).position(|_| f.learn(true, 5_000.0, dt)).expect("learns after the hold");
    assert!(after + 1 >= ticks(LEARN_CALM_SECS), "a whole calm second after the hold: {after} ticks");
}

/// One rule for every Rust reader of the known map: answered over a second,
/// and never when the last answer is dated before the first.
#[test]
fn a_client_is_known_after_a_second_of_answers_and_never_across_a_clock_step_back() {
    let span = u64::from(crate::bpf_intf::SLUICE_KNOWN_SPAN_MS);
    assert!(known_span(5_000, 5_000 + span));
    assert!(!known_span(5_000, 5_000 + span - 1));
    assert!(!known_span(5_000 + span, 5_000), "last before first");
}

/// Issue 48: with known clients sharing the socket, a queue over
/// QUEUE_TARGET of the buffer shrinks the unknown tier before anything is
/// dropped, in proportion to how far over it is; under the target it grows
/// back; with no known client to protect the queue cuts nothing.
#[test]
fn a_queue_over_its_target_shrinks_the_unknown_tier_before_any_drop() {
    let counts = FairCounts { known: 50, unknown: 500, under: 500, active: 2, over: 1, ..Default::default() };
    let at = |q: f64| FairTick { queue: Some(q), ..tick(100_000.0, counts) };
    let mut f = Fair::default();
    let first = f.step(&at(0.1)).unknown_pps;
    let full = f.step(&at(1.0)).unknown_pps;
    assert!((full - first * (1.0 - QUEUE_GAIN)).abs() < 1.0, "a full buffer: {first} -> {full}");
    let half = f.step(&at(0.5)).unknown_pps;
    let by = 1.0 - QUEUE_GAIN * (0.5 - QUEUE_TARGET) / (1.0 - QUEUE_TARGET);
    assert!((half - full * by).abs() < 1.0, "half full: {full} -> {half}");
    assert_eq!(f.step(&at(QUEUE_TARGET)).unknown_pps, half, "at the target: held");
    let grown = f.step(&at(0.1)).unknown_pps;
    assert!(grown > half, "under the target it grows back: {half} -> {grown}");
    // Nobody known: the queue is the unknown sources' own; no cut.
    let mut alone = Fair::default();
    let t = FairTick { counts: FairCounts { known: 0, ..counts }, ..at(1.0) };
    let before = alone.step(&t).unknown_pps;
    assert!(alone.step(&t).unknown_pps >= before, "no known client to protect: no cut");
}

/// Issue 48: while known clients share the class, the unknown tier is a
/// rate of its own: a tick at a 25% higher class rate (the auto
/// controller's probe) raises it by REGROW at most, not by the probe; with
/// no known client it follows the class rate at once.
#[test]
fn a_probe_of_the_class_rate_reaches_the_unknown_tier_only_by_its_regrowth() {
    let counts = FairCounts { known: 50, unknown: 500, under: 500, active: 2, over: 1, ..Default::default() };
    let at = |rate: f64| FairTick { queue: Some(0.1), ..tick(rate, counts) };
    let mut f = Fair::default();
    let base = f.step(&at(100_000.0)).unknown_pps;
    let probed = f.step(&at(125_000.0)).unknown_pps;
    assert!(probed <= base * (1.0 + REGROW) + 1.0, "{base} -> {probed} in a probe's tick");
    let mut alone = Fair::default();
    let no_known = |rate: f64| FairTick { counts: FairCounts { known: 0, ..counts }, ..at(rate) };
    let base = alone.step(&no_known(100_000.0)).unknown_pps;
    assert!(alone.step(&no_known(125_000.0)).unknown_pps > 1.2 * base, "nobody known: the tier follows the rate");
}

/// Issue 48: between surges, a class with a known lane arms the gate's own
/// surge mark at GATE_SURGE times its usual arrivals over the gate's
/// window (never under GATE_SURGE_MIN_PKTS); while the daemon keeps room
/// it says so instead; with no known lane, or in its first calm second (no
/// usual yet), nothing.
#[test]
fn room_is_armed_at_ten_times_the_usual_between_surges_where_a_known_lane_exists() {
    let mut f = Fair::default();
    assert_eq!(f.room(), Room::Off, "nothing seen");
    f.learn(true, 50_000.0, DT);
    f.note_known(10, 9);
    assert_eq!(f.room(), Room::Off, "warming up, and under MIN_SAMPLES");
    for _ in 0..300 {
        f.learn(true, 50_000.0, DT);
        f.note_known(10, 9);
    }
    // 10 x 50k/s over 2 ms: 1,000 packets on one CPU, 1,024 in steps of 128.
    assert_eq!(f.room(), Room::Armed { surge_pkts: 1024 });
    f.learn(true, 51_000.0, DT);
    assert_eq!(f.room(), Room::Armed { surge_pkts: 1024 }, "a usual that drifts a little writes nothing new");
    f.learn(false, 2_000_000.0, DT);
    assert_eq!(f.room(), Room::Kept, "the daemon's own rule saw the surge");
    assert_eq!(gate_surge_pkts(1_000.0), GATE_SURGE_MIN_PKTS, "a trickle's mark is a NIC poll at least");
    let mut f = Fair::default();
    for _ in 0..300 {
        f.learn(true, 50_000.0, DT);
        f.note_known(100, 2);
    }
    assert_eq!(f.room(), Room::Off, "no known lane: nobody to keep room for");
}

/// Issue 48, do no harm: a class keeps room in its sockets for known
/// clients for ROOM_HOLD_SECS after a surge only; a service its own clients
/// hold at its knee (a steady load, however high) keeps none, so its
/// clients not known yet are never dropped for it, nor does the burst its
/// clients' packets make after a stall of its host (40 ms of the usual
/// load in one tick, five times the usual: a surge by LEARN_SURGE, over
/// ROOM_EXCESS_SECS only if it lasts).
#[test]
fn room_for_known_clients_is_kept_after_a_surge_only() {
    let mut f = Fair::default();
    for _ in 0..300 {
        f.learn(true, 50_000.0, DT);
        f.note_known(10, 9);
    }
    assert!(!f.keeps_room(), "a steady load, calm or at the knee: no room");
    f.learn(false, 0.0, 0.04);
    f.learn(false, 50_000.0 + 50_000.0 * 0.04 / DT, DT);
    assert!(!f.keeps_room(), "a stall's catch-up burst kept room");
    for _ in 0..300 {
        f.learn(true, 50_000.0, DT);
    }
    f.learn(false, 2_000_000.0, DT);
    assert!(f.keeps_room(), "a surge of 40 times the usual: room at once");
    let ticks = (ROOM_HOLD_SECS / DT).round() as usize;
    for _ in 0..ticks - 2 {
        f.learn(true, 50_000.0, DT);
    }
    assert!(f.keeps_room(), "held after the surge");
    for _ in 0..3 {
        f.learn(true, 50_000.0, DT);
    }
    assert!(!f.keeps_room(), "let go ROOM_HOLD_SECS after it");
    // A class whose calm arrivals were not its known clients' (never
    // learned: only a probe of theirs is known) keeps no room for them.
    let mut f = Fair::default();
    for _ in 0..300 {
        f.learn(true, 50_000.0, DT);
        f.note_known(100, 2);
    }
    f.learn(false, 2_000_000.0, DT);
    assert!(!f.keeps_room(), "room kept for the known 2% of the calm arrivals");
    // A light class samples a packet every few ticks: the share is over
    // the last KNOWN_SHARE_SAMPLES samples, not each tick's, and a pause
    // (no sample) fades nothing.
    let mut f = Fair::default();
    for i in 0..300 {
        f.learn(true, 200.0, DT);
        f.note_known(u64::from(i % 8 == 0), u64::from(i % 8 == 0));
    }
    assert!(f.calm_known_share().is_some_and(|k| k > 0.99), "{:?}", f.calm_known_share());
    for _ in 0..300 {
        f.learn(true, 0.0, DT);
        f.note_known(0, 0);
    }
    f.learn(false, 2_000_000.0, DT);
    assert!(f.keeps_room(), "a light known client's class keeps room after a surge");
}
