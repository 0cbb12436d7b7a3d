//! The cells' clients: dnsperf and the probes, wrk and the http probe,
//! and their addresses on A (the new client's, the connection floods').
use super::*;

impl Bench<'_> {
    /// A PROBE_QPS probe for `secs` from an address the service never saw before the flood.
    pub(in crate::services) fn new_client(&self, v6: bool) -> std::thread::JoinHandle<Result<dns::Probe>> {
        let bind = if v6 { NEW_CLIENT_V6 } else { NEW_CLIENT_V4 };
        self.probe_spawn(v6, Some(bind.parse().expect("an address")), self.o.secs)
    }

    /// A PROBE_QPS probe to the service for `secs` on a thread of its own,
    /// from `bind` (None: A's own address, that of the clients).
    pub(in crate::services) fn probe_spawn(
        &self,
        v6: bool,
        bind: Option<std::net::IpAddr>,
        secs: f64,
    ) -> std::thread::JoinHandle<Result<dns::Probe>> {
        let net = &self.bed.net;
        let server = if v6 { net.ip6_b } else { net.ip_b };
        let (ns, cpu) = (net.a.clone(), self.o.clients_cpu);
        std::thread::spawn(move || {
            dns::probe_bound(&ns, cpu, bind, std::net::SocketAddr::new(server, 53), dns::PROBE_QPS, secs)
        })
    }

    /// dnsperf at the scenario's rate and the probe, side by side, for
    /// `secs`, on a thread of their own.
    pub(in crate::services) fn dns_clients_spawn(
        &self,
        v6: bool,
        secs: f64,
    ) -> std::thread::JoinHandle<Result<(dns::Dnsperf, dns::Probe)>> {
        let net = &self.bed.net;
        let server = if v6 { net.ip6_b } else { net.ip_b };
        let (ns, dir, qps, cpu) = (net.a.clone(), self.dir.to_path_buf(), self.o.qps, self.o.clients_cpu);
        std::thread::spawn(move || dns::clients(&ns, cpu, &dir, server, qps, secs))
    }

    /// The clients a `calm` flood comes after, for `secs` on a thread of
    /// their own, the same as the cell's: dnsperf and the probe (dns), or
    /// wrk and the http probe (so the service's answers to them while calm
    /// set the rate their address is known at).
    pub(super) fn calm_clients_spawn(&self, v6: bool, secs: f64) -> std::thread::JoinHandle<Result<()>> {
        match self.svc {
            Service::Dns => {
                let t = self.dns_clients_spawn(v6, secs);
                std::thread::spawn(move || {
                    t.join().map_err(|_| anyhow::anyhow!("the dns clients panicked"))?.map(|_| ())
                })
            }
            Service::Http => {
                let net = &self.bed.net;
                let (ns, wrk, cpu) = (net.a.clone(), (self.o.conns, self.o.keep_alive), self.o.clients_cpu);
                let addr = if v6 { net.ip6_b } else { net.ip_b };
                std::thread::spawn(move || {
                    let probe = http::start_probe(&ns, cpu, (light_client(v6), addr), secs);
                    http::run_wrk(&ns, cpu, addr, wrk, secs)?;
                    probe.join().map_err(|_| anyhow::anyhow!("the http probe panicked"))?.map(|_| ())
                })
            }
        }
    }

    /// dnsperf at the scenario's rate and the probe, side by side, for `secs`.
    pub(in crate::services) fn dns_clients(&self, v6: bool, secs: f64) -> Result<Cell> {
        self.dns_clients_at(v6, secs, self.o.qps)
    }

    /// dnsperf at `qps` and the probe, side by side, for `secs`.
    pub(in crate::services) fn dns_clients_at(&self, v6: bool, secs: f64, qps: u64) -> Result<Cell> {
        let net = &self.bed.net;
        let server = if v6 { net.ip6_b } else { net.ip_b };
        let (p, probe) = dns::clients(&net.a, self.o.clients_cpu, self.dir, server, qps, secs)?;
        Ok(Cell {
            client_rate: p.sent_qps,
            client_short: p.sent_qps < 0.95 * qps as f64,
            success: (p.sent > 0).then(|| p.completed as f64 / p.sent as f64),
            p50_ms: sluice_testkit::summary::percentile(&probe.rtt_ms, 0.5),
            p99_ms: sluice_testkit::summary::percentile(&probe.rtt_ms, 0.99),
            ..Cell::default()
        })
    }

    /// wrk for `secs`, and beside it the probe (connect times, a long-lived connection).
    pub(in crate::services) fn http_clients(&self, v6: bool) -> Result<Cell> {
        let net = &self.bed.net;
        let addr = if v6 { net.ip6_b } else { net.ip_b };
        let probe = http::start_probe(&net.a, self.o.clients_cpu, (light_client(v6), addr), self.o.secs);
        let w = http::run_wrk(&net.a, self.o.clients_cpu, addr, (self.o.conns, self.o.keep_alive), self.o.secs)?;
        let mut p = probe.join().map_err(|_| anyhow::anyhow!("the http probe panicked"))??;
        let tried = w.requests + w.errors;
        let timeout_ms = http::CONNECT_TIMEOUT.as_secs_f64() * 1e3;
        let mut connects: Vec<f64> =
            p.connect_ms.iter().copied().chain((0..p.connect_failed).map(|_| timeout_ms)).collect();
        connects.sort_by(f64::total_cmp);
        p.kept_ms.sort_by(f64::total_cmp);
        Ok(Cell {
            client_rate: w.rps,
            success: (tried > 0).then(|| w.requests as f64 / tried as f64),
            p50_ms: w.p50_ms,
            p99_ms: w.p99_ms,
            connect_p50_ms: sluice_testkit::summary::percentile(&connects, 0.5),
            connect_p99_ms: sluice_testkit::summary::percentile(&connects, 0.99),
            connects_failed: Some(p.connect_failed),
            kept_rps: p.kept_rps(),
            kept_p99_ms: sluice_testkit::summary::percentile(&p.kept_ms, 0.99),
            ..Cell::default()
        })
    }
}

/// A's filter: it passes replies to the clients' ports and drops the rest
/// (the victim's ICMP errors to the flood's spoofed sources, ...), so the
/// generator's CPU spends nothing on them.
pub(crate) fn attach_client_filter(bed: &VictimBed) -> Result<Gate> {
    attach_gate(
        &bed.net.a,
        IF_A,
        vec![
            format!("clients:match=udp:{CLIENT_PORTS},match=tcp:{CLIENT_PORTS}"),
            "default:rate=blocked,match=icmp,match=icmpv6".into(),
        ],
    )
}

/// The http probe's address (a light client on a host of its own).
fn light_client(v6: bool) -> std::net::IpAddr {
    (if v6 { LIGHT_CLIENT_V6 } else { LIGHT_CLIENT_V4 }).parse().expect("an address")
}

/// A connection flood's `n` source addresses.
pub(super) fn heavy_sources(n: u8) -> Vec<std::net::IpAddr> {
    let first: std::net::Ipv4Addr = HEAVY_SRC_V4.parse().expect("an address");
    (0..n as u32).map(|i| std::net::Ipv4Addr::from(u32::from(first) + i).into()).collect()
}

/// The connection floods' addresses on A (/32: never a source other
/// clients pick), known to B as neighbours as the new client's are.
pub(super) fn add_heavy_sources(bed: &VictimBed) -> Result<()> {
    let mac = sluice_testkit::testbed::format_mac(bed.net.mac_a);
    for ip in heavy_sources(HEAVY_SRCS.max(NEWCONN_SRCS)) {
        let (ip, addr) = (ip.to_string(), format!("{ip}/32"));
        netns::sh(&["ip", "-n", &bed.net.a, "addr", "add", &addr, "dev", IF_A])?;
        netns::sh(&["ip", "-n", &bed.net.b, "neigh", "replace", &ip, "lladdr", &mac, "dev", IF_B, "nud", "permanent"])?;
    }
    Ok(())
}

/// The new client's addresses on A, and the http probe's: deprecated
/// (preferred_lft 0), so the other clients never pick them as their
/// source, and known to B as neighbours (A's filter blocks ICMPv6, so B
/// could not resolve them).
pub(in crate::services) fn add_clients_of_their_own(bed: &VictimBed) -> Result<()> {
    let (a, b) = (&bed.net.a, &bed.net.b);
    let mac = sluice_testkit::testbed::format_mac(bed.net.mac_a);
    let all = [(NEW_CLIENT_V4, 24), (NEW_CLIENT_V6, 64), (LIGHT_CLIENT_V4, 24), (LIGHT_CLIENT_V6, 64)];
    for (ip, len) in all {
        let addr = format!("{ip}/{len}");
        netns::sh(&["ip", "-n", a, "addr", "add", &addr, "dev", IF_A, "nodad", "preferred_lft", "0"])?;
        netns::sh(&["ip", "-n", b, "neigh", "replace", ip, "lladdr", &mac, "dev", IF_B, "nud", "permanent"])?;
    }
    Ok(())
}
