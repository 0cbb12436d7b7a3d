//! A network interface, named and numbered once. The daemon resolves the
//! name it was given at its start and hands this on, so no part of it looks
//! the name up again (an interface renamed or re-created under the daemon
//! is the gate's detach check's business: `sluice status` says GATE
//! DETACHED).
use std::fmt;

/// An interface of this network namespace: its name and its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub index: u32,
}

impl Iface {
    /// The interface named `name` in this network namespace (None: there is none).
    pub fn resolve(name: &str) -> Option<Iface> {
        let c = std::ffi::CString::new(name).ok()?;
        // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        (index != 0).then(|| Iface { name: name.to_string(), index })
    }
}

impl fmt::Display for Iface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_resolves_and_a_missing_name_does_not() {
        let lo = Iface::resolve("lo").expect("every namespace has lo");
        assert!(lo.index > 0);
        assert_eq!(lo.to_string(), "lo");
        assert_eq!(Iface::resolve("no-such-if0"), None);
        assert_eq!(Iface::resolve("a\0b"), None, "a name with a NUL is no interface");
    }
}
