/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * classify.h - which traffic class a packet belongs to: the tables the daemon
 * compiles from its rules (src/classify.rs) and the one lookup that reads
 * them. Included by the gate (gate.bpf.c, on the packet at the driver) and by
 * the tracer (trace.bpf.c, on the kernel's copy further up the stack), so a
 * packet gets the same class at every stage. The tracer either shares the
 * gate's maps (libbpf reuse_fd) or gets its own copy filled from the same
 * compiled tables.
 */
#ifndef SLUICE_CLASSIFY_H
#define SLUICE_CLASSIFY_H

#include <linux/in6.h>
#include <bpf/bpf_endian.h>

#include "sluice.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_GENERATIONS * SLUICE_CELLS);
	__type(key, __u32);
	__type(value, struct sluice_cell);
} cells SEC(".maps");

/* The tables generation in force (sluice.h, SLUICE_GENERATIONS): 0 or 1. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} tables_gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SLUICE_MAX_PREFIX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_v4_key);
	__type(value, __u32);
} prefix_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SLUICE_MAX_PREFIX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sluice_v6_key);
	__type(value, __u32);
} prefix_v6 SEC(".maps");

/*
 * What the parser found. The parsers take `egress` as a compile-time constant
 * (they are always inlined): on ingress (the gate) the port is the destination
 * port and the peer the source address; on egress (the learner) the port is
 * the source port (the service's) and the peer the destination (the client).
 */
struct pkt {
	__u32 slot;  /* enum sluice_slot */
	__u32 port;  /* the service's port (host order) or, port-less, the IP protocol */
	__u32 family; /* 4 or 6 */
	__u32 peer4; /* IPv4 peer, network order */
	struct in6_addr peer6;
	__u8 tcp_flags; /* TCP only: the flags byte */
	__u8 fragment;  /* 1: a non-first fragment (no L4 header): the gate counts it, the tc programs do not */
	__u8 odd_l3;    /* 1: the L4 header follows IPv4 options or IPv6 extension headers (the cookie paths take neither) */
	__u8 first_fragment; /* 1: a first fragment (more fragments follow; the L4 header is here) */
	__u8 frag_reply;     /* 1: a non-first fragment whose first was a reply to the host's own connection (gate/frags.h) */
	__u8 tcp_hlen;       /* TCP only: the header's length in 32-bit words (its data offset) */
	__u16 peer_port;     /* the peer's port (host order; 0 port-less) */
	__u32 l4_len;        /* bytes from the L4 header to the IP packet's end (gate/delay.h: is there data?) */
	__be32 frag_id;      /* a fragment's IP id (IPv4's 16 bits, IPv6's 32), as in its header */
};

/* A TCP segment that carries no data (a SYN, a bare ACK, a FIN): no request. */
static __always_inline int tcp_bare(const struct pkt *pk)
{
	return pk->slot == SLUICE_SLOT_TCP && pk->l4_len <= pk->tcp_hlen * 4;
}

/* The tables generation in force: read once a packet, before any table. */
static __always_inline __u32 tables_in_force(void)
{
	__u32 zero = 0;
	__u32 *gen = bpf_map_lookup_elem(&tables_gen, &zero);

	return gen ? *gen & 1 : 0;
}

/* The cell of (slot, port) in generation `gen`. */
static __always_inline struct sluice_cell *cell_of(__u32 gen, __u32 slot, __u32 port)
{
	__u32 idx = gen * SLUICE_CELLS + slot * SLUICE_PORTS_PER_SLOT + port;

	return bpf_map_lookup_elem(&cells, &idx);
}

/* The class id of a packet whose (slot, port) has `cell` in generation
 * `gen`: the cell's, refined by the source-prefix tries (with the packet's
 * peer) when the cell says rules with a source prefix apply. */
static __always_inline __u32 class_of_cell(const struct pkt *pk, __u32 gen, const struct sluice_cell *cell)
{
	__u32 group, *cls = NULL;

	if (!(cell->flags & SLUICE_CELL_PREFIX))
		return cell->class_id;
	group = bpf_htonl(gen << SLUICE_GEN_GROUP_SHIFT | cell->group);
	if (pk->family == 4) {
		struct sluice_v4_key k = {
			.prefixlen = 64,
			.group = group,
			.addr = pk->peer4,
		};
		cls = bpf_map_lookup_elem(&prefix_v4, &k);
	} else {
		struct sluice_v6_key k = {
			.prefixlen = 160,
			.group = group,
		};
		__builtin_memcpy(k.addr, &pk->peer6, 16);
		cls = bpf_map_lookup_elem(&prefix_v6, &k);
	}
	return cls ? *cls : cell->class_id;
}

/* The packet's class id in generation `gen`. `default_class` is returned
 * only if the cell lookup fails, which cannot happen (every cell is in the
 * array). */
static __always_inline __u32 classify(const struct pkt *pk, __u32 gen, __u32 default_class)
{
	struct sluice_cell *cell = cell_of(gen, pk->slot, pk->port);

	return cell ? class_of_cell(pk, gen, cell) : default_class;
}

#endif /* SLUICE_CLASSIFY_H */
