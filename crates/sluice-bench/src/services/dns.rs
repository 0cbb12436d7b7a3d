//! A real DNS service for the demo: Debian's NSD serving a small zone, its
//! legitimate clients (dnsperf at a steady rate, and a low-rate probe that
//! times every answer, since dnsperf reports no percentiles), all inside the
//! testbed's namespaces.
//!
//! Traps handled here (../shared/LINUX-NOTES.md): NSD's response-rate
//! limiting is off (it would drop the repeated legitimate queries), and
//! dnsperf's outstanding-query window is rate x timeout so it does not slow
//! its own sending when answers are lost.
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::testbed::procs::{in_ns, Proc};

/// The latency probe's rate (queries/s), beside dnsperf.
pub const PROBE_QPS: f64 = 200.0;

/// The zone NSD serves, and the name the clients ask for.
pub const ZONE: &str = "example.";
pub const QNAME: &str = "www.example.";

/// nsd.conf for a foreground NSD with `servers` server processes on `addrs`
/// (2 or more: each with its own socket in a reuseport group), its files in `dir`.
pub fn nsd_conf(dir: &Path, addrs: &[String], servers: u32) -> String {
    let d = dir.display();
    let ips: String = addrs.iter().map(|a| format!("  ip-address: {a}\n")).collect();
    let reuse = if servers > 1 { "  reuseport: yes\n" } else { "" };
    format!(
        "server:\n{ips}  port: 53\n  server-count: {servers}\n{reuse}  username: \"\"\n  chroot: \"\"\n  \
         zonesdir: \"{d}\"\n  database: \"\"\n  zonelistfile: \"{d}/zone.list\"\n  xfrdfile: \"{d}/xfrd.state\"\n  \
         pidfile: \"{d}/nsd.pid\"\n  verbosity: 0\n  rrl-ratelimit: 0\n  rrl-whitelist-ratelimit: 0\n\
         remote-control:\n  control-enable: no\nzone:\n  name: \"{ZONE}\"\n  zonefile: \"{d}/example.zone\"\n"
    )
}

/// The zone file: an SOA, an NS and the A record the clients ask for.
pub fn zone_file() -> String {
    format!(
        "$ORIGIN {ZONE}\n$TTL 3600\n@ IN SOA ns.{ZONE} admin.{ZONE} 1 3600 900 604800 60\n@ IN NS ns.{ZONE}\n\
         ns IN A 192.0.2.1\nwww IN A 192.0.2.80\n"
    )
}

/// Write the config, zone and dnsperf's query file into `dir`, and check the config.
fn prepare(dir: &Path, addrs: &[String], servers: u32) -> Result<()> {
    std::fs::write(dir.join("nsd.conf"), nsd_conf(dir, addrs, servers))?;
    std::fs::write(dir.join("example.zone"), zone_file())?;
    std::fs::write(dir.join("queries.txt"), format!("{QNAME} A\n"))?;
    let out = Command::new("nsd-checkconf")
        .arg(dir.join("nsd.conf"))
        .output()
        .context("running nsd-checkconf (is nsd installed? make deps installs it)")?;
    if !out.status.success() {
        bail!("nsd-checkconf refused the demo's config: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// NSD (one server process) on `addrs` in namespace `ns` pinned to `cpu`,
/// its files in `dir`; returns once it answers a probe from `client`
/// (namespace, CPU) at the first address.
pub fn start_nsd(dir: &Path, ns: &str, cpu: usize, addrs: &[String], client: (&str, usize)) -> Result<Proc> {
    start_nsd_servers(dir, ns, cpu, addrs, client, 1)
}

/// [`start_nsd`] with `servers` server processes (a reuseport group when 2+).
pub fn start_nsd_servers(
    dir: &Path,
    ns: &str,
    cpu: usize,
    addrs: &[String],
    client: (&str, usize),
    servers: u32,
) -> Result<Proc> {
    prepare(dir, addrs, servers)?;
    let mut c = in_ns(ns, Some(cpu));
    // Foreground (-d); its stderr is read only if it exits while starting.
    c.args(["nsd", "-d", "-c"]).arg(dir.join("nsd.conf")).stdout(Stdio::null()).stderr(Stdio::piped());
    let server = SocketAddr::new(addrs[0].parse()?, 53);
    Proc::spawn_server(c, "nsd")?.wait_ready("nsd", &format!("answering on {server}"), Duration::from_secs(10), || {
        Ok(!probe_from(client.0, client.1, server, 20.0, 0.2)?.rtt_ms.is_empty())
    })
}

/// The latency probe from namespace `ns`, on `cpu` (on veth the receive side
/// runs on the sender's CPU: a probe that wandered between CPUs would move
/// its arrivals between the gate's per-CPU buckets).
pub fn probe_from(ns: &str, cpu: usize, server: SocketAddr, rate: f64, secs: f64) -> Result<Probe> {
    probe_bound(ns, cpu, None, server, rate, secs)
}

/// [`probe_from`] from a given local address (None: the kernel picks).
pub fn probe_bound(
    ns: &str,
    cpu: usize,
    bind: Option<IpAddr>,
    server: SocketAddr,
    rate: f64,
    secs: f64,
) -> Result<Probe> {
    let any: IpAddr =
        if server.is_ipv4() { std::net::Ipv4Addr::UNSPECIFIED.into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() };
    let local = SocketAddr::new(bind.unwrap_or(any), 0);
    let sock = sluice::base::netns::run_in(ns, move || Ok(UdpSocket::bind(local)?))?;
    std::thread::spawn(move || {
        sluice::base::netns::pin_thread(cpu)?;
        probe(sock, server, rate, secs)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
}

/// A DNS query for QNAME type A with the given id (RD off).
pub fn query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in QNAME.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// What dnsperf reported.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dnsperf {
    pub sent: u64,
    pub completed: u64,
    /// Queries per second it managed to send (below the asked rate: marked in the output).
    pub sent_qps: f64,
}

/// dnsperf from namespace `ns` on `cpu` at `server`, `qps` queries/s (None:
/// as fast as it goes, 200 outstanding) for `secs`, started. Its report is
/// piped; its warnings go to DIR/dnsperf.err: answers that come after their
/// timeout make it print a line each, and a pipe nobody reads until the end
/// fills and stalls it (it then sends a fraction of its rate).
pub fn spawn_dnsperf(ns: &str, cpu: usize, dir: &Path, server: &str, qps: Option<u64>, secs: f64) -> Result<Proc> {
    let mut c = in_ns(ns, Some(cpu));
    c.args(["dnsperf", "-s", server, "-d"]).arg(dir.join("queries.txt")).args(["-t", "1", "-l", &format!("{secs}")]);
    match qps {
        // -q: outstanding queries = rate x timeout (1 s), so lost answers do not slow the sending.
        Some(q) => c.args(["-Q", &q.to_string(), "-q", &q.max(100).to_string()]),
        None => c.args(["-q", "200"]),
    };
    c.stdout(Stdio::piped()).stderr(std::fs::File::create(dir.join("dnsperf.err"))?);
    Proc::spawn(c, "dnsperf (is it installed? make deps installs it)")
}

/// The legitimate clients side by side for `secs`, from namespace `ns` on
/// `cpu` to `server` port 53: dnsperf at `qps` and the PROBE_QPS probe.
pub fn clients(ns: &str, cpu: usize, dir: &Path, server: IpAddr, qps: u64, secs: f64) -> Result<(Dnsperf, Probe)> {
    let perf = spawn_dnsperf(ns, cpu, dir, &server.to_string(), Some(qps), secs)?;
    let probe = probe_from(ns, cpu, SocketAddr::new(server, 53), PROBE_QPS, secs)?;
    Ok((finish_dnsperf(perf, dir, secs)?, probe))
}

/// Wait for a dnsperf from [`spawn_dnsperf`] and parse its report.
pub fn finish_dnsperf(p: Proc, dir: &Path, secs: f64) -> Result<Dnsperf> {
    let out = p.into_output()?;
    if !out.status.success() {
        let err = std::fs::read_to_string(dir.join("dnsperf.err")).unwrap_or_default();
        bail!("dnsperf failed ({}): {}", out.status, err.lines().take(5).collect::<Vec<_>>().join("\n"));
    }
    parse_dnsperf(&String::from_utf8_lossy(&out.stdout), secs)
}

/// Parse dnsperf's "Queries sent:" and "Queries completed:" lines.
pub fn parse_dnsperf(text: &str, secs: f64) -> Result<Dnsperf> {
    let num = |key: &str| -> Option<u64> {
        text.lines().find_map(|l| l.trim().strip_prefix(key)).and_then(|r| r.split_whitespace().next()?.parse().ok())
    };
    let (Some(sent), Some(completed)) = (num("Queries sent:"), num("Queries completed:")) else {
        bail!("dnsperf's report has no 'Queries sent' / 'Queries completed' lines:\n{text}");
    };
    Ok(Dnsperf { sent, completed, sent_qps: sent as f64 / secs })
}

/// What the latency probe saw.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub sent: u64,
    /// Round-trip times of the answered queries (ms), sorted.
    pub rtt_ms: Vec<f64>,
}

impl Probe {
    pub fn answered_share(&self) -> Option<f64> {
        (self.sent > 0).then(|| self.rtt_ms.len() as f64 / self.sent as f64)
    }
}

/// Send `rate` queries/s for `secs` from `sock` (made in the client's
/// namespace) to `server`, timing each answer; an answer later than 1 s
/// after the last query is lost.
pub fn probe(sock: UdpSocket, server: SocketAddr, rate: f64, secs: f64) -> Result<Probe> {
    sock.set_read_timeout(Some(Duration::from_millis(1)))?;
    // Query ids are the query's index: at most 65536 queries.
    let n = ((rate * secs) as usize).min(65_536);
    let mut sent_at: Vec<Option<Instant>> = vec![None; n];
    let mut rtt_ms = vec![];
    let start = Instant::now();
    let mut buf = [0u8; 512];
    let mut next = 0;
    while start.elapsed().as_secs_f64() < secs + 1.0 {
        if next < n && start.elapsed().as_secs_f64() >= next as f64 / rate {
            sock.send_to(&query(next as u16), server)?;
            sent_at[next] = Some(Instant::now());
            next += 1;
        }
        if let Ok((len, _)) = sock.recv_from(&mut buf) {
            let id = u16::from_be_bytes([buf[0], buf[1]]) as usize;
            if let Some(at) = sent_at.get_mut(id).filter(|_| len >= 12).and_then(Option::take) {
                rtt_ms.push(at.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    rtt_ms.sort_by(f64::total_cmp);
    Ok(Probe { sent: next as u64, rtt_ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_a_well_formed_dns_question() {
        let q = query(0x1234);
        assert_eq!(&q[..2], &[0x12, 0x34]);
        assert_eq!(&q[4..6], &[0, 1], "one question");
        assert_eq!(&q[12..], b"\x03www\x07example\x00\x00\x01\x00\x01");
    }

    #[test]
    fn dnsperf_counts_are_parsed_and_a_broken_report_is_an_error() {
        let text = "Statistics:\n\n  Queries sent:         50000\n  Queries completed:    49990 (99.98%)\n  Queries lost:         10 (0.02%)\n";
        let d = parse_dnsperf(text, 10.0).unwrap();
        assert_eq!((d.sent, d.completed), (50_000, 49_990));
        assert_eq!(d.sent_qps, 5_000.0);
        assert!(parse_dnsperf("dnsperf: error", 10.0).is_err());
    }
}
