//! The sockets services listen on (see `discover`'s top for what counts),
//! read by one set of sock_diag dumps that discovery, the steering finder
//! and the service-CPU look share.
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Family, L4};
use crate::signals::sock_diag::{DiagSock, SockDiag, TCP_CLOSE, TCP_LISTEN};

/// Is a socket one a service listens on, for an interface with index `ifindex`?
pub fn is_listener(s: &DiagSock, l4: L4, ifindex: u32, ephemeral: (u16, u16)) -> bool {
    let state_ok = match l4 {
        L4::Tcp => s.state == TCP_LISTEN,
        L4::Udp => s.state == TCP_CLOSE && s.dport == 0 && !(ephemeral.0..=ephemeral.1).contains(&s.sport),
    };
    let loopback = match s.src {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|m| m.is_loopback()),
    };
    state_ok && s.sport != 0 && !loopback && (s.ifindex == 0 || s.ifindex == ifindex)
}

/// A socket a service listens on, as the users of [`Listeners`] keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub l4: L4,
    pub port: u16,
    /// The local address (unspecified: the wildcard).
    pub addr: IpAddr,
    pub inode: u32,
    /// Its creator, as the kernel records it (sk_uid, from sock_diag).
    pub uid: u32,
    /// The families it receives.
    pub family: Family,
}

/// How long one reading of the listeners serves every user that asks.
pub const LISTENERS_FRESH: Duration = Duration::from_millis(100);

/// The sockets services listen on for one interface, read by one set of
/// sock_diag dumps (UDP and TCP, both families) that discovery, the steering
/// finder and the service-CPU look share: a reading younger than
/// LISTENERS_FRESH serves them all. Each dumped on its own before, and an
/// unfiltered UDP dump walks the whole UDP hash table (16,384 slots here):
/// those walks were a fifth of an idle daemon's CPU with 20 services.
/// A handle: clones share the one reading.
#[derive(Clone)]
pub struct Listeners(std::sync::Arc<std::sync::Mutex<ListenersInner>>);

struct ListenersInner {
    diag: SockDiag,
    ifindex: u32,
    fresh: Duration,
    read_at: Option<Instant>,
    socks: Vec<Listening>,
}

impl Listeners {
    /// For interface `ifindex` (0: any), in the current network namespace.
    pub fn new(ifindex: u32) -> Result<Listeners> {
        Self::fresh_for(ifindex, LISTENERS_FRESH)
    }

    /// As `new`, a reading serving for `fresh` (zero: every call reads; the bench times the dumps so).
    pub fn fresh_for(ifindex: u32, fresh: Duration) -> Result<Listeners> {
        let inner = ListenersInner { diag: SockDiag::open(None)?, ifindex, fresh, read_at: None, socks: vec![] };
        Ok(Listeners(std::sync::Arc::new(std::sync::Mutex::new(inner))))
    }

    /// The listeners now: the last reading if it is younger than its freshness, else a new one.
    pub fn now(&self) -> Result<Vec<Listening>> {
        let mut g = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let inner = &mut *g;
        if inner.read_at.is_none_or(|at| at.elapsed() >= inner.fresh) {
            let mut socks = Vec::with_capacity(inner.socks.len());
            each_listener(&mut inner.diag, inner.ifindex, &[L4::Udp, L4::Tcp], &mut |l4, s| {
                socks.push(Listening {
                    l4,
                    port: s.sport,
                    addr: s.src,
                    inode: s.inode,
                    uid: s.uid,
                    family: Family::of(s),
                })
            })?;
            inner.socks = socks;
            inner.read_at = Some(Instant::now());
        }
        Ok(inner.socks.clone())
    }
}

/// Each socket a service listens on (`is_listener`) for the protocols in
/// `l4s`, in both families: one sock_diag dump per protocol and family.
pub fn each_listener(diag: &mut SockDiag, ifindex: u32, l4s: &[L4], each: &mut dyn FnMut(L4, &DiagSock)) -> Result<()> {
    let ephemeral = ephemeral_range();
    for &l4 in l4s {
        let (proto, states) = match l4 {
            L4::Udp => (libc::IPPROTO_UDP, 1u32 << TCP_CLOSE),
            L4::Tcp => (libc::IPPROTO_TCP, 1 << TCP_LISTEN),
        };
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            diag.dump(family, proto as u8, states, &mut |s| {
                if is_listener(s, l4, ifindex, ephemeral) {
                    each(l4, s);
                }
            })?;
        }
    }
    Ok(())
}

/// This namespace's ephemeral port range (clients' ports; unreadable: the
/// kernel's default range).
pub fn ephemeral_range() -> (u16, u16) {
    parse_port_range(&std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default())
}

/// "32768\t60999" -> (32768, 60999); anything else -> the kernel's default range.
pub fn parse_port_range(text: &str) -> (u16, u16) {
    let v: Vec<u16> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    match v.as_slice() {
        [lo, hi] if lo <= hi => (*lo, *hi),
        _ => (32768, 60999),
    }
}
