//! Reader steering on a real SO_REUSEPORT group, in a namespace each test
//! makes: the test process opens the group's sockets in namespace B (as a
//! service would), `sluice::dataplane::steer` reaches them through pidfd_getfd like it
//! reaches any service's, and datagrams go to B's own address from inside B.
mod common;

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::testbed::{in_netns, load, Testbed};
use sluice::dataplane::steer::{Group, Reader, Steer};
use sluice::policy::config::Readers;

const PORT: u16 = 7400;

/// `n` sockets in one reuseport group on B's address, with 8 MiB buffers.
fn group_sockets(tb: &Testbed, n: usize) -> Vec<UdpSocket> {
    let ip = tb.ip_b.clone();
    in_netns(&tb.b, move || {
        (0..n)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
                s.set_reuse_port(true).unwrap();
                s.set_recv_buffer_size(8 << 20).unwrap();
                s.bind(&format!("{ip}:{PORT}").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
                s.set_nonblocking(true).unwrap();
                UdpSocket::from(s)
            })
            .collect()
    })
}

fn group(socks: &[UdpSocket], policy: Readers) -> Group {
    let readers = socks
        .iter()
        .map(|s| {
            let inode = std::fs::metadata(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap().ino() as u32;
            Reader { inode, pid: std::process::id(), fd: s.as_raw_fd() }
        })
        .collect();
    let mut g = Group { port: PORT, readers, policy };
    g.readers.sort();
    g
}

/// The sockets in the group's (inode) order.
fn in_order(socks: Vec<UdpSocket>, g: &Group) -> Vec<UdpSocket> {
    let mut socks = socks;
    let ino = |s: &UdpSocket| std::fs::metadata(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap().ino() as u32;
    socks.sort_by_key(|s| g.readers.iter().position(|r| r.inode == ino(s)));
    socks
}

/// Send `count` datagrams from each of `flows` source sockets, one CPU, in
/// turn; each carries its flow number.
fn send(tb: &Testbed, flows: usize, count: usize) {
    let dst = format!("{}:{PORT}", tb.ip_b);
    in_netns(&tb.b, move || {
        sluice::base::netns::pin_thread(0).unwrap();
        let socks: Vec<UdpSocket> = (0..flows).map(|_| UdpSocket::bind("0.0.0.0:0").unwrap()).collect();
        for _ in 0..count {
            for (i, s) in socks.iter().enumerate() {
                s.send_to(&(i as u32).to_ne_bytes(), &dst).unwrap();
            }
        }
    });
}

/// A thread per socket draining it every `pause` until told to stop (then
/// once more); the count of datagrams read, summed.
fn keep_reading(
    socks: &[Arc<UdpSocket>],
    pause: Duration,
) -> (Arc<AtomicBool>, Arc<AtomicU64>, Vec<std::thread::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let threads = socks
        .iter()
        .map(|s| {
            let (s, stop, read) = (s.clone(), stop.clone(), read.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    read.fetch_add(drain(&s).len() as u64, Ordering::Relaxed);
                    std::thread::sleep(pause);
                }
                read.fetch_add(drain(&s).len() as u64, Ordering::Relaxed);
            })
        })
        .collect();
    (stop, read, threads)
}

/// Everything queued at a socket now: the flow number of each datagram.
fn drain(s: &UdpSocket) -> Vec<u32> {
    let mut got = vec![];
    let mut buf = [0u8; 64];
    while let Ok(n) = s.recv(&mut buf) {
        assert_eq!(n, 4);
        got.push(u32::from_ne_bytes(buf[..4].try_into().unwrap()));
    }
    got
}

#[test]
fn round_robin_deals_exactly_in_turn() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 4);
    let g = group(&socks, Readers::RoundRobin);
    let socks = in_order(socks, &g);
    let (steer, log) = steering(&g);
    assert!(log.iter().all(|l| !l.contains("not steered")), "{log:?}");
    send(&tb, 1, 400);
    let counts: Vec<usize> = socks.iter().map(|s| drain(s).len()).collect();
    assert_eq!(counts, [100, 100, 100, 100], "one flow, one CPU: exactly one in four each");
    let st = steer.status();
    assert_eq!(st[0].readers.iter().map(|r| r.steered).collect::<Vec<_>>(), [100, 100, 100, 100]);
}

#[test]
fn least_loaded_sends_nothing_more_to_a_reader_that_stopped_reading() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 4);
    let g = group(&socks, Readers::LeastLoaded);
    let socks = in_order(socks, &g);
    let (steer, log) = steering(&g);
    assert!(log.iter().all(|l| !l.contains("not steered") && !l.contains("tracepoints")), "{log:?}");
    // Readers 1-3 keep reading; reader 0 never does.
    let socks: Vec<Arc<UdpSocket>> = socks.into_iter().map(Arc::new).collect();
    let (stop, read, threads) = keep_reading(&socks[1..], Duration::from_micros(200));
    send_paced(&tb, 2_000, Duration::from_micros(100));
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().unwrap());
    let st = steer.status();
    let stalled = drain(&socks[0]).len() as u64;
    assert_eq!(st[0].readers[0].queued, Some(stalled as u32), "status showed its queue: {st:?}");
    let total = stalled + read.load(Ordering::Relaxed);
    assert_eq!(total, 2_000, "nothing lost");
    // A flow the hash gives reader 0 stays there until its queue holds the
    // stall depth; never again after that.
    let most = u64::from(sluice::bpf_intf::SLUICE_STEER_STALL_DEPTH) + 2;
    assert!(stalled <= most, "the stalled reader got {stalled} of 2000 (round-robin would give it 500)");
}

/// With the hash policy the program chooses nothing: every flow lands on the
/// socket the kernel picks without sluice.
#[test]
fn hash_leaves_the_kernels_choice_unchanged() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 4);
    let g = group(&socks, Readers::Hash);
    let socks = in_order(socks, &g);
    let flows = 64;
    let landing = |socks: &[UdpSocket]| -> Vec<Vec<u32>> {
        socks
            .iter()
            .map(|s| {
                let mut v = drain(s);
                v.sort();
                v
            })
            .collect()
    };
    // The same 64 source ports both times: the senders are bound explicitly.
    let send_fixed = |tb: &Testbed| {
        let dst = format!("{}:{PORT}", tb.ip_b);
        in_netns(&tb.b, move || {
            for i in 0..flows {
                let s = UdpSocket::bind(format!("0.0.0.0:{}", 20_000 + i)).unwrap();
                s.send_to(&(i as u32).to_ne_bytes(), &dst).unwrap();
            }
        })
    };
    send_fixed(&tb);
    let without = landing(&socks);
    let (steer, _) = steering(&g);
    send_fixed(&tb);
    let with = landing(&socks);
    assert_eq!(without, with);
    assert!(without.iter().filter(|v| !v.is_empty()).count() >= 2, "64 flows spread: {without:?}");
    assert_eq!(steer.status()[0].hashed, flows as u64, "each datagram ran the program and was left to the hash");
}

/// Least-loaded with every queue empty sends each flow where the kernel's
/// hash would (a flow keeps its reader until some queue is longer).
#[test]
fn least_loaded_keeps_each_flow_on_its_hashed_reader_while_queues_are_equal() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 4);
    let g = group(&socks, Readers::LeastLoaded);
    let socks = in_order(socks, &g);
    // One datagram per flow, every queue drained before the next: all equal.
    let one_by_one = |tb: &Testbed, socks: &[UdpSocket]| -> Vec<usize> {
        (0..32u32)
            .map(|i| {
                let dst = format!("{}:{PORT}", tb.ip_b);
                in_netns(&tb.b, move || {
                    let s = UdpSocket::bind(format!("0.0.0.0:{}", 21_000 + i)).unwrap();
                    s.send_to(&i.to_ne_bytes(), &dst).unwrap();
                });
                let got: Vec<usize> = socks.iter().map(|s| drain(s).len()).collect();
                got.iter().position(|&n| n == 1).expect("the datagram arrived")
            })
            .collect()
    };
    let without = one_by_one(&tb, &socks);
    let (steer, _) = steering(&g);
    let with = one_by_one(&tb, &socks);
    assert_eq!(without, with);
    assert!(steer.status()[0].readers.iter().map(|r| r.steered).sum::<u64>() == 32, "the program chose each");
}

/// Least-loaded keeps a flow on its hashed reader while that reader's queue
/// is under the stall depth, even with other queues shorter (moving a flow
/// breaks per-socket state); past it the flow goes to the shortest queues
/// (issue 23, item 9: it moved whenever queues differed).
#[test]
fn least_loaded_moves_a_flow_only_off_a_reader_that_fell_behind() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 4);
    let g = group(&socks, Readers::LeastLoaded);
    let socks = in_order(socks, &g);
    let (_steer, _) = steering(&g); // held: dropping it detaches
    let depth = sluice::bpf_intf::SLUICE_STEER_STALL_DEPTH as usize;
    // Nobody reads: one flow, fewer datagrams than the stall depth.
    send(&tb, 1, depth - 1);
    let queued: Vec<usize> = socks.iter().map(|s| drain(s).len()).collect();
    assert!(queued.contains(&(depth - 1)), "one reader took the whole flow: {queued:?}");
    // Again, with twice the depth: the flow's reader fills to the depth, the rest spreads.
    send(&tb, 1, 2 * depth);
    let queued: Vec<usize> = socks.iter().map(|s| drain(s).len()).collect();
    assert_eq!(queued.iter().sum::<usize>(), 2 * depth, "{queued:?}");
    assert!(queued.contains(&depth), "the flow's reader held it up to the stall depth: {queued:?}");
    assert!(queued.iter().filter(|&&n| n > 0).count() >= 2, "then it moved: {queued:?}");
}

/// A (pid, fd) pair whose fd is no longer the socket the scan saw (pid or
/// fd reused) is not steered (issue 23, item 9: it was used unchecked).
#[test]
fn a_reader_whose_fd_changed_since_the_scan_is_not_steered() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 2);
    let mut g = group(&socks, Readers::LeastLoaded);
    g.readers[1].inode += 1_000_000; // the fd now holds another file
    let (steer, log) = steering(&g);
    assert!(log.iter().any(|l| l.contains("is no longer socket inode")), "{log:?}");
    assert!(steer.status().is_empty(), "nothing attached: {:?}", steer.status());
}

/// Attaching and detaching while datagrams flow loses none of them.
#[test]
fn attaching_and_detaching_under_traffic_loses_nothing() {
    let tb = Testbed::new();
    let socks = group_sockets(&tb, 4);
    let g = group(&socks, Readers::LeastLoaded);
    let socks: Vec<Arc<UdpSocket>> = socks.into_iter().map(Arc::new).collect();
    let (stop, read, readers) = keep_reading(&socks, Duration::from_micros(500));
    let sender = {
        let tb_b = tb.b.clone();
        let dst = format!("{}:{PORT}", tb.ip_b);
        std::thread::spawn(move || {
            sluice::base::netns::enter(&tb_b).unwrap();
            let flows: Vec<UdpSocket> = (0..16).map(|_| UdpSocket::bind("0.0.0.0:0").unwrap()).collect();
            for i in 0..20_000u32 {
                flows[i as usize % 16].send_to(&i.to_ne_bytes(), &dst).unwrap();
                if i % 20 == 0 {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
        })
    };
    let mut steer = Steer::load().unwrap();
    let mut steered = 0;
    while !sender.is_finished() {
        steer.keep_alive(now_ns());
        steer.sync(std::slice::from_ref(&g));
        std::thread::sleep(Duration::from_millis(20));
        steered += steer.status()[0].readers.iter().map(|r| r.steered).sum::<u64>();
        steer.sync(&[]);
        std::thread::sleep(Duration::from_millis(20));
    }
    sender.join().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    readers.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(read.load(Ordering::Relaxed), 20_000, "every datagram was read");
    assert!(steered > 0, "the program steered while attached");
}

/// Zero config: a service reading with 4 reuseport sockets gets least-loaded,
/// and `status` shows its readers.
#[test]
fn a_reuseport_service_is_found_and_steered_with_no_config() {
    let mut tb = Testbed::new();
    let ns = tb.b.clone();
    tb.spawn_cmd(
        &ns,
        &[load(), "serve", "udp-echo", "--port", "7400", "--readers", "4", "--no-echo", "--duration", "20"],
    );
    tb.start_gate(&[]);
    let deadline = Instant::now() + Duration::from_secs(8);
    let s = loop {
        let s = tb.status();
        if s.readers.first().is_some_and(|g| g.readers.len() == 4) {
            break s;
        }
        assert!(Instant::now() < deadline, "no steered group: {:?}", s.readers);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(s.readers[0].policy, "least-loaded");
    let (sent, _) = tb.send(PORT, 2_000, 1.0);
    // The statistics refresh every 100 ms, or every second once the daemon
    // ticks calmly beside the healthy traffic: wait up to 3 s for the count.
    let steered = |s: &sluice::surface::stats::Snapshot| s.readers[0].readers.iter().map(|r| r.steered).sum::<u64>();
    let deadline = Instant::now() + Duration::from_secs(3);
    let s = loop {
        let s = tb.status();
        if steered(&s) >= sent || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let steered = steered(&s);
    // No flood: the gate drops nothing of the service's (do no harm), and
    // every datagram is steered (issue 23, item 14: half was accepted).
    let class = s.classes.iter().find(|c| c.name.ends_with("/udp:7400")).expect("the service's class");
    assert_eq!(class.totals.dropped_pkts(), 0, "the gate dropped some of an unflooded 2k/s: {:?}", class.totals);
    assert_eq!(steered, sent, "{steered} of {sent} steered: {:?}", s.readers);
    assert!(s.readers[0].readers.iter().all(|r| r.queued.is_some()), "least-loaded shows the queues");
}

/// A service's own reuseport program is never replaced (issue 23, item 9):
/// a group whose first socket takes everything (a classic BPF program that
/// returns 0) keeps doing so with round-robin asked for.
#[test]
fn a_services_own_reuseport_program_is_left_alone() {
    let tb = Testbed::new();
    sluice::base::netns::enter(&tb.b).unwrap(); // the iterator lists this thread's netns
    let socks = group_sockets(&tb, 3);
    attach_cbpf_pick_first(&socks[0]);
    let g = group(&socks, Readers::RoundRobin);
    let (steer, log) = steering(&g);
    assert!(log.iter().any(|l| l.contains("its own SO_REUSEPORT program (classic BPF): left alone")), "{log:?}");
    assert!(steer.status().is_empty(), "nothing attached: {:?}", steer.status());
    send(&tb, 1, 300);
    let counts: Vec<usize> = socks.iter().map(|s| drain(s).len()).collect();
    assert_eq!(counts, [300, 0, 0], "the service's program still picks its first socket");
}

/// A program the service puts in after sluice's is not detached at exit.
#[test]
fn a_program_the_service_put_in_later_survives_sluices_exit() {
    let tb = Testbed::new();
    sluice::base::netns::enter(&tb.b).unwrap();
    let socks = group_sockets(&tb, 3);
    let g = group(&socks, Readers::RoundRobin);
    let (mut steer, log) = steering(&g);
    assert!(log.iter().all(|l| !l.contains("not steered")), "{log:?}");
    attach_cbpf_pick_first(&socks[0]);
    steer.detach_all();
    send(&tb, 1, 300);
    let counts: Vec<usize> = socks.iter().map(|s| drain(s).len()).collect();
    assert_eq!(counts, [300, 0, 0], "the service's program was detached with sluice's");
}

/// Attach a classic BPF reuseport program that picks the group's first socket.
fn attach_cbpf_pick_first(s: &UdpSocket) {
    const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
    let mut ret0 = [libc::sock_filter { code: 0x06 /* BPF_RET | BPF_K */, jt: 0, jf: 0, k: 0 }];
    let prog = libc::sock_fprog { len: 1, filter: ret0.as_mut_ptr() };
    // SAFETY: setsockopt with a sock_fprog that points at our filter array, alive for the call.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_ATTACH_REUSEPORT_CBPF: {}", std::io::Error::last_os_error());
}

/// A loaded steering program, kept alive, attached to `g`; and its log lines.
fn steering(g: &Group) -> (Steer, Vec<String>) {
    let mut steer = Steer::load().unwrap();
    steer.keep_alive(now_ns());
    let log = steer.sync(std::slice::from_ref(g));
    (steer, log)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime into a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One flow, `count` datagrams, `gap` apart.
fn send_paced(tb: &Testbed, count: u32, gap: Duration) {
    let dst = format!("{}:{PORT}", tb.ip_b);
    in_netns(&tb.b, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..count {
            s.send_to(&i.to_ne_bytes(), &dst).unwrap();
            std::thread::sleep(gap);
        }
    });
}
