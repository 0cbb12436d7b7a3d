//! Reader steering (the shared-socket study): a UDP service that reads with several sockets
//! in an SO_REUSEPORT group gets each datagram sent to the socket its class's
//! `readers` policy picks, by the SK_REUSEPORT program in `bpf/steer.bpf.c`.
//!
//! sluice attaches to a running service without changing it: for each socket
//! of the group it takes a duplicate from the process that holds it
//! (pidfd_open + pidfd_getfd, which needs the right to ptrace that process:
//! root, or CAP_SYS_PTRACE), puts it in the program's sockarray, reads its
//! cookie (so the queue tracepoints know it), attaches the program to the
//! group through it (SO_ATTACH_REUSEPORT_EBPF), and closes the duplicate at
//! once: the service's sockets close when the service closes them.
//!
//! When the group changes (a reader added or closed) the daemon's next look
//! (every second) re-fills the group's slots; in between, a datagram for a
//! closed reader goes to the kernel's hash (counted as missed) and a new
//! reader gets only what the hash gives it. When the service restarts, its
//! new sockets form a new group without the program, and the next look
//! attaches to it. When the daemon stops it detaches the program
//! (SO_DETACH_REUSEPORT_BPF); if it dies instead, the program finds
//! `alive_until` past within 2 s and leaves every datagram to the hash.
//!
//! A group whose service attached its own reuseport program (eBPF or
//! classic, nginx's QUIC one for instance) is left alone: before attaching
//! and before detaching, the `reuseport_socks` iterator tells which program
//! the group has, and sluice only replaces none or its own.
//!
//! With nothing configured, a UDP port served by 2+ sockets on one address
//! gets `least-loaded` while discovery is on (`groups::policy_for`).
pub mod groups;

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Iter, Link, MapCore, MapFlags};
use serde::{Deserialize, Serialize};

use crate::bpf_intf::{
    sluice_group, sluice_reuseport_sock, SLUICE_GROUPS_MAX, SLUICE_READERS_MAX, SLUICE_READER_SLOTS, SLUICE_SS_HASHED,
    SLUICE_SS_MISSED, SLUICE_SS_NR,
};
use crate::dataplane::gate::{bytes_of, from_bytes, Owned};
use crate::policy::config::{Config, Readers};
use crate::signals::discover::{socket_holders, Listeners, L4};
use crate::steer_skel::{SteerSkel, SteerSkelBuilder};
pub use groups::{Group, Listener, Reader};

/// setsockopt names from <asm-generic/socket.h> that the libc crate lacks.
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;
const SO_DETACH_REUSEPORT_BPF: libc::c_int = 68;
const SO_COOKIE: libc::c_int = 57;

/// A group the program steers now.
struct Attached {
    index: u32,
    readers: Vec<Reader>,
    policy: Readers,
}

/// One reader's view in `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReaderStatus {
    /// The reader's process id.
    pub pid: u32,
    /// Its socket's inode.
    pub inode: u32,
    /// Datagrams the program sent to it.
    pub steered: u64,
    /// Datagrams queued at its socket, as last seen by the tracepoints
    /// (least-loaded only: None when the tracepoints are not attached).
    pub queued: Option<u32>,
}

/// One steered group in `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GroupStatus {
    /// The UDP port of the reuseport group.
    pub port: u16,
    /// How datagrams are spread over its readers (least-loaded, ...).
    pub policy: String,
    /// Its readers.
    pub readers: Vec<ReaderStatus>,
    /// Datagrams left to the kernel's hash (the daemon's view was stale).
    pub hashed: u64,
    /// Datagrams whose chosen reader had closed (left to the hash).
    pub missed: u64,
}

/// The loaded program and the groups it steers.
pub struct Steer {
    skel: Owned<SteerSkel<'static>>,
    /// The two queue tracepoints, attached while a group is least-loaded.
    tracepoints: Option<(Link, Link)>,
    attached: BTreeMap<u16, Attached>,
}

/// The inode number of an open file.
fn inode_of(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: fstat fills the zeroed struct we own; fd is open.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.st_ino)
    }
}

/// A duplicate of fd `fd` of process `pid` (pidfd_getfd).
pub fn take_fd(pid: u32, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain syscalls with integer arguments; a returned fd is new and ours.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(dup as RawFd))
    }
}

fn setsockopt_int(fd: &OwnedFd, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt with an int we own, on a socket we hold.
    let r =
        unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, name, (&value as *const libc::c_int).cast(), 4) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The socket's cookie (the kernel gives it one on the first ask).
fn cookie(fd: &OwnedFd) -> io::Result<u64> {
    let mut c = 0u64;
    let mut len = 8 as libc::socklen_t;
    // SAFETY: getsockopt into a u64 we own, with its length.
    let r =
        unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_COOKIE, (&mut c as *mut u64).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(c)
}

fn policy_code(p: Readers) -> u32 {
    match p {
        Readers::Hash => crate::bpf_intf::SLUICE_READERS_HASH,
        Readers::RoundRobin => crate::bpf_intf::SLUICE_READERS_ROUND_ROBIN,
        Readers::LeastLoaded => crate::bpf_intf::SLUICE_READERS_LEAST_LOADED,
    }
}

fn group_key(port: u16) -> [u8; 4] {
    u32::from(port).to_ne_bytes()
}

impl Steer {
    /// Load the program (nothing is attached yet).
    pub fn load() -> Result<Steer> {
        let skel = Owned::new(|storage| SteerSkelBuilder::default().open(storage)?.load())
            .context("loading the steering program (bpf/steer.bpf.c)")?;
        Ok(Steer { skel, tracepoints: None, attached: BTreeMap::new() })
    }

    /// Tell the program the daemon is alive (every tick): `now` is CLOCK_MONOTONIC ns.
    pub fn keep_alive(&mut self, now_ns: u64) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        data.settings.alive_until = now_ns + crate::dataplane::ALIVE_NS;
    }

    /// The program's id and its kernel run statistics (run_time_ns, run_cnt),
    /// counted only while kernel.bpf_stats_enabled is 1.
    pub fn prog_stats(&self) -> Result<(u32, u64, u64)> {
        let fd = self.skel.progs.steer.as_fd().as_raw_fd();
        let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
        let mut len = std::mem::size_of_val(&info) as u32;
        // SAFETY: the kernel fills at most `len` bytes of `info`, which we own.
        let r = unsafe { libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
        if r < 0 {
            return Err(io::Error::from_raw_os_error(-r).into());
        }
        Ok((info.id, info.run_time_ns, info.run_cnt))
    }

    /// Steer exactly `want`: attach new groups, re-fill changed ones, detach
    /// the ones gone. Returns a line per change (for the log) and per group
    /// that could not be attached (it stays with the kernel's hash).
    pub fn sync(&mut self, want: &[Group]) -> Vec<String> {
        let mut log = Vec::new();
        let gone: Vec<u16> = self.attached.keys().filter(|p| !want.iter().any(|g| g.port == **p)).copied().collect();
        for port in gone {
            let a = self.attached.remove(&port).expect("listed above");
            self.clear_group(port, &a);
            log.push(format!("steer: udp:{port}: no longer a group of 2+ readers; left to the kernel's hash"));
        }
        for g in want {
            let same = self.attached.get(&g.port).is_some_and(|a| a.readers == g.readers && a.policy == g.policy);
            if same {
                continue;
            }
            match self.attach_group(g) {
                Ok(()) => log.push(format!("steer: udp:{}: {} readers, {}", g.port, g.readers.len(), g.policy.name())),
                Err(e) => log.push(format!("steer: udp:{}: not steered, the kernel's hash stays: {e:#}", g.port)),
            }
        }
        if let Err(e) = self.want_tracepoints() {
            log.push(format!("steer: queue tracepoints: {e:#}; least-loaded sees no queues and deals in turn"));
        }
        log
    }

    fn free_index(&self) -> Option<u32> {
        (0..SLUICE_GROUPS_MAX).find(|i| !self.attached.values().any(|a| a.index == *i))
    }

    /// Fill a group's slots and attach the program to it. On failure the
    /// group's entries are emptied again, and a program sluice had attached
    /// to it before is detached: the group is left to the kernel's hash.
    fn attach_group(&mut self, g: &Group) -> Result<()> {
        if g.readers.len() > SLUICE_READERS_MAX as usize {
            bail!("{} readers, at most {SLUICE_READERS_MAX} are steered", g.readers.len());
        }
        self.check_not_foreign(g)?;
        let (index, before) = match self.attached.remove(&g.port) {
            Some(a) => {
                self.clear_slots(&a);
                (a.index, Some(a))
            }
            None => (self.free_index().context(format!("already {SLUICE_GROUPS_MAX} groups steered"))?, None),
        };
        let filled = self.fill_group(g, index);
        if filled.is_err() {
            match before {
                Some(old) => self.clear_group(g.port, &old),
                None => self.clear_entries(g.port, &Attached { index, readers: vec![], policy: g.policy }),
            }
        }
        filled
    }

    /// Fail if the group's sockets have a program that is not sluice's: the
    /// service chose its readers itself.
    fn check_not_foreign(&self, g: &Group) -> Result<()> {
        let programs = self.group_programs().context("listing the reuseport sockets' programs (iter/udp)")?;
        let ours = self.prog_stats()?.0;
        for r in &g.readers {
            match programs.get(&u64::from(r.inode)) {
                Some(Some(id)) if *id != ours => bail!(
                    "the service attached its own SO_REUSEPORT program ({}): left alone",
                    if *id == 0 { "classic BPF".to_string() } else { format!("BPF prog id {id}") }
                ),
                _ => {}
            }
        }
        Ok(())
    }

    /// Each reuseport socket of the daemon's netns by inode: the id of its
    /// group's program (0: classic BPF), None when it has none.
    fn group_programs(&self) -> Result<HashMap<u64, Option<u32>>> {
        let link = self.skel.progs.reuseport_socks.attach()?;
        let mut bytes = Vec::new();
        Iter::new(&link)?.read_to_end(&mut bytes)?;
        let size = std::mem::size_of::<sluice_reuseport_sock>();
        let mut out = HashMap::new();
        for rec in bytes.chunks_exact(size) {
            let s: sluice_reuseport_sock = from_bytes(rec);
            out.insert(s.inode, (s.has_prog != 0).then_some(s.prog_id));
        }
        Ok(out)
    }

    /// Write a group's slots, cookies and entry, then attach the program through its first socket.
    fn fill_group(&mut self, g: &Group, index: u32) -> Result<()> {
        let mut first = None;
        for (i, r) in g.readers.iter().enumerate() {
            let fd = take_fd(r.pid, r.fd).with_context(|| {
                format!("taking fd {} of pid {} (pidfd_getfd needs root or CAP_SYS_PTRACE)", r.fd, r.pid)
            })?;
            // The (pid, fd) pair comes from an earlier /proc scan: the pid may
            // have been reused, the fd closed and reopened. Only the socket seen then.
            let inode = inode_of(&fd).context("fstat")?;
            if inode != u64::from(r.inode) {
                bail!(
                    "fd {} of pid {} is no longer socket inode {} (now {inode}): left to the next look",
                    r.fd,
                    r.pid,
                    r.inode
                );
            }
            let slot = index * SLUICE_READERS_MAX + i as u32;
            let c = cookie(&fd).context("SO_COOKIE")?;
            let value = (fd.as_raw_fd() as u64).to_ne_bytes();
            self.skel.maps.readers.update(&slot.to_ne_bytes(), &value, MapFlags::ANY).with_context(|| {
                format!("putting pid {}'s socket in the sockarray (is it in an SO_REUSEPORT group?)", r.pid)
            })?;
            self.skel.maps.slot_of.update(&c.to_ne_bytes(), &slot.to_ne_bytes(), MapFlags::ANY)?;
            self.skel.maps.depth.update(&slot.to_ne_bytes(), &0u32.to_ne_bytes(), MapFlags::ANY)?;
            first.get_or_insert(fd);
        }
        let info = sluice_group { index, n: g.readers.len() as u32, policy: policy_code(g.policy), _pad: 0 };
        self.skel.maps.groups.update(&group_key(g.port), bytes_of(&info), MapFlags::ANY)?;
        let fd = first.context("a group has readers")?;
        setsockopt_int(&fd, SO_ATTACH_REUSEPORT_EBPF, self.skel.progs.steer.as_fd().as_raw_fd())
            .context("SO_ATTACH_REUSEPORT_EBPF")?;
        self.attached.insert(g.port, Attached { index, readers: g.readers.clone(), policy: g.policy });
        Ok(())
    }

    /// Empty a group's slots and its cookies (the program then hashes a missed datagram).
    fn clear_slots(&mut self, a: &Attached) {
        for i in 0..SLUICE_READERS_MAX {
            let slot = (a.index * SLUICE_READERS_MAX + i).to_ne_bytes();
            let _ = self.skel.maps.readers.delete(&slot);
        }
        let cookies: Vec<Vec<u8>> = self
            .skel
            .maps
            .slot_of
            .keys()
            .filter(|k| {
                let slot = self.skel.maps.slot_of.lookup(k, MapFlags::ANY).ok().flatten();
                slot.and_then(|v| v.try_into().ok())
                    .map(u32::from_ne_bytes)
                    .is_some_and(|s| s / SLUICE_READERS_MAX == a.index)
            })
            .collect();
        for k in cookies {
            let _ = self.skel.maps.slot_of.delete(&k);
        }
    }

    /// Detach the program from a group (through any reader still open) and forget it.
    fn clear_group(&mut self, port: u16, a: &Attached) {
        self.clear_entries(port, a);
        // Only sluice's own program is detached: the service may have put its
        // own in since (or the listing failed: then nothing is detached, and
        // the emptied entry leaves the group to the kernel's hash).
        let ours = self.prog_stats().map(|s| s.0).ok();
        let programs = self.group_programs().unwrap_or_default();
        let still_ours = a.readers.iter().any(|r| programs.get(&u64::from(r.inode)) == Some(&ours));
        if !still_ours {
            return;
        }
        // Detach through a socket that is still the group's (checked by inode:
        // the pid or fd may have been reused for another group's socket).
        for r in &a.readers {
            let Ok(fd) = take_fd(r.pid, r.fd) else { continue };
            if inode_of(&fd).is_ok_and(|i| i == u64::from(r.inode))
                && setsockopt_int(&fd, SO_DETACH_REUSEPORT_BPF, 0).is_ok()
            {
                break;
            }
        }
    }

    /// Empty a group's entry and slots (its program, if attached, then
    /// leaves every datagram to the kernel's hash).
    fn clear_entries(&mut self, port: u16, a: &Attached) {
        let none = [0u8; std::mem::size_of::<sluice_group>()];
        let _ = self.skel.maps.groups.update(&group_key(port), &none, MapFlags::ANY);
        self.clear_slots(a);
    }

    /// Attach the queue tracepoints while some group is least-loaded, and only then.
    fn want_tracepoints(&mut self) -> Result<()> {
        let need = self.attached.values().any(|a| a.policy == Readers::LeastLoaded);
        if !need {
            self.tracepoints = None;
        } else if self.tracepoints.is_none() {
            let queued = self.skel.progs.steer_queued.attach().context("tp_btf/sk_data_ready")?;
            let read = self.skel.progs.steer_read.attach().context("tp_btf/sock_recv_length")?;
            self.tracepoints = Some((queued, read));
        }
        Ok(())
    }

    fn sum_percpu(&self, map: &libbpf_rs::Map, key: u32) -> u64 {
        crate::dataplane::gate::maps::percpu_sum(map, "steer counters", key).unwrap_or(0)
    }

    /// Each steered group, its readers' counts and queues.
    pub fn status(&self) -> Vec<GroupStatus> {
        let maps = &self.skel.maps;
        self.attached
            .iter()
            .map(|(port, a)| {
                let readers = a
                    .readers
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let slot = a.index * SLUICE_READERS_MAX + i as u32;
                        let queued = self.tracepoints.as_ref().and_then(|_| {
                            let v = maps.depth.lookup(&slot.to_ne_bytes(), MapFlags::ANY).ok().flatten()?;
                            Some(u32::from_ne_bytes(v.as_slice().try_into().ok()?))
                        });
                        ReaderStatus {
                            pid: r.pid,
                            inode: r.inode,
                            steered: self.sum_percpu(&maps.steered, slot),
                            queued,
                        }
                    })
                    .collect();
                let stat = |s: u32| self.sum_percpu(&maps.group_stats, a.index * SLUICE_SS_NR + s);
                GroupStatus {
                    port: *port,
                    policy: a.policy.name().into(),
                    readers,
                    hashed: stat(SLUICE_SS_HASHED),
                    missed: stat(SLUICE_SS_MISSED),
                }
            })
            .collect()
    }

    /// Detach from every group (the daemon's exit).
    pub fn detach_all(&mut self) {
        let ports: Vec<u16> = self.attached.keys().copied().collect();
        for port in ports {
            let a = self.attached.remove(&port).expect("listed above");
            self.clear_group(port, &a);
        }
        self.tracepoints = None;
    }
}

/// Finds the UDP reuseport groups in the daemon's network namespace: the shared
/// listeners' reading (`Listeners`), and a /proc scan for the sockets' holders
/// when a socket not seen before appears (or a holder went away).
pub struct Finder {
    listeners: Listeners,
    holders: HashMap<u32, Vec<(u32, i32)>>,
    rescan: bool,
}

impl Finder {
    /// A finder reading `listeners` (a handle others share).
    pub fn new(listeners: Listeners) -> Finder {
        Finder { listeners, holders: HashMap::new(), rescan: true }
    }

    /// Look for the holders again at the next `groups` (an fd could not be taken).
    pub fn rescan(&mut self) {
        self.rescan = true;
    }

    /// The groups to steer now under `cfg`.
    pub fn groups(&mut self, cfg: &Config) -> Result<Vec<Group>> {
        let listeners: Vec<Listener> = (self.listeners.now()?.iter())
            .filter(|l| l.l4 == L4::Udp)
            .map(|l| Listener { port: l.port, addr: l.addr, inode: l.inode })
            .collect();
        if std::mem::take(&mut self.rescan) || listeners.iter().any(|l| !self.holders.contains_key(&l.inode)) {
            self.holders = socket_holders();
        }
        Ok(groups::find(&listeners, &self.holders, cfg, SLUICE_READERS_MAX as usize))
    }
}

/// The lines `sluice status` adds for the steered groups: per reader, its
/// share of what the program steered and its queue.
pub fn render_status(o: &mut String, groups: &[GroupStatus]) {
    use std::fmt::Write;
    for g in groups {
        let total: u64 = g.readers.iter().map(|r| r.steered).sum();
        let _ = writeln!(
            o,
            "READERS udp:{} ({}): {} steered, {} left to the hash, {} to a closed reader",
            g.port, g.policy, total, g.hashed, g.missed
        );
        for (i, r) in g.readers.iter().enumerate() {
            let share = if total > 0 { format!("{:.1}%", 100.0 * r.steered as f64 / total as f64) } else { "-".into() };
            let queued = r.queued.map_or("-".to_string(), |q| q.to_string());
            let _ = writeln!(o, "  reader {i:<3} pid {:<8} {:>12} {:>7}  queued {queued}", r.pid, r.steered, share);
        }
    }
}

impl Drop for Steer {
    fn drop(&mut self) {
        self.detach_all();
    }
}

const _: () = assert!(SLUICE_READER_SLOTS == SLUICE_GROUPS_MAX * SLUICE_READERS_MAX);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shows_each_readers_share_and_a_missing_queue_as_missing() {
        let g = GroupStatus {
            port: 53,
            policy: "round-robin".into(),
            readers: vec![
                ReaderStatus { pid: 7, inode: 1, steered: 300, queued: None },
                ReaderStatus { pid: 7, inode: 2, steered: 100, queued: None },
            ],
            hashed: 5,
            missed: 0,
        };
        let mut o = String::new();
        render_status(&mut o, &[g]);
        assert!(o.contains("READERS udp:53 (round-robin): 400 steered, 5 left to the hash"), "{o}");
        assert!(o.contains("75.0%") && o.contains("25.0%") && o.contains("queued -"), "{o}");
    }
}
