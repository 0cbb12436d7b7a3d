//! Zero configuration: find the services listening in this network namespace
//! and give each a class of its own, with a priority taken from the process
//! that owns it (the priority-receive study: the scheduler already knows what matters more).
//!
//! What counts as a service (one sock_diag dump per protocol and family):
//! - a TCP socket in LISTEN;
//! - an unconnected UDP socket whose port is outside the namespace's
//!   ephemeral range (ip_local_port_range: those are clients' sockets);
//! - bound to the wildcard or to any address but a loopback one (Linux
//!   delivers a packet to any local address whichever interface it came in
//!   on, but drops one from the wire to 127/8 or ::1), and not bound by
//!   SO_BINDTODEVICE to another interface.
//!
//! Who owns it: the processes holding the socket's inode open
//! (`/proc/PID/fd/*` -> `socket:[INODE]`; the scan runs only when a socket
//! not seen before appears). Its priority is 20 + the owner's nice value
//! (nice -20 -> 0, the highest; nice 0 -> 20; nice 19 -> 39); with several
//! owners, the highest. A nice that cannot be read (the process left, /proc
//! refuses) counts as nice 0, and the class says so.
//!
//! Whose nice counts (the trust model): a service whose every owner runs as
//! root or a system user (a uid below UID_MIN of /etc/login.defs, or one of
//! systemd's dynamic users, 61184-65519) keeps its nice-derived priority.
//! Any other (a login user, nobody, a rootless container's subordinate
//! uids above 65535, a uid that cannot be read) is untrusted: any local user
//! can bind a port, and a service of theirs must not outrank (nor, in
//! distress, throttle) the host's traffic unless a configured class says
//! so. A port a login user shares with root (SO_REUSEADDR) is untrusted:
//! some of its datagrams go to the user's socket. A socket no visible
//! process holds (parked in an unread SCM_RIGHTS message, or closed before
//! the /proc scan reached its holder) is owned by the uid the kernel
//! records as its creator (see `holders`).
//!
//! Untrusted services all share one class, USERS_CLASS, at
//! UNTRUSTED_PRIORITY (the implicit default class's): what local users bind
//! never takes a class slot, so it can neither push the host's services into
//! shared classes (renaming them) nor crowd them out of the table.
//!
//! Services that go away keep their class for LINGER, so a service that
//! restarts, or binds and closes many times a second, does not make its
//! class (and its counters and controller state) come and go.
//!
//! `listeners.rs` reads the sockets, `owners.rs` who holds them and whose
//! nice counts; this file turns the services into classes.
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::bpf_intf::SLUICE_MAX_CLASSES;
use crate::policy::config::{AutoSpec, Class, Config, Limit, Prefix, Proto, Rule, SynCookies};
use crate::signals::sock_diag::DiagSock;

mod listeners;
mod owners;

pub use listeners::{
    each_listener, ephemeral_range, is_listener, parse_port_range, Listeners, Listening, LISTENERS_FRESH,
};
use owners::{holders, owner};
pub use owners::{
    login_uids, parse_login_defs, socket_holders, socket_inodes, trusted, Owner, SocketOwners, RESCAN_UNOWNED,
};

/// How long a service that is no longer seen keeps its class.
pub const LINGER: Duration = Duration::from_secs(3);
/// Priority of a service whose owner's nice is 0 (or unknown).
pub const NICE_ZERO_PRIORITY: u8 = 20;
/// Priority of a service run only by login users or nobody.
pub const UNTRUSTED_PRIORITY: u8 = crate::policy::config::IMPLICIT_DEFAULT_PRIORITY;
/// The process names of container runtimes' host-side proxies of DNATed
/// ports (see `Service::dnat_proxy`).
pub const HOST_PROXIES: &[&str] = &["docker-proxy"];
/// The class all untrusted services share.
pub const USERS_CLASS: &str = "users/ports";

/// The two protocols a service can listen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L4 {
    Udp,
    Tcp,
}

impl L4 {
    pub fn name(self) -> &'static str {
        match self {
            L4::Udp => "udp",
            L4::Tcp => "tcp",
        }
    }
    fn proto(self) -> Proto {
        match self {
            L4::Udp => Proto::Udp,
            L4::Tcp => Proto::Tcp,
        }
    }
}

/// The address families a service's class takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Both: the port's sockets are one service's.
    #[default]
    Both,
    /// IPv4 only, or IPv6 only: the port's IPv4 sockets and its IPv6-only
    /// ones (IPV6_V6ONLY) are held by different processes, so each is a
    /// service of its own (a local user's v6-only bind beside a service on
    /// 0.0.0.0 must not take the service's class for IPv6).
    V4,
    V6,
}

impl Family {
    /// Which families a listening socket receives.
    pub fn of(s: &DiagSock) -> Family {
        match s.src {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Family::V4,
            IpAddr::V6(a) if a.is_unspecified() && !s.v6only => Family::Both,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The source prefix a class of this family matches (None: any).
    fn prefix(self) -> Option<Prefix> {
        let any = |a: IpAddr| Some(Prefix { addr: a, len: 0 });
        match self {
            Family::Both => None,
            Family::V4 => any(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
            Family::V6 => any(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
        }
    }

    /// The suffix of the protocol in a class name ("udp6:53").
    fn suffix(self) -> &'static str {
        match self {
            Family::Both => "",
            Family::V4 => "4",
            Family::V6 => "6",
        }
    }
}

/// A port's sockets (inode, families) as services: one, or one per family
/// when its IPv4 and IPv6-only sockets are held by different processes and
/// no socket takes both. Each with the pids holding its sockets.
pub fn by_family(socks: &[(u32, Family)], owners: &HashMap<u32, Vec<u32>>) -> Vec<(Family, Vec<u32>)> {
    let pids = |want: &dyn Fn(Family) -> bool| {
        let mut p: Vec<u32> =
            socks.iter().filter(|(_, f)| want(*f)).filter_map(|(i, _)| owners.get(i)).flatten().copied().collect();
        p.sort_unstable();
        p.dedup();
        p
    };
    let has = |f: Family| socks.iter().any(|s| s.1 == f);
    let (v4, v6) = (pids(&|f| f == Family::V4), pids(&|f| f == Family::V6));
    if !has(Family::Both) && has(Family::V4) && has(Family::V6) && v4 != v6 {
        vec![(Family::V4, v4), (Family::V6, v6)]
    } else {
        vec![(Family::Both, pids(&|_| true))]
    }
}

/// A listening port and the processes behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub l4: L4,
    pub port: u16,
    pub owners: Vec<Owner>,
    /// Which families it takes (see `Family`).
    #[serde(default)]
    pub family: Family,
}

impl Service {
    /// The priority (0 = highest) and a sentence saying where it came from:
    /// the nice-derived one, or UNTRUSTED_PRIORITY when every owner whose
    /// user is known runs as a login user or nobody.
    pub fn priority(&self) -> (u8, String) {
        self.priority_with(login_uids())
    }

    /// As `priority`, with the login users' uid range given.
    pub fn priority_with(&self, logins: (u32, u32)) -> (u8, String) {
        match self.untrusted_why(logins) {
            Some(who) => (
                UNTRUSTED_PRIORITY,
                format!("{who}: untrusted, priority {UNTRUSTED_PRIORITY}, the default class's, unless a class is configured"),
            ),
            None => self.nice_priority(),
        }
    }

    /// Is the service untrusted (see the module's trust model)?
    pub fn untrusted(&self) -> bool {
        self.untrusted_why(login_uids()).is_some()
    }

    /// Why the service is untrusted, if it is: its first owner not known to
    /// run as root or a system user.
    fn untrusted_why(&self, logins: (u32, u32)) -> Option<String> {
        if self.owners.is_empty() {
            return Some("no process visible in /proc holds the socket".into());
        }
        self.owners.iter().find_map(|o| match o.uid {
            Some(u) if trusted(u, logins) => None,
            // An owner with no process (`holders`): the socket's creator.
            Some(u) if o.pid == 0 => Some(format!(
                "no process visible in /proc holds the socket; uid {u} made it, not root or a system user"
            )),
            Some(u) => Some(format!("{} pid {} runs as uid {u}, not root or a system user", o.comm, o.pid)),
            None => Some(format!("the user of {} pid {} cannot be read", o.comm, o.pid)),
        })
    }

    /// The priority from the owners' nice values alone.
    fn nice_priority(&self) -> (u8, String) {
        let known = self.owners.iter().filter_map(|o| o.nice.as_ref().ok().map(|n| (*n, o))).min_by_key(|(n, _)| *n);
        match known {
            Some((nice, o)) => {
                let p = (i16::from(NICE_ZERO_PRIORITY) + i16::from(nice)).clamp(0, 39) as u8;
                let others = if self.owners.len() > 1 {
                    format!(" (highest of {} owners)", self.owners.len())
                } else {
                    String::new()
                };
                (p, format!("{} pid {} has nice {nice}{others}: priority 20{nice:+} = {p}", o.comm, o.pid))
            }
            None => {
                let why = match self.owners.first() {
                    Some(o) => {
                        format!("the nice of {} pid {} cannot be read ({})", o.comm, o.pid, o.nice.clone().unwrap_err())
                    }
                    None => "no process visible in /proc holds the socket".to_string(),
                };
                (NICE_ZERO_PRIORITY, format!("{why}: nice 0 assumed, priority {NICE_ZERO_PRIORITY}"))
            }
        }
    }

    /// Is this TCP listener a container runtime's host-side proxy of a
    /// port the namespace DNATs to a container (docker-proxy, run by root)?
    /// Its SYNs must reach netfilter: a SYN the gate answers would make the
    /// connection on the proxy's listener, not the NAT target's (issue 49,
    /// item 7). A new connection has no conntrack entry for the gate to ask,
    /// so the listener's owner is what tells. Untrusted owners are not
    /// taken at their word (their class is shared: `USERS_CLASS`).
    pub fn dnat_proxy(&self) -> bool {
        self.l4 == L4::Tcp && !self.untrusted() && self.owners.iter().any(|o| HOST_PROXIES.contains(&o.comm.as_str()))
    }

    /// The process name the class is named after ("unknown" without owners).
    fn comm(&self) -> String {
        // A process may retitle itself ("nsd: xfrd"): the name is the part before a colon.
        let c = self.owners.first().map_or("unknown", |o| o.comm.split(':').next().unwrap_or_default().trim());
        let c: String = c
            .chars()
            .map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' || ch == '.' { ch } else { '_' })
            .take(15)
            .collect();
        if c.is_empty() {
            "unknown".into()
        } else {
            c
        }
    }

    /// The class name: process/protocol:port ("nsd/udp:53"; "nsd/udp4:53"
    /// and "x/udp6:53" when the port's families are separate services).
    pub fn class_name(&self) -> String {
        format!("{}/{}{}:{}", self.comm(), self.l4.name(), self.family.suffix(), self.port)
    }
}

/// The discovery state the daemon keeps between polls.
pub struct Discovery {
    listeners: Listeners,
    owners: SocketOwners,
    /// Every service seen, and when it was last seen.
    seen: BTreeMap<(L4, u16, Family), (Service, Instant)>,
    /// The owners read since the last /proc scan, by pid (see `owner`).
    processes: HashMap<u32, Owner>,
}

impl Discovery {
    /// Discovery for the interface `ifindex`, in the current network namespace.
    pub fn new(ifindex: u32) -> Result<Discovery> {
        Ok(Self::sharing(Listeners::new(ifindex)?))
    }

    /// Discovery reading `listeners` (a handle others share).
    pub fn sharing(listeners: Listeners) -> Discovery {
        Discovery { listeners, owners: SocketOwners::default(), seen: BTreeMap::new(), processes: HashMap::new() }
    }

    /// Look again: the services listening now, plus those gone for less than LINGER.
    pub fn poll(&mut self) -> Result<Vec<Service>> {
        let mut found: BTreeMap<(L4, u16), Vec<(u32, Family)>> = BTreeMap::new();
        let mut uids: HashMap<u32, u32> = HashMap::new();
        for l in self.listeners.now()? {
            found.entry((l.l4, l.port)).or_default().push((l.inode, l.family));
            uids.insert(l.inode, l.uid);
        }
        let now = Instant::now();
        let inodes: Vec<u32> = found.values().flatten().map(|(i, _)| *i).collect();
        if self.owners.follow(&inodes) {
            self.processes.clear();
        }
        for ((l4, port), socks) in found {
            for (family, pids) in by_family(&socks, &self.owners.owners) {
                let key = (l4, port, family);
                let held: Vec<Owner> = pids.into_iter().map(|p| owner(p, &mut self.processes)).collect();
                let mut creators: Vec<u32> = socks
                    .iter()
                    .filter(|(_, f)| family == Family::Both || *f == family)
                    .filter_map(|(i, _)| uids.get(i).copied())
                    .collect();
                creators.sort_unstable();
                creators.dedup();
                let owners = holders(held, self.seen.get(&key).map(|(s, _)| s), &creators);
                self.seen.insert(key, (Service { l4, port, owners, family }, now));
            }
        }
        self.seen.retain(|_, (_, at)| now.duration_since(*at) < LINGER);
        Ok(self.seen.values().map(|(s, _)| s.clone()).collect())
    }
}

/// Does a configured class already cover this service's port (config wins)?
fn covered(cfg: &Config, s: &Service) -> bool {
    cfg.classes.iter().flat_map(|c| &c.rules).any(|r| {
        let proto = r.proto == Proto::Any || r.proto == s.l4.proto();
        proto && r.src.is_none() && r.ports.is_none_or(|(lo, hi)| (lo..=hi).contains(&s.port))
    })
}

/// A class for a group of services (one service, or many once the class
/// table is too small for one each).
fn group_class(name: String, services: &[&Service], algo: crate::policy::controller::Algo) -> Class {
    let (priority, why) = services.iter().map(|s| s.priority()).min_by_key(|(p, _)| *p).expect("a group has a service");
    let why = if services.len() > 1 { format!("{} ports; {why}", services.len()) } else { why };
    let why = if name == USERS_CLASS {
        format!("every port of untrusted owners shares this class, so what they bind renames no other ({why})")
    } else {
        why
    };
    let proxied = services.iter().any(|s| s.dnat_proxy());
    let why = if proxied {
        format!("{why}; a host-side proxy of a NATed port listens here: the gate answers none of its SYNs")
    } else {
        why
    };
    Class {
        name,
        priority,
        limit: Limit::Auto(AutoSpec { algo, ..AutoSpec::default() }),
        rules: services
            .iter()
            .map(|s| Rule { proto: s.l4.proto(), ports: Some((s.port, s.port)), src: s.family.prefix() })
            .collect(),
        discovered: Some(why),
        readers: None,
        away: false,
        syn_cookies: if proxied { SynCookies::Off } else { SynCookies::Auto },
    }
}

/// Group services into at most `room` classes: one each if they fit, else
/// one per process and priority, else one per priority, else the lowest
/// priorities share the last class.
fn groups<'a>(services: &[&'a Service], room: usize) -> Vec<(String, Vec<&'a Service>)> {
    let one_each: Vec<_> = services.iter().map(|s| (s.class_name(), vec![*s])).collect();
    if one_each.len() <= room {
        return one_each;
    }
    let by = |key: &dyn Fn(&Service) -> String| {
        let mut m: BTreeMap<(u8, String), Vec<&'a Service>> = BTreeMap::new();
        for s in services {
            m.entry((s.priority().0, key(s))).or_default().push(*s);
        }
        // No port count in the name: a class keeps its name (its counters,
        // controller and known clients) when a port joins or leaves.
        m.into_iter().map(|((_, k), v)| (format!("{k}/ports"), v)).collect::<Vec<_>>()
    };
    let by_process = by(&|s| format!("{}.p{}", s.comm(), s.priority().0));
    if by_process.len() <= room {
        return by_process;
    }
    let mut by_prio = by(&|s| format!("prio{}", s.priority().0));
    if by_prio.len() > room && room > 0 {
        let rest: Vec<&Service> = by_prio.drain(room - 1..).flat_map(|(_, v)| v).collect();
        by_prio.push(("lowest/ports".to_string(), rest));
    }
    by_prio.truncate(room);
    by_prio
}

/// What merging found, for the daemon's log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MergeNote {
    /// Services a configured class covers already.
    pub covered: usize,
    /// Services that had to share a class (too many for one each).
    pub grouped: bool,
    /// Services left without a class (no class slot at all): they go to the default class.
    pub unplaced: usize,
}

/// The config with a class for each discovered service that no configured
/// class covers, placed before the default class if it is the last one.
pub fn merge(base: &Config, services: &[Service]) -> (Config, MergeNote) {
    let mut cfg = base.clone();
    let mut note = MergeNote::default();
    let mut todo: Vec<&Service> = services.iter().filter(|s| !covered(base, s)).collect();
    note.covered = services.len() - todo.len();
    todo.sort_by_key(|s| (s.priority().0, s.l4, s.port));
    let room = (SLUICE_MAX_CLASSES as usize).saturating_sub(base.classes.len());
    let algo = base
        .classes
        .iter()
        .find_map(|c| if let Limit::Auto(a) = c.limit { Some(a.algo) } else { None })
        .unwrap_or_default();
    let (users, hosts): (Vec<&Service>, Vec<&Service>) = todo.iter().partition(|s| s.untrusted());
    let mut groups = groups(&hosts, room);
    note.grouped = groups.len() < hosts.len();
    // What is left of the table after the host's services: the users' one class.
    if !users.is_empty() && groups.len() < room {
        groups.push((USERS_CLASS.to_string(), users));
    }
    note.unplaced = todo.len() - groups.iter().map(|(_, v)| v.len()).sum::<usize>();
    let new: Vec<Class> = groups.into_iter().map(|(name, v)| group_class(name, &v, algo)).collect();
    let at = if base.default_class == base.classes.len() - 1 { base.default_class } else { base.classes.len() };
    let n = new.len();
    cfg.classes.splice(at..at, new);
    if cfg.default_class >= at {
        cfg.default_class += n;
    }
    (cfg, note)
}

#[cfg(test)]
mod tests;
