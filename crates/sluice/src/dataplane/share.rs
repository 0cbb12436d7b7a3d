//! Per-CPU split of a class's rate (pure logic; see the design comment in
//! `bpf/gate.bpf.c` for why the split follows each CPU's recent arrivals).
use crate::bpf_intf::{
    sluice_share, ClassCounters, SLUICE_CLOCK_SKIP, SLUICE_CS_KNOWN_PKTS, SLUICE_CS_SAMPLED_KNOWN, SLUICE_CS_SEEN_PKTS,
    SLUICE_CS_UNDER_PKTS, SLUICE_CS_UNKNOWN_PKTS, SLUICE_MODE_BLOCKED, SLUICE_MODE_LIMITED, SLUICE_MODE_UNLIMITED,
    SLUICE_TOKEN_SCALE,
};
use crate::policy::config::Limit;

/// The class counters a split follows, in `CpuArrivals`' order.
const SPLIT_COUNTERS: [u32; 5] =
    [SLUICE_CS_SEEN_PKTS, SLUICE_CS_KNOWN_PKTS, SLUICE_CS_SAMPLED_KNOWN, SLUICE_CS_UNDER_PKTS, SLUICE_CS_UNKNOWN_PKTS];

/// A class's per-CPU counters at the last split (`CpuArrivals::since`),
/// and its known sources' recent packets per CPU (`CpuArrivals::known_recent`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SplitCounts {
    last: Vec<[u64; SPLIT_COUNTERS.len()]>,
    known_recent: Vec<u64>,
}

/// The known tier follows where known packets landed over the last few
/// splits, not the last one alone: each split's known packets are added to
/// a per-CPU sum that loses 1/2^KNOWN_SPLIT_SHIFT of itself a split (an
/// eighth: half of a CPU's weight is gone after 5 ticks, 50 ms). One
/// queue's packets are not always taken on one CPU (on veth a busy NAPI on
/// the flood's CPU takes the other sender's packets too): split by one
/// tick's counts, the CPU that took one of a client's packets in a tick got
/// half the tier, and the next tick a floor of 4/s and a bucket of one
/// packet, where the client's next stray packet was dropped (an
/// integration run: 2-23 of 499 lost, every one at the known tier).
pub const KNOWN_SPLIT_SHIFT: u32 = 3;
/// The sums are kept in 1/2^KNOWN_SPLIT_SCALE packets, so that a CPU's last
/// packet fades over many splits, not in one rounding.
const KNOWN_SPLIT_SCALE: u32 = 10;

/// What each CPU saw of a class since the last split, by tier. Each tier
/// is split by its own arrivals: a known client that enters on a CPU the
/// flood does not reach (another RSS queue) finds the known tier there, where a
/// split by all arrivals gave that CPU the flood's share of it, next to
/// nothing (issue 51: 51.5% of a known client's answers on 2 CPUs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuArrivals {
    /// Every packet of the class.
    pub seen: Vec<u64>,
    /// Known sources' packets within their own rate (counted while source
    /// fairness is on).
    pub known: Vec<u64>,
    /// Known sources' packets in the gate's sample (one in
    /// SLUICE_KNOWN_SAMPLE, counted in any mode).
    pub sampled_known: Vec<u64>,
    /// Unknown sources' packets within their source's share (fairness on).
    pub under: Vec<u64>,
    /// Unknown sources' packets (fairness on).
    pub unknown: Vec<u64>,
    /// The known packets per CPU over the last few splits, this one's
    /// included (`KNOWN_SPLIT_SHIFT`).
    pub known_recent: Vec<u64>,
}

impl CpuArrivals {
    /// The arrivals since `last` (updated to `now`, one class's per-CPU
    /// counters). A counter that went back (a class id reset) counts 0.
    pub fn since(last: &mut SplitCounts, now: &[ClassCounters]) -> CpuArrivals {
        last.last.resize(now.len(), [0; SPLIT_COUNTERS.len()]);
        last.known_recent.resize(now.len(), 0);
        let mut a = CpuArrivals::default();
        for (cnt, old) in now.iter().zip(last.last.iter_mut()) {
            let new = SPLIT_COUNTERS.map(|i| cnt[i as usize]);
            let [seen, known, sampled_known, under, unknown] = std::array::from_fn(|i| new[i].saturating_sub(old[i]));
            a.seen.push(seen);
            a.known.push(known);
            a.sampled_known.push(sampled_known);
            a.under.push(under);
            a.unknown.push(unknown);
            *old = new;
        }
        for (sum, &n) in last.known_recent.iter_mut().zip(&a.known) {
            *sum = *sum - (*sum >> KNOWN_SPLIT_SHIFT) + n.saturating_mul(1 << KNOWN_SPLIT_SCALE);
        }
        a.known_recent.clone_from(&last.known_recent);
        a
    }

    /// What splits the known tier (the class bucket while source fairness
    /// is on): the known sources' recent packets (`known_recent`), so a
    /// tick that counted none (a client's pause, a short tick) moves
    /// nothing. Fairness just turned on: the gate's sample of known
    /// sources; with no known packet at all, an even split (known clients
    /// may come on any CPU; split by all arrivals, the flood's CPU would
    /// take the tier).
    pub fn known_tier(&self) -> &[u64] {
        first_counted([&self.known_recent, &self.sampled_known])
    }

    /// What splits the unknown tier: its packets within their source's
    /// share, each CPU's part of the max-min fair budget (a CPU whose few
    /// light sources are all within their share gets what they send, not
    /// the share of the unknown arrivals a flood on another CPU leaves it);
    /// without them, its packets; without those, all of the class's.
    pub fn unknown_tier(&self) -> &[u64] {
        first_counted([&self.under, &self.unknown, &self.seen])
    }
}

/// The first of `counts` that counted a packet on some CPU (else the
/// last: all zero, an even split).
fn first_counted<const N: usize>(counts: [&Vec<u64>; N]) -> &[u64] {
    counts.iter().find(|v| v.iter().any(|&n| n > 0)).unwrap_or(&counts[N - 1])
}

/// Every CPU keeps at least 1/FLOOR_DIV of an even share, so a CPU that starts
/// receiving a class's packets is not shut out until the next update; and
/// at least a packet a second where the rate has one for each CPU (at 256
/// CPUs, 1/64 of an even share is 0 for a rate under 16,384/s, and a rate
/// of 0 drops everything).
pub const FLOOR_DIV: u64 = 64;

/// Split `total` packets/s over CPUs in proportion to `arrivals` (packets each
/// CPU saw in the last period), each CPU keeping a small floor. The shares add
/// up to `total` exactly. With no arrivals at all, the split is even.
pub fn split_rate(total: u64, arrivals: &[u64]) -> Vec<u64> {
    let n = arrivals.len() as u64;
    assert!(n > 0, "at least one CPU");
    let sum: u128 = arrivals.iter().map(|&a| a as u128).sum();
    let floor = (total / (n * FLOOR_DIV)).max(u64::from(total >= n));
    let spread = total - floor * n;
    let mut shares: Vec<u64> = arrivals
        .iter()
        .map(|&a| {
            let extra = (spread as u128 * a as u128).checked_div(sum).map_or(spread / n, |x| x as u64);
            floor + extra
        })
        .collect();
    // Rounding leftovers go to the busiest CPU, so the sum is exact.
    let given: u64 = shares.iter().sum();
    let busiest = (0..arrivals.len()).rev().max_by_key(|&i| arrivals[i]).unwrap_or(0);
    shares[busiest] += total - given;
    shares
}

/// The per-CPU map values for a class with `limit`, its rate split by
/// `arrivals`; with `under` (the class arrived below its limit in the last
/// period) every CPU gets the whole rate and burst instead: a split by last
/// period's arrivals would leave a CPU that starts receiving the class's
/// packets (a flow moved, RSS rehashed) a small share while the class as a
/// whole is under its rate. The price: for one period after a flood starts
/// the CPUs together may admit up to their number times the rate.
pub fn shares_for(limit: &Limit, arrivals: &[u64], under: bool) -> Vec<sluice_share> {
    match *limit {
        // An auto class admits everything until the controller's first tick sets its rate.
        Limit::Unlimited | Limit::Auto(_) => {
            vec![sluice_share { mode: SLUICE_MODE_UNLIMITED, ..Default::default() }; arrivals.len()]
        }
        Limit::Blocked => vec![sluice_share { mode: SLUICE_MODE_BLOCKED, ..Default::default() }; arrivals.len()],
        Limit::Rate { pps, burst } if under => vec![share(pps, burst); arrivals.len()],
        Limit::Rate { pps, burst } => split_rate(pps, arrivals)
            .into_iter()
            .map(|rate| {
                // The burst follows the rate share, at least one packet.
                let b = ((burst as u128 * rate as u128) / pps as u128).max(1) as u64;
                share(rate, b)
            })
            .collect(),
    }
}

/// The known tier's per-CPU shares (`shares_for` of its limit, split by
/// `CpuArrivals::known_tier`), each bucket at least SLUICE_KNOWN_BURST_PKTS
/// deep (a known client's own smallest burst, bpf/sluice.h): a CPU that
/// takes a known client's packets now and then has a small share of the
/// rate, and a bucket of one packet there dropped the second of two that
/// came close together.
pub fn known_shares(limit: &Limit, arrivals: &[u64], under: bool) -> Vec<sluice_share> {
    deep_shares(limit, arrivals, under, u64::from(crate::bpf_intf::SLUICE_KNOWN_BURST_PKTS))
}

/// The unknown tier's per-CPU shares (`shares_for` of its limit, split by
/// `CpuArrivals::unknown_tier`), each bucket at least the tier's own least
/// depth (`fair::UNKNOWN_DEPTH_MIN`). A light source alone on a CPU (a
/// client new during a flood that enters on another queue) gets about
/// what it sends there, and the tier's 1 ms of depth split by that left
/// its bucket one packet deep: any two of its packets that came closer
/// than its pace lost the second (the sources bench's new client on
/// another CPU than the flood: 58-62% answered, against 93-95% when the
/// tier was 10 ms deep).
pub fn unknown_shares(limit: &Limit, arrivals: &[u64], under: bool) -> Vec<sluice_share> {
    deep_shares(limit, arrivals, under, crate::policy::fair::UNKNOWN_DEPTH_MIN)
}

/// `shares_for`, with every CPU's bucket at least `least` packets deep
/// (never deeper than the limit's whole burst). The rates are split as
/// ever; all CPUs together may admit that many packets more, once.
fn deep_shares(limit: &Limit, arrivals: &[u64], under: bool, least: u64) -> Vec<sluice_share> {
    let shares = shares_for(limit, arrivals, under);
    let Limit::Rate { burst, .. } = *limit else { return shares };
    let least = least.min(burst);
    shares.into_iter().map(|s| if s.burst < least { share(s.rate_pps, least) } else { s }).collect()
}

/// One CPU's bucket parameters, with fill_ns precomputed (no division in BPF).
pub fn share(rate_pps: u64, burst: u64) -> sluice_share {
    let fill_ns = if rate_pps == 0 {
        u64::MAX
    } else {
        (burst as u128 * SLUICE_TOKEN_SCALE as u128).div_ceil(rate_pps as u128) as u64
    };
    // Fewer tokens than the burst may accrue between clock reads (gate.bpf.c).
    let clock_skip = (burst.saturating_sub(1)).min(SLUICE_CLOCK_SKIP as u64) as u32;
    sluice_share { rate_pps, burst, fill_ns, mode: SLUICE_MODE_LIMITED, clock_skip, ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_arrivals_and_sum_exactly() {
        let s = split_rate(100_000, &[300, 100]);
        assert_eq!(s.iter().sum::<u64>(), 100_000);
        // floor = 100000/128 = 781 each; the remaining 98438 split 3:1.
        assert_eq!(s[1], 781 + 98_438 / 4);
        assert!(s[0] > s[1] * 2);
    }

    #[test]
    fn idle_cpu_keeps_a_floor_and_no_arrivals_split_evenly() {
        let s = split_rate(64_000, &[1000, 0]);
        assert_eq!(s[1], 64_000 / 128);
        assert_eq!(s.iter().sum::<u64>(), 64_000);
        assert_eq!(split_rate(10_001, &[0, 0]), vec![5001, 5000]);
    }

    #[test]
    fn on_many_cpus_an_idle_cpu_keeps_a_packet_a_second() {
        let mut arrivals = vec![0u64; 256];
        arrivals[3] = 50_000;
        let s = split_rate(10_000, &arrivals);
        assert_eq!(s.iter().sum::<u64>(), 10_000);
        assert!(s.iter().all(|&r| r >= 1), "a CPU at 0/s drops all: {:?}", &s[..8]);
        assert_eq!(s[3], 10_000 - 255);
        assert_eq!(split_rate(100, &arrivals).iter().sum::<u64>(), 100, "fewer packets than CPUs: no floor");
    }

    #[test]
    fn under_limit_every_cpu_gets_at_least_its_arrivals() {
        // Arrivals in one period; the shares are packets/s, so a CPU's share
        // must cover its arrivals times the periods per second (10 here).
        let arrivals = [4_000u64, 1_000];
        let s = split_rate(100_000, &arrivals);
        for (share, a) in s.iter().zip(arrivals) {
            assert!(*share >= a * 10, "{share} < {}", a * 10);
        }
    }

    #[test]
    fn fill_time_and_modes() {
        let sh = share(1_000_000, 100);
        assert_eq!(sh.fill_ns, 100_000); // 100 packets at 1 Mpps = 100 us
        assert_eq!(share(3, 1).fill_ns, 333_333_334, "rounded up");
        assert_eq!(share(0, 1).fill_ns, u64::MAX);
        assert_eq!(share(10, 1).clock_skip, 0, "a one-packet bucket reads the clock on every drop");
        assert_eq!(share(10, 1000).clock_skip, SLUICE_CLOCK_SKIP);
        let v = shares_for(&Limit::Rate { pps: 1000, burst: 10 }, &[1, 1], false);
        assert_eq!(v.iter().map(|s| s.rate_pps).sum::<u64>(), 1000);
        assert!(v.iter().all(|s| s.mode == SLUICE_MODE_LIMITED && s.burst == 5));
        assert!(shares_for(&Limit::Blocked, &[0; 4], false).iter().all(|s| s.mode == SLUICE_MODE_BLOCKED));
    }

    /// Per-CPU counters with `seen`, `known`, `sampled_known`, `under`, `unknown` set.
    fn counters(v: [u64; 5]) -> ClassCounters {
        let mut c = [0; crate::bpf_intf::SLUICE_CS_NR as usize];
        for (i, x) in SPLIT_COUNTERS.iter().zip(v) {
            c[*i as usize] = x;
        }
        c
    }

    #[test]
    fn each_tier_is_split_by_its_own_arrivals_since_the_last_split() {
        let mut last = SplitCounts::default();
        let a = CpuArrivals::since(&mut last, &[counters([5, 0, 0, 0, 0]), counters([1, 0, 0, 0, 0])]);
        assert_eq!((a.seen, a.known), (vec![5, 1], vec![0, 0]), "the first read counts from 0");
        // CPU 0: a flood of strangers; CPU 1: a known client and one light stranger.
        let now = [counters([20_005, 0, 1_250, 9, 20_000]), counters([504, 500, 31, 3, 3])];
        let a = CpuArrivals::since(&mut last, &now);
        assert_eq!(a.seen, vec![20_000, 503]);
        assert_eq!(a.known_tier(), &[0, 500 << KNOWN_SPLIT_SCALE], "the known tier follows the known packets");
        assert_eq!(a.unknown_tier(), &[9, 3], "the unknown tier follows the packets within their share");
        let a = CpuArrivals::since(&mut last, &now);
        let faded = (500 << KNOWN_SPLIT_SCALE) * 7 / 8;
        assert_eq!(a.known_tier(), &[0, faded], "no known packet since: the recent ones, an eighth gone");
        assert_eq!(a.unknown_tier(), &[0, 0], "nothing since: all zero (an even split)");
        // A stray known packet on CPU 0 moves an eighth of a tick's weight there, not half the tier.
        let stray = [counters([20_005, 1, 1_250, 9, 20_000]), counters([506, 502, 31, 3, 3])];
        let a = CpuArrivals::since(&mut last, &stray);
        let split = split_rate(400, a.known_tier());
        assert!(split[0] < 10 && split[1] > 390, "{split:?}");
    }

    #[test]
    fn a_tier_with_nothing_counted_falls_back_to_the_sample_then_to_all_arrivals() {
        let mut last = SplitCounts::default();
        // Fairness just turned on: no known or unknown packet counted yet.
        let a = CpuArrivals::since(&mut last, &[counters([900, 0, 0, 0, 0]), counters([100, 0, 3, 0, 0])]);
        assert_eq!(a.known_tier(), &[0, 3], "the gate's sample of known sources");
        assert_eq!(a.unknown_tier(), &[900, 100], "all arrivals");
        let a = CpuArrivals::since(&mut last, &[counters([1900, 0, 0, 0, 50]), counters([200, 0, 3, 0, 10])]);
        assert_eq!(a.known_tier(), &[0, 0], "no known packet recently, no sample: an even split, not the flood's");
        assert_eq!(a.unknown_tier(), &[50, 10], "none within share: the unknown packets");
        // A counter that went back (the class id reset) counts nothing.
        let a = CpuArrivals::since(&mut last, &[counters([0; 5]), counters([0; 5])]);
        assert_eq!(a.seen, vec![0, 0]);
    }

    #[test]
    fn every_cpus_known_tier_bucket_holds_a_known_clients_smallest_burst() {
        let limit = Limit::Rate { pps: 400, burst: 40 };
        let v = known_shares(&limit, &[1, 1000], false);
        assert_eq!(v.iter().map(|s| s.rate_pps).sum::<u64>(), 400, "the rate is split as ever");
        assert_eq!(v[0].burst, u64::from(crate::bpf_intf::SLUICE_KNOWN_BURST_PKTS), "{v:?}");
        assert_eq!(v[0].fill_ns, share(v[0].rate_pps, v[0].burst).fill_ns);
        assert!(v[1].burst > v[0].burst);
        let shallow = known_shares(&Limit::Rate { pps: 100, burst: 3 }, &[1, 1000], false);
        assert!(shallow.iter().all(|s| s.burst <= 3), "never deeper than the tier: {shallow:?}");
    }

    #[test]
    fn every_cpus_unknown_tier_bucket_holds_the_tiers_least_depth() {
        // The sources bench's case: the tier 1 ms deep beside known clients
        // (20k/s, 20 tokens), a flood's source within its share on CPU 0 and
        // a new client's 2 packets a tick on CPU 1.
        let limit = Limit::Rate { pps: 20_000, burst: 20 };
        let v = unknown_shares(&limit, &[200, 2], false);
        assert_eq!(v.iter().map(|s| s.rate_pps).sum::<u64>(), 20_000, "the rate is split as ever");
        assert!(v[1].rate_pps >= 200, "the light CPU's rate covers what it sends: {v:?}");
        let split = shares_for(&limit, &[200, 2], false);
        assert_eq!(split[1].burst, 1, "split by the rate alone, one packet deep");
        assert_eq!(v[1].burst, crate::policy::fair::UNKNOWN_DEPTH_MIN, "{v:?}");
        assert_eq!(v[0].burst, split[0].burst, "the flood's CPU keeps its own depth");
        let shallow = unknown_shares(&Limit::Rate { pps: 100, burst: 3 }, &[1, 1000], false);
        assert!(shallow.iter().all(|s| s.burst <= 3), "never deeper than the tier: {shallow:?}");
    }

    /// Do no harm (issue 21): a class under its rate with all of its last
    /// period's packets on CPU 0 must not find CPU 1's bucket nearly empty
    /// when its packets move there.
    #[test]
    fn a_class_under_its_rate_gets_the_whole_rate_on_every_cpu() {
        let limit = Limit::Rate { pps: 10_000, burst: 100 };
        let split = shares_for(&limit, &[50, 0], false);
        assert!(split[1].rate_pps < 200, "over its rate: split by arrivals ({})", split[1].rate_pps);
        let whole = shares_for(&limit, &[50, 0], true);
        assert!(whole.iter().all(|s| s.rate_pps == 10_000 && s.burst == 100), "{whole:?}");
    }
}
