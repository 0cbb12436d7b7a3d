//! What the gate's SYN answer and its egress learner cost per call
//! (`SynCost`, `LearnerCost`): one run per test-run call, as the answer
//! rewrites its frame.
use super::*;

/// A SYN answered by the gate (a cookie SYN-ACK built in the frame,
/// XDP_TX), after the socket lookup and without it (a direct class: its
/// listener a wildcard one, the client holding no socket; bpf/sluice.h,
/// struct sluice_syn_guard), beside the same SYN dropped by a class's
/// rate, and the no-op floor.
/// Measured one run per test-run call (SYN_CALLS calls, the kernel's mean
/// per call; the median over the rounds): the answer rewrites the frame,
/// so a repeated run would answer a SYN-ACK after the first.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SynCost {
    pub noop_ns: f64,
    pub dropped_ns: f64,
    pub answered_ns: f64,
    #[serde(default)]
    pub direct_ns: f64,
    /// Passed to the kernel by a class that neither answers nor watches
    /// (`syn_cookies = "off"`), and by one that watches (the default,
    /// "auto": one SYN in SLUICE_WATCH_EVERY looked up, its listener's SYN
    /// queue with room); their difference is what watching costs a SYN with no flood.
    #[serde(default)]
    pub passed_ns: Option<f64>,
    #[serde(default)]
    pub watched_ns: Option<f64>,
}

pub(super) const SYN_CALLS: u32 = 20_000;

/// A SYN as Linux sends it (MSS, SACK permitted, timestamps, window scale)
/// from 127.0.0.2 to 127.0.0.1:`port`.
fn syn_frame(port: u16) -> Vec<u8> {
    let mut f = Frame::tcp("127.0.0.2", "127.0.0.1", 40000, port).payload(0).build();
    let l4 = f.len() - 20;
    f.truncate(l4 + 12);
    f.extend([0xa0, 0x02, 0xfa, 0xf0, 0, 0, 0, 0]); // doff 10, SYN, window, checksum, urgent
    f.extend([2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7]);
    let ip = l4 - 20;
    let total = (f.len() - ip) as u16;
    f[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
    f
}

/// The egress learner (tc) on one packet leaving, ns a call (one run per
/// call, median of the rounds): from a port of no class (it looks the port
/// up and stops), and a class's answer whose flow has no stamp (the answer
/// delay's hash and lookup: the usual case, as the gate offers one request
/// in SLUICE_DELAY_EVERY a stamp). An answer that times a stamp adds a
/// clock read and a bucket's count; not measured here: each call would
/// need a request through the XDP program first, and an XDP test run
/// beside a TC one waits for an RCU grace period (the kernel's XDP
/// dispatcher), which swamps the figure.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LearnerCost {
    pub noop_ns: f64,
    pub unclassed_ns: f64,
    pub untimed_ns: f64,
}

pub(super) fn learner_cost(rounds: usize) -> Result<LearnerCost> {
    let cfg = config::from_flags(&["bench:match=udp:53".to_string()])?;
    let (gate, _) = bench_gate(Gate::load()?, &cfg)?;
    let answer = Frame::udp("10.0.0.2", "10.0.0.1", 53, 4000).build();
    let other = Frame::udp("10.0.0.2", "10.0.0.1", 9999, 4000).build();
    let floor = Generator::load()?;
    let learn = |p: &[u8], n| Ok(gate.test_run(Prog::Learn, p, n)?);
    let (mut noop, mut unclassed, mut untimed) = (vec![], vec![], vec![]);
    for _ in 0..rounds.min(7) {
        noop.push(per_call(|p, n| floor.noop_run(p, n), &answer, XDP_PASS)?);
        unclassed.push(per_call(learn, &other, 0)?);
        untimed.push(per_call(learn, &answer, 0)?);
    }
    Ok(LearnerCost {
        noop_ns: median(&mut noop),
        unclassed_ns: median(&mut unclassed),
        untimed_ns: median(&mut untimed),
    })
}

/// A gate whose class "bench" (tcp:`port`) has the SYN guard `guard`, at
/// a rate that admits everything, or, `drop`, one that drops SYNs the guard does not answer.
fn syn_gate(port: u16, guard: sluice_syn_guard, drop: bool) -> Result<Gate> {
    let rate = if drop { "1" } else { "1G" };
    let cfg = config::from_flags(&[format!("bench:rate={rate},burst=1000000,match=tcp:{port}")])?;
    let (mut gate, bench) = bench_gate(Gate::load()?, &cfg)?;
    gate.set_syn_key([0x0123_4567_89ab_cdef, 0xfeed_f00d], 1500);
    gate.set_clock(&Clock { epoch: 1, now_ms: sluice::base::clock::wall_ms(), known_ttl_ms: 3_600_000 });
    gate.set_syn_guard(bench, &guard)?;
    Ok(gate)
}

/// The kernel's mean ns of SYN_CALLS single-run calls, each on a fresh copy
/// of `pkt`. All but 1% must get `want`: the rate-limited class refills a
/// token a second, and a call that finds one passes its SYN.
fn per_call(run: impl Fn(&[u8], u32) -> Result<(u32, Duration)>, pkt: &[u8], want: u32) -> Result<f64> {
    let (mut total, mut other) = (0.0, 0u32);
    for _ in 0..SYN_CALLS {
        let (verdict, d) = run(pkt, 1)?;
        other += u32::from(verdict != want);
        total += d.as_nanos() as f64;
    }
    anyhow::ensure!(
        other <= SYN_CALLS / 100,
        "bench SYN: {other} of {SYN_CALLS} calls got another verdict than {want}"
    );
    Ok(total / SYN_CALLS as f64)
}

pub(super) fn syn_cost(rounds: usize) -> Result<SynCost> {
    const XDP_TX: u32 = 3;
    // The gate answers only SYNs for a listener it finds: a real one, on loopback.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let syn = syn_frame(port);
    let guard = |answer, direct, early| sluice_syn_guard { answer, check_until_ms: u64::MAX, direct, early, _pad: 0 };
    let (answers, drops) = (syn_gate(port, guard(1, 0, 0), false)?, syn_gate(port, guard(0, 0, 0), true)?);
    let (passes, watches) = (syn_gate(port, guard(0, 0, 0), false)?, syn_gate(port, guard(0, 0, 1), false)?);
    // A direct class: the wildcard listener the daemon would have found,
    // and the bits of 1,000 other client addresses holding sockets (syn_peers).
    let wildcard = std::net::TcpListener::bind("0.0.0.0:0")?;
    let direct_syn = syn_frame(wildcard.local_addr()?.port());
    let both = SLUICE_SYN_DIRECT_V4 | SLUICE_SYN_DIRECT_V6;
    let directs = syn_gate(wildcard.local_addr()?.port(), guard(1, both, 0), false)?;
    let held = (0..1000u32).map(|i| peer_key(std::net::Ipv4Addr::from(0x0a01_0000 + i).into())).collect();
    directs.set_syn_peer_words(&peer_words(&held))?;
    drops.test_run(Prog::Gate, &syn, 2_000_000)?; // drain the burst
    let floor = Generator::load()?;
    let (mut noop, mut dropped, mut answered, mut direct) = (vec![], vec![], vec![], vec![]);
    let (mut passed, mut watched) = (vec![], vec![]);
    for _ in 0..rounds.min(7) {
        noop.push(per_call(|p, n| floor.noop_run(p, n), &syn, XDP_PASS)?);
        dropped.push(per_call(|p, n| Ok(drops.test_run(Prog::Gate, p, n)?), &syn, XDP_DROP)?);
        answered.push(per_call(|p, n| Ok(answers.test_run(Prog::Gate, p, n)?), &syn, XDP_TX)?);
        direct.push(per_call(|p, n| Ok(directs.test_run(Prog::Gate, p, n)?), &direct_syn, XDP_TX)?);
        passed.push(per_call(|p, n| Ok(passes.test_run(Prog::Gate, p, n)?), &syn, XDP_PASS)?);
        watched.push(per_call(|p, n| Ok(watches.test_run(Prog::Gate, p, n)?), &syn, XDP_PASS)?);
    }
    let direct_ns = median(&mut direct);
    let answered_ns = median(&mut answered);
    let (passed_ns, watched_ns) = (Some(median(&mut passed)), Some(median(&mut watched)));
    Ok(SynCost {
        noop_ns: median(&mut noop),
        dropped_ns: median(&mut dropped),
        answered_ns,
        direct_ns,
        passed_ns,
        watched_ns,
    })
}
