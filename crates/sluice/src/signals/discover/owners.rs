//! Who owns a service's socket, and whose nice counts (the trust model of
//! `discover`): the processes holding the socket's inode open (a /proc
//! scan, redone only when a socket calls for it), each one's name, nice
//! and user, and the uids trusted to give a service a priority above the
//! default's.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Service;

/// systemd's dynamic service users (DynamicUser=), system users above
/// UID_MAX (the gate's copy: bpf/gate/host.h's host_owner_trusted).
const DYNAMIC_UIDS: std::ops::RangeInclusive<u32> =
    crate::bpf_intf::SLUICE_DYNAMIC_UID_LO..=crate::bpf_intf::SLUICE_DYNAMIC_UID_HI;

/// A process holding a service's socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    pub comm: String,
    /// The nice value, or why it could not be read.
    pub nice: Result<i8, String>,
    /// The user it runs as (None: unreadable).
    #[serde(default)]
    pub uid: Option<u32>,
}

/// The login users' uid range, UID_MIN and UID_MAX of /etc/login.defs
/// (1000 and 60000 where it does not say).
pub fn login_uids() -> (u32, u32) {
    static RANGE: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *RANGE.get_or_init(|| parse_login_defs(&std::fs::read_to_string("/etc/login.defs").unwrap_or_default()))
}

/// UID_MIN and UID_MAX from the text of login.defs.
pub fn parse_login_defs(text: &str) -> (u32, u32) {
    let get = |key: &str, or: u32| {
        text.lines()
            .rev()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(key)).then(|| w.next()?.parse().ok()).flatten()
            })
            .unwrap_or(or)
    };
    (get("UID_MIN", 1000), get("UID_MAX", 60000))
}

/// May a process of `uid` give its service a priority above the default's?
/// Root and system users (below UID_MIN of `logins`) and systemd's dynamic
/// users may; login users, nobody and container uids may not.
pub fn trusted(uid: u32, logins: (u32, u32)) -> bool {
    uid < logins.0 || DYNAMIC_UIDS.contains(&uid)
}

/// One process's nice value (getpriority(2): no /proc text to render and parse).
pub(super) fn nice_of(pid: u32) -> Result<i8, String> {
    // SAFETY: errno is cleared first, as getpriority may return -1 as a value.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, pid);
        let e = std::io::Error::last_os_error();
        if n == -1 && e.raw_os_error().is_some_and(|c| c != 0) {
            return Err(format!("getpriority({pid}): {e}"));
        }
        Ok(n as i8)
    }
}

/// Read one process's name, nice and user. `known` caches the name and user
/// by pid until the next /proc scan (a pid is reused only after its process
/// exited, and its sockets with it: the scan that finds the new sockets
/// clears the cache); the nice is read every time (it may change).
pub(super) fn owner(pid: u32, known: &mut HashMap<u32, Owner>) -> Owner {
    let nice = nice_of(pid);
    if let Some(o) = known.get(&pid) {
        return Owner { nice, ..o.clone() };
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_default();
    // /proc/PID belongs to the process's effective user.
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let o = Owner { pid, comm: if comm.is_empty() { "unknown".into() } else { comm }, nice, uid };
    known.insert(pid, o.clone());
    o
}

/// Every socket inode held open by a process, and each (pid, fd) holding it.
pub fn socket_holders() -> HashMap<u32, Vec<(u32, i32)>> {
    let mut map: HashMap<u32, Vec<(u32, i32)>> = HashMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return map };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        for (num, inode) in sockets_in(&p.path().join("fd")) {
            map.entry(inode).or_default().push((pid, num));
        }
    }
    map
}

/// The socket inodes process `pid` holds now (none if it is gone).
pub fn socket_inodes(pid: u32) -> Vec<u32> {
    sockets_in(std::path::Path::new(&format!("/proc/{pid}/fd"))).into_iter().map(|(_, inode)| inode).collect()
}

/// Each (fd, socket inode) of a /proc/PID/fd directory (a descriptor that
/// is no socket, or closes while read, is left out).
fn sockets_in(fds: &std::path::Path) -> Vec<(i32, u32)> {
    let Ok(fds) = std::fs::read_dir(fds) else { return vec![] };
    fds.flatten()
        .filter_map(|fd| {
            let num = fd.file_name().to_str()?.parse::<i32>().ok()?;
            let link = std::fs::read_link(fd.path()).ok()?;
            Some((num, link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()?))
        })
        .collect()
}

/// Every socket inode held open by a process, and the processes holding it.
fn socket_owners() -> HashMap<u32, Vec<u32>> {
    let mut map = socket_holders();
    map.values_mut().for_each(|v| v.dedup_by_key(|(pid, _)| *pid));
    map.into_iter().map(|(inode, v)| (inode, v.into_iter().map(|(pid, _)| pid).collect())).collect()
}

/// Socket inode -> the pids holding it, from a /proc scan that is redone
/// only when a socket calls for it (`rescan_due`).
#[derive(Default)]
pub struct SocketOwners {
    pub owners: HashMap<u32, Vec<u32>>,
    /// When the last /proc scan ran (a socket no process holds waits
    /// RESCAN_UNOWNED for the next).
    scanned: Option<Instant>,
}

impl SocketOwners {
    /// Scan /proc again if a socket of `found` calls for it; true if it did.
    /// A socket held by no visible process (a kernel socket, a process in
    /// another mount of /proc) is noted, so it alone does not send every
    /// call through /proc again.
    pub fn follow(&mut self, found: &[u32]) -> bool {
        let now = Instant::now();
        if !rescan_due(found.iter(), &self.owners, self.scanned, now) {
            return false;
        }
        self.owners = socket_owners();
        self.scanned = Some(now);
        for i in found {
            self.owners.entry(*i).or_default();
        }
        true
    }
}

/// Who holds a service's sockets this poll:
/// - the processes the /proc scan found holding them;
/// - else the owners seen last (within LINGER): the scan raced a close and
///   a new bind of a service that rebinds its port, and they still hold it;
/// - else, with no process visible holding them (a socket that lived
///   shorter than the scan, one parked in an unread SCM_RIGHTS message, one
///   held in another mount of /proc), each socket's creator as the kernel
///   records it (`creators`: sk_uid, from sock_diag), as an owner with no
///   process. A uid that is trusted makes the service trusted, one that is
///   not untrusted, so what a login user parks or churns is theirs, and a
///   root service whose sockets live shorter than a scan keeps its class
///   (counted as untrusted at once, it moved between `USERS_CLASS` and its
///   own class: a CI flake).
pub(super) fn holders(found: Vec<Owner>, last: Option<&Service>, creators: &[u32]) -> Vec<Owner> {
    if !found.is_empty() {
        return found;
    }
    if let Some(s) = last.filter(|s| !s.owners.is_empty()) {
        return s.owners.clone();
    }
    let unheld = |uid: u32| Owner {
        pid: 0,
        comm: "unknown".into(),
        nice: Err(format!("no process visible in /proc holds the socket; uid {uid} made it")),
        uid: Some(uid),
    };
    creators.iter().map(|u| unheld(*u)).collect()
}

/// A socket no process was seen holding is looked for again this long after
/// the last /proc scan (a new one, with an owner, triggers a scan at once).
pub const RESCAN_UNOWNED: Duration = Duration::from_secs(30);

/// Should a poll scan /proc: a socket inode not seen at the last scan, or
/// one seen without an owner once RESCAN_UNOWNED has passed?
pub(super) fn rescan_due<'a>(
    found: impl Iterator<Item = &'a u32>,
    owners: &HashMap<u32, Vec<u32>>,
    scanned: Option<Instant>,
    now: Instant,
) -> bool {
    let stale = scanned.is_none_or(|t| now.duration_since(t) >= RESCAN_UNOWNED);
    let mut found = found;
    found.any(|i| match owners.get(i) {
        None => true,
        Some(pids) => pids.is_empty() && stale,
    })
}
