//! A sock_diag client: the memory, queue and drops of the sockets behind a
//! class's ports (`INET_DIAG_SKMEMINFO`: rmem_alloc, rcvbuf,
//! `SK_MEMINFO_DROPS`), filtered by port in the kernel, and a socket read
//! again alone by its cookie. The netlink socket is created once, inside
//! the service's namespace.
//!
//! Why not `netlink-packet-sock-diag` (read in its source, 2026-11; not
//! built in and measured): its `InetRequest` carries no attributes, so it
//! cannot send `INET_DIAG_REQ_BYTECODE`: without that filter every tick
//! would dump every UDP socket of the namespace instead of those on the
//! class's ports (`SockDiag::udp`).
use anyhow::{Context, Result};
use serde::Serialize;

use crate::base::netns;

// sock_diag: the UDP sockets behind a class's ports.

/// Memory and drops of the sockets bound to some ports, added up, and the
/// fullest one's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SockStats {
    pub sockets: u32,
    /// Bytes queued (sk_rmem_alloc), all sockets.
    pub queued: u64,
    /// Receive buffer size (sk_rcvbuf), all sockets.
    pub rcvbuf: u64,
    /// Datagrams dropped by the sockets (sk_drops), since they were created.
    pub drops: u64,
    /// The fullest socket's queue and buffer (bytes). A socket drops when
    /// it is full, whatever its siblings hold: a service's IPv6 socket
    /// beside its full IPv4 one halves the sums, and "over half the
    /// buffer" read from them would never be true.
    pub full_queued: u64,
    pub full_rcvbuf: u64,
}

impl SockStats {
    /// One socket's figures from its INET_DIAG_SKMEMINFO array.
    pub fn of_socket(mem: &[u32]) -> SockStats {
        SockStats {
            sockets: 1,
            queued: u64::from(mem[SK_MEMINFO_RMEM_ALLOC]),
            rcvbuf: u64::from(mem[SK_MEMINFO_RCVBUF]),
            drops: u64::from(mem[SK_MEMINFO_DROPS]),
            full_queued: u64::from(mem[SK_MEMINFO_RMEM_ALLOC]),
            full_rcvbuf: u64::from(mem[SK_MEMINFO_RCVBUF]),
        }
    }

    pub fn add(&self, o: &SockStats) -> SockStats {
        // Fuller: a larger share of its buffer queued (cross-multiplied).
        let fuller = |a: &SockStats, b: &SockStats| {
            u128::from(a.full_queued) * u128::from(b.full_rcvbuf.max(1))
                > u128::from(b.full_queued) * u128::from(a.full_rcvbuf.max(1))
        };
        let full = if self.sockets == 0 || fuller(o, self) { o } else { self };
        SockStats {
            sockets: self.sockets + o.sockets,
            queued: self.queued + o.queued,
            rcvbuf: self.rcvbuf + o.rcvbuf,
            drops: self.drops + o.drops,
            full_queued: full.full_queued,
            full_rcvbuf: full.full_rcvbuf,
        }
    }

    /// The fullest socket's queue as a share of its buffer (None: no socket).
    pub fn fullest_share(&self) -> Option<f64> {
        (self.sockets > 0 && self.full_rcvbuf > 0).then(|| self.full_queued as f64 / self.full_rcvbuf as f64)
    }

    /// Is the fullest socket's queue over `share` of its buffer?
    pub fn fuller_than(&self, share: f64) -> bool {
        crate::policy::queue::over(self.full_queued, self.full_rcvbuf, share)
    }
}

// From linux/inet_diag.h and linux/sock_diag.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_SKMEMINFO: u16 = 7;
const INET_DIAG_REQ_BYTECODE: u16 = 1;
/// The protocol as a u32, for those above 255 (IPPROTO_MPTCP).
const INET_DIAG_REQ_PROTOCOL: u16 = 3;
const INET_DIAG_SKV6ONLY: u16 = 11;
const INET_DIAG_BC_JMP: u8 = 1;
const INET_DIAG_BC_S_GE: u8 = 2;
const INET_DIAG_BC_S_LE: u8 = 3;
const INET_DIAG_BC_D_COND: u8 = 8;
// From linux/unix_diag.h.
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_PEER: u16 = 2;
const UDIAG_SHOW_NAME: u32 = 1;
const UDIAG_SHOW_PEER: u32 = 4;
/// struct unix_diag_req: family, protocol, pad, states, ino, show, cookie.
const UNIX_REQ_LEN: usize = 24;
/// struct unix_diag_msg: family, type, state, pad, ino, cookie.
const UNIX_MSG_LEN: usize = 16;
const SK_MEMINFO_RMEM_ALLOC: usize = 0;
const SK_MEMINFO_RCVBUF: usize = 1;
const SK_MEMINFO_DROPS: usize = 8;
const NLMSG_HDRLEN: usize = 16;
/// INET_DIAG_NOCOOKIE: a one-socket request that names no cookie (the
/// kernel then checks only the addresses and ports).
const NO_COOKIE: [u8; 8] = [0xff; 8];
/// struct inet_diag_req_v2: family, protocol, ext, pad, states, 48-byte sockid.
const REQ_LEN: usize = 56;
/// struct inet_diag_msg: family, state, timer, retrans, sockid (48), expires,
/// rqueue, wqueue, uid, inode.
const MSG_LEN: usize = 72;

/// A NETLINK_SOCK_DIAG socket, created in one namespace.
pub struct SockDiag {
    fd: std::os::fd::OwnedFd,
    seq: u32,
    /// The replies' buffer, kept: the daemon dumps several times a second.
    buf: Vec<u8>,
    /// `read_each`'s replies, kept until every socket was found.
    staged: Vec<u8>,
}

impl SockDiag {
    /// Open in namespace `ns` (None: the current one).
    pub fn open(ns: Option<&str>) -> Result<SockDiag> {
        let open = || -> Result<SockDiag> {
            use std::os::fd::FromRawFd;
            // SAFETY: plain socket(2); the fd is owned from here on.
            let fd =
                unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error()).context("opening a NETLINK_SOCK_DIAG socket");
            }
            // SAFETY: fd is a fresh, valid descriptor.
            Ok(SockDiag {
                fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
                seq: 0,
                buf: vec![0; 32 * 1024],
                staged: vec![],
            })
        };
        match ns {
            Some(ns) => netns::run_in(ns, open),
            None => open(),
        }
    }

    /// The UDP sockets (IPv4 and IPv6) whose local port is in one of `ports`.
    pub fn udp(&mut self, ports: &[(u16, u16)]) -> Result<SockStats> {
        let v4 = self.udp_in(libc::AF_INET as u8, ports)?;
        Ok(v4.add(&self.udp_in(libc::AF_INET6 as u8, ports)?))
    }

    /// The UDP sockets of one address family whose local port is in one of `ports`.
    pub fn udp_in(&mut self, family: u8, ports: &[(u16, u16)]) -> Result<SockStats> {
        let mut total = SockStats::default();
        if ports.is_empty() {
            return Ok(total);
        }
        self.dump_ports(family, libc::IPPROTO_UDP as u8, u32::MAX, ports, &mut |s| {
            if let Some(mem) = s.mem.filter(|_| ports.iter().any(|&(lo, hi)| (lo..=hi).contains(&s.sport))) {
                total = total.add(&SockStats::of_socket(mem));
            }
        })?;
        Ok(total)
    }

    /// Dump the sockets of one family and protocol whose TCP state is in the
    /// bit set `states` (`1 << TCP_LISTEN`, ...; UDP sockets are in
    /// TCP_CLOSE when unconnected), calling `each` per socket.
    pub fn dump(&mut self, family: u8, protocol: u8, states: u32, each: &mut dyn FnMut(&DiagSock)) -> Result<()> {
        self.dump_ports(family, protocol, states, &[], each)
    }

    /// As `dump`, but the kernel sends only the sockets whose local port is
    /// in one of `ports` (inet_diag bytecode: the others cost no netlink
    /// message and no parsing); empty `ports`: every socket.
    pub fn dump_ports(
        &mut self,
        family: u8,
        protocol: u8,
        states: u32,
        ports: &[(u16, u16)],
        each: &mut dyn FnMut(&DiagSock),
    ) -> Result<()> {
        self.request(family, u32::from(protocol), states, ports, each)
    }

    /// The MPTCP listening sockets of one family (IPPROTO_MPTCP, named by
    /// INET_DIAG_REQ_PROTOCOL: it does not fit the request's byte; the
    /// kernel's mptcp_diag answers). An error where the kernel has no
    /// MPTCP diag.
    pub fn dump_mptcp_listeners(&mut self, family: u8, each: &mut dyn FnMut(&DiagSock)) -> Result<()> {
        self.request(family, libc::IPPROTO_MPTCP as u32, 1 << TCP_LISTEN, &[], each)
    }

    /// Read the sockets of `keys` again, each alone: the kernel looks each
    /// up by its addresses and ports (a hash lookup, where a dump walks
    /// every slot of the protocol's table) and answers only if it finds
    /// the socket of the key's cookie. `each` is called per socket only if
    /// every one was found; Ok(false), and no call, if one is gone, was
    /// replaced by another socket, or its lookup chose another socket (a
    /// SO_REUSEPORT group's lookup picks one of its sockets by hash).
    pub fn read_each(&mut self, keys: &[SockKey], each: &mut dyn FnMut(&DiagSock)) -> Result<bool> {
        self.staged.clear();
        let mut replies = Vec::with_capacity(keys.len());
        for key in keys {
            self.send(key.family, u32::from(key.protocol), u32::MAX, None, Some(key))?;
            let n = self.recv_into_buf()?;
            let reply = &self.buf[..n];
            let mut found = false;
            match parse_diag_reply(reply, self.seq, &mut |_| found = true) {
                Ok(_) if found => {}
                Ok(_) => return Ok(false),
                Err(e) if gone(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
            replies.push((self.seq, self.staged.len()..self.staged.len() + n));
            self.staged.extend_from_slice(reply);
        }
        for (seq, range) in replies {
            parse_diag_reply(&self.staged[range], seq, each)?;
        }
        Ok(true)
    }

    /// The owner (uid) of the TCP socket of this namespace whose local end
    /// is `from` and whose remote end is `to`: the process at the other end
    /// of a connection accepted from `from` on `to`, where that process is
    /// on this host. None where no such socket is here (a remote peer).
    pub fn tcp_owner(&mut self, from: std::net::SocketAddr, to: std::net::SocketAddr) -> Result<Option<u32>> {
        // An IPv4 peer of an IPv6 listener shows as ::ffff:a.b.c.d; its socket is IPv4.
        let plain = |a: std::net::IpAddr| a.to_canonical();
        let (src, dst) = (plain(from.ip()), plain(to.ip()));
        let family = if src.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 } as u8;
        if src.is_ipv4() != dst.is_ipv4() {
            return Ok(None);
        }
        let key = SockKey {
            family,
            protocol: libc::IPPROTO_TCP as u8,
            src,
            sport: from.port(),
            dst,
            dport: to.port(),
            ifindex: 0,
            cookie: NO_COOKIE,
        };
        let mut uid = None;
        self.read_each(&[key], &mut |s| uid = Some(s.uid))?;
        Ok(uid)
    }

    fn request(
        &mut self,
        family: u8,
        protocol: u32,
        states: u32,
        ports: &[(u16, u16)],
        each: &mut dyn FnMut(&DiagSock),
    ) -> Result<()> {
        self.send(family, protocol, states, port_filter(ports), None)?;
        self.replies(each)
    }

    /// Read a dump's replies to its end, calling `each` per socket.
    fn replies(&mut self, each: &mut dyn FnMut(&DiagSock)) -> Result<()> {
        loop {
            let n = self.recv_into_buf()?;
            if parse_diag_reply(&self.buf[..n], self.seq, each)? {
                return Ok(());
            }
        }
    }

    /// The TCP sockets of one family in `states` whose remote address is in
    /// one of `nets` (address, prefix length; the kernel filters them, as
    /// `dump_ports` by port), calling `each` per socket.
    pub fn dump_to(
        &mut self,
        family: u8,
        states: u32,
        nets: &[(std::net::IpAddr, u8)],
        each: &mut dyn FnMut(&DiagSock),
    ) -> Result<()> {
        let Some(bc) = dest_filter(nets) else { return Ok(()) };
        self.send(family, libc::IPPROTO_TCP as u32, states, Some(bc), None)?;
        self.replies(each)
    }

    /// The unix sockets listening or connected (stream and seqpacket), each
    /// with its peer's inode and its name (an accepted socket carries its
    /// listener's).
    pub fn dump_unix(&mut self, each: &mut dyn FnMut(&UnixSock)) -> Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut body = [0u8; UNIX_REQ_LEN];
        body[0] = libc::AF_UNIX as u8;
        body[4..8].copy_from_slice(&(1u32 << TCP_ESTABLISHED | 1u32 << TCP_LISTEN).to_ne_bytes());
        body[12..16].copy_from_slice(&(UDIAG_SHOW_NAME | UDIAG_SHOW_PEER).to_ne_bytes());
        self.send_raw(&body, true)?;
        loop {
            let n = self.recv_into_buf()?;
            if parse_unix_reply(&self.buf[..n], self.seq, each)? {
                return Ok(());
            }
        }
    }

    /// Send `body` (the request after the netlink header) under the
    /// current sequence number, as a dump or a one-socket request.
    fn send_raw(&mut self, body: &[u8], dump: bool) -> Result<()> {
        use std::os::fd::AsRawFd;
        let mut req = vec![0u8; NLMSG_HDRLEN];
        req.extend_from_slice(body);
        let flags = if dump { libc::NLM_F_REQUEST | libc::NLM_F_DUMP } else { libc::NLM_F_REQUEST };
        let len = req.len() as u32;
        req[0..4].copy_from_slice(&len.to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&(flags as u16).to_ne_bytes());
        req[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        // SAFETY: send(2) of a byte buffer we own.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("sock_diag request");
        }
        Ok(())
    }

    /// Send a request under a new sequence number: a dump (of the sockets
    /// in `states` that bytecode `bc` passes), or with `one`, a request
    /// for that one socket.
    fn send(
        &mut self,
        family: u8,
        protocol: u32,
        states: u32,
        bc: Option<Vec<u8>>,
        one: Option<&SockKey>,
    ) -> Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut req = vec![0u8; REQ_LEN];
        if let Some(bc) = &bc {
            req.extend_from_slice(&((4 + bc.len()) as u16).to_ne_bytes());
            req.extend_from_slice(&INET_DIAG_REQ_BYTECODE.to_ne_bytes());
            req.extend_from_slice(bc);
        }
        if let Ok(small) = u8::try_from(protocol) {
            req[1] = small;
        } else {
            req.extend_from_slice(&8u16.to_ne_bytes());
            req.extend_from_slice(&INET_DIAG_REQ_PROTOCOL.to_ne_bytes());
            req.extend_from_slice(&protocol.to_ne_bytes());
        }
        req[0] = family;
        req[2] = 1 << (INET_DIAG_SKMEMINFO - 1);
        req[4..8].copy_from_slice(&states.to_ne_bytes());
        if let Some(key) = one {
            req[8..56].copy_from_slice(&key.sockid());
        }
        self.send_raw(&req, one.is_none())
    }

    /// Receive one datagram of replies into `buf`; its length.
    fn recv_into_buf(&mut self) -> Result<usize> {
        use std::os::fd::AsRawFd;
        // SAFETY: recv(2) into a buffer we own, at most its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), self.buf.as_mut_ptr().cast(), self.buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("sock_diag reply");
        }
        Ok(n as usize)
    }
}

/// Is this sock_diag error one socket's absence (ENOENT: no socket of the
/// addresses; ESTALE: another socket than the cookie's)?
fn gone(e: &anyhow::Error) -> bool {
    let errno = e.root_cause().downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error);
    matches!(errno, Some(libc::ENOENT | libc::ESTALE))
}

/// One socket as sock_diag names it, from a dump: enough to read it again
/// alone ([`SockDiag::read_each`]), and only while it is the same socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockKey {
    pub family: u8,
    pub protocol: u8,
    /// Local address and port, remote address and port (as in [`DiagSock`]).
    pub src: std::net::IpAddr,
    pub sport: u16,
    pub dst: std::net::IpAddr,
    pub dport: u16,
    pub ifindex: u32,
    /// The kernel's cookie of the socket, as the dump gave it.
    pub cookie: [u8; 8],
}

impl SockKey {
    /// The request's struct inet_diag_sockid (48 bytes). The kernel finds
    /// a TCP socket as the socket names itself (src: its local end) but
    /// looks a UDP one up as a packet to it would be (src: the remote end;
    /// udp_diag.c: "src and dst are swapped for historical reasons").
    fn sockid(&self) -> [u8; 48] {
        let (mut id, addr) = ([0u8; 48], |a: std::net::IpAddr| match a {
            std::net::IpAddr::V4(v4) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&v4.octets());
                b
            }
            std::net::IpAddr::V6(v6) => v6.octets(),
        });
        let local = (self.sport, addr(self.src));
        let remote = (self.dport, addr(self.dst));
        let (first, second) = if self.protocol == libc::IPPROTO_UDP as u8 { (remote, local) } else { (local, remote) };
        id[0..2].copy_from_slice(&first.0.to_be_bytes());
        id[2..4].copy_from_slice(&second.0.to_be_bytes());
        id[4..20].copy_from_slice(&first.1);
        id[20..36].copy_from_slice(&second.1);
        id[36..40].copy_from_slice(&self.ifindex.to_ne_bytes());
        id[40..48].copy_from_slice(&self.cookie);
        id
    }
}

/// inet_diag bytecode (linux/inet_diag.h) that accepts a socket whose local
/// port is in one of `ranges`; None (no filter) for no range or too many to
/// jump over. The kernel runs it per socket: an op's `yes` or `no` is how
/// many bytes to skip on a match or a miss; landing exactly on the end
/// accepts, jumping past it rejects. One block per range:
///   S_GE lo (yes: next op; no: next block)
///   S_LE hi (yes: next op; no: next block)
///   JMP     (always `no`: to the end, accept)
/// The last block's misses jump past the end. `yes` is a byte, `no` two,
/// so only the JMP makes the long jump.
pub fn port_filter(ranges: &[(u16, u16)]) -> Option<Vec<u8>> {
    const BLOCK: usize = 20;
    let n = ranges.len();
    let total = n * BLOCK;
    if n == 0 || total > usize::from(u16::MAX) - 8 {
        return None;
    }
    let mut bc = Vec::with_capacity(total);
    let mut op = |code: u8, yes: u8, no: usize| {
        bc.push(code);
        bc.push(yes);
        bc.extend_from_slice(&(no as u16).to_ne_bytes());
    };
    for (i, &(lo, hi)) in ranges.iter().enumerate() {
        let last = i + 1 == n;
        op(INET_DIAG_BC_S_GE, 8, if last { BLOCK + 4 } else { BLOCK });
        op(0, 0, usize::from(lo));
        op(INET_DIAG_BC_S_LE, 8, if last { 12 + 4 } else { 12 });
        op(0, 0, usize::from(hi));
        op(INET_DIAG_BC_JMP, 4, total - (i * BLOCK + 16));
    }
    Some(bc)
}

/// Bytecode that passes a socket whose remote address is in one of `nets`
/// (address, prefix length): a block per net, as `port_filter`'s:
///   D_COND net (yes: next op; no: next block)
///   JMP        (always `no`: to the end, accept)
/// The last block's miss jumps past the end (reject). The kernel audits a
/// program along its `yes` jumps, so each must go to the next op. None for
/// no nets (or too many).
pub fn dest_filter(nets: &[(std::net::IpAddr, u8)]) -> Option<Vec<u8>> {
    // struct inet_diag_bc_op, then struct inet_diag_hostcond: family,
    // prefix length, 2 pad bytes, port (-1: any), the address.
    let conds: Vec<Vec<u8>> = nets
        .iter()
        .map(|&(addr, prefix)| {
            let (family, bytes) = match addr {
                std::net::IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
                std::net::IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
            };
            let mut cond = vec![0, 0, 0, 0, family, prefix, 0, 0];
            cond.extend_from_slice(&(-1i32).to_ne_bytes());
            cond.extend_from_slice(&bytes);
            cond
        })
        .collect();
    let total: usize = conds.iter().map(|c| c.len() + 4).sum();
    if conds.is_empty() || total > usize::from(u16::MAX) - 8 {
        return None;
    }
    let (mut bc, n) = (Vec::with_capacity(total), conds.len());
    for (i, mut cond) in conds.into_iter().enumerate() {
        let len = cond.len();
        let miss = if i + 1 == n { len + 8 } else { len + 4 };
        cond[0] = INET_DIAG_BC_D_COND;
        cond[1] = len as u8;
        cond[2..4].copy_from_slice(&(miss as u16).to_ne_bytes());
        bc.extend_from_slice(&cond);
        let to_end = total - bc.len();
        bc.extend_from_slice(&[INET_DIAG_BC_JMP, 4]);
        bc.extend_from_slice(&(to_end as u16).to_ne_bytes());
    }
    Some(bc)
}

/// One unix socket of a `dump_unix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixSock {
    pub inode: u32,
    /// TCP_LISTEN or TCP_ESTABLISHED (connected).
    pub state: u8,
    /// Its peer's inode (None: the kernel sent none).
    pub peer: Option<u32>,
    /// Its name (a path, or an abstract name from its 0 byte on): a bound
    /// socket's, or an accepted one's, which is its listener's. None: unnamed.
    pub name: Option<Vec<u8>>,
}

/// TCP states as sock_diag numbers them (include/net/tcp_states.h).
pub const TCP_ESTABLISHED: u8 = 1;
/// Request sockets (half-open connections) are dumped in this state.
pub const TCP_SYN_RECV: u8 = 3;
pub const TCP_CLOSE: u8 = 7;
pub const TCP_LISTEN: u8 = 10;

/// One socket of a sock_diag dump.
#[derive(Debug, Clone, Copy)]
pub struct DiagSock<'a> {
    pub family: u8,
    /// TCP state (UDP: TCP_CLOSE unconnected, TCP_ESTABLISHED connected).
    pub state: u8,
    /// Local and remote port.
    pub sport: u16,
    pub dport: u16,
    /// Local address (unspecified: the wildcard).
    pub src: std::net::IpAddr,
    /// Remote address (unspecified for a listener).
    pub dst: std::net::IpAddr,
    /// Interface the socket is bound to (SO_BINDTODEVICE), 0 for none.
    pub ifindex: u32,
    /// Listeners: the accept queue's length and its limit; others: bytes
    /// in the receive and send queues.
    pub rqueue: u32,
    pub wqueue: u32,
    /// The socket's owner (sk_uid: who created it), as this namespace's
    /// user namespace maps it.
    pub uid: u32,
    pub inode: u32,
    /// The kernel's cookie of the socket (struct inet_diag_sockid's, as sent).
    pub cookie: [u8; 8],
    /// An IPv6 socket with IPV6_V6ONLY (it takes no IPv4 packet).
    pub v6only: bool,
    /// INET_DIAG_SKMEMINFO, if the kernel sent it (SK_MEMINFO_* indexes).
    pub mem: Option<&'a [u32]>,
}

impl DiagSock<'_> {
    /// The key to read this socket of `protocol` again alone.
    pub fn key(&self, protocol: u8) -> SockKey {
        SockKey {
            family: self.family,
            protocol,
            src: self.src,
            sport: self.sport,
            dst: self.dst,
            dport: self.dport,
            ifindex: self.ifindex,
            cookie: self.cookie,
        }
    }

    fn parse(m: &[u8]) -> DiagSock<'_> {
        let u32_at = |o: usize| u32::from_ne_bytes(m[o..o + 4].try_into().unwrap());
        // struct inet_diag_sockid: the ports, then 16 bytes of each address.
        let addr = |o: usize| {
            if m[0] == libc::AF_INET6 as u8 {
                std::net::IpAddr::from(<[u8; 16]>::try_from(&m[o..o + 16]).unwrap())
            } else {
                std::net::IpAddr::from(<[u8; 4]>::try_from(&m[o..o + 4]).unwrap())
            }
        };
        let (src, dst) = (addr(8), addr(24));
        DiagSock {
            family: m[0],
            state: m[1],
            sport: u16::from_be_bytes([m[4], m[5]]),
            dport: u16::from_be_bytes([m[6], m[7]]),
            src,
            dst,
            ifindex: u32_at(40),
            rqueue: u32_at(56),
            wqueue: u32_at(60),
            uid: u32_at(64),
            inode: u32_at(68),
            cookie: m[44..52].try_into().unwrap(),
            v6only: false,
            mem: None,
        }
    }
}

/// Walk one datagram of sock_diag replies, calling `each` per socket.
/// Returns true at the end of the dump (NLMSG_DONE).
pub fn parse_diag_reply(b: &[u8], seq: u32, each: &mut dyn FnMut(&DiagSock)) -> Result<bool> {
    each_message(b, seq, MSG_LEN, "sock_diag", &mut |m| {
        let mut sock = DiagSock::parse(m);
        // SK_MEMINFO_VARS is 9 today; later kernels may add more, unread here.
        let (mut mem, mut mem_len) = ([0u32; 16], 0);
        each_attr(&m[MSG_LEN..], &mut |kind, v| match kind {
            INET_DIAG_SKMEMINFO => {
                for (m, c) in mem.iter_mut().zip(v.chunks_exact(4)) {
                    *m = u32::from_ne_bytes(c.try_into().unwrap());
                    mem_len += 1;
                }
            }
            INET_DIAG_SKV6ONLY if !v.is_empty() => sock.v6only = v[0] != 0,
            _ => {}
        });
        if mem_len > SK_MEMINFO_DROPS {
            sock.mem = Some(&mem[..mem_len]);
        }
        each(&sock);
    })
}

/// Walk one datagram of unix_diag replies, calling `each` per socket.
/// Returns true at the end of the dump (NLMSG_DONE).
pub fn parse_unix_reply(b: &[u8], seq: u32, each: &mut dyn FnMut(&UnixSock)) -> Result<bool> {
    each_message(b, seq, UNIX_MSG_LEN, "unix_diag", &mut |m| {
        let inode = u32::from_ne_bytes(m[4..8].try_into().unwrap());
        let mut sock = UnixSock { inode, state: m[2], peer: None, name: None };
        each_attr(&m[UNIX_MSG_LEN..], &mut |kind, v| match kind {
            UNIX_DIAG_NAME if !v.is_empty() => sock.name = Some(v.to_vec()),
            UNIX_DIAG_PEER if v.len() >= 4 => sock.peer = Some(u32::from_ne_bytes(v[..4].try_into().unwrap())),
            _ => {}
        });
        each(&sock);
    })
}

/// Walk one datagram of netlink messages answering request `seq`, calling
/// `each` with each message's payload of at least `min` bytes (shorter
/// ones are skipped). Returns true at NLMSG_DONE; an NLMSG_ERROR with an
/// errno is an error, as is a message whose length does not fit.
fn each_message(mut b: &[u8], seq: u32, min: usize, what: &str, each: &mut dyn FnMut(&[u8])) -> Result<bool> {
    let u32_at = |b: &[u8], o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
    while b.len() >= NLMSG_HDRLEN {
        let len = u32_at(b, 0) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            anyhow::bail!("{what}: malformed netlink message (length {len} of {})", b.len());
        }
        let (msg, kind) = (&b[..len], i32::from(u16::from_ne_bytes([b[4], b[5]])));
        if u32_at(b, 8) == seq {
            match kind {
                libc::NLMSG_DONE => return Ok(true),
                libc::NLMSG_ERROR => {
                    let errno = if len >= NLMSG_HDRLEN + 4 { -(u32_at(msg, NLMSG_HDRLEN) as i32) } else { 0 };
                    if errno != 0 {
                        return Err(std::io::Error::from_raw_os_error(errno)).context(format!("{what} dump"));
                    }
                }
                _ if len >= NLMSG_HDRLEN + min => each(&msg[NLMSG_HDRLEN..]),
                _ => {}
            }
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    Ok(false)
}

/// Walk the netlink attributes in `a` (4-byte aligned), calling `each`
/// with each one's type and value; a malformed one ends the walk.
fn each_attr<'a>(mut a: &'a [u8], each: &mut dyn FnMut(u16, &'a [u8])) {
    while a.len() >= 4 {
        let alen = usize::from(u16::from_ne_bytes([a[0], a[1]]));
        if alen < 4 || alen > a.len() {
            return;
        }
        each(u16::from_ne_bytes([a[2], a[3]]), &a[4..alen]);
        a = &a[alen.next_multiple_of(4).min(a.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sockets of one service, a full one and an empty one: the sums
    /// read half full, the fullest socket full (the case of a service's
    /// IPv4 socket under a flood beside its idle IPv6 one).
    #[test]
    fn the_fullest_socket_is_kept_beside_the_sums() {
        let sock = |q: u32, b: u32| {
            let mut mem = [0u32; 9];
            (mem[SK_MEMINFO_RMEM_ALLOC], mem[SK_MEMINFO_RCVBUF]) = (q, b);
            SockStats::of_socket(&mem)
        };
        let (full, empty) = (sock(200_000, 212_992), sock(0, 212_992));
        for s in [SockStats::default().add(&full).add(&empty), SockStats::default().add(&empty).add(&full)] {
            assert_eq!((s.sockets, s.queued, s.rcvbuf), (2, 200_000, 425_984), "{s:?}");
            assert_eq!((s.full_queued, s.full_rcvbuf), (200_000, 212_992), "{s:?}");
            assert!(s.fuller_than(0.9) && s.queued as f64 <= 0.5 * s.rcvbuf as f64);
        }
        // The fuller by share, not by bytes: a small buffer nearly full.
        let s = sock(300_000, 1_000_000).add(&sock(9_000, 10_000));
        assert_eq!((s.full_queued, s.full_rcvbuf), (9_000, 10_000));
    }

    /// sock_diag finds a real socket by its port and sees its queue grow.
    #[test]
    fn sock_diag_sees_a_sockets_queue() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = rx.local_addr().unwrap().port();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut diag = SockDiag::open(None).unwrap();
        let empty = diag.udp(&[(port, port)]).unwrap();
        assert_eq!((empty.sockets, empty.queued), (1, 0), "{empty:?}");
        assert!(empty.rcvbuf > 0);
        for _ in 0..10 {
            tx.send_to(&[0u8; 100], rx.local_addr().unwrap()).unwrap();
        }
        let full = diag.udp(&[(port, port)]).unwrap();
        assert!(full.queued >= 1000, "{full:?}");
        // Another port range does not see it.
        let other = diag.udp(&[(port.wrapping_add(1), port.wrapping_add(1))]).unwrap();
        assert_eq!(other.queued, 0);
    }

    /// The kernel filters by remote address: a loopback connection's two
    /// ends are in a dump of the connections to 127.0.0.0/8 and not in one
    /// to 10.0.0.0/8 (the bytecode the kernel checks, and runs).
    #[test]
    fn sock_diag_filters_by_remote_address_in_the_kernel() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let ports = [c.local_addr().unwrap().port(), a.local_addr().unwrap().port()];
        let mut diag = SockDiag::open(None).unwrap();
        let ends = |diag: &mut SockDiag, net: [u8; 4], prefix: u8| {
            let mut got = vec![];
            diag.dump_to(libc::AF_INET as u8, 1 << TCP_ESTABLISHED, &[(net.into(), prefix)], &mut |s| {
                if ports.contains(&s.sport) && ports.contains(&s.dport) {
                    got.push(s.sport);
                }
            })
            .unwrap();
            got.sort_unstable();
            got
        };
        let mut both = ports.to_vec();
        both.sort_unstable();
        assert_eq!(ends(&mut diag, [127, 0, 0, 0], 8), both);
        assert!(ends(&mut diag, [10, 0, 0, 0], 8).is_empty());
        // Two nets: either passes.
        let mut got = vec![];
        let nets = [([10, 0, 0, 0].into(), 8), ([127, 0, 0, 1].into(), 32)];
        diag.dump_to(libc::AF_INET as u8, 1 << TCP_ESTABLISHED, &nets, &mut |s| {
            if ports.contains(&s.sport) && ports.contains(&s.dport) {
                got.push(s.sport);
            }
        })
        .unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        drop((a, c));
    }

    /// The kernel filters by port (issue 23, item 5): a dump with ranges
    /// hands back only the sockets in them, with no check in user space.
    #[test]
    fn sock_diag_filters_by_port_in_the_kernel() {
        let socks: Vec<std::net::UdpSocket> =
            (0..4).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let port = |i: usize| socks[i].local_addr().unwrap().port();
        let mut diag = SockDiag::open(None).unwrap();
        for want in [vec![0], vec![1, 3], vec![0, 1, 2, 3]] {
            let ranges: Vec<(u16, u16)> = want.iter().map(|&i| (port(i), port(i))).collect();
            let mut got = vec![];
            diag.dump_ports(libc::AF_INET as u8, libc::IPPROTO_UDP as u8, u32::MAX, &ranges, &mut |s| {
                got.push(s.sport)
            })
            .unwrap();
            got.sort_unstable();
            let mut expect: Vec<u16> = want.iter().map(|&i| port(i)).collect();
            expect.sort_unstable();
            assert_eq!(got, expect, "ranges {ranges:?}");
        }
        // A range that holds several: every socket of the namespace's UDP in it.
        let (lo, hi) = ((0..4).map(port).min().unwrap(), (0..4).map(port).max().unwrap());
        let mut got = 0;
        diag.dump_ports(libc::AF_INET as u8, libc::IPPROTO_UDP as u8, u32::MAX, &[(lo, hi)], &mut |s| {
            assert!((lo..=hi).contains(&s.sport));
            got += 1;
        })
        .unwrap();
        assert!(got >= 4, "{got}");
    }

    /// IPV6_V6ONLY is read from the dump (issue 23, item 3).
    #[test]
    fn sock_diag_says_which_ipv6_sockets_are_v6_only() {
        let bind = |only: bool| {
            let s = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None).unwrap();
            s.set_only_v6(only).unwrap();
            s.bind(&"[::]:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
            let port = s.local_addr().unwrap().as_socket().unwrap().port();
            (s, port)
        };
        let ((_a, only), (_b, dual)) = (bind(true), bind(false));
        let mut seen = vec![];
        let mut diag = SockDiag::open(None).unwrap();
        let ranges = [(only, only), (dual, dual)];
        diag.dump_ports(libc::AF_INET6 as u8, libc::IPPROTO_UDP as u8, u32::MAX, &ranges, &mut |s| {
            seen.push((s.sport, s.v6only))
        })
        .unwrap();
        seen.sort_unstable();
        let mut want = vec![(only, true), (dual, false)];
        want.sort_unstable();
        assert_eq!(seen, want);
    }

    /// The keys of the sockets of `proto` on `ports`, by a dump of both families.
    fn keys_of(diag: &mut SockDiag, proto: i32, states: u32, ports: &[u16]) -> Vec<(SockKey, u32)> {
        let ranges: Vec<(u16, u16)> = ports.iter().map(|&p| (p, p)).collect();
        let mut keys = vec![];
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            diag.dump_ports(family, proto as u8, states, &ranges, &mut |s| keys.push((s.key(proto as u8), s.inode)))
                .unwrap();
        }
        keys
    }

    /// A socket read again alone is the one the dump found (UDP wildcard,
    /// UDP on one address, UDP over IPv6, TCP listeners): its own queue;
    /// one closed, or its port taken by a new socket, reads as gone and
    /// `each` is not called for the others either.
    #[test]
    fn sock_diag_reads_a_dumped_socket_again_alone_and_knows_when_it_is_gone() {
        let any = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let one = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let six = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let tcp_any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let tcp_one = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = |a: std::net::SocketAddr| a.port();
        let udp_ports =
            [port(any.local_addr().unwrap()), port(one.local_addr().unwrap()), port(six.local_addr().unwrap())];
        let tcp_ports = [port(tcp_any.local_addr().unwrap()), port(tcp_one.local_addr().unwrap())];
        let mut diag = SockDiag::open(None).unwrap();
        let udp = keys_of(&mut diag, libc::IPPROTO_UDP, u32::MAX, &udp_ports);
        let tcp = keys_of(&mut diag, libc::IPPROTO_TCP, 1 << TCP_LISTEN, &tcp_ports);
        assert_eq!((udp.len(), tcp.len()), (3, 2), "{udp:?} {tcp:?}");
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..10 {
            tx.send_to(&[0u8; 100], ("127.0.0.1", udp_ports[1])).unwrap();
        }
        let read = |diag: &mut SockDiag, keys: &[(SockKey, u32)]| {
            let only: Vec<SockKey> = keys.iter().map(|k| k.0).collect();
            let mut got = vec![];
            let all = diag
                .read_each(&only, &mut |s| got.push((s.inode, s.sport, s.mem.map(|m| m[SK_MEMINFO_RMEM_ALLOC]))))
                .unwrap();
            (all, got)
        };
        let (all, got) = read(&mut diag, &udp);
        assert!(all);
        for ((key, inode), (got_inode, got_port, rmem)) in udp.iter().zip(&got) {
            assert_eq!((inode, key.sport), (got_inode, *got_port), "the same socket, in order");
            let queued = rmem.unwrap();
            if key.sport == udp_ports[1] {
                assert!(queued >= 1000, "its own queue: {queued}");
            } else {
                assert_eq!(queued, 0, "port {}", key.sport);
            }
        }
        let (all, got) = read(&mut diag, &tcp);
        assert!(all);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), tcp.iter().map(|k| k.1).collect::<Vec<_>>());
        // Closed: gone, and no socket is handed on.
        drop(one);
        assert_eq!(read(&mut diag, &udp), (false, vec![]));
        drop(tcp_one);
        assert_eq!(read(&mut diag, &tcp), (false, vec![]));
        // The port taken again by a new socket: not the socket of the key.
        let again = std::net::UdpSocket::bind(("127.0.0.1", udp_ports[1])).unwrap();
        assert!(!read(&mut diag, &udp).0, "a new socket at the old key's address");
        drop(again);
        let live: Vec<_> = udp.iter().filter(|k| k.0.sport != udp_ports[1]).copied().collect();
        assert_eq!(read(&mut diag, &live).1.len(), 2);
    }

    #[test]
    fn the_port_filter_is_one_block_per_range_and_none_when_it_cannot_jump() {
        assert_eq!(port_filter(&[]), None);
        let bc = port_filter(&[(53, 53), (8000, 8100)]).unwrap();
        assert_eq!(bc.len(), 40);
        assert_eq!(&bc[4 + 2..4 + 4], &53u16.to_ne_bytes(), "the low port follows S_GE");
        assert_eq!(&bc[20 + 12 + 2..20 + 12 + 4], &8100u16.to_ne_bytes());
        assert_eq!(u16::from_ne_bytes([bc[18], bc[19]]), 40 - 16, "the first JMP lands on the end");
        assert!(port_filter(&vec![(1, 1); 4000]).is_none(), "65,535 bytes at most");
    }

    #[test]
    fn a_truncated_diag_reply_is_an_error_not_a_panic() {
        let mut msg = vec![0u8; 20];
        msg[0..4].copy_from_slice(&200u32.to_ne_bytes());
        assert!(parse_diag_reply(&msg, 1, &mut |_| {}).is_err());
        assert!(!parse_diag_reply(&msg[..8], 1, &mut |_| {}).unwrap());
        assert!(parse_unix_reply(&msg, 1, &mut |_| {}).is_err());
    }

    /// A unix_diag reply: a socket with its peer and a name, one with a
    /// peer and no name, one whose peer attribute is cut short (no peer),
    /// then the end of the dump.
    #[test]
    fn a_unix_diag_reply_gives_each_sockets_peer_and_whether_it_has_a_name() {
        let msg = |ino: u32, attrs: &[(u16, &[u8])]| {
            let mut m = vec![0u8; NLMSG_HDRLEN + UNIX_MSG_LEN];
            m[8..12].copy_from_slice(&7u32.to_ne_bytes());
            m[NLMSG_HDRLEN] = libc::AF_UNIX as u8;
            m[NLMSG_HDRLEN + 2] = TCP_ESTABLISHED;
            m[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].copy_from_slice(&ino.to_ne_bytes());
            for (kind, v) in attrs {
                m.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
                m.extend_from_slice(&kind.to_ne_bytes());
                m.extend_from_slice(v);
                m.resize(m.len().next_multiple_of(4), 0);
            }
            let len = m.len() as u32;
            m[0..4].copy_from_slice(&len.to_ne_bytes());
            m
        };
        let mut b = msg(11, &[(UNIX_DIAG_NAME, b"/run/php/fpm.sock"), (UNIX_DIAG_PEER, &12u32.to_ne_bytes())]);
        b.extend(msg(12, &[(UNIX_DIAG_PEER, &11u32.to_ne_bytes())]));
        b.extend(msg(13, &[(UNIX_DIAG_PEER, &[1, 2])]));
        let mut done = msg(0, &[]);
        done[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        b.extend(done);
        let mut got = vec![];
        assert!(parse_unix_reply(&b, 7, &mut |s| got.push((s.inode, s.state, s.peer, s.name.clone()))).unwrap());
        let est = TCP_ESTABLISHED;
        assert_eq!(
            got,
            [
                (11, est, Some(12), Some(b"/run/php/fpm.sock".to_vec())),
                (12, est, Some(11), None),
                (13, est, None, None),
            ]
        );
    }
}
