//! Per-CPU split of a class's rate (pure logic; see the design comment in
//! `bpf/gate.bpf.c` for why the split follows each CPU's recent arrivals).
use crate::bpf_intf::{
    sluice_share, SLUICE_CLOCK_SKIP, SLUICE_MODE_BLOCKED, SLUICE_MODE_LIMITED, SLUICE_MODE_UNLIMITED,
    SLUICE_TOKEN_SCALE,
};
use crate::policy::config::Limit;

/// Every CPU keeps at least 1/FLOOR_DIV of an even share, so a CPU that starts
/// receiving a class's packets is not shut out until the next update.
pub const FLOOR_DIV: u64 = 64;

/// Split `total` packets/s over CPUs in proportion to `arrivals` (packets each
/// CPU saw in the last period), each CPU keeping a small floor. The shares add
/// up to `total` exactly. With no arrivals at all, the split is even.
pub fn split_rate(total: u64, arrivals: &[u64]) -> Vec<u64> {
    let n = arrivals.len() as u64;
    assert!(n > 0, "at least one CPU");
    let sum: u128 = arrivals.iter().map(|&a| a as u128).sum();
    let floor = total / (n * FLOOR_DIV);
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
