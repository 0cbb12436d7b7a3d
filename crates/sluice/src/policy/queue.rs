//! The rules that read a queue: one copy, over plain numbers (what is
//! queued and what it may hold, bytes or connections), for what a class's
//! sockets say (`distress`), the auto controller and the known-client
//! fairness. The readers only read; these decide.

/// A queue over this share of what it may hold at both edges of a tick is
/// a standing one (below it: the few datagrams a batch-reading service
/// leaves under steady arrivals): the service is at its knee.
pub const QUEUE_LOW: f64 = 1.0 / 16.0;
/// A queue over this share at a tick's end is a full one: drops with it
/// are loss (a burst that overflowed a buffer a few ms deep drains within a
/// tick when the service keeps up: dnsperf's bursts overflowed NSD's socket
/// at a fifth of its capacity), and without drops it is drained.
pub const OVERLOAD_QUEUE: f64 = 0.5;
/// An accept queue over this share of the listen backlog at both edges of
/// a tick stands.
pub const ACCEPT_STANDS: f64 = 0.125;

/// Is `queued` over `share` of `of` (nothing can be over a share of 0)?
pub fn over(queued: u64, of: u64, share: f64) -> bool {
    of > 0 && queued as f64 > share * of as f64
}

/// Does a queue stand: over `share` of `of` at both edges of a tick
/// (`start`, then `end`)?
pub fn stands(start: u64, end: u64, of: u64, share: f64) -> bool {
    over(start, of, share) && over(end, of, share)
}

/// Is a service behind and losing: its sockets `dropped` in a tick while
/// their queue stood over OVERLOAD_QUEUE of the buffer `of` at both edges
/// (`start`, `end`)? Drops alone are also a burst overflowing a short queue
/// of a service with CPU to spare, which a cut of admission would only
/// starve.
pub fn losing(dropped: bool, start: u64, end: u64, of: u64) -> bool {
    dropped && stands(start, end, of, OVERLOAD_QUEUE)
}

/// Did a set of sockets, (count, drops so far) at two reads, drop between
/// them? Only if it is the same set: a new socket (a restarted service)
/// starts its count again.
pub fn drops_grew((p_socks, p_drops): (u32, u64), (n_socks, n_drops): (u32, u64)) -> bool {
    n_socks > 0 && n_drops > p_drops && p_socks == n_socks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_stands_only_over_its_share_at_both_edges() {
        assert!(over(101, 1600, QUEUE_LOW) && !over(100, 1600, QUEUE_LOW));
        assert!(!over(5, 0, QUEUE_LOW), "no buffer: nothing is over a share of it");
        assert!(stands(900, 900, 1600, OVERLOAD_QUEUE));
        assert!(!stands(900, 700, 1600, OVERLOAD_QUEUE), "drained by the tick's end");
        assert!(!stands(700, 900, 1600, OVERLOAD_QUEUE), "filled within the tick");
    }

    #[test]
    fn losing_is_drops_with_a_queue_standing_over_half_the_buffer() {
        assert!(losing(true, 900, 900, 1600));
        assert!(!losing(false, 900, 900, 1600), "a full queue without drops");
        assert!(!losing(true, 100, 100, 1600), "a burst's drops over a short queue");
        assert!(!losing(true, 0, 900, 1600), "the queue at one edge only");
    }

    #[test]
    fn drops_count_only_for_the_same_sockets() {
        assert!(drops_grew((1, 10), (1, 11)));
        assert!(!drops_grew((1, 10), (1, 10)));
        assert!(!drops_grew((1, 10), (2, 11)), "a new socket's count is not the old one's");
        assert!(!drops_grew((1, 10), (0, 11)), "no socket");
    }
}
