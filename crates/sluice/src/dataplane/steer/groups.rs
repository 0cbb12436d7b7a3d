//! Which reuseport groups to steer, and how: pure logic over what sock_diag
//! and /proc showed, tested without root.
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::policy::config::{Config, Proto, Readers};

/// One socket of a service, and one process/fd through which sluice can reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reader {
    pub inode: u32,
    pub pid: u32,
    pub fd: i32,
}

/// A UDP port served by 2+ sockets (an SO_REUSEPORT group), to be steered by `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub port: u16,
    /// Ordered by inode, so a group that did not change keeps its slots.
    pub readers: Vec<Reader>,
    pub policy: Readers,
}

/// A listening UDP socket as sock_diag showed it.
#[derive(Debug, Clone, Copy)]
pub struct Listener {
    pub port: u16,
    pub addr: IpAddr,
    pub inode: u32,
}

/// The policy for a UDP port: the `readers` of the first class whose rules
/// match it (a rule with a source prefix does not decide a whole port), else
/// `least-loaded` while discovery is on. None: leave it to the kernel.
pub fn policy_for(cfg: &Config, port: u16) -> Option<Readers> {
    let class = cfg.classes.iter().find(|c| {
        c.rules.iter().any(|r| {
            r.src.is_none()
                && matches!(r.proto, Proto::Udp | Proto::Any)
                && r.ports.is_some_and(|(lo, hi)| (lo..=hi).contains(&port))
        })
    });
    match class.and_then(|c| c.readers) {
        Some(Readers::Hash) => None,
        Some(r) => Some(r),
        None if cfg.discover => Some(Readers::LeastLoaded),
        None => None,
    }
}

/// The groups to steer: per port, the sockets bound to one address (the
/// kernel groups by address and port; when one port has groups on several
/// addresses, the largest is steered and the others keep the hash), 2 to
/// `max_readers` of them, each with a holder found in /proc. A socket no
/// process holds (it is being closed) is left out.
pub fn find(
    listeners: &[Listener],
    holders: &HashMap<u32, Vec<(u32, i32)>>,
    cfg: &Config,
    max_readers: usize,
) -> Vec<Group> {
    let mut by_addr: BTreeMap<(u16, IpAddr), Vec<Reader>> = BTreeMap::new();
    for l in listeners {
        if let Some(&(pid, fd)) = holders.get(&l.inode).and_then(|h| h.first()) {
            by_addr.entry((l.port, l.addr)).or_default().push(Reader { inode: l.inode, pid, fd });
        }
    }
    let mut best: BTreeMap<u16, Vec<Reader>> = BTreeMap::new();
    for ((port, _), readers) in by_addr {
        let slot = best.entry(port).or_default();
        if readers.len() > slot.len() {
            *slot = readers;
        }
    }
    best.into_iter()
        .filter(|(_, r)| r.len() >= 2 && r.len() <= max_readers)
        .filter_map(|(port, mut readers)| {
            readers.sort();
            policy_for(cfg, port).map(|policy| Group { port, readers, policy })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config;

    fn listener(port: u16, addr: &str, inode: u32) -> Listener {
        Listener { port, addr: addr.parse().unwrap(), inode }
    }

    fn holders(inodes: &[u32]) -> HashMap<u32, Vec<(u32, i32)>> {
        inodes.iter().map(|&i| (i, vec![(100, i as i32)])).collect()
    }

    #[test]
    fn a_group_of_two_or_more_gets_least_loaded_with_discovery_on() {
        let cfg = config::from_flags(&[]).unwrap();
        let l = [listener(53, "0.0.0.0", 3), listener(53, "0.0.0.0", 1), listener(7, "0.0.0.0", 9)];
        let g = find(&l, &holders(&[1, 3, 9]), &cfg, 32);
        assert_eq!(g.len(), 1, "a lone socket is no group: {g:?}");
        assert_eq!(g[0].port, 53);
        assert_eq!(g[0].policy, Readers::LeastLoaded);
        assert_eq!(g[0].readers.iter().map(|r| r.inode).collect::<Vec<_>>(), [1, 3], "ordered by inode");
    }

    #[test]
    fn a_configured_policy_wins_and_hash_means_leave_it_alone() {
        let cfg = config::from_flags(&[
            "dns:match=udp:53,readers=round-robin".into(),
            "api:match=udp:8000-8100,readers=hash".into(),
        ])
        .unwrap();
        let l = [listener(53, "::", 1), listener(53, "::", 2), listener(8053, "::", 3), listener(8053, "::", 4)];
        let g = find(&l, &holders(&[1, 2, 3, 4]), &cfg, 32);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!((g[0].port, g[0].policy), (53, Readers::RoundRobin));
    }

    #[test]
    fn without_discovery_only_configured_groups_are_steered() {
        let mut cfg = config::from_flags(&["dns:match=udp:53,readers=least-loaded".into()]).unwrap();
        cfg.discover = false;
        assert_eq!(policy_for(&cfg, 53), Some(Readers::LeastLoaded));
        assert_eq!(policy_for(&cfg, 5353), None);
    }

    #[test]
    fn the_largest_address_group_of_a_port_is_steered_and_orphans_are_skipped() {
        let cfg = config::from_flags(&[]).unwrap();
        let l = [
            listener(53, "10.0.0.1", 1),
            listener(53, "10.0.0.1", 2),
            listener(53, "10.0.0.2", 3),
            listener(53, "10.0.0.2", 4),
            listener(53, "10.0.0.2", 5),
            listener(53, "10.0.0.2", 6),
        ];
        let g = find(&l, &holders(&[1, 2, 3, 4, 5]), &cfg, 32);
        assert_eq!(g[0].readers.iter().map(|r| r.inode).collect::<Vec<_>>(), [3, 4, 5], "6 has no holder");
        assert!(find(&l, &holders(&[1, 2, 3, 4, 5]), &cfg, 2).is_empty(), "more readers than slots: left alone");
    }
}
