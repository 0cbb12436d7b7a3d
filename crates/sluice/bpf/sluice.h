/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sluice.h - the ONE header shared by the BPF programs (the XDP gate in
 * gate.bpf.c and the headers it includes, the reader steering in
 * steer.bpf.c, the tracer in trace.bpf.c) and user space.
 *
 * Every constant, enum and struct that both sides use lives here. build.rs runs
 * bindgen over this file, so the Rust side (crate::bpf_intf) is generated from it
 * and never copied by hand. Rules for what goes in here:
 *   - fixed-width __u8/__u16/__u32/__u64 only, no bool, explicit padding;
 *   - every struct is a map key or value, or the .data settings block;
 *   - a comment per field saying who writes it (BPF or the daemon).
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <linux/types.h>

/*
 * Traffic classes. A config has at most SLUICE_MAX_CLASSES classes; the gate
 * knows each by an id in 0..SLUICE_CLASS_IDS-1 that never changes while the
 * class exists: a reload gives a new class an id no class in force holds,
 * so the maps indexed by class (shares, class_state, fairness, away,
 * known_part, syn_guard) and the known map's keys never move. The daemon
 * maps a config's class index to its id (src/dataplane/gate/ids.rs).
 */
#define SLUICE_MAX_CLASSES 64
#define SLUICE_CLASS_IDS (2 * SLUICE_MAX_CLASSES)

/*
 * Two generations of the class tables (cells and the prefix tries): the
 * one in force is the value of the 1-entry array `tables_gen` (0 or 1),
 * which every program that classifies reads once a packet. A reload writes
 * the other generation and then switches with that one write, so a packet
 * is classified wholly by the old tables or wholly by the new ones. Cells
 * of generation g are at g * SLUICE_CELLS; its prefix groups carry g in
 * bit SLUICE_GEN_GROUP_SHIFT of the tries' group.
 */
#define SLUICE_GENERATIONS 2
#define SLUICE_GEN_GROUP_SHIFT 16

/*
 * Classification table ("cells"): one array entry per (port slot, port).
 * UDP and TCP packets index their slot with the destination port; every other
 * IP packet (ICMP, ICMPv6, other protocols, non-first fragments, which carry
 * no ports) indexes the port-less slot with its IP protocol number.
 */
enum sluice_slot {
	SLUICE_SLOT_UDP = 0,
	SLUICE_SLOT_TCP = 1,
	SLUICE_SLOT_PORTLESS = 2,
	SLUICE_SLOT_NR = 3,
};
#define SLUICE_PORTS_PER_SLOT 65536
#define SLUICE_CELLS (SLUICE_SLOT_NR * SLUICE_PORTS_PER_SLOT)

/* sluice_cell.flags */
#define SLUICE_CELL_PREFIX 1 /* rules with a source prefix apply: look up the tries */

/* Value of the "cells" array. Written by the daemon. */
struct sluice_cell {
	__u8 class_id; /* class when no source-prefix rule matches */
	__u8 flags;    /* SLUICE_CELL_* */
	__u16 group;   /* prefix group to look up when SLUICE_CELL_PREFIX is set */
};

/*
 * Source-prefix tries (LPM). The key is the prefix group (always fully
 * specified, so prefixlen = 32 + address prefix length) then the source
 * address. The value is a __u32 class id. Written by the daemon.
 */
#define SLUICE_MAX_PREFIX_ENTRIES 65536
struct sluice_v4_key {
	__u32 prefixlen; /* 32 + source prefix length */
	__u32 group;     /* prefix group, network byte order */
	__u32 addr;      /* IPv4 source address, network byte order */
};
struct sluice_v6_key {
	__u32 prefixlen; /* 32 + source prefix length */
	__u32 group;     /* prefix group, network byte order */
	__u8 addr[16];   /* IPv6 source address */
};

/* What the gate does with a class's packets. */
enum sluice_mode {
	SLUICE_MODE_UNLIMITED = 0, /* admit everything */
	SLUICE_MODE_LIMITED = 1,   /* token bucket: rate_pps with burst */
	SLUICE_MODE_BLOCKED = 2,   /* drop everything */
};

/* Token buckets count tokens in units of 1/SLUICE_TOKEN_SCALE packet. */
#define SLUICE_TOKEN_SCALE 1000000000ULL
/* At most this many empty-bucket drops between two clock reads. */
#define SLUICE_CLOCK_SKIP 8
/* Largest rate and burst accepted, so burst * SCALE and elapsed * rate fit in 64 bits. */
#define SLUICE_MAX_RATE 1000000000ULL
#define SLUICE_MAX_BURST 1000000000ULL

/*
 * A CPU's share of a class's limit ("shares", an entry per CPU and class
 * id, gate/maps.h). The daemon writes its bucket fields; the gate and the
 * learner write only the wake fields below (a mark fired, a slow answer).
 */
struct sluice_share {
	__u64 rate_pps; /* this CPU's share of the class rate, packets/s */
	__u64 burst;    /* this CPU's bucket depth, packets */
	__u64 fill_ns;  /* time an empty bucket takes to fill: burst * 1e9 / rate, rounded up */
	__u32 mode;     /* enum sluice_mode */
	__u32 clock_skip; /* empty-bucket drops between clock reads, < burst (see gate.bpf.c) */
	/* While the daemon ticks slowly (all calm): the class's seen-packets
	 * count on this CPU at which the gate wakes it (a class id into the
	 * "wake" ring); 0: off. The gate clears it when it fires. */
	__u64 wake_at;
	/* While wake_at is armed: SLUICE_WAKE_BATCH packets of the class
	 * arriving on this CPU in less than this many ns (a rate over the
	 * daemon's mark) wake it too, wherever the count is; 0: off. */
	__u64 wake_gap_ns;
	/* While wake_at is armed, for a class judged on its answer delay
	 * (policy/late.rs): an answer the egress learner times on this CPU
	 * later than this many us is slow, and the SLUICE_SLOW_WAKE_ANSWERS-th
	 * since the arming wakes the daemon (gate/delay.h); 0: off. A flood of
	 * real connections brings no jump of arrivals, only late answers. */
	__u32 slow_wake_us;
	__u32 slow_answers; /* slow answers since the arming (the learner's count) */
};

/* Packets between the gate's clock reads for the wake's rate mark (a power of 2). */
#define SLUICE_WAKE_BATCH 256
/* Slow answers on one CPU between two calm ticks that wake the daemon
 * (struct sluice_share's slow_wake_us): one is a moment's stall. */
#define SLUICE_SLOW_WAKE_ANSWERS 8

/*
 * Source fairness of a limited class on a CPU ("fairness", an entry per CPU
 * and class id, gate/maps.h). Written by the daemon only, where it changed
 * at a tick; all zero = off.
 *
 * While it is on, a packet from a known source (the "known" map: the
 * service answered it while it was healthy) takes the class's bucket
 * (struct sluice_share); any other packet is counted against its source
 * (the "sources" map, keyed at plen4/plen6): within its share (one packet
 * every src_interval_ns, paced, see SLUICE_SRC_BURST_*) it takes the unknown
 * tier's bucket `unknown`; over it, only that bucket's top half.
 */
struct sluice_fair {
	struct sluice_share unknown; /* the unknown sources' bucket parameters on this CPU */
	__u32 on;     /* 1: source fairness applies to this class */
	__u32 quota;  /* one unknown source's share, packets per epoch (the daemon's tick; shown, not read here) */
	__u32 src_interval_ns; /* the same share as a pace: ns per packet (0: unlimited) */
	__u8 plen4;   /* IPv4 prefix length a source is counted at (32, 24 or 16) */
	__u8 plen6;   /* IPv6 prefix length (64, 48 or 32) */
	__u8 learn;   /* 1: the egress learner records this class's clients (on or off) */
	__u8 room;    /* 1: keep room in the class's UDP sockets for its known clients (gate/room.h) */
	/*
	 * The gate clock's last window in which the learner noted answers the
	 * daemon never confirmed: learning was on, then the daemon's next tick
	 * saw a surge or distress (a flood answered in the ms before it was
	 * seen). A client first noted in it starts its span again at its next
	 * answer: a pulsing flood is never known. 0, 0: none.
	 */
	__u64 taint_from_ms;
	__u64 taint_to_ms;
	/*
	 * Room armed (room 0): this many of the class's packets arriving on
	 * one CPU within SLUICE_SURGE_WINDOW_NS are a surge the gate marks on
	 * its own, and the CPU keeps room as if `room` were 1 for
	 * SLUICE_SURGE_HOLD_NS (gate/room.h, note_surge). 0: not armed.
	 */
	__u32 surge_pkts;
	/*
	 * Offer a stamp (gate/delay.h) to one admitted packet of the class in
	 * this many on this CPU, a power of two; 0: SLUICE_DELAY_EVERY. The
	 * daemon sets 1 while the class's answers are slower than usual
	 * (policy/late.rs): its known clients' answers, few among a flood's,
	 * then fill a window in tens of ms, not in a second.
	 */
	__u32 delay_every;
	/*
	 * 1: the unknown tier's bucket counts TCP data in work, not packets: a
	 * segment takes a token per SLUICE_WORK_BYTES of its data (tier_cost in
	 * gate/sources.h), and moves its source's pace on by as many
	 * intervals (src_interval_ns is then per token, UNDER_PKTS counts
	 * tokens). The daemon sets it while the tier runs at a rate of its own
	 * (beside known clients, or the class limited for its late answers): a
	 * keep-alive flood's segment carries many pipelined requests, and
	 * counted as one packet each of the tier's admissions was many
	 * requests of the service's work at once.
	 */
	__u32 by_work;
	__u32 _pad;
	/*
	 * With learn 1: the gate clock when learning last turned on. A known
	 * entry the learner last refreshed before it waited out a pause of
	 * learning (a flood, slow answers): its answers then were not counted,
	 * so the pause is kept out of its span (struct sluice_known's
	 * paused_ms), or the client's own rate falls at each pause.
	 */
	__u64 learn_from_ms;
};

/* Data bytes of a TCP segment per token of a tier counted in work (a small
 * request's size: a bare ACK or one short request costs one token). */
#define SLUICE_WORK_BYTES 64

/*
 * Key of the "sources" and "known" maps: a source prefix within a class.
 * addr holds the IPv4 address in its first 4 bytes; bits past plen are zero.
 */
struct sluice_src_key {
	__u8 class_id;
	__u8 family; /* 4 or 6 */
	__u8 plen;
	__u8 _pad;
	__u8 addr[16];
};

/* An unknown source's pace and counts (in its slot of "sources"). Written by the gate only. */
struct sluice_src {
	__u32 epoch; /* settings.epoch when pkts was last reset */
	__u32 pkts;  /* packets in that epoch (sampled past SLUICE_SRC_EXACT) */
	__u64 drops; /* packets dropped over its share, ever (sampled past SLUICE_SRC_EXACT) */
	__u64 tat_ns; /* its share's theoretical arrival time (bpf_ktime_get_ns), 0 = none yet */
	__u32 over_epoch; /* the last epoch it went over its share in (counted SRC_OVER once) */
	__u32 _pad;
};
/*
 * An unknown source is paced at its share, not counted per epoch: a GCRA
 * on tat_ns admits a packet unless the source is more than a tolerance
 * ahead of its pace. The tolerance is SLUICE_SRC_BURST_PKTS intervals, at
 * least SLUICE_SRC_BURST_NS: a source that was quiet may send that burst
 * at once, a heavy one then gets one packet per interval. Per-epoch counts
 * let every heavy source send its whole quota at the start of each epoch,
 * all at once (clumps a ~50-datagram socket buffer cannot hold); this way
 * the unknown tier's admitted stream in any 1 ms stays within its rate x
 * (1 ms + 2 x SLUICE_SRC_BURST_NS) plus 2 x (SLUICE_SRC_BURST_PKTS + 1) per
 * source (two bursts: one may be paced from a CPU's last clock read, see
 * src_within_share in gate.bpf.c).
 */
#define SLUICE_SRC_BURST_PKTS 4
#define SLUICE_SRC_BURST_NS 1000000ULL
/*
 * A source's counts (its packets this epoch, its drops) are written from
 * every CPU its packets arrive on, and a source whose flows RSS spreads
 * over queues would have every queue write its slot's cache line for each
 * packet. Each count is exact up to SLUICE_SRC_EXACT; past it, one packet
 * in SLUICE_SRC_SAMPLE adds SLUICE_SRC_SAMPLE (gate/sources.h,
 * src_count_step), so a flooding source writes its slot for one packet in
 * SLUICE_SRC_SAMPLE. Its pace (tat_ns) moves only for a packet it is
 * admitted. SLUICE_SRC_SAMPLE is 2^SLUICE_SRC_SAMPLE_BITS.
 */
#define SLUICE_SRC_EXACT 64
#define SLUICE_SRC_SAMPLE_BITS 4
#define SLUICE_SRC_SAMPLE (1 << SLUICE_SRC_SAMPLE_BITS)

/*
 * A slot of the direct-mapped "sources" table: the source it holds (key;
 * family 0: empty) and its state. A source's slot is its seeded hash
 * (sources.h, peer_hash) masked to the table's size, a power of 2; a
 * source that finds another in its slot takes it over with a fresh state
 * (counted SLUICE_CS_SRC_INSERTS, or SLUICE_CS_SRC_COLLIDED where the
 * other one sent in this epoch: the daemon reads inserts as the table's
 * turnover, and two live sources taking a slot from each other are not
 * turnover). There is no second place to look: a hash table's bucket walk
 * and an LRU's bookkeeping cost about 35 ns a packet, a slot one lookup of
 * an array (docs/results, "where its time goes").
 */
struct sluice_src_slot {
	struct sluice_src_key key;
	__u32 _pad;
	struct sluice_src v;
};

/*
 * Value of the LRU "known" map: a client the service answered. Written by the
 * egress learner (sluice_learn) while the class's fairness says learn, and by the daemon
 * (restoring its state file). Times are the gate's clock, settings.now_ms:
 * Unix milliseconds that the daemon writes every tick, the wall clock as it
 * read it at its start moved on by CLOCK_MONOTONIC (a wall clock stepped
 * back mid-run does not take it back). Not CLOCK_MONOTONIC alone: it starts
 * near 0 at boot, so on a host up for a minute "answered two hours ago" (a
 * restored entry) cannot be said in it, and a state file outlives the boot.
 */
struct sluice_known {
	__u64 first_ms; /* gate clock at the first answer */
	__u64 last_ms;  /* gate clock at the last answer */
	__u32 answers;  /* answers seen (saturating) */
	__u32 interval_ns; /* gate only: one packet's interval at its own rate; 0 = to compute (the learner resets it) */
	__u64 tat_ns;   /* gate only: its own rate's theoretical arrival time (bpf_ktime_get_coarse_ns), 0 = none yet */
	/* learner only: where its count of answers is held to its requests
	 * from (see SLUICE_ASKED_REFRESH_MS): the "asked" slot's requests then,
	 * and its answers then plus one (0: not set, as in an entry the daemon
	 * wrote; the learner sets both at its next refresh of the entry). */
	__u32 asks_from;
	__u32 answers_from;
	/* learner only: ms of learning's pauses between first_ms and last_ms,
	 * when it counted none of the client's answers (struct sluice_fair's
	 * learn_from_ms); its rate is its answers over the rest of its span. */
	__u32 paused_ms;
	__u32 _pad;
};
/*
 * A record of the "wake" ring: the class whose arrivals passed their wake
 * mark, and when (bpf_ktime_get_ns, CLOCK_MONOTONIC): the daemon measures
 * how long the gate's call took to reach its loop.
 */
struct sluice_wake {
	__u32 class_id;
	__u32 _pad;
	__u64 at_ns;
};
/*
 * A class's part of the "known" map (the map "known_part", one per class):
 * how many new clients the learner may still add to it, and how many
 * entries it holds. The daemon writes both after every scan of the map and
 * at a restore; the learner takes one from room and adds one to held per
 * new client. held == 0: the gate does not look the class's sources up in
 * "known" at all (a class nobody was ever answered in skips that lookup).
 */
struct sluice_known_part {
	__s64 room;
	__u64 held;
};
/*
 * A client is known once the service answered it over at least this span
 * (ms, of the gate clock): a flood that is answered for the few ticks before
 * the daemon sees it never spans a second, a client that came back does.
 */
#define SLUICE_KNOWN_SPAN_MS 1000
/* The learner moves a known source's last_ms at most once in this long (the
 * known TTL is seconds); its answers it counts each time. */
#define SLUICE_LEARN_REFRESH_MS 100
/*
 * A known source is admitted as known only up to its own rate: the rate it
 * was answered at while the class was calm (answers over the span, at
 * least SLUICE_KNOWN_MIN_PPS) times SLUICE_KNOWN_HEADROOM, with bursts of
 * SLUICE_KNOWN_BURST_MS of that rate (at least SLUICE_KNOWN_BURST_PKTS
 * packets). Past it, its packets are an unknown source's (share, unknown
 * tier): an address that became known, honestly or not, floods at most at
 * four times the rate it showed while all was calm.
 */
#define SLUICE_KNOWN_HEADROOM 4
#define SLUICE_KNOWN_MIN_PPS 10
/*
 * A known source's TCP segments without data but its SYN (its handshake's
 * ACK, its ACKs, its FIN) move its rate by 1 >> SLUICE_KNOWN_BARE_SHIFT of
 * a packet. Its rate counts answers (segments that end a service's
 * write), and a client that opens a connection per request sends about six
 * segments per answer, four of them bare ACKs or FINs: counted whole, that
 * was over SLUICE_KNOWN_HEADROOM, and the bench's wrk and the light client
 * sharing its address went to the unknown tier with the flood. Counted a
 * quarter, 3 steps an answer. A SYN counts whole (it costs the listener a
 * request socket: a SYN flood spoofing a known address gets cookies past
 * the rate); a known address sending only bare ACKs is held at four times
 * its allowance.
 */
#define SLUICE_KNOWN_BARE_SHIFT 2
#define SLUICE_KNOWN_BURST_MS 100
#define SLUICE_KNOWN_BURST_PKTS 8
/*
 * A reply teaches the learner only if its peer asked first: the gate notes,
 * in the "asked" table, when each peer last sent a learning class a packet
 * (its time moved at most once per SLUICE_ASKED_REFRESH_MS) and how many
 * it sent, and the learner skips replies to peers not noted in the last
 * SLUICE_ASKED_WINDOW_MS. The host's own outbound traffic from a service's
 * port (a `sendto` loop, a reply to nobody) then teaches nothing. A known
 * source's answers are held to its requests: at each refresh of its entry
 * (SLUICE_LEARN_REFRESH_MS) the learner cuts the answers it counted since
 * it set the entry's *_from marks to the requests its slot counted since,
 * so a service that sends several datagrams (or writes) per request
 * teaches its client one answer per request, not its own packet rate
 * (issue 49, item 3). A spoofer that sends from an address still "asks";
 * what bounds it is the known source's own rate (above).
 */
#define SLUICE_ASKED_REFRESH_MS 1000
/* Requests taken as unanswered when an entry's marks are set: a client's
 * pipelined requests before its first counted answer (or a daemon's
 * restore) are not lost to the hold. */
#define SLUICE_ASKS_IN_FLIGHT 8
#define SLUICE_ASKED_WINDOW_MS 5000
/*
 * A slot of "asked" (gate/maps.h). The requests are counted whoever holds
 * the slot: a peer that takes it from another does not start them again,
 * so the learner's difference over a span only ever over-counts a peer's
 * requests (by another's on its slot), never wraps.
 */
struct sluice_asked {
	__u32 tag;  /* the upper half of the (class, peer) hash */
	__u32 ms;   /* gate clock's low 32 bits when the peer last asked (moved at most once per SLUICE_ASKED_REFRESH_MS) */
	__u32 asks; /* packets the slot's peers sent a learning class (wraps; the learner takes differences) */
	__u32 asks_at_ms; /* asks when ms last moved */
	__u32 overflowed; /* 1: the slot's count went on in "asks_over" once (the learner sums it then) */
	__u32 _pad;
};
/*
 * A slot counts at most this many packets a second in itself (from when
 * its time moved), the rest in this CPU's entry of "asks_over": each count
 * in the slot is an atomic add on a line every CPU the peer's packets
 * reach writes, and one source on both CPUs of the reference VM cost
 * 44-52 ns a packet with no count and 53-56 ns with an add at each
 * (72-75 ns sampling one in 16 past a first 256: the other CPU's reads
 * miss the line each time it moved). The learner sums a heavy peer's
 * "asks_over" over the CPUs, up to SLUICE_ASKS_MAX_CPUS of them.
 */
#define SLUICE_ASKS_PER_SEC 4096
#define SLUICE_ASKS_OVER_SLOTS 4096
#define SLUICE_ASKS_MAX_CPUS 4096
/* Entries of the "known" map and slots of "asked" (a power of 2); the slots of "sources" are set at load (default below, a power of 2). */
#define SLUICE_KNOWN_ENTRIES 65536
#define SLUICE_ASKED_SLOTS 65536
#define SLUICE_SOURCES_DEFAULT 262144

/* One CPU's token bucket of a class (in struct sluice_class_state). Written by the gate only. */
struct sluice_bucket {
	__u64 tokens;  /* in 1/SLUICE_TOKEN_SCALE packets */
	__u64 last_ns; /* bpf_ktime_get_ns() at the last refill */
	__u32 skip;    /* drops left before the next clock read */
	__u32 _pad;
};

/*
 * The clock of the unknown sources' pacing on one CPU, for one class (in
 * struct sluice_class_state). Written by the gate only.
 */
struct sluice_pacer {
	__u64 seen_ns; /* the last bpf_ktime_get_ns() it read: now is at least this */
	__u32 skip;    /* over-share verdicts left before the next clock read */
	__u32 _pad;
};

/* Per-class counters, index into struct sluice_class_state's cnt[]. */
enum sluice_class_stat {
	SLUICE_CS_SEEN_PKTS = 0,
	SLUICE_CS_SEEN_BYTES,
	SLUICE_CS_ADMIT_PKTS,
	SLUICE_CS_ADMIT_BYTES,
	SLUICE_CS_DROP_RATE_PKTS, /* bucket empty */
	SLUICE_CS_DROP_RATE_BYTES,
	SLUICE_CS_DROP_BLOCKED_PKTS, /* class is blocked */
	SLUICE_CS_DROP_BLOCKED_BYTES,
	SLUICE_CS_DROP_SHARE_PKTS, /* source over its fair share (struct sluice_fair) */
	SLUICE_CS_DROP_SHARE_BYTES,
	/* The rest are informational (source fairness, only while it is on): */
	SLUICE_CS_KNOWN_PKTS,     /* from a known source (took the class bucket) */
	SLUICE_CS_KNOWN_ADMIT_PKTS,
	SLUICE_CS_UNKNOWN_PKTS,   /* from an unknown source */
	SLUICE_CS_UNDER_PKTS,     /* unknown, within its source's share (tokens while by_work) */
	SLUICE_CS_SRC_ACTIVE,     /* sources that sent their first packet of an epoch */
	SLUICE_CS_SRC_OVER,       /* sources that went over their share in an epoch */
	SLUICE_CS_SRC_INSERTS,    /* sources that took a slot of "sources" that was empty or whose source was quiet this epoch */
	SLUICE_CS_SRC_COLLIDED,   /* sources that took a slot from a source that sent this epoch (two live ones share it) */
	SLUICE_CS_AWAY_PKTS,      /* admitted and sent to another CPU's cpumap kthread (the "away" map) */
	SLUICE_CS_KNOWN_OVER_PKTS, /* from a known source over its own rate: taken as unknown */
	SLUICE_CS_SYNACK_PKTS,    /* verdict: a SYN the gate answered with a cookie SYN-ACK (XDP_TX) */
	SLUICE_CS_SYNACK_BYTES,
	SLUICE_CS_COOKIE_OK,      /* an ACK with a valid gate cookie: the listener got a request socket */
	SLUICE_CS_COOKIE_BAD,     /* an ACK to a guarded listener with no valid gate cookie (left to the kernel) */
	SLUICE_CS_SYN_PKTS,       /* TCP SYNs (no ACK) that reached the class, answered by the gate or not */
	SLUICE_CS_DROP_NOCONN_PKTS, /* verdict: while the SYN guard answers, an ACK or RST of no connection, or a segment the cookie paths cannot check (synack.h) */
	SLUICE_CS_DROP_NOCONN_BYTES,
	SLUICE_CS_COOKIE_REFUSED, /* an ACK with a valid gate cookie whose request socket the kernel refused (left to it) */
	SLUICE_CS_SYNACK_DIRECT,  /* of SLUICE_CS_SYNACK_PKTS: answered without the socket lookup (struct sluice_syn_guard) */
	SLUICE_CS_DROP_ROOM_PKTS, /* verdict: an unknown source's UDP packet to a socket over SLUICE_ROOM_UNKNOWN_PCT full (gate/room.h) */
	SLUICE_CS_DROP_ROOM_BYTES,
	SLUICE_CS_SAMPLED_PKTS,   /* one packet in SLUICE_KNOWN_SAMPLE (per CPU) whose source was looked up in "known", any mode (gate/sources.h) */
	SLUICE_CS_SAMPLED_KNOWN,  /* of those: from a known source */
	SLUICE_CS_SURGE_MARKS,    /* surges the gate marked on its own while the class's room was armed (gate/room.h) */
	SLUICE_CS_SYNACK_EARLY,   /* of SLUICE_CS_SYNACK_PKTS: answered while the guard only watched, the listener's queue half full (`early`) */
	SLUICE_CS_DELAY_SAMPLES,  /* answers timed (gate/delay.h), counted by the CPU that saw the answer leave */
	SLUICE_CS_DELAY_NS,       /* the sum of their delays, ns */
	SLUICE_CS_DELAY_BUCKET0,  /* the first of SLUICE_DELAY_BUCKETS: delays under 2^SLUICE_DELAY_SHIFT0 ns */
	SLUICE_CS_DELAY_LAST = SLUICE_CS_DELAY_BUCKET0 + 15, /* SLUICE_DELAY_BUCKETS - 1 after it */
	SLUICE_CS_DELAY_KNOWN_SAMPLES, /* of the answers timed: to a known client (the same three, for them alone) */
	SLUICE_CS_DELAY_KNOWN_NS,
	SLUICE_CS_DELAY_KNOWN_BUCKET0,
	SLUICE_CS_DELAY_KNOWN_LAST = SLUICE_CS_DELAY_KNOWN_BUCKET0 + 15,
	SLUICE_CS_NR,
};

/*
 * How long a service takes to answer (gate/delay.h): the gate stamps a
 * flow's request as it admits it, the egress learner times the service's
 * answer to that flow. A flow is a 4-tuple of a class; a request or an
 * answer is a UDP datagram or a TCP segment that carries data. One stamp
 * per slot: a request that finds its slot taken by another flow's
 * unanswered one (younger than SLUICE_DELAY_STALE_NS) is not timed, and an
 * answer more than SLUICE_DELAY_STALE_NS after its stamp is not counted
 * (the stamped request may be one the service never answered: a datagram
 * its socket dropped). Delays go in SLUICE_DELAY_BUCKETS power-of-two
 * buckets per class: bucket 0 holds those under 2^SLUICE_DELAY_SHIFT0 ns
 * (32.8 us), bucket i those under 2^(SHIFT0 + i) ns; the 250 ms limit
 * falls in bucket 13, and the last two stay empty.
 */
#define SLUICE_DELAY_SLOTS 4096
/* The gate offers one admitted packet in this many of a class on a CPU
 * for a stamp: stamping every request cost an admitted packet 52 ns (a
 * clock read, the hash and the lookup: 39 ns became 91 in `sluice bench
 * gate`); a service answering 100 requests/s is still timed 6 times a second.
 * The daemon may ask for every one while a class's answers are slow
 * (struct sluice_fair's delay_every). */
#define SLUICE_DELAY_EVERY 16
#define SLUICE_DELAY_BUCKETS 16
#define SLUICE_DELAY_SHIFT0 15
#define SLUICE_DELAY_STALE_NS 250000000ULL

/* A timed request's slot: the flow's 32-bit tag and when the gate admitted it (0: empty). */
struct sluice_delay_slot {
	__u32 tag;
	__u32 _pad;
	__u64 asked_ns;
};

/* A class on a CPU reads the clock against the daemon's deadline once every
 * this many drops and answers (gate.bpf.c, daemon_stalled). */
#define SLUICE_STALE_EVERY 64
/*
 * Room for known clients (gate/room.h): unknown sources' packets are
 * admitted to a UDP socket only while it holds at most this share (%) of
 * its receive buffer; the last quarter is the known clients'. At the
 * bench's NSD (a 4 MiB buffer, about 1,000 datagrams, read at about 100k/s)
 * the unknown sources keep 7 ms of reads queued, so the reader is never
 * left idle by the rule, and a known client at 5k/s has 50 ms of room
 * through a stall of its reader. The socket is looked at once every
 * SLUICE_ROOM_EVERY admitted packets per CPU while it has room.
 */
#define SLUICE_ROOM_UNKNOWN_PCT 75
#define SLUICE_ROOM_EVERY 16
/*
 * The gate's own surge mark (gate/room.h, note_surge): struct sluice_fair's
 * surge_pkts arriving on a CPU within this window mark a surge, which keeps
 * room on that CPU for the hold. A socket of about 1,000 datagrams fills in
 * about 3 ms under a flood four times what its reader takes, before the
 * daemon's next tick: the mark comes within two windows of a surge of ten
 * times the usual. The hold bridges the ticks until the daemon's own rule
 * (policy/fair, ROOM_EXCESS_SECS) keeps room, or lets a short spike go.
 */
#define SLUICE_SURGE_WINDOW_NS 2000000ull
#define SLUICE_SURGE_HOLD_NS 100000000ull

/*
 * A class's state on one CPU, an entry of the "class_state" array (gate/maps.h):
 * the bucket and the counters side by side, so the packet path does one
 * lookup for both. Written by the gate on that CPU only; user space reads
 * it. Its size is whole cache lines (the assert below), so no two CPUs'
 * entries share one.
 */
struct sluice_class_state {
	struct sluice_bucket bucket;
	struct sluice_bucket unknown; /* the unknown sources' bucket (struct sluice_fair) */
	struct sluice_pacer pacer;    /* the unknown sources' clock on this CPU (gate.bpf.c) */
	__u64 wake_batch_ns;          /* the clock at the last SLUICE_WAKE_BATCH boundary while armed */
	__u64 stale_until;            /* the daemon's deadline at the last clock read against it (gate.bpf.c) */
	__u32 stale_left;             /* drops and answers until the next read */
	__u32 stale;                  /* 1: past it at the last read */
	__u32 room_left;              /* admitted UDP packets until the next look at their socket (gate/room.h) */
	__u32 room_full;              /* 1: the socket was over SLUICE_ROOM_UNKNOWN_PCT at the last look */
	__u64 surge_from_ns;          /* the clock when this CPU's surge count last started (gate/room.h) */
	__u64 surge_mark_ns;          /* the clock at this CPU's last surge mark (it keeps room, armed room); 0: none */
	__u32 surge_cnt;              /* the class's packets on this CPU since surge_from_ns */
	__u32 watch_all;              /* SYNs of a watching guard this CPU still looks up each (SLUICE_WATCH_ALL) */
	__u64 marked;                 /* settings.epoch + 1 when this CPU last set its bit in class_cpus (0: not since a reset) */
	__u64 cnt[SLUICE_CS_NR]; /* indexed by enum sluice_class_stat */
	__u64 _pad[1];           /* to whole cache lines: a counter added takes the pad */
};
_Static_assert(sizeof(struct sluice_class_state) % 64 == 0,
	       "struct sluice_class_state fills whole cache lines: resize _pad");

/*
 * Global counters: the per-CPU "global_stats" array indexed by this enum.
 * The first four are verdict counters (a packet lands in exactly one of them
 * or in one class's ADMIT/DROP_* counters); the rest are informational.
 */
enum sluice_global_stat {
	SLUICE_GS_NON_IP_PASS = 0, /* verdict: not IPv4/IPv6 (ARP, LLDP, ...), passed */
	SLUICE_GS_MALFORMED_DROP,  /* verdict: IP packet truncated or invalid, dropped */
	SLUICE_GS_MALFORMED_PASS,  /* verdict: same, passed (settings.malformed_verdict) */
	SLUICE_GS_NON_IP_DROP,     /* verdict: not IPv4/IPv6, over the host's link bucket while the default class is limited (gate/host.h) */
	SLUICE_GS_DEPTH_EXCEEDED,  /* info: headers beyond the parse depth (also counted malformed) */
	SLUICE_GS_FRAGMENTS,       /* info: non-first fragments, classified without ports */
	SLUICE_GS_OBSERVED_PASS,   /* info: observe mode: counted as dropped (class or malformed), passed */
	SLUICE_GS_UNASKED,         /* info: the learner skipped a reply to a peer that had asked the class nothing */
	SLUICE_GS_STALE_PASS,      /* info: past the daemon's deadline, passed instead of dropped or answered */
	SLUICE_GS_ODD_L3_DROP,     /* info: while a SYN guard answers, a SYN, ACK or RST after IPv4 options or IPv6 extension headers, dropped (also its class's DROP_NOCONN) */
	SLUICE_GS_HOST_REPLY,      /* info: a default-class packet its limit would drop, passed as a reply to a connection of the host's own (gate/host.h) */
	SLUICE_GS_HOST_ICMP,       /* info: the same, passed as IPv6 neighbour discovery or a PMTU message (gate/host.h) */
	SLUICE_GS_NR,
};
#define SLUICE_GS_VERDICT_NR 4

/* Parse depth limits. */
#define SLUICE_MAX_VLAN 2    /* 802.1Q / 802.1ad tags */
#define SLUICE_MAX_IPV6_EXT 6 /* IPv6 extension headers skipped */

/* Minimum L4 header sizes: shorter is malformed. */
#define SLUICE_UDP_HLEN 8
#define SLUICE_TCP_HLEN 20
#define SLUICE_ICMP_HLEN 8
#define SLUICE_ICMPV6_HLEN 4

/* The settings a config decides, one per tables generation: they switch with the tables. */
struct sluice_verdicts {
	__u32 malformed_verdict; /* XDP_DROP or XDP_PASS */
	__u32 default_class;     /* class id for a packet no cell names (cannot happen: every cell is written) */
	__u32 observe;           /* 1: observe mode: every verdict counted as usual, nothing dropped */
	__u32 _pad;
};

/* Run-time settings, the gate's .data section. Written by the daemon through mmap. */
struct sluice_settings {
	__u64 now_ms;            /* the gate clock: Unix ms that never step back (base::clock::gate_ms), written every tick (0: not yet) */
	__u64 known_ttl_ms;      /* a known source not answered for this long is unknown again */
	struct sluice_verdicts verdicts[SLUICE_GENERATIONS]; /* by tables generation (tables_gen) */
	__u32 epoch;             /* the daemon's tick count: source counts are per epoch */
	__u32 sources_mask;      /* slots of "sources" - 1 (written at load, before any packet) */
	__u64 slot_seed;         /* random, drawn at load: where a source's slot is (sources.h, peer_hash) */
	__u16 syn_mss4;          /* the MSS the gate's SYN-ACKs offer (the interface's MTU - 40) */
	__u16 syn_mss6;          /* the same for IPv6 (MTU - 60) */
	__u32 syn_allow;         /* SLUICE_SYN_*: what the namespace's TCP settings let a gate cookie carry */
	__u64 syn_key[2];        /* the SYN cookies' SipHash key (random, drawn at start; 0: no cookies) */
	__u64 alive_until_ns;    /* CLOCK_MONOTONIC ns (coarse): past it the daemon stalled and the gate fails open (0: no deadline) */
	__u16 ephemeral_lo;      /* net.ipv4.ip_local_port_range: the ports the host's own connections take (gate/host.h) */
	__u16 ephemeral_hi;      /* (both 0: every port) */
	__u32 host_uid_min;      /* a reply's socket is the host's own if its owner's uid is under it (root, system users: UID_MIN) or a systemd dynamic user's (gate/host.h; set at load, as discovery's UID_MIN) */
};

/*
 * What the host needs (gate/host.h): IPv6 neighbour discovery and PMTU
 * messages that the default class's limit would drop are passed at up to
 * this rate per CPU (a bucket of their own, this deep).
 */
#define SLUICE_HOST_ICMP_PPS 1000
#define SLUICE_HOST_ICMP_BURST 100

/*
 * The same for frames that are not IPv4/IPv6 (ARP, LLDP, STP, ...) while
 * the default class is limited or blocked (gate/host.h): a host's ARP
 * needs a few a second, a large broadcast domain's some hundreds.
 */
#define SLUICE_HOST_LINK_PPS 10000
#define SLUICE_HOST_LINK_BURST 1000

/*
 * Every this many packets of a class on a CPU, whatever its mode, the gate
 * looks the source up in "known" and counts it (SAMPLED_*): the share of
 * an unlimited class's arrivals that its known clients send, which the
 * tiers count only while it is limited. A power of two; the lookup costs
 * a sixteenth of itself per packet.
 */
#define SLUICE_KNOWN_SAMPLE 16

/*
 * systemd's dynamic users (DynamicUser=): trusted as system users are, by
 * discovery (signals::discover::trusted) and for the host's own replies
 * (gate/host.h, settings.host_uid_min).
 */
#define SLUICE_DYNAMIC_UID_LO 61184
#define SLUICE_DYNAMIC_UID_HI 65519

/*
 * A datagram in fragments (gate/frags.h): its first fragment's class, so
 * that its other fragments, which carry no ports, take the same one (the
 * "frags" LRU map, SLUICE_FRAGS entries, each found for SLUICE_FRAG_MS
 * after its first fragment). Keyed as the kernel reassembles, less the
 * destination (one of the host's own addresses): the sender, the IP id,
 * and for IPv4 the protocol (an IPv6 fragment's next header counts only in
 * its first fragment, RFC 8200, so it is 0 in the key).
 */
struct sluice_frag {
	__be32 src[4]; /* IPv4: src[0] */
	__be32 id;     /* IPv4's 16-bit id, or IPv6's 32-bit one, as in the header */
	__u8 family;   /* 4 or 6 */
	__u8 proto;    /* IPv4: the protocol; IPv6: 0 */
	__u16 _pad;
};

/* What a datagram's first fragment was given (struct sluice_frag's value). */
struct sluice_frag_class {
	__u64 at_ms;    /* the gate clock at its first fragment */
	__u32 cls;      /* its class id ... */
	__u8 gen;       /* ... in this tables generation */
	__u8 host_reply; /* 1: it was a reply to a connection of the host's own (gate/host.h) */
	__u16 _pad;
};
#define SLUICE_FRAGS 16384
#define SLUICE_FRAG_MS 2000

/*
 * SYN cookies at the driver (syncookie.h). A cookie is made in one slot of
 * SLUICE_COOKIE_SLOT_MS of the gate clock and taken in it and the next.
 * The gate's SYN-ACKs offer window scale SLUICE_COOKIE_WSCALE (the
 * kernel's own choice for a default receive buffer) when the client
 * offered one.
 */
#define SLUICE_COOKIE_SLOT_MS 64000

/*
 * settings.syn_allow: what bpf_sk_assign_tcp_reqsk and the listener take in
 * the gate's network namespace (net.ipv4.*, read by the daemon at start and
 * every second). Without SLUICE_SYN_COOKIES (tcp_syncookies = 0) the
 * listener ignores the request socket: the gate answers no SYN. Each other
 * bit: the SYN-ACK may offer that option (the kernel refuses a request
 * socket with an option the namespace turned off).
 */
#define SLUICE_SYN_COOKIES (1u << 0) /* net.ipv4.tcp_syncookies != 0 */
#define SLUICE_SYN_SACK (1u << 1)    /* net.ipv4.tcp_sack */
#define SLUICE_SYN_TS (1u << 2)      /* net.ipv4.tcp_timestamps */
#define SLUICE_SYN_WSCALE (1u << 3)  /* net.ipv4.tcp_window_scaling */
/*
 * The gate's interface forwards this family (net.ipv4/ipv6.conf.IFACE.forwarding):
 * the host may route segments through it to other machines, and a wildcard
 * listener matches any destination at the socket lookup. The SYN answer and
 * the drop of ACKs of no connection then first ask the kernel's FIB
 * (bpf_fib_lookup) and leave a segment it would forward to the kernel.
 */
#define SLUICE_SYN_ROUTES_V4 (1u << 4)
#define SLUICE_SYN_ROUTES_V6 (1u << 5)
#define SLUICE_COOKIE_WSCALE 7

/* A TCP class's SYN guard, written by the daemon. */
struct sluice_syn_guard {
	__u64 check_until_ms; /* gate clock: ACKs to the class's listeners are checked for a gate cookie until then */
	__u32 answer;         /* 1: the gate answers the class's SYNs with cookie SYN-ACKs */
	__u32 direct;         /* SLUICE_SYN_DIRECT_*: which answered SYNs skip the socket lookup (below) */
	__u32 early;          /* 1: while not answering, answer a SYN whose listener's queue is filling (below) */
	__u32 _pad;
};

/*
 * Early answers: the guard of an "auto" class (the default) watches while
 * it does not answer. The daemon's guard engages at a tick (every 10 ms
 * at most) once the kernel shows SYN pressure, and at 130k SYNs/s a
 * listener's queue of 512 overflows in 4 ms: the kernel then sends its
 * own cookies, and the flood's first SYNs sit in the queue as request
 * sockets for a minute of SYN-ACK retries. Instead, with `early` set, the
 * gate looks a SYN's listener up (one in SLUICE_WATCH_EVERY, below) and
 * answers it with a cookie when the
 * listener holds half its backlog or more in request sockets (the kernel's
 * own test, inet_csk_reqsk_queue_is_full, at half: gate/synack.h,
 * listener_filling). No flood: request sockets last a round trip, the
 * queue never gets there, and the SYN goes to the kernel. A SYN answered so is counted SYN-ACK as any other, and sets the
 * class's entry in syn_early (and its last, the latest of all) to when
 * the checker stops looking at its ACKs; the daemon's guard, seeing the
 * gate answer, engages (`policy::syn_guard`). Up to a NAPI batch of SYNs
 * (64) passes the gate before the kernel makes their request sockets: a
 * listener with a backlog under 128 can still overflow at a flood's start.
 */
#define SLUICE_SYN_CHECK_MS (2 * SLUICE_COOKIE_SLOT_MS) /* a cookie is valid in its slot and the next */
/*
 * Watching costs the socket lookup (about 180 ns a SYN, `sluice bench
 * gate`), so a CPU looks up one SYN in SLUICE_WATCH_EVERY of a watching
 * class, and each of the next SLUICE_WATCH_ALL after one it answered early:
 * with no flood a SYN costs a twentieth of that, and at a flood's start up
 * to SLUICE_WATCH_EVERY - 1 more SYNs a CPU reach the queue before the
 * gate sees it filling.
 */
#define SLUICE_WATCH_EVERY 8
#define SLUICE_WATCH_ALL 1024

/*
 * The socket lookup of an answered SYN, only where it decides something.
 * It costs more than the rest of the answer (issue 37) and decides two
 * things: a listener that takes a gate cookie exists for the SYN (not
 * MPTCP's), and the kernel holds no socket of the SYN's 4-tuple (TIME_WAIT,
 * established, half-open: only the kernel can take that SYN). Instead:
 *   - direct (SLUICE_SYN_DIRECT_V4, _V6), from the daemon: every port of
 *     the class has a wildcard listener of that family on the gate's
 *     interface, none of them MPTCP's (read once a second while answering);
 *   - syn_peers, a bit set of client addresses (struct sluice_syn_peer,
 *     hashed: syn_peer_bit) that may hold a socket of the class's port. Its
 *     first half is the daemon's: when a class's guard starts answering,
 *     it reads every socket on the class's ports once (one dump) and sets
 *     their clients' bits. Its second half is the gate's: while a guard
 *     answers, the gate looks up every other TCP packet of the class
 *     (no_connection) and each SYN it does not skip, and sets the bit of a
 *     client whose packet finds a socket other than the listener, or whose
 *     ACK carries a valid cookie (a connection about to be). The daemon
 *     clears both when no guard answers.
 * A SYN of a direct family whose client's bit is clear is answered without
 * the lookup; a set bit (a client with a socket, or another address
 * sharing its bit) is looked up as before. No false negative for a socket
 * made through the gate's interface: one made while the guard answers
 * comes from a handshake whose ACK the gate saw; one made before was in
 * the dump. Missed: a half-open connection the kernel made between the
 * dump and the guard's write (microseconds) whose client retries its SYN.
 */
#define SLUICE_SYN_DIRECT_V4 (1u << 0)
#define SLUICE_SYN_DIRECT_V6 (1u << 1)
#define SLUICE_SYN_PEER_LOG2 20
#define SLUICE_SYN_PEER_BITS (1u << SLUICE_SYN_PEER_LOG2)
#define SLUICE_SYN_PEER_WORDS (SLUICE_SYN_PEER_BITS / 64) /* per half of syn_peers */

/* A client address as syn_peers hashes it: IPv6, or IPv4 as ::ffff:a.b.c.d (network order). */
struct sluice_syn_peer {
	__u32 addr[4];
};

/*
 * A client address's bit in each half of syn_peers: its words folded to 64
 * bits, times the golden ratio, the top SLUICE_SYN_PEER_LOG2 bits (Fibonacci hashing). The
 * daemon computes the same (signals::syn_peers::peer_bit).
 */
static __always_inline __u32 syn_peer_bit(const struct sluice_syn_peer *p)
{
	__u64 x = (__u64)(p->addr[0] ^ p->addr[2]) << 32 | (p->addr[1] ^ p->addr[3]);

	return (__u32)((x * 0x9e3779b97f4a7c15ULL) >> (64 - SLUICE_SYN_PEER_LOG2));
}

/*
 * Reader steering (steer.bpf.c): an SK_REUSEPORT program picks which socket
 * of a UDP service's reuseport group gets each datagram. A group is known by
 * its local port (the `groups` array's index); its readers are the sockarray
 * slots index * SLUICE_READERS_MAX .. + n - 1.
 */
#define SLUICE_GROUPS_MAX 16
#define SLUICE_READERS_MAX 32
#define SLUICE_READER_SLOTS (SLUICE_GROUPS_MAX * SLUICE_READERS_MAX)
/* Least-loaded keeps a flow on the reader the kernel's hash names until that
 * reader has this many datagrams queued (it is behind or stalled): moving a
 * flow between readers breaks per-socket state (QUIC, DTLS). */
#define SLUICE_STEER_STALL_DEPTH 16

enum sluice_readers {
	SLUICE_READERS_HASH = 0,         /* the kernel's own choice: a hash of the 4-tuple */
	SLUICE_READERS_ROUND_ROBIN = 1,  /* each CPU deals datagrams to the readers in turn */
	SLUICE_READERS_LEAST_LOADED = 2, /* the reader with the fewest datagrams queued */
};

struct sluice_group {
	__u32 index;  /* daemon: the group's number, 0..SLUICE_GROUPS_MAX-1 */
	__u32 n;      /* daemon: readers in the group's slots, 1..SLUICE_READERS_MAX */
	__u32 policy; /* daemon: enum sluice_readers */
	__u32 _pad;
};

/* One UDP socket in an SO_REUSEPORT group, as the `reuseport_socks`
 * iterator writes it: the group's program, whoever attached it. */
struct sluice_reuseport_sock {
	__u64 inode;   /* the socket's inode (as /proc/PID/fd shows it) */
	__u32 prog_id; /* the group's program's id; 0 for none or classic BPF */
	__u16 port;    /* local port */
	__u8 has_prog; /* 1: a program (eBPF or classic) picks the group's socket */
	__u8 _pad;
};

/* Per-group counters (per-CPU array, index group * SLUICE_STEER_STAT_NR + stat). */
enum sluice_steer_stat {
	SLUICE_SS_HASHED = 0, /* left to the kernel's hash: policy hash, or the daemon is gone */
	SLUICE_SS_MISSED = 1, /* the chosen reader had closed: left to the kernel's hash */
	SLUICE_SS_NR = 2,
};

/* Run-time settings, steer.bpf.c's .data section. Written by the daemon through mmap. */
struct sluice_steer_settings {
	__u64 alive_until; /* CLOCK_MONOTONIC ns: past it the daemon is gone and the kernel hashes */
};

/*
 * Tracing (trace.bpf.c): where each packet of a class goes after the gate.
 * Stages a packet passes, in order; each has an "in" counter per class
 * (per-CPU array `stage_in`, index class * SLUICE_STAGE_NR + stage).
 */
enum sluice_stage {
	SLUICE_STAGE_DRIVER = 0, /* the driver handed an skb to the stack (napi_gro_receive_entry, netif_rx_entry, netif_receive_skb_entry) */
	SLUICE_STAGE_STACK = 1,  /* the stack took it (netif_receive_skb: after GRO and the per-CPU backlog) */
	SLUICE_STAGE_QUEUED = 2, /* it was queued to a socket (sk_data_ready) */
	SLUICE_STAGE_READ = 3,   /* a reader took a datagram, or TCP bytes (sock_recv_length) */
	SLUICE_STAGE_NR = 4,
};

/* Class index for packets the tracer could not classify (not IP, or headers unreadable). */
#define SLUICE_TRACE_UNCLASSIFIED SLUICE_CLASS_IDS
#define SLUICE_TRACE_CLASSES (SLUICE_CLASS_IDS + 1)
/* Drop reasons counted one by one (enum skb_drop_reason); larger values (subsystem
 * reasons) are counted under SLUICE_TRACE_REASONS - 1. Per-CPU hash `drops`,
 * key class << 16 | reason. */
#define SLUICE_TRACE_REASONS 256
/*
 * Per-CPU array `known_lost`, by class id: packets of the class's known
 * clients (answered over SLUICE_KNOWN_SPAN_MS, as the gate's known tier
 * reads it; the entry's age is not checked) that the receive path dropped
 * for want of room after the gate admitted them: at a full socket buffer
 * (SOCKET_RCVBUFF), the protocol's memory limit (PROTO_MEM) or a full
 * per-CPU backlog (CPU_BACKLOG). Its target is 0: the gate should have
 * dropped a stranger's packet instead.
 */

/* Latency intervals of sampled packets, between consecutive stages. */
enum sluice_interval {
	SLUICE_IV_DRIVER_STACK = 0, /* driver -> stack: GRO, RPS hand-off, per-CPU backlog */
	SLUICE_IV_STACK_QUEUED = 1, /* stack -> socket queue: IP and UDP/TCP receive */
	SLUICE_IV_QUEUED_READ = 2,  /* socket queue -> the application's read */
	SLUICE_IV_NR = 3,
};
#define SLUICE_HIST_BUCKETS 32 /* bucket b holds durations in [2^b, 2^(b+1)) ns; 0 holds 0-1 ns */

/* Per-CPU array `latency`, index class * SLUICE_IV_NR + interval. Written by trace.bpf.c. */
struct sluice_latency {
	__u64 count;   /* samples */
	__u64 sum_ns;  /* sum of durations */
	__u64 sum_sq;  /* sum of squared durations, in units of (8 ns)^2 so it does not overflow */
	__u64 hist[SLUICE_HIST_BUCKETS];
};
#define SLUICE_SQ_SHIFT 3

/* trace.bpf.c's .data section: what to trace. Written by user space before attach. */
struct sluice_trace_settings {
	__u64 netns;         /* inode of the traced network namespace */
	__u32 ifindex;       /* the traced interface in it */
	__u32 default_class; /* as the gate's settings.verdicts[].default_class */
	__u32 sample_every;  /* 1 in N skbs at the driver stage gets timed; 0 = none */
	__u32 tgid;          /* the daemon (root PID namespace): softirq time while its threads run; 0 = none */
	__u32 backlog_reason; /* enum skb_drop_reason's CPU_BACKLOG on this kernel; 0 = not counted */
	__u32 rcvbuf_reason;  /* its SOCKET_RCVBUFF (a full socket buffer); 0 = known_lost not counted */
	__u32 proto_mem_reason; /* its PROTO_MEM (the protocol's memory limit); 0 = not counted */
	__u32 pad;
};

/* Per-CPU array `cpu_rx` (one entry), written by trace.bpf.c's softirq pair
 * and its kfree_skb program: what one CPU spent on receive work. */
struct sluice_cpu_rx {
	__u64 rx_ns;         /* time in NET_RX softirq on this CPU, whatever task was current */
	__u64 rx_start;      /* when the running NET_RX softirq began (0: none runs) */
	__u64 daemon_ns;     /* softirq time (any vector) run while a thread of settings.tgid was current */
	__u64 daemon_start;  /* when that softirq began (0: none) */
	__u64 backlog_drops; /* skbs of the traced interface dropped at this CPU's backlog (softnet "dropped") */
	__u64 stack_pkts;    /* skbs this CPU's stack took in (netif_receive_skb), any interface's */
	__u64 iface_pkts;    /* the part of stack_pkts that came in on the traced interface */
};

#endif /* SLUICE_H */
