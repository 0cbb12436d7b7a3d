//! The per-source cases of `sluice bench gate`: a limited class's unknown
//! sources within and over their share, known clients, the room's socket
//! look, and what the sources map costs in memory.
use super::*;

/// The per-source cases: (name, verdict, how the class is set up).
pub(super) const SOURCE_CASES: [(&str, u32, SourceCase); 7] = [
    ("IPv4 UDP, unknown source within its share, admitted", XDP_PASS, SourceCase::Within),
    ("IPv4 UDP, unknown source over its share, dropped", XDP_DROP, SourceCase::Over),
    ("IPv4 UDP, known source, admitted", XDP_PASS, SourceCase::Known),
    ("IPv4 UDP, fairness off, learning (notes who asked), admitted", XDP_PASS, SourceCase::Learning),
    ("IPv4 UDP, unknown within its share, a known client held, admitted", XDP_PASS, SourceCase::Held),
    ("IPv4 UDP, the same, socket with room (looked at 1 in 16), admitted", XDP_PASS, SourceCase::Room),
    ("IPv4 UDP, the same, socket 3/4 full (looked at each), dropped", XDP_DROP, SourceCase::Crowded),
];

#[derive(Clone, Copy, PartialEq)]
pub(super) enum SourceCase {
    /// Fairness off, the learner on (a calm class): the gate notes who asked.
    Learning,
    Within,
    Over,
    Known,
    /// Within its share, the class holding a known client (another
    /// address): the known lookup misses. Then also room kept for known
    /// clients (bpf/gate/room.h): a real socket the packet goes to, empty
    /// or filled past three quarters.
    Held,
    Room,
    Crowded,
}

/// A UDP socket on 127.0.0.1 the cases that look at a socket send to,
/// filled past three quarters of its buffer if `crowded`, and its port.
fn room_socket(crowded: bool) -> Result<(std::net::UdpSocket, u16)> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let port = sock.local_addr()?.port();
    if crowded {
        let tx = std::net::UdpSocket::bind("127.0.0.1:0")?;
        // Far more than a default buffer holds: it stays full (nobody reads).
        for _ in 0..4096 {
            tx.send_to(&[0u8; 64], ("127.0.0.1", port))?;
        }
    }
    Ok((sock, port))
}

/// The large sources map's kernel memory (memlock) and this process's RSS
/// after reading it whole, bytes; that read's time (ms) and the sources it found.
type Memory = (Option<u64>, Option<u64>, Option<f64>, Option<u64>);

/// Gates for the per-source cases, with 1 and SOURCES_MANY sources in the
/// map; and the memory of the large map.
pub(super) fn source_cells(pkt: &[u8]) -> Result<(Vec<Vec<Cell>>, Memory)> {
    let mut memory: Memory = (None, None, None, None);
    let mut cells = Vec::new();
    for (_, verdict, case) in SOURCE_CASES {
        let mut row = Vec::new();
        for many in [false, true] {
            let looks = matches!(case, SourceCase::Held | SourceCase::Room | SourceCase::Crowded);
            let (socket, port, pkt) = match looks {
                true => {
                    let (s, port) = room_socket(case == SourceCase::Crowded)?;
                    (Some(s), port, Frame::udp("10.0.0.1", "127.0.0.1", 1234, port).frame_len(64).build())
                }
                false => (None, 7000, pkt.to_vec()),
            };
            let cfg = config::from_flags(&[format!("bench:rate=1G,burst=1000000,match=udp:{port}")])?;
            // rate=1G,burst=1000000: its shares are share(1_000_000_000, 1_000_000).
            let (mut gate, id) = bench_gate(Gate::load_with(if many { SOURCES_MANY } else { 1024 })?, &cfg)?;
            // Within its share: paced at 1 ns a packet (the clock is read, the
            // source never falls behind). Over it: one packet a second, and an
            // unknown tier too small to lend its spare half.
            let (interval, unknown) = match case {
                SourceCase::Over => (1_000_000_000, share(1, 2)),
                _ => (1, share(1_000_000_000, 1_000_000)),
            };
            let fair = sluice_fair {
                unknown,
                on: 1,
                quota: 1,
                src_interval_ns: interval,
                plen4: 32,
                plen6: 64,
                ..Default::default()
            };
            let fair = match case {
                SourceCase::Learning => sluice_fair { learn: 1, ..Default::default() },
                SourceCase::Room | SourceCase::Crowded => sluice_fair { room: 1, ..fair },
                _ => fair,
            };
            gate.set_fairness(id, &vec![fair; gate.ncpus()])?;
            gate.set_clock(&Clock { epoch: 1, now_ms: sluice::base::clock::wall_ms(), known_ttl_ms: 3_600_000 });
            if many {
                gate.fill_sources(id as u8, SOURCES_MANY - 1, 1)?;
                if memory.0.is_none() {
                    memory.0 = gate.map_memlock("sources");
                    let t = std::time::Instant::now();
                    let held = gate.sources()?.len();
                    memory.2 = Some(t.elapsed().as_secs_f64() * 1e3);
                    memory.3 = Some(held as u64);
                    memory.1 = sluice::surface::stats::rss_bytes();
                }
            }
            // The known source (the looking cases: another address, so the
            // class holds a known client and the packet's source is unknown).
            if case == SourceCase::Known || looks {
                let mut addr = [0u8; 16];
                addr[..4].copy_from_slice(if case == SourceCase::Known { &[10, 0, 0, 1] } else { &[10, 0, 0, 9] });
                let key = sluice_src_key { class_id: id as u8, family: 4, plen: 32, addr, ..Default::default() };
                let last_ms = sluice::base::clock::wall_ms();
                let first_ms = last_ms - 2000;
                // Answered at a rate no test run reaches: it stays within its own rate.
                let answers = 1_000_000_000;
                gate.insert_known(&[(key, sluice_known { first_ms, last_ms, answers, ..Default::default() })])?;
            }
            gate.test_run(Prog::Gate, &pkt, 1000)?;
            row.push(Cell { gate, pkt, verdict, samples: vec![], _socket: socket });
        }
        cells.push(row);
    }
    Ok((cells, memory))
}
