/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sluice.h - the ONE header shared by the XDP gate (gate.bpf.c) and user space.
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

/* Traffic classes: class ids are 0..SLUICE_MAX_CLASSES-1. */
#define SLUICE_MAX_CLASSES 64

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
 * Per-CPU share of a class's limit ("shares" per-CPU array, indexed by class).
 * Written by the daemon only; the gate only reads it.
 */
struct sluice_share {
	__u64 rate_pps; /* this CPU's share of the class rate, packets/s */
	__u64 burst;    /* this CPU's bucket depth, packets */
	__u64 fill_ns;  /* time an empty bucket takes to fill: burst * 1e9 / rate, rounded up */
	__u32 mode;     /* enum sluice_mode */
	__u32 clock_skip; /* empty-bucket drops between clock reads, < burst (see gate.bpf.c) */
};

/* One CPU's token bucket of a class (in struct sluice_class_state). Written by the gate only. */
struct sluice_bucket {
	__u64 tokens;  /* in 1/SLUICE_TOKEN_SCALE packets */
	__u64 last_ns; /* bpf_ktime_get_ns() at the last refill */
	__u32 skip;    /* drops left before the next clock read */
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
	SLUICE_CS_NR,
};

/*
 * Value of the per-CPU "class_state" array (indexed by class): the bucket and
 * the counters side by side, so the packet path does one lookup for both.
 * Written by the gate only; user space reads it.
 */
struct sluice_class_state {
	struct sluice_bucket bucket;
	__u64 cnt[SLUICE_CS_NR]; /* indexed by enum sluice_class_stat */
};

/*
 * Global counters: the per-CPU "global_stats" array indexed by this enum.
 * The first three are verdict counters (a packet lands in exactly one of them
 * or in one class's ADMIT/DROP_* counters); the rest are informational.
 */
enum sluice_global_stat {
	SLUICE_GS_NON_IP_PASS = 0, /* verdict: not IPv4/IPv6 (ARP, LLDP, ...), passed */
	SLUICE_GS_MALFORMED_DROP,  /* verdict: IP packet truncated or invalid, dropped */
	SLUICE_GS_MALFORMED_PASS,  /* verdict: same, passed (settings.malformed_verdict) */
	SLUICE_GS_DEPTH_EXCEEDED,  /* info: headers beyond the parse depth, sent to the default class */
	SLUICE_GS_FRAGMENTS,       /* info: non-first fragments, classified without ports */
	SLUICE_GS_NR,
};
#define SLUICE_GS_VERDICT_NR 3

/* Parse depth limits. */
#define SLUICE_MAX_VLAN 2    /* 802.1Q / 802.1ad tags */
#define SLUICE_MAX_IPV6_EXT 6 /* IPv6 extension headers skipped */

/* Minimum L4 header sizes: shorter is malformed. */
#define SLUICE_UDP_HLEN 8
#define SLUICE_TCP_HLEN 20
#define SLUICE_ICMP_HLEN 8
#define SLUICE_ICMPV6_HLEN 4

/* Run-time settings, the gate's .data section. Written by the daemon through mmap. */
struct sluice_settings {
	__u32 malformed_verdict; /* XDP_DROP or XDP_PASS */
	__u32 default_class;     /* class for headers beyond the parse depth */
};

#endif /* SLUICE_H */
