//! Attaching the gate: the privileges it needs, the interface, the XDP
//! bpf_link and the tcx learner, and what another program on the interface
//! is (introspection, for the errors and for `--replace`).
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use libbpf_rs::libbpf_sys;

use super::*;

/// Bits of CapEff that sluice needs.
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Does a /proc/self/status text grant what sluice needs?
pub fn caps_sufficient(proc_status: &str) -> bool {
    let Some(eff) = proc_status.lines().find_map(|l| l.strip_prefix("CapEff:")) else { return false };
    let Ok(bits) = u64::from_str_radix(eff.trim(), 16) else { return false };
    let has = |c: u32| bits & (1u64 << c) != 0;
    // The gate reads the clock and does pointer arithmetic: CAP_PERFMON with CAP_BPF.
    has(CAP_NET_ADMIN) && ((has(CAP_BPF) && has(CAP_PERFMON)) || has(CAP_SYS_ADMIN))
}

/// Fail early, plainly, without the privileges to load and attach.
pub fn check_privileges() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if caps_sufficient(&status) {
        Ok(())
    } else {
        Err(GateError::NotPermitted)
    }
}

/// The interface named `name`, or the error that says there is none.
pub fn iface(name: &str) -> Result<crate::base::iface::Iface> {
    crate::base::iface::Iface::resolve(name).ok_or_else(|| GateError::NoInterface(name.into()))
}

/// Interface name to index.
pub fn ifindex(name: &str) -> Result<u32> {
    iface(name).map(|i| i.index)
}

impl Gate {
    /// Attach to `iface` through a bpf_link (it detaches when the daemon exits,
    /// however it exits). Refuses if another XDP program is there, unless
    /// `replace` and it was attached through netlink (a program held by a
    /// bpf_link can only be removed by its owner). The tc programs go first
    /// (they share the interface with any XDP program); a program `replace`
    /// takes off is put back if the gate's own link then fails: a refused
    /// attach leaves the interface as it was. Call it after every other check.
    pub fn attach(&mut self, iface: &str, mode: XdpMode, replace: bool) -> Result<()> {
        let ifidx = ifindex(iface)? as i32;
        self.check_attachable(iface, replace)?;
        self.attach_learner(iface, ifidx)?;
        // Past the check, a program still there is netlink-attached and `replace` is set.
        let old = match attached_prog_id(ifidx) {
            Some(id) => match Replaced::take_off(iface, ifidx, id) {
                Ok(old) => Some(old),
                Err(e) => {
                    self.detach();
                    return Err(e);
                }
            },
            None => None,
        };
        if let Err(e) = self.link_xdp(iface, ifidx, mode) {
            self.detach();
            if let Some(old) = old {
                old.put_back(iface, ifidx);
            }
            return Err(e);
        }
        self.replaced = old.map(|o| (o, iface.to_string()));
        Ok(())
    }

    /// The daemon started: the program `--replace` took off stays off (a
    /// gate dropped before this puts it back: see `Drop for Gate`).
    pub fn keep_replaced(&mut self) {
        self.replaced = None;
    }

    /// Detach, and put back the program `--replace` took off unless
    /// `keep_replaced` was called: the interface as it was.
    pub(super) fn undo_attach(&mut self) {
        self.detach();
        if let Some((old, iface)) = self.replaced.take() {
            match ifindex(&iface) {
                Ok(ifidx) => old.put_back(&iface, ifidx as i32),
                Err(e) => crate::base::log::error(format_args!("{e}: the program --replace took off is not put back")),
            }
        }
    }

    /// The gate's XDP bpf_link on `ifidx`, in `mode`.
    fn link_xdp(&mut self, iface: &str, ifidx: i32, mode: XdpMode) -> Result<()> {
        let flags = match mode {
            XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
        };
        let opts = libbpf_sys::bpf_link_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
            flags,
            ..Default::default()
        };
        let prog_fd = self.skel.progs.sluice_gate.as_fd().as_raw_fd();
        // SAFETY: prog_fd is the loaded program's open fd, opts is initialised with its size.
        let fd = unsafe { libbpf_sys::bpf_link_create(prog_fd, ifidx, libbpf_sys::BPF_XDP, &opts) };
        if fd < 0 {
            let err = std::io::Error::from_raw_os_error(-fd);
            if mode == XdpMode::Native && matches!(-fd, libc::EOPNOTSUPP | libc::EINVAL) {
                return Err(GateError::NativeUnsupported(iface.into()));
            }
            if -fd == libc::EBUSY {
                if let Some(id) = attached_prog_id(ifidx) {
                    return Err(GateError::HeldByLink { iface: iface.into(), id });
                }
            }
            return Err(GateError::Attach { iface: iface.into(), err });
        }
        // SAFETY: bpf_link_create returned a new file descriptor that we now own.
        self.link = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(())
    }

    /// Attach the egress learner (tcx egress, a bpf_link like the gate's),
    /// then the cookie checker. On failure whatever was attached is detached
    /// again: they go together.
    fn attach_learner(&mut self, iface: &str, ifidx: i32) -> Result<()> {
        match tcx_link(&self.skel.progs.sluice_learn, ifidx, libbpf_sys::BPF_TCX_EGRESS) {
            Ok(link) => self.learn_link = Some(link),
            Err(err) => {
                self.detach();
                return Err(GateError::AttachLearner { iface: iface.into(), err });
            }
        }
        self.attach_cookie_checker(iface, ifidx)
    }

    /// Would `attach` go ahead? Err if another program holds the interface
    /// (through a bpf_link: always; through netlink: unless `replace`).
    /// Changes nothing: the daemon calls it before its other checks.
    pub fn check_attachable(&self, iface: &str, replace: bool) -> Result<()> {
        let ifidx = ifindex(iface)? as i32;
        let Some(id) = attached_prog_id(ifidx) else { return Ok(()) };
        if xdp_link_holding(ifidx, id) {
            return Err(GateError::HeldByLink { iface: iface.into(), id });
        }
        if !replace {
            return Err(GateError::AlreadyAttached { iface: iface.into(), id, name: prog_name(id) });
        }
        Ok(())
    }

    /// Detach (drop the link).
    pub fn detach(&mut self) {
        self.link = None;
        self.learn_link = None;
        self.cookie_link = None;
    }

    /// The id of the loaded gate program.
    pub fn prog_id(&self) -> u32 {
        prog_id_of_fd(self.skel.progs.sluice_gate.as_fd().as_raw_fd())
    }

    /// Is the gate still attached to `ifindex`? Its own link is asked
    /// (one bpf syscall): a link detached behind its back, or whose
    /// interface went away, names no interface. The status asks every
    /// publish (10 a second while the loop ticks fast); a netlink query
    /// opened a socket each time (6.6% of an idle daemon's CPU in perf).
    pub fn attached_to(&self, ifindex: i32) -> bool {
        let Some(link) = &self.link else { return false };
        xdp_link_info(link.as_raw_fd()).is_some_and(|(at, prog)| at == ifindex && prog == self.prog_id())
    }
}

/// The interface and program of an XDP link (None: not an XDP link, or unreadable).
fn xdp_link_info(fd: i32) -> Option<(i32, u32)> {
    // SAFETY: bpf_link_info is plain integers and unions of them: all-zero is valid.
    let mut info: libbpf_sys::bpf_link_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libbpf_sys::bpf_link_info>() as u32;
    // SAFETY: info and len are ours and len is info's size.
    if unsafe { libbpf_sys::bpf_link_get_info_by_fd(fd, &mut info, &mut len) } != 0 {
        return None;
    }
    // SAFETY: for an XDP link the kernel filled the union's `xdp` member.
    let ifindex = unsafe { info.__bindgen_anon_1.xdp.ifindex };
    (info.type_ == libbpf_sys::BPF_LINK_TYPE_XDP).then_some((ifindex as i32, info.prog_id))
}

pub(super) fn tcx_link(prog: &libbpf_rs::ProgramMut<'static>, ifidx: i32, hook: u32) -> std::io::Result<OwnedFd> {
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    // SAFETY: the program's fd is open while `prog` lives, opts is initialised with its size.
    let fd = unsafe { libbpf_sys::bpf_link_create(prog.as_fd().as_raw_fd(), ifidx, hook, &opts) };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: bpf_link_create returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn prog_info(fd: i32) -> libbpf_sys::bpf_prog_info {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: info and len are ours and len is info's size; a bad fd only makes the call fail.
    unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
    info
}

fn prog_id_of_fd(fd: i32) -> u32 {
    prog_info(fd).id
}

/// The id of the XDP program attached to an interface, in any mode.
pub fn attached_prog_id(ifindex: i32) -> Option<u32> {
    let mut id = 0u32;
    // SAFETY: writes one u32 into `id`; a bad ifindex only makes the call fail.
    let r = unsafe { libbpf_sys::bpf_xdp_query_id(ifindex, 0, &mut id) };
    (r == 0 && id != 0).then_some(id)
}

/// A netlink-attached XDP program `--replace` took off an interface, kept
/// (its fd and attach mode) to put back if the gate then cannot attach, or
/// the daemon's start fails after it did.
pub(super) struct Replaced {
    id: u32,
    fd: OwnedFd,
    flags: u32,
}

impl Replaced {
    fn take_off(iface: &str, ifidx: i32, id: u32) -> Result<Replaced> {
        // SAFETY: a plain syscall wrapper; returns a new fd or a negative error.
        let fd = unsafe { libbpf_sys::bpf_prog_get_fd_by_id(id) };
        if fd < 0 {
            return Err(GateError::Attach { iface: iface.into(), err: std::io::Error::from_raw_os_error(-fd) });
        }
        // SAFETY: a new fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut q = libbpf_sys::bpf_xdp_query_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_xdp_query_opts>() as _,
            ..Default::default()
        };
        // SAFETY: q is initialised with its size; the kernel fills it.
        unsafe { libbpf_sys::bpf_xdp_query(ifidx, 0, &mut q) };
        let flags = match u32::from(q.attach_mode) {
            libbpf_sys::XDP_ATTACHED_SKB => libbpf_sys::XDP_FLAGS_SKB_MODE,
            libbpf_sys::XDP_ATTACHED_HW => libbpf_sys::XDP_FLAGS_HW_MODE,
            _ => libbpf_sys::XDP_FLAGS_DRV_MODE,
        };
        // SAFETY: a plain syscall wrapper; a null opts pointer means "no options".
        if unsafe { libbpf_sys::bpf_xdp_detach(ifidx, flags, std::ptr::null()) } != 0
            || attached_prog_id(ifidx).is_some()
        {
            return Err(GateError::HeldByLink { iface: iface.into(), id });
        }
        Ok(Replaced { id, fd, flags })
    }

    /// Attach the program again as it was; a failure is logged (the error
    /// the caller returns is the gate's own).
    fn put_back(self, iface: &str, ifidx: i32) {
        // SAFETY: self.fd is an open program fd; a null opts pointer means "no options".
        let r = unsafe { libbpf_sys::bpf_xdp_attach(ifidx, self.fd.as_raw_fd(), self.flags, std::ptr::null()) };
        if r != 0 {
            crate::base::log::error(format_args!(
                "the XDP program id {} that --replace took off {iface} could not be put back: {}",
                self.id,
                std::io::Error::from_raw_os_error(-r)
            ));
        }
    }
}

/// A program's name from its id ("?" if it cannot be read).
pub fn prog_name(id: u32) -> String {
    // SAFETY: a plain syscall wrapper; returns a new fd or a negative error.
    let fd = unsafe { libbpf_sys::bpf_prog_get_fd_by_id(id) };
    if fd < 0 {
        return "?".into();
    }
    // SAFETY: a new fd we own; closed on drop.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let info = prog_info(owned.as_raw_fd());
    // SAFETY: the kernel NUL-terminates the name inside the fixed-size array.
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) };
    name.to_string_lossy().into_owned()
}

/// Is XDP program `prog_id` on `ifindex` held by a bpf_link (of any process)?
/// Walks the kernel's links: one is an XDP link on that interface running that program.
pub fn xdp_link_holding(ifindex: i32, prog_id: u32) -> bool {
    let mut id = 0u32;
    // SAFETY: each call writes the next link id into `id`, ours.
    while unsafe { libbpf_sys::bpf_link_get_next_id(id, &mut id) } == 0 {
        // SAFETY: a plain syscall wrapper; returns a new fd or a negative error.
        let fd = unsafe { libbpf_sys::bpf_link_get_fd_by_id(id) };
        if fd < 0 {
            continue; // the link went away meanwhile
        }
        // SAFETY: a new fd we own; closed on drop.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        if xdp_link_info(owned.as_raw_fd()) == Some((ifindex, prog_id)) {
            return true;
        }
    }
    false
}
