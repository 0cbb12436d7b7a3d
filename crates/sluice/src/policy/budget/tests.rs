use super::*;

fn class(priority: u8, offered: f64, admitted: f64, distress: Option<&'static str>) -> BudgetClass {
    BudgetClass { priority, offered, admitted, distress }
}

#[test]
fn distress_throttles_the_lowest_level_first_and_never_the_higher_ones() {
    let mut b = Budget::default();
    let cs = [
        class(0, 1e6, 1e6, None),
        class(20, 5e3, 5e3, Some("socket queue")),
        class(30, 1e5, 1e5, None),
        class(255, 7e5, 7e5, None),
    ];
    let l = b.step(&cs, false).to_vec();
    // Priority 0 is above the distressed service, 20 is the service: untouched.
    assert_eq!(l[0], None);
    assert_eq!(l[1], None);
    // Only the lowest level is cut, to half of what it admitted.
    assert_eq!(l[2], None);
    assert_eq!(l[3], Some(3.5e5));
    // While the signals lag, no second cut.
    let l = b.step(&cs, false).to_vec();
    assert_eq!(l[3], Some(3.5e5));
}

#[test]
fn the_next_level_is_cut_once_the_lowest_is_at_the_floor() {
    let mut b = Budget::default();
    let cs = [class(20, 5e3, 5e3, Some("socket drops")), class(30, 1e5, 1e5, None), class(255, 7e5, 50.0, None)];
    let l = b.step(&cs, false).to_vec();
    assert_eq!(l[2], None, "the floor is not cut further");
    assert_eq!(l[1], Some(5e4));
}

/// Observe mode stops at the budget's first step: the lowest level is cut
/// down to the floor as enforcing would, but while its throttle would hold
/// back traffic the level above is not cut (enforcing, that throttle might
/// have ended the distress).
#[test]
fn observing_the_next_level_is_not_cut_while_a_lower_throttle_would_hold() {
    let sick = |flood_admitted| {
        [class(20, 5e3, 5e3, Some("socket drops")), class(30, 1e5, 1e5, None), class(255, 7e5, flood_admitted, None)]
    };
    let mut b = Budget::new(true);
    let mut cuts = 0;
    let mut admitted = 7e5;
    for _ in 0..200 {
        let l = b.step(&sick(admitted), false).to_vec();
        if l[2].is_some_and(|t| t < admitted) {
            cuts += 1;
        }
        // Observing, the gate counts as admitted what it would have admitted.
        admitted = l[2].unwrap_or(admitted);
    }
    assert!(cuts > 5 && b.limits[2] == Some(FLOOR_PPS), "the flood's level goes to the floor: {:?}", b.limits);
    assert_eq!(b.limits[1], None, "the level above is not cut while the flood's throttle would hold");
    // Enforcing, the same health cuts the next level once the lowest is at the floor.
    let mut b = Budget::default();
    b.step(&sick(50.0), false);
    assert_eq!(b.limits[1], Some(5e4));
}

#[test]
fn backlog_drops_throttle_everything_below_the_highest_priority() {
    let mut b = Budget::default();
    let cs = [class(20, 5e3, 5e3, None), class(255, 7e5, 7e5, None)];
    let l = b.step(&cs, true).to_vec();
    assert_eq!(l, [None, Some(3.5e5)]);
    assert_eq!(b.distress, Some((20, "backlog drops")));
}

#[test]
fn healthy_ticks_grow_the_highest_throttled_level_first() {
    let mut b = Budget::default();
    let sick = [class(0, 5e3, 5e3, Some("q")), class(10, 1e5, 1e5, None), class(20, 1e5, 1e5, None)];
    b.step(&sick, false);
    for _ in 0..COOL_TICKS {
        b.step(&[class(0, 5e3, 5e3, Some("q")), class(10, 1e5, 1e5, None), class(20, 1e5, 100.0, None)], false);
    }
    let before = b.limits.clone();
    assert!(before[1].is_some() && before[2].is_some(), "{before:?}");
    let healthy = [class(0, 5e3, 5e3, None), class(10, 1e5, before[1].unwrap(), None), class(20, 1e5, 100.0, None)];
    let after = b.step(&healthy, false).to_vec();
    assert!(after[1].unwrap() > before[1].unwrap(), "the higher throttled level grows");
    assert_eq!(after[2], before[2], "the lower one waits");
}

#[test]
fn a_level_far_above_its_traffic_is_released_after_a_healthy_spell() {
    let mut b = Budget::default();
    b.step(&[class(0, 5e3, 5e3, Some("q")), class(255, 1e5, 1e5, None)], false);
    let calm = [class(0, 5e3, 5e3, None), class(255, 10.0, 10.0, None)];
    for _ in 0..RELEASE_TICKS - 1 {
        b.step(&calm, false);
    }
    assert!(b.limits[1].is_some());
    b.step(&calm, false);
    assert_eq!(b.limits[1], None);
}

/// A receive path of capacity C (work units per second) shared by a service
/// (priority 20, 5k/s) and a flood to a closed port (priority 255): while the
/// admitted total is over C the service's queue stands. The budget must keep
/// the service healthy most of the time and still give the flood a good part
/// of the spare capacity (it is not told which packets are bad).
#[test]
fn the_budget_settles_below_the_knee_of_a_shared_receive_path() {
    let (cap, legit, flood) = (100e3, 5e3, 7e5);
    let mut b = Budget::default();
    let (mut sick_ticks, mut flood_sum) = (0, 0.0);
    let mut backlog = 0.0;
    for t in 0..3000 {
        let admitted_flood = b.limits.get(1).copied().flatten().map_or(flood, |l| l.min(flood));
        // Work beyond capacity piles up and drains at the spare capacity.
        backlog = (backlog + (legit + admitted_flood - cap) * 0.01).max(0.0);
        let distress = (backlog > 50.0).then_some("socket queue");
        let cs = [class(20, legit, legit, distress), class(255, flood, admitted_flood, None)];
        b.step(&cs, false);
        if t >= 1000 {
            sick_ticks += u32::from(distress.is_some());
            flood_sum += admitted_flood;
        }
    }
    let flood_avg = flood_sum / 2000.0;
    // The trade the constants make: the service is almost never touched
    // (each touch queues its requests), the flood keeps over a third of the
    // spare capacity (measured: 1 tick in distress, 41%).
    assert!(sick_ticks < 20, "the service was in distress {sick_ticks} of 2000 ticks");
    assert!(flood_avg > 0.35 * (cap - legit) && flood_avg < cap, "the flood got {flood_avg:.0}/s");
}

/// Issue 48: with the tracer, a service's own socket drops or queue never
/// make it distressed for the budget (only the CPU signal does); without
/// the tracer (it could not load), they are the fallback.
#[test]
fn own_socket_trouble_is_distress_only_without_the_tracer() {
    assert_eq!(cause(None, Some("socket drops"), true), None, "traced: its own drops throttle no one");
    assert_eq!(cause(Some(CPU_TAKEN), Some("socket drops"), true), Some(CPU_REASON));
    assert_eq!(cause(Some(CPU_TAKEN * 0.99), None, true), None, "under the CPU-taken mark");
    assert_eq!(cause(Some(0.0), Some("socket drops"), false), Some("socket drops"));
    assert_eq!(
        cause(None, Some("socket drops"), false),
        Some("socket drops"),
        "no tracer: the queues are all there is"
    );
    assert_eq!(cause(None, None, false), None);
}
