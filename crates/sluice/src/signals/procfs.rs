//! The /proc files the daemon reads, from the service's own namespace and
//! cheaply (microseconds, no process started): /proc/net/snmp and snmp6
//! (the datagrams the services took, `InDatagrams`; socket drops,
//! `RcvbufErrors`), /proc/net/netstat (`TcpExt`), /proc/net/softnet_stat
//! (time squeeze and backlog drops of the whole host: read and shown; the
//! budget takes backlog drops from the tracer, for the gate's interface
//! only, `health::RxWork`), a process's /proc/PID/stat and the CPUs' times
//! in /proc/stat (`cpu_times`, the host's, not a namespace's). The files are
//! opened once, inside the namespace, and re-read in place (`NsFile`).
//! The sockets themselves are read over sock_diag (`sock_diag.rs`).
//!
//! Why not the `procfs` crate (read in its source, 2026-11; not built in
//! and measured): it parses /proc/net/snmp by column position into ~80
//! fields, with an `unwrap` on a missing line (a truncated read panics the
//! daemon's control thread), has no snmp6, and opens the file by path each
//! time (the process's namespace, not the service's). The tick needs two
//! counters, found by their header name (a kernel that adds a column moves
//! nothing), from files opened once in the service's namespace.
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::base::netns;

/// UDP counters of a namespace (/proc/net/snmp, "Udp:" lines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct UdpCounters {
    /// Datagrams the application took from its sockets.
    pub in_datagrams: u64,
    pub no_ports: u64,
    pub in_errors: u64,
    /// Datagrams dropped because a socket's receive buffer was full.
    pub rcvbuf_errors: u64,
    pub out_datagrams: u64,
}

/// The fields of a /proc/PID/stat text from field 3 (the state) on: field N
/// of proc(5) is index N - 3. The name in field 2 may hold spaces and
/// parentheses, so the fields are counted from its closing one. None without it.
pub fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

/// One CPU's time from /proc/stat, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// All but idle and iowait.
    pub busy: u64,
    /// Interrupts and softirq (the receive work for packets, whoever they
    /// are for): part of `busy`.
    pub irq: u64,
    pub total: u64,
}

/// Each CPU's time from a /proc/stat text, by CPU number.
pub type CpuTimes = std::collections::HashMap<usize, CpuTime>;

/// The `cpuN` lines of a /proc/stat text (a line it cannot read is left out).
pub fn cpu_times(stat: &str) -> CpuTimes {
    let line = |l: &str| {
        let mut f = l.split_whitespace();
        let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
        // user nice system idle iowait irq softirq steal (guest time is in user).
        let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
        let total: u64 = v.iter().sum();
        let irq = v.get(5).unwrap_or(&0) + v.get(6).unwrap_or(&0);
        (v.len() >= 5).then(|| (cpu, CpuTime { busy: total - v[3] - v[4], irq, total }))
    };
    stat.lines().filter_map(line).collect()
}

/// utime + stime (fields 14 and 15, clock ticks) of a /proc/PID/stat text.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let f = stat_fields(stat)?;
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The counter `name` from the first pair of lines starting with `prefix`
/// (a header line of names, then a line of values), as /proc/net/snmp and
/// /proc/net/netstat write them; 0 if absent.
pub fn proc_counter(text: &str, prefix: &str, name: &str) -> u64 {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (Some(h), Some(v)) = (lines.next(), lines.next()) else { return 0 };
    h.split_whitespace().position(|x| x == name).and_then(|i| v.split_whitespace().nth(i)?.parse().ok()).unwrap_or(0)
}

/// The counters of `names` that the `prefix` lines of `text` lack (a kernel
/// without them: `proc_counter` reads them as 0, so they are said once).
pub fn missing_counters<'a>(text: &str, prefix: &str, names: &[&'a str]) -> Vec<&'a str> {
    let header = text.lines().find(|l| l.starts_with(prefix)).unwrap_or("");
    names.iter().copied().filter(|n| !header.split_whitespace().any(|x| x == *n)).collect()
}

/// Parse the "Udp:" header and value lines of /proc/net/snmp.
pub fn parse_snmp_udp(text: &str) -> UdpCounters {
    let get = |name: &str| proc_counter(text, "Udp:", name);
    UdpCounters {
        in_datagrams: get("InDatagrams"),
        no_ports: get("NoPorts"),
        in_errors: get("InErrors"),
        rcvbuf_errors: get("RcvbufErrors"),
        out_datagrams: get("OutDatagrams"),
    }
}

/// A /proc/net file of one namespace, opened once from inside it and re-read
/// in place: reading it costs microseconds, with no thread or process to
/// start, so the counters at a window's edge are read close together.
pub struct NsFile(std::fs::File);

impl NsFile {
    pub fn open(ns: &str, name: &str) -> Result<NsFile> {
        let path = format!("/proc/thread-self/net/{name}");
        netns::run_in(ns, move || Ok(NsFile(std::fs::File::open(&path).with_context(|| format!("opening {path}"))?)))
    }

    /// The file of the current namespace.
    pub fn open_here(name: &str) -> Result<NsFile> {
        let path = format!("/proc/thread-self/net/{name}");
        Ok(NsFile(std::fs::File::open(&path).with_context(|| format!("opening {path}"))?))
    }

    pub fn read(&mut self) -> Result<String> {
        use std::io::{Read, Seek};
        self.0.seek(std::io::SeekFrom::Start(0))?;
        let mut s = String::new();
        self.0.read_to_string(&mut s)?;
        Ok(s)
    }
}

/// UDP counters from /proc/net/snmp and snmp6 texts (IPv4 and IPv6 added up).
pub fn udp_counters(snmp: &str, snmp6: &str) -> UdpCounters {
    let v4 = parse_snmp_udp(snmp);
    let g = |n: &str| -> u64 {
        snmp6.lines().find_map(|l| l.strip_prefix(n).map(|x| x.trim().parse().unwrap_or(0))).unwrap_or(0)
    };
    UdpCounters {
        in_datagrams: v4.in_datagrams + g("Udp6InDatagrams "),
        no_ports: v4.no_ports + g("Udp6NoPorts "),
        in_errors: v4.in_errors + g("Udp6InErrors "),
        rcvbuf_errors: v4.rcvbuf_errors + g("Udp6RcvbufErrors "),
        out_datagrams: v4.out_datagrams + g("Udp6OutDatagrams "),
    }
}

/// The first three columns of /proc/net/softnet_stat, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Softnet {
    /// Packets taken from the per-CPU backlogs.
    pub processed: u64,
    /// Packets dropped because a backlog was full.
    pub dropped: u64,
    /// Times a receive round ran out of budget or time with work left.
    pub time_squeeze: u64,
}

pub fn parse_softnet(text: &str) -> Softnet {
    let mut t = Softnet::default();
    for l in text.lines() {
        let v: Vec<u64> = l.split_whitespace().filter_map(|x| u64::from_str_radix(x, 16).ok()).collect();
        if v.len() >= 3 {
            t.processed += v[0];
            t.dropped += v[1];
            t.time_squeeze += v[2];
        }
    }
    t
}

pub fn softnet() -> Result<Softnet> {
    Ok(parse_softnet(&std::fs::read_to_string("/proc/net/softnet_stat")?))
}

// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_times_are_read_from_proc_stat_without_idle_and_iowait() {
        let stat = "cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 5 0 5 40 10 0 5 0 0 0\ncpu1 1 2 3 4\nintr 1 2\ncpu2 x\n";
        let t = super::cpu_times(stat);
        assert_eq!(t.get(&0), Some(&CpuTime { busy: 15, irq: 5, total: 65 }), "user+system+softirq of 65 ticks");
        assert_eq!(t.get(&1), None, "too few fields");
        assert_eq!(t.len(), 1, "the total line and junk left out: {t:?}");
    }

    #[test]
    fn missing_counters_are_named() {
        let text = "TcpExt: SyncookiesSent ListenDrops\nTcpExt: 1 2\n";
        let want = ["SyncookiesSent", "ListenOverflows", "ListenDrops"];
        assert_eq!(super::missing_counters(text, "TcpExt:", &want), ["ListenOverflows"]);
        assert_eq!(super::missing_counters("", "TcpExt:", &["A"]), ["A"]);
    }

    use super::*;

    #[test]
    fn stat_fields_count_from_the_names_closing_parenthesis() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1";
        assert_eq!(stat_fields(stat).unwrap()[..2], ["S", "1"]);
        assert_eq!(stat_cpu_ticks(stat), Some(12), "utime 7 + stime 5");
        assert_eq!(stat_cpu_ticks("42 (x) S 1"), None, "too few fields");
        assert_eq!(stat_fields("no name here"), None);
    }
}
