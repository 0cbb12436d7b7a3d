//! The kernel's "netdev" generic netlink family: an interface's NAPI
//! instances and the pid of each one's kthread (threaded NAPI; the
//! NETDEV_A_NAPI_PID attribute, Linux 6.8). The kernel names the kthread
//! "napi/IFACE-ID", but any process can take that name: the pid the kernel
//! gives is the only attribute no one else can fake. The family answers for
//! the caller's network namespace: call it from the interface's.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

// From linux/netlink.h, linux/genetlink.h and linux/netdev.h (not in every
// distribution's headers yet).
const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_NAPI_GET: u8 = 11;
const NETDEV_A_NAPI_IFINDEX: u16 = 1;
const NETDEV_A_NAPI_ID: u16 = 2;
const NETDEV_A_NAPI_PID: u16 = 4;
/// The attribute type's flag bits (nested, network byte order).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// One NAPI instance of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Napi {
    pub id: u32,
    /// Its kthread's pid (threaded NAPI only).
    pub pid: Option<i32>,
}

/// A NETLINK_GENERIC socket.
struct Genl {
    fd: OwnedFd,
    seq: u32,
}

impl Genl {
    fn open() -> Result<Genl> {
        // SAFETY: plain socket(2); the fd is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_GENERIC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("opening a NETLINK_GENERIC socket");
        }
        // SAFETY: fd is a fresh, valid descriptor.
        Ok(Genl { fd: unsafe { OwnedFd::from_raw_fd(fd) }, seq: 0 })
    }

    /// Send one request (`kind` the family id, `cmd` its command, `attrs`
    /// already encoded) and hand each reply's attributes to `each`, until
    /// the kernel says done (a dump) or after the one reply.
    fn ask(&mut self, kind: u16, dump: bool, cmd: u8, attrs: &[u8], each: &mut dyn FnMut(&[u8])) -> Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut req = vec![0u8; NLMSG_HDRLEN + GENL_HDRLEN];
        req.extend_from_slice(attrs);
        let flags = libc::NLM_F_REQUEST | if dump { libc::NLM_F_DUMP } else { libc::NLM_F_ACK };
        let len = req.len() as u32;
        req[0..4].copy_from_slice(&len.to_ne_bytes());
        req[4..6].copy_from_slice(&kind.to_ne_bytes());
        req[6..8].copy_from_slice(&(flags as u16).to_ne_bytes());
        req[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        (req[16], req[17]) = (cmd, 1);
        // SAFETY: send(2) of a byte buffer we own.
        if unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
            return Err(std::io::Error::last_os_error()).context("generic netlink request");
        }
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: recv(2) into a buffer we own, at most its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(std::io::Error::last_os_error()).context("generic netlink reply");
            }
            if replies(&buf[..n as usize], self.seq, each)? {
                return Ok(());
            }
        }
    }
}

/// Walk one datagram of netlink messages answering `seq`: each message's
/// attributes (past the generic header) go to `each`. True once the kernel
/// says done (NLMSG_DONE, or an NLMSG_ERROR of 0: an acknowledgement).
fn replies(mut buf: &[u8], seq: u32, each: &mut dyn FnMut(&[u8])) -> Result<bool> {
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
        let got = u32::from_ne_bytes(buf[8..12].try_into().unwrap());
        if len < NLMSG_HDRLEN || len > buf.len() {
            bail!("generic netlink: a message of {len} bytes in a datagram of {}", buf.len());
        }
        let body = &buf[NLMSG_HDRLEN..len];
        if got == seq {
            match kind {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    let code = body.get(0..4).map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap()));
                    if code != 0 {
                        return Err(std::io::Error::from_raw_os_error(-code)).context("generic netlink");
                    }
                    return Ok(true);
                }
                _ => each(body.get(GENL_HDRLEN..).unwrap_or(&[])),
            }
        }
        buf = &buf[((len + 3) & !3).min(buf.len())..];
    }
    Ok(false)
}

/// The attributes in `buf`: (type, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((kind, payload))
    })
}

/// One attribute, encoded (padded to 4 bytes).
fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(4 + payload.len() + 3);
    a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize((a.len() + 3) & !3, 0);
    a
}

fn u32_of(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(0..4)?.try_into().ok()?))
}

/// The NAPI instances of one reply's attributes.
fn napi_of(body: &[u8]) -> Option<Napi> {
    let mut napi = Napi { id: 0, pid: None };
    let mut found = false;
    for (kind, p) in attrs(body) {
        match kind {
            NETDEV_A_NAPI_ID => (napi.id, found) = (u32_of(p)?, true),
            NETDEV_A_NAPI_PID => napi.pid = u32_of(p).map(|v| v as i32).filter(|&v| v > 0),
            _ => {}
        }
    }
    found.then_some(napi)
}

/// The NAPI instances of the interface `ifindex` in this network namespace
/// (Err: the kernel has no netdev family or no NAPI listing, before 6.8).
pub fn napis(ifindex: u32) -> Result<Vec<Napi>> {
    let mut nl = Genl::open()?;
    let mut family = None;
    nl.ask(GENL_ID_CTRL, false, CTRL_CMD_GETFAMILY, &attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0"), &mut |body| {
        for (kind, p) in attrs(body) {
            if kind == CTRL_ATTR_FAMILY_ID && p.len() >= 2 {
                family = Some(u16::from_ne_bytes([p[0], p[1]]));
            }
        }
    })
    .context("looking up the netdev generic netlink family")?;
    let Some(family) = family else { bail!("no netdev generic netlink family") };
    let mut out = Vec::new();
    let filter = attr(NETDEV_A_NAPI_IFINDEX, &ifindex.to_ne_bytes());
    nl.ask(family, true, NETDEV_CMD_NAPI_GET, &filter, &mut |body| out.extend(napi_of(body)))
        .context("listing the interface's NAPI instances")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply's attributes are read whatever their order and padding;
    /// one without an id is no NAPI instance; a pid of 0 is none.
    #[test]
    fn napi_replies_are_parsed() {
        let body =
            [attr(NETDEV_A_NAPI_IFINDEX, &7u32.to_ne_bytes()), attr(NETDEV_A_NAPI_ID, &8193u32.to_ne_bytes())].concat();
        assert_eq!(napi_of(&body), Some(Napi { id: 8193, pid: None }));
        let body =
            [attr(NETDEV_A_NAPI_PID, &412u32.to_ne_bytes()), attr(NETDEV_A_NAPI_ID, &8194u32.to_ne_bytes())].concat();
        assert_eq!(napi_of(&body), Some(Napi { id: 8194, pid: Some(412) }));
        assert_eq!(napi_of(&attr(NETDEV_A_NAPI_PID, &412u32.to_ne_bytes())), None, "no id");
        let zero = [attr(NETDEV_A_NAPI_ID, &1u32.to_ne_bytes()), attr(NETDEV_A_NAPI_PID, &0u32.to_ne_bytes())].concat();
        assert_eq!(napi_of(&zero).unwrap().pid, None);
        let odd = attr(9, b"abc");
        assert_eq!(odd.len(), 8, "padded to 4 bytes");
        assert_eq!(attrs(&[odd, attr(NETDEV_A_NAPI_ID, &5u32.to_ne_bytes())].concat()).count(), 2);
        assert_eq!(attrs(&[3, 0, 1, 0]).count(), 0, "a length under the header ends the walk");
    }

    /// The loopback interface has no NAPI: an empty list on a kernel with
    /// the family, an error before 6.8; never a panic.
    #[test]
    fn the_loopback_has_no_napi_instance() {
        if let Ok(n) = napis(1) {
            assert!(n.is_empty(), "{n:?}");
        }
    }
}
