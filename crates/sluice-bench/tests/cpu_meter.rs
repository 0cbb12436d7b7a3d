//! The bench's two CPU meters (the idle thread and /proc/stat) on a CPU this
//! test loads to a known share: each reads that share, and they agree within
//! the bound the bench uses to mark a level. Its own test binary, so no other
//! test of this crate runs on the CPU meanwhile.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::base::netns::pin_thread;
use sluice_bench::scenarios::level::CPU_METERS_BOUND;
use sluice_bench::testbed::measure::IdleMeter;

const CPU: usize = 1;

/// Keep `CPU` busy for `share` of every 10 ms until stopped.
fn load(share: f64, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        pin_thread(CPU).unwrap();
        let period = Duration::from_millis(10);
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            while start.elapsed() < period.mul_f64(share) {
                std::hint::spin_loop();
            }
            std::thread::sleep(period.saturating_sub(start.elapsed()));
        }
    })
}

/// Both meters' busy fraction of `CPU` over 2 s with `share` of it loaded.
fn measure(meter: &IdleMeter, share: f64) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let t = (share > 0.0).then(|| load(share, stop.clone()));
    std::thread::sleep(Duration::from_millis(200));
    let a = meter.sample(CPU).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let b = meter.sample(CPU).unwrap();
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = t {
        t.join().unwrap();
    }
    let busy = meter.busy_between(&a, &b);
    (busy.idle_thread.expect("the meter runs"), busy.procstat)
}

#[test]
fn both_cpu_meters_read_a_known_load() {
    assert!(std::thread::available_parallelism().unwrap().get() > CPU, "needs CPU {CPU}");
    let meter = IdleMeter::start(CPU).unwrap();
    for share in [0.0, 0.3, 0.7] {
        let (idle_thread, procstat) = measure(&meter, share);
        eprintln!("load {share:.2}: idle-thread meter {idle_thread:.3}, /proc/stat {procstat:.3}");
        // The loader's sleep overshoots by a timer slack and the VM steals
        // time now and then: 0.12 around the share (a broken meter reads 0, 1,
        // or the other meter's complement).
        for (name, got) in [("idle thread", idle_thread), ("/proc/stat", procstat)] {
            assert!((got - share).abs() <= 0.12, "{name} read {got:.3} with {share} of the CPU loaded");
        }
        assert!(
            (idle_thread - procstat).abs() <= CPU_METERS_BOUND,
            "the meters differ by {:.3} at load {share}",
            (idle_thread - procstat).abs()
        );
    }
}
