//! What the host needs from its default class (`bpf/gate/host.h`): the
//! ephemeral port range, where the gate looks for replies to the host's
//! own connections, read from the namespace's settings.
use super::Gate;

/// `net.ipv4.ip_local_port_range` (it covers IPv6 too) of this process's
/// network namespace, the gate's.
const LOCAL_PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// The range in the file's text ("32768\t60999"), or None where it is not two ports, low first.
pub fn parse_port_range(text: &str) -> Option<(u16, u16)> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    (it.next().is_none() && lo <= hi && hi > 0).then_some((lo, hi))
}

/// The namespace's ephemeral range as its settings say (None: unreadable, or not a range).
pub fn local_port_range() -> Option<(u16, u16)> {
    std::fs::read_to_string(LOCAL_PORT_RANGE).ok().and_then(|t| parse_port_range(&t))
}

impl Gate {
    /// Tell the gate the ports the host's own connections take (None:
    /// every port, which costs a socket lookup for every packet the default
    /// class's limit drops). The range in force.
    pub fn set_ephemeral(&mut self, range: Option<(u16, u16)>) {
        let data = self.skel.maps.data_data.as_deref_mut().expect(".data is mmap'ed after load");
        let (lo, hi) = range.unwrap_or((0, 0));
        data.settings.ephemeral_lo = lo;
        data.settings.ephemeral_hi = hi;
    }

    /// Read the namespace's ephemeral range again and tell the gate; the
    /// range read (None: unreadable, every port is looked at).
    pub fn refresh_ephemeral(&mut self) -> Option<(u16, u16)> {
        let range = local_port_range();
        self.set_ephemeral(range);
        range
    }

    /// The range the gate has (None: every port).
    pub fn ephemeral(&self) -> Option<(u16, u16)> {
        let d = self.skel.maps.data_data.as_deref()?;
        (d.settings.ephemeral_hi > 0).then_some((d.settings.ephemeral_lo, d.settings.ephemeral_hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_range_is_two_ports_low_first() {
        assert_eq!(parse_port_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_port_range("1024 1024"), Some((1024, 1024)));
        for bad in ["", "32768", "60999 32768", "1 2 3", "x 2", "0 70000", "0 0"] {
            assert_eq!(parse_port_range(bad), None, "{bad:?}");
        }
    }
}
