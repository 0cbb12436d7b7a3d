//! Whether a class's service is in trouble, judged from two readings of its
//! own sockets a tick apart: the rules the budget (distress), the auto
//! controller and the fairness tiers (dropped, behind) and the SYN guard
//! (SYN pressure) act on. One copy, over plain numbers: `signals::health`
//! reads the sockets, the daemon's tick pairs its readings, these judge.
//!
//! A reading is of the class's own sockets only (why: `signals::health`),
//! so no rule here can be moved by a socket another user owns.
use crate::policy::queue::{drops_grew, losing, stands, ACCEPT_STANDS, OVERLOAD_QUEUE, QUEUE_LOW};

/// A class's listeners under SYN pressure hold at least this share of their
/// backlog in request sockets: the kernel sends cookies at the whole
/// backlog, and a spoofed flood's requests stay for the SYN-ACK retries
/// (about a minute), so a flooded listener sits there.
pub const SYN_QUEUE_FULL: f64 = 0.5;

/// A class's UDP sockets at one read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpReading {
    pub sockets: u32,
    /// Datagrams the sockets dropped, since they were created.
    pub drops: u64,
    /// The fullest socket's queue and buffer (bytes): a socket drops when
    /// it is full, whatever its siblings hold.
    pub full_queued: u64,
    pub full_rcvbuf: u64,
}

/// A class's TCP listeners, summed over its listening sockets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenStats {
    pub sockets: u32,
    /// Connections waiting to be accepted, and the backlog limit.
    pub accept_queue: u64,
    pub backlog: u64,
    /// SYNs and handshakes the listeners dropped (sk_drops: the kernel's
    /// tcp_listendrop, a full accept queue), since they were created.
    pub drops: u64,
    /// Request sockets (half-open connections) of the listeners, read only
    /// when the namespace sent SYN cookies since the last read (None: not
    /// read). The kernel sends cookies once a listener holds its backlog of them.
    pub syn_queue: Option<u64>,
}

/// A class's service at one read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub udp: UdpReading,
    pub listen: ListenStats,
}

/// What two readings of a class's service say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Judgement {
    /// Why the service is in distress, if it is: its UDP sockets dropped or
    /// their queue stood over QUEUE_LOW, its accept queue stood or its
    /// listeners dropped.
    pub distress: Option<&'static str>,
    /// Its UDP sockets dropped (not a restarted service's new socket, whose
    /// count starts again).
    pub dropped: bool,
    /// Its fullest UDP socket's queue stood over OVERLOAD_QUEUE of its
    /// buffer at both edges.
    pub queue_stands: bool,
    /// Behind and losing: dropped while that queue stood (`queue::losing`).
    pub behind: bool,
    /// Its listeners hold SYN_QUEUE_FULL of their backlog in request
    /// sockets, dropped a SYN or a handshake, or their accept queue stood.
    pub syn_pressure: bool,
}

/// Judge a class's service from its readings at the start (`p`) and the end
/// (`n`) of a tick.
pub fn judge(p: &Reading, n: &Reading) -> Judgement {
    let (pu, nu, pl, nl) = (&p.udp, &n.udp, &p.listen, &n.listen);
    let dropped = drops_grew((pu.sockets, pu.drops), (nu.sockets, nu.drops));
    let udp_stands = |share| nu.sockets > 0 && stands(pu.full_queued, nu.full_queued, nu.full_rcvbuf, share);
    let listening = nl.sockets > 0;
    let accept_stands = listening && stands(pl.accept_queue, nl.accept_queue, nl.backlog, ACCEPT_STANDS);
    let listen_dropped = listening && drops_grew((pl.sockets, pl.drops), (nl.sockets, nl.drops));
    let syn_full = listening && nl.syn_queue.is_some_and(|q| q > 0 && q as f64 >= SYN_QUEUE_FULL * nl.backlog as f64);
    let queue_stands = udp_stands(OVERLOAD_QUEUE);
    let distress = [
        (dropped, "socket drops"),
        (udp_stands(QUEUE_LOW), "socket queue"),
        (accept_stands, "accept queue"),
        (listen_dropped, "listen drops"),
    ]
    .into_iter()
    .find_map(|(yes, why)| yes.then_some(why));
    Judgement {
        distress,
        dropped,
        queue_stands,
        behind: losing(dropped, pu.full_queued, nu.full_queued, nu.full_rcvbuf),
        syn_pressure: syn_full || listen_dropped || accept_stands,
    }
}

/// Did the gate's interface lose packets at the per-CPU backlogs between two
/// reads of its drop count (None: no tracer, which alone counts them; the
/// host-wide softnet_stat is not read for this, as any local user can
/// overflow a backlog)?
pub fn path_lost(prev: Option<u64>, now: Option<u64>) -> bool {
    matches!((prev, now), (Some(a), Some(b)) if b > a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One UDP socket with a 160,000-byte buffer.
    fn sock(queued: u64, drops: u64) -> Reading {
        Reading {
            udp: UdpReading { sockets: 1, drops, full_queued: queued, full_rcvbuf: 160_000 },
            ..Default::default()
        }
    }

    /// One listener with a backlog of 128.
    fn listener(accept_queue: u64, drops: u64, syn_queue: Option<u64>) -> Reading {
        let listen = ListenStats { sockets: 1, accept_queue, backlog: 128, drops, syn_queue };
        Reading { listen, ..Default::default() }
    }

    /// Another count of sockets: a restarted service.
    fn restarted(mut r: Reading) -> Reading {
        r.udp.sockets *= 2;
        r.listen.sockets *= 2;
        r
    }

    #[test]
    fn a_standing_queue_or_drops_are_distress_a_passing_queue_is_not() {
        let d = |a, b| judge(&a, &b).distress;
        assert_eq!(d(sock(0, 0), sock(50_000, 0)), None, "a queue at one edge only is passing");
        assert_eq!(d(sock(20_000, 0), sock(50_000, 0)), Some("socket queue"));
        assert_eq!(d(sock(0, 5), sock(0, 6)), Some("socket drops"));
        // A restarted service's socket starts its drop count again: not a drop.
        assert_eq!(d(sock(0, 5), restarted(sock(0, 6))), None);
        assert_eq!(d(Reading::default(), Reading::default()), None, "no socket");
    }

    /// What cuts the unknown sources' tier: drops with the queue standing
    /// over half the buffer, not a burst overflowing a short queue.
    #[test]
    fn behind_is_drops_with_a_queue_over_half_the_buffer_at_both_ends() {
        let b = |a, c| judge(&a, &c).behind;
        assert!(b(sock(90_000, 5), sock(100_000, 6)));
        assert!(!b(sock(10_000, 5), sock(10_000, 6)), "a burst's drops over a short queue: not behind");
        assert!(!b(sock(90_000, 5), sock(100_000, 5)), "a full queue without drops: not behind");
        assert!(!b(sock(0, 5), sock(100_000, 6)), "the queue at one end only");
        assert!(!b(sock(90_000, 5), restarted(sock(100_000, 6))), "a restarted service");
        let j = judge(&sock(90_000, 5), &sock(100_000, 5));
        assert!(j.queue_stands && !j.dropped, "{j:?}");
    }

    #[test]
    fn tcp_distress_comes_from_the_class_listeners_own_queue_and_drops() {
        let d = |a, b| judge(&a, &b).distress;
        assert_eq!(d(listener(0, 0, None), listener(0, 0, None)), None);
        assert_eq!(d(listener(20, 0, None), listener(30, 0, None)), Some("accept queue"));
        assert_eq!(d(listener(0, 7, None), listener(0, 9, None)), Some("listen drops"));
        // A restarted listener starts its drop count again: not a drop.
        assert_eq!(d(listener(0, 7, None), restarted(listener(0, 9, None))), None);
        // Request sockets are SYN pressure, not distress.
        assert_eq!(d(listener(0, 0, None), listener(0, 0, Some(128))), None);
    }

    #[test]
    fn syn_pressure_is_the_class_listeners_own_syn_queue_drops_or_accept_queue() {
        let p = |a, b| judge(&a, &b).syn_pressure;
        assert!(!p(listener(0, 0, None), listener(0, 0, None)));
        assert!(p(listener(0, 0, None), listener(0, 0, Some(64))), "half the backlog in request sockets");
        assert!(!p(listener(0, 0, None), listener(0, 0, Some(63))), "under half the backlog");
        assert!(!p(listener(0, 0, None), listener(0, 0, Some(0))), "cookies were sent for another listener");
        assert!(p(listener(0, 1, None), listener(0, 2, None)), "its listener dropped");
        assert!(p(listener(20, 0, None), listener(30, 0, None)), "its accept queue stands");
        assert!(!p(sock(0, 5), sock(100_000, 6)), "UDP trouble is no SYN pressure");
    }

    #[test]
    fn the_path_loses_only_where_the_tracer_counted_drops() {
        assert!(path_lost(Some(5), Some(6)));
        assert!(!path_lost(Some(5), Some(5)));
        assert!(!path_lost(None, None), "no tracer: no path signal");
        assert!(!path_lost(None, Some(6)), "the tracer's first read");
    }
}
