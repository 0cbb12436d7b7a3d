//! The gate's counters as totals (summed over CPUs) and rates: what the
//! control path (the tick, auto, the trace ledger) and the statistics read.
use serde::{Deserialize, Serialize};

use crate::bpf_intf::*;
use crate::dataplane::gate::{ClassCounters, GlobalCounters};
use crate::policy::delay::Delays;

/// Packet and byte totals of one class, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClassTotals {
    /// Packets classified into this class.
    pub seen_pkts: u64,
    /// Bytes of the packets classified into this class.
    pub seen_bytes: u64,
    /// Packets admitted (XDP_PASS).
    pub admitted_pkts: u64,
    /// Bytes admitted.
    pub admitted_bytes: u64,
    /// Packets dropped because the class's token bucket was empty.
    pub dropped_rate_pkts: u64,
    /// Bytes dropped by the token bucket.
    pub dropped_rate_bytes: u64,
    /// Packets dropped because the class is blocked.
    pub dropped_blocked_pkts: u64,
    /// Bytes dropped because the class is blocked.
    pub dropped_blocked_bytes: u64,
    /// Packets dropped because their source was over its fair share.
    #[serde(default)]
    pub dropped_share_pkts: u64,
    /// Bytes dropped over a source's fair share.
    #[serde(default)]
    pub dropped_share_bytes: u64,
    /// Packets from known sources, while the class is limited with source fairness on.
    #[serde(default)]
    pub known_pkts: u64,
    /// Packets from known sources (`known_pkts`) the known tier admitted;
    /// the rest it dropped: known clients' packets lost at the gate.
    #[serde(default)]
    pub known_admitted_pkts: u64,
    /// Source-epochs: a source's first packet in a 10 ms epoch, while the class is limited with source fairness on.
    #[serde(default)]
    pub source_epochs: u64,
    /// Slots of the per-source table this class's sources took that were
    /// empty or held by a source quiet this epoch (its turnover; a slot
    /// taken from a source that sent this epoch is a collision, not counted).
    #[serde(default)]
    pub source_inserts: u64,
    /// Admitted packets sent to another CPU (cpu = "away", while a higher
    /// priority is in distress).
    #[serde(default)]
    pub away_pkts: u64,
    /// Packets of known sources over their own rate (taken as unknown).
    #[serde(default)]
    pub known_over_pkts: u64,
    /// TCP SYNs that reached the class.
    #[serde(default)]
    pub syn_pkts: u64,
    /// SYNs the gate answered itself with a cookie SYN-ACK (a verdict of
    /// their own: neither admitted nor dropped).
    #[serde(default)]
    pub synack_pkts: u64,
    /// Bytes of those SYN-ACKs.
    #[serde(default)]
    pub synack_bytes: u64,
    /// ACKs to a guarded listener with a valid gate cookie the kernel took
    /// (a connection completed from it).
    #[serde(default)]
    pub cookies_valid: u64,
    /// ACKs to a guarded listener with no valid gate cookie (left to the kernel).
    #[serde(default)]
    pub cookies_invalid: u64,
    /// ACKs with a valid gate cookie the kernel refused a request socket for
    /// (left to it: an option or a listener the gate's SYN-ACKs should have avoided).
    #[serde(default)]
    pub cookies_refused: u64,
    /// Of `synack_pkts`: SYNs answered without the socket lookup (the
    /// daemon found a wildcard listener and no socket of the client's).
    #[serde(default)]
    pub synack_direct: u64,
    /// Of `synack_pkts`: SYNs answered while the class's guard did not
    /// answer, its listener's SYN queue half full (the gate's early answers).
    #[serde(default)]
    pub synack_early: u64,
    /// While the class's SYN guard answers: ACKs and RSTs of no connection
    /// (only the listener found, no valid cookie) the gate dropped.
    #[serde(default)]
    pub dropped_noconn_pkts: u64,
    /// Bytes of those ACKs and RSTs.
    #[serde(default)]
    pub dropped_noconn_bytes: u64,
    /// Unknown sources' UDP packets dropped because their socket was over
    /// SLUICE_ROOM_UNKNOWN_PCT full: its last quarter is the known clients'
    /// (bpf/gate/room.h).
    #[serde(default)]
    pub dropped_room_pkts: u64,
    /// Bytes of those packets.
    #[serde(default)]
    pub dropped_room_bytes: u64,
    /// Packets whose source the gate looked up in the known map, one in
    /// SLUICE_KNOWN_SAMPLE per CPU in any mode.
    #[serde(default)]
    pub sampled_pkts: u64,
    /// Of those, the known sources': the known share of the class's arrivals.
    #[serde(default)]
    pub sampled_known_pkts: u64,
    /// Surges the gate marked on its own, a CPU at a time, while the
    /// class's room was armed (bpf/gate/room.h): each kept room on that
    /// CPU before a tick of the daemon saw the surge.
    #[serde(default)]
    pub surge_marks: u64,
    /// The service's answers the gate timed, from the request it admitted
    /// to the answer leaving (bpf/gate/delay.h), in power-of-two buckets.
    #[serde(default)]
    pub answer_delays: Delays,
    /// Of those, the answers to the class's known clients: what they wait,
    /// which a flood's own answers can hide (a flow that pipelines its
    /// requests is answered at once, to an earlier one).
    #[serde(default)]
    pub answer_delays_known: Delays,
}

impl From<ClassCounters> for ClassTotals {
    fn from(c: ClassCounters) -> Self {
        ClassTotals {
            seen_pkts: c[SLUICE_CS_SEEN_PKTS as usize],
            seen_bytes: c[SLUICE_CS_SEEN_BYTES as usize],
            admitted_pkts: c[SLUICE_CS_ADMIT_PKTS as usize],
            admitted_bytes: c[SLUICE_CS_ADMIT_BYTES as usize],
            dropped_rate_pkts: c[SLUICE_CS_DROP_RATE_PKTS as usize],
            dropped_rate_bytes: c[SLUICE_CS_DROP_RATE_BYTES as usize],
            dropped_blocked_pkts: c[SLUICE_CS_DROP_BLOCKED_PKTS as usize],
            dropped_blocked_bytes: c[SLUICE_CS_DROP_BLOCKED_BYTES as usize],
            dropped_share_pkts: c[SLUICE_CS_DROP_SHARE_PKTS as usize],
            dropped_share_bytes: c[SLUICE_CS_DROP_SHARE_BYTES as usize],
            known_pkts: c[SLUICE_CS_KNOWN_PKTS as usize],
            known_admitted_pkts: c[SLUICE_CS_KNOWN_ADMIT_PKTS as usize],
            source_epochs: c[SLUICE_CS_SRC_ACTIVE as usize],
            source_inserts: c[SLUICE_CS_SRC_INSERTS as usize],
            away_pkts: c[SLUICE_CS_AWAY_PKTS as usize],
            known_over_pkts: c[SLUICE_CS_KNOWN_OVER_PKTS as usize],
            syn_pkts: c[SLUICE_CS_SYN_PKTS as usize],
            synack_pkts: c[SLUICE_CS_SYNACK_PKTS as usize],
            synack_bytes: c[SLUICE_CS_SYNACK_BYTES as usize],
            cookies_valid: c[SLUICE_CS_COOKIE_OK as usize],
            cookies_invalid: c[SLUICE_CS_COOKIE_BAD as usize],
            cookies_refused: c[SLUICE_CS_COOKIE_REFUSED as usize],
            synack_direct: c[SLUICE_CS_SYNACK_DIRECT as usize],
            synack_early: c[SLUICE_CS_SYNACK_EARLY as usize],
            dropped_noconn_pkts: c[SLUICE_CS_DROP_NOCONN_PKTS as usize],
            dropped_noconn_bytes: c[SLUICE_CS_DROP_NOCONN_BYTES as usize],
            dropped_room_pkts: c[SLUICE_CS_DROP_ROOM_PKTS as usize],
            dropped_room_bytes: c[SLUICE_CS_DROP_ROOM_BYTES as usize],
            sampled_pkts: c[SLUICE_CS_SAMPLED_PKTS as usize],
            sampled_known_pkts: c[SLUICE_CS_SAMPLED_KNOWN as usize],
            surge_marks: c[SLUICE_CS_SURGE_MARKS as usize],
            answer_delays: delays_at(&c, SLUICE_CS_DELAY_SAMPLES, SLUICE_CS_DELAY_NS, SLUICE_CS_DELAY_BUCKET0),
            answer_delays_known: delays_at(
                &c,
                SLUICE_CS_DELAY_KNOWN_SAMPLES,
                SLUICE_CS_DELAY_KNOWN_NS,
                SLUICE_CS_DELAY_KNOWN_BUCKET0,
            ),
        }
    }
}

/// A set of answer-delay counters (its count, its sum of ns, its first
/// bucket: bpf/gate/delay.h) read from the class's counters.
fn delays_at(c: &ClassCounters, samples: u32, sum_ns: u32, bucket0: u32) -> Delays {
    Delays {
        samples: c[samples as usize],
        sum_ns: c[sum_ns as usize],
        buckets: std::array::from_fn(|i| c[bucket0 as usize + i]),
    }
}

impl ClassTotals {
    pub fn dropped_pkts(&self) -> u64 {
        self.dropped_rate_pkts
            + self.dropped_blocked_pkts
            + self.dropped_share_pkts
            + self.dropped_noconn_pkts
            + self.dropped_room_pkts
    }
}

/// Global counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GlobalTotals {
    /// Not IPv4/IPv6 (ARP, LLDP, ...): passed.
    pub non_ip_pass: u64,
    /// Malformed IP packets dropped (malformed = "drop").
    pub malformed_drop: u64,
    /// Malformed IP packets passed (malformed = "pass").
    pub malformed_pass: u64,
    /// Not IPv4/IPv6: dropped, over the host's link bucket (10,000/s a CPU)
    /// while the default class was limited or blocked.
    #[serde(default)]
    pub non_ip_drop: u64,
    /// Headers beyond the parse depth (sent to the default class).
    pub depth_exceeded: u64,
    /// Non-first fragments (no ports: classed as their first fragment was, or by protocol).
    pub fragments: u64,
    /// Observe mode: packets counted as dropped (by a class or as
    /// malformed) that the gate passed.
    #[serde(default)]
    pub observed_pass: u64,
    /// Replies the egress learner saw from a learning class's port to a peer
    /// that had asked the class nothing (not learned).
    #[serde(default)]
    pub unasked_replies: u64,
    /// Packets the gate passed past the daemon's deadline (it stalled)
    /// instead of dropping or answering them.
    #[serde(default)]
    pub stale_pass: u64,
    /// While a SYN guard answered: SYNs, ACKs and RSTs after IPv4 options
    /// or IPv6 extension headers, dropped (also in their class's dropped_noconn).
    #[serde(default)]
    pub odd_l3_drop: u64,
    /// Default-class packets its limit would drop, passed as replies to a
    /// connection of the host's own (also admitted in the class).
    #[serde(default)]
    pub host_reply: u64,
    /// The same, passed as IPv6 neighbour discovery or a PMTU message.
    #[serde(default)]
    pub host_icmp: u64,
}

impl From<GlobalCounters> for GlobalTotals {
    fn from(g: GlobalCounters) -> Self {
        GlobalTotals {
            non_ip_pass: g[SLUICE_GS_NON_IP_PASS as usize],
            malformed_drop: g[SLUICE_GS_MALFORMED_DROP as usize],
            malformed_pass: g[SLUICE_GS_MALFORMED_PASS as usize],
            non_ip_drop: g[SLUICE_GS_NON_IP_DROP as usize],
            depth_exceeded: g[SLUICE_GS_DEPTH_EXCEEDED as usize],
            fragments: g[SLUICE_GS_FRAGMENTS as usize],
            observed_pass: g[SLUICE_GS_OBSERVED_PASS as usize],
            unasked_replies: g[SLUICE_GS_UNASKED as usize],
            stale_pass: g[SLUICE_GS_STALE_PASS as usize],
            odd_l3_drop: g[SLUICE_GS_ODD_L3_DROP as usize],
            host_reply: g[SLUICE_GS_HOST_REPLY as usize],
            host_icmp: g[SLUICE_GS_HOST_ICMP as usize],
        }
    }
}

/// Per-second rates of a class over the last second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClassRates {
    /// Packets/s classified into the class.
    pub seen_pps: f64,
    /// Packets/s admitted.
    pub admitted_pps: f64,
    /// Packets/s dropped, every cause.
    pub dropped_pps: f64,
    /// Packets/s from known sources.
    #[serde(default)]
    pub known_pps: f64,
    /// Packets/s dropped over a source's fair share.
    #[serde(default)]
    pub share_dropped_pps: f64,
    /// Source-epochs per second (divide by 100 for sources per epoch).
    #[serde(default)]
    pub source_epochs_ps: f64,
    /// Answers/s of the class's service the gate timed (bpf/gate/delay.h).
    #[serde(default)]
    pub answers_ps: f64,
    /// Their delay's median, ms: its power-of-two bucket's upper edge (null: no answer timed in the window).
    #[serde(default)]
    pub answer_p50_ms: Option<f64>,
    /// Their delay's 99th percentile, ms, as the median (null: no answer timed in the window).
    #[serde(default)]
    pub answer_p99_ms: Option<f64>,
}

impl ClassRates {
    /// Rates between two totals taken `secs` apart.
    pub fn between(old: &ClassTotals, new: &ClassTotals, secs: f64) -> ClassRates {
        if secs <= 0.0 {
            return ClassRates::default();
        }
        let r = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let window = new.answer_delays.since(&old.answer_delays);
        ClassRates {
            seen_pps: r(old.seen_pkts, new.seen_pkts),
            admitted_pps: r(old.admitted_pkts, new.admitted_pkts),
            dropped_pps: r(old.dropped_pkts(), new.dropped_pkts()),
            known_pps: r(old.known_pkts, new.known_pkts),
            share_dropped_pps: r(old.dropped_share_pkts, new.dropped_share_pkts),
            source_epochs_ps: r(old.source_epochs, new.source_epochs),
            answers_ps: r(old.answer_delays.samples, new.answer_delays.samples),
            answer_p50_ms: window.quantile_ms(0.5),
            answer_p99_ms: window.quantile_ms(0.99),
        }
    }
}
