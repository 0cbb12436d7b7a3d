//! The one description of each metric family `/metrics` serves: the HELP
//! text the endpoint sends and the metrics reference (docs/metrics.md) are
//! both made from this table, and the tests hold the served families, this
//! table and the document equal.

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Served as NAME_bucket{le}, NAME_sum and NAME_count.
    Histogram,
}

/// One metric family.
#[derive(Debug)]
pub struct FamilyDoc {
    /// Without the `sluice_` prefix, and for a counter without `_total`
    /// (the encoder adds both).
    pub name: &'static str,
    pub kind: Kind,
    /// Its labels, comma-separated ("" for none).
    pub labels: &'static str,
    /// What it counts: the HELP text and the reference's description.
    pub help: &'static str,
}

impl FamilyDoc {
    /// The name a scraper sees (0.0.4 text: with `_total` on a counter).
    pub fn served_name(&self) -> String {
        match self.kind {
            Kind::Counter => format!("sluice_{}_total", self.name),
            Kind::Gauge | Kind::Histogram => format!("sluice_{}", self.name),
        }
    }
}

/// Every family, in the reference's order.
pub const FAMILIES: &[FamilyDoc] = &[
    FamilyDoc {
        name: "class_packets",
        kind: Kind::Counter,
        labels: "class, verdict",
        help: "packets per class and verdict (admitted, dropped_rate, dropped_blocked, dropped_share: over its source's fair share, syn_cookie: a SYN the gate answered itself, dropped_noconn: an ACK or RST of no connection while the class's SYN guard answers, or a segment its cookie paths cannot check, dropped_room: an unknown source's datagram to a socket over three quarters full, whose last quarter is its known clients'); each packet gets one verdict, so the sum over verdicts is what the class saw",
    },
    FamilyDoc {
        name: "class_bytes",
        kind: Kind::Counter,
        labels: "class, verdict",
        help: "bytes per class and verdict, as for class_packets",
    },
    FamilyDoc {
        name: "answer_delay_seconds",
        kind: Kind::Histogram,
        labels: "class, le",
        help: "how long the class's service took to answer: from the gate admitting a request (a UDP datagram, or a TCP segment with data) to the service's next answer to that flow (a datagram, or a segment with data) leaving through the gate's interface; power-of-two buckets from 32.8 us; an answer over 250 ms after its request is not counted (that request may be one the service never answered); the default class is not timed (docs/protection.md, \"Answer delay\")",
    },
    FamilyDoc {
        name: "class_rate_limit_packets_per_second",
        kind: Kind::Gauge,
        labels: "class",
        help: "the configured packets/s limit of a limited class",
    },
    FamilyDoc {
        name: "class_throttle_packets_per_second",
        kind: Kind::Gauge,
        labels: "class",
        help: "the budget's throttle on a class while a service of higher priority is or was in distress (absent: not throttled)",
    },
    FamilyDoc {
        name: "class_distress_seconds",
        kind: Kind::Counter,
        labels: "class",
        help: "time the class's service showed distress (its own: socket drops or a standing queue, accept queue, listen overflows; or receive work of lower classes on its CPUs), in 10 ms ticks; classes with UDP/TCP ports only",
    },
    FamilyDoc {
        name: "class_dropped_with_room_packets",
        kind: Kind::Counter,
        labels: "class",
        help: "packets the gate dropped in stretches of 0.5 s or more of ticks where the class's UDP sockets showed no distress, an auto class admitted under 90% of its capacity estimate, and no cap but sluice's own applied (no static rate, no budget throttle): loss sluice inflicted on a service that had room: 0 with no flood, and under a flood while the limit sits at what the service takes (`sluice status` says SELF-INFLICTED); classes with UDP sockets only",
    },
    FamilyDoc {
        name: "class_known_lost_packets",
        kind: Kind::Counter,
        labels: "class",
        help: "packets of the class's known clients that the receive path dropped for want of room after the gate admitted them (a full socket buffer, the protocol's memory limit, a full per-CPU backlog): the gate should have dropped a stranger's instead; target 0; absent without the daemon's tracer",
    },
    FamilyDoc {
        name: "syn_guard_answering",
        kind: Kind::Gauge,
        labels: "class",
        help: "1 while the gate answers the class's TCP SYNs with its own cookies (SYN cookies at the driver), else 0; classes with TCP ports or `syn_cookies = \"on\"`",
    },
    FamilyDoc {
        name: "syn_cookie_acks",
        kind: Kind::Counter,
        labels: "class, result",
        help: "ACKs to a guarded class's listener: valid (carried a gate cookie the kernel took: the listener completed the connection), invalid (no gate cookie: left to the kernel) or refused (a valid gate cookie the kernel would not take)",
    },
    FamilyDoc {
        name: "syn_cookie_direct_packets",
        kind: Kind::Counter,
        labels: "class",
        help: "of the class's syn_cookie packets, the SYN-ACKs the gate sent without its socket lookup: every port of the class has a wildcard listener (none MPTCP's) and the client held no socket on them (docs/protection.md, \"SYN floods\")",
    },
    FamilyDoc {
        name: "syn_cookie_early_packets",
        kind: Kind::Counter,
        labels: "class",
        help: "of the class's syn_cookie packets, the SYN-ACKs the gate sent before its guard engaged: the listener held half its backlog in request sockets (docs/protection.md, \"SYN floods\")",
    },
    FamilyDoc {
        name: "unclassified_packets",
        kind: Kind::Counter,
        labels: "verdict",
        help: "packets outside the classes: non_ip_pass, non_ip_drop (not IPv4/IPv6, over the host's link bucket of 10,000/s a CPU while the default class is limited or blocked), malformed_drop, malformed_pass",
    },
    FamilyDoc {
        name: "flagged_packets",
        kind: Kind::Counter,
        labels: "flag",
        help: "packets the gate noted: depth_exceeded (headers past its parse depth, given the malformed verdict), fragment (no ports), observed_pass (observe mode: counted as dropped, passed), stale_pass (past the daemon's deadline: it stalled, and what the gate would drop or answer was passed), odd_l3_drop (while a SYN guard answered, a SYN, ACK or RST after IPv4 options or IPv6 extension headers, dropped: the cookie paths can check neither), host_reply and host_icmp (a default-class packet its limit would drop, passed as what the host needs: a reply to a connection of its own, IPv6 neighbour discovery or a PMTU message); also in their class's (or the unclassified) counts",
    },
    FamilyDoc {
        name: "learner_unasked_replies",
        kind: Kind::Counter,
        labels: "",
        help: "replies the egress learner saw from a learning class's port to a peer that had sent the class nothing in the last 5 s: not learned (a service's own outbound traffic, or replies to nobody)",
    },
    FamilyDoc {
        name: "auto_rate_packets_per_second",
        kind: Kind::Gauge,
        labels: "class, kind",
        help: "auto classes: capacity estimate, controller target, the class's current rate (+Inf: unlimited)",
    },
    FamilyDoc {
        name: "auto_socket_queued_bytes",
        kind: Kind::Gauge,
        labels: "class",
        help: "auto classes: bytes queued in the class's fullest socket",
    },
    FamilyDoc {
        name: "auto_signals_lost_seconds",
        kind: Kind::Gauge,
        labels: "class",
        help: "auto classes: seconds without signals (holding, then fallback)",
    },
    FamilyDoc {
        name: "auto_state",
        kind: Kind::Gauge,
        labels: "class, algo, state",
        help: "auto classes: 1 on the controller's current state",
    },
    FamilyDoc {
        name: "class_sources_active",
        kind: Kind::Gauge,
        labels: "class",
        help: "distinct unknown sources per 10 ms epoch, mean over a second (a limited class)",
    },
    FamilyDoc {
        name: "class_sources_known",
        kind: Kind::Gauge,
        labels: "class",
        help: "known sources of the class: clients it answered while healthy (after the first scan)",
    },
    FamilyDoc {
        name: "class_source_quota_packets",
        kind: Kind::Gauge,
        labels: "class",
        help: "one unknown source's share, packets per 10 ms epoch; the gate paces it (a GCRA) rather than counting it per epoch (a limited class)",
    },
    FamilyDoc {
        name: "source_inserts",
        kind: Kind::Counter,
        labels: "",
        help: "slots of the per-source table taken that were empty or held by a quiet source (not collisions of live ones), every class",
    },
    FamilyDoc {
        name: "source_evictions",
        kind: Kind::Counter,
        labels: "map",
        help: "entries evicted from the full per-source map: inserts less entries held (no sample before the first scan, 5 s)",
    },
    FamilyDoc {
        name: "kernel_dropped_packets",
        kind: Kind::Counter,
        labels: "class, stage, reason",
        help: "packets of a class the kernel dropped after the gate admitted them, by receive stage and the kernel's drop reason (kfree_skb; `sluice trace` explains the stages)",
    },
    FamilyDoc {
        name: "daemon_cpu_seconds",
        kind: Kind::Counter,
        labels: "",
        help: "CPU time the daemon used (user + system)",
    },
    FamilyDoc {
        name: "daemon_softirq_seconds",
        kind: Kind::Counter,
        labels: "",
        help: "of that, softirq work the kernel ran while one of the daemon's threads was on the CPU (charged to it: no IRQ_TIME_ACCOUNTING); no sample where not counted (the daemon in a PID namespace of its own)",
    },
    FamilyDoc {
        name: "daemon_wake_seconds",
        kind: Kind::Gauge,
        labels: "which",
        help: "time from the gate's wake call (a calm loop's class saw a jump in packets) to the control loop: `last` and `longest` (no sample before the first wake)",
    },
    FamilyDoc {
        name: "start_time_seconds",
        kind: Kind::Gauge,
        labels: "",
        help: "when the gate was attached (Unix time)",
    },
    FamilyDoc {
        name: "gate_attached",
        kind: Kind::Gauge,
        labels: "",
        help: "1 while the daemon's program is the one attached to the interface (checked every 100 ms), 0 after a detach behind its back",
    },
];

/// The HELP text of family `name` (as registered: no prefix, no `_total`).
pub fn help(name: &str) -> &'static str {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.help)
        .unwrap_or_else(|| panic!("metric family {name} has no entry in surface/stats/families.rs"))
}

/// The metrics reference's table (docs/metrics.md holds it verbatim).
pub fn reference_table() -> String {
    let mut out = String::from("| family | type | labels | what |\n|---|---|---|---|\n");
    for f in FAMILIES {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        out += &format!("| `{}` | {kind} | {} | {} |\n", f.served_name(), f.labels, f.help);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/metrics.md carries the table made from FAMILIES. With
    /// SLUICE_WRITE_DOCS=1 the test writes it there instead of failing.
    #[test]
    fn the_metrics_reference_is_made_from_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let table = reference_table();
        let start = doc.find("| family | type |").expect("docs/metrics.md has the reference table");
        let end = doc[start..].find("\n\n").map_or(doc.len(), |e| start + e + 1);
        if doc[start..end] != table && std::env::var_os("SLUICE_WRITE_DOCS").is_some() {
            std::fs::write(path, format!("{}{table}{}", &doc[..start], &doc[end..])).unwrap();
            return;
        }
        assert_eq!(doc[start..end], table, "docs/metrics.md is stale: run this test with SLUICE_WRITE_DOCS=1");
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
    }
}
