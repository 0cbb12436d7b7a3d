// SPDX-License-Identifier: GPL-2.0-only
/*
 * gate.bpf.c - sluice's admission gate: an XDP program that refuses excess
 * load at the driver, before the kernel spends anything on it.
 *
 * What runs where
 * ---------------
 * In the kernel (this file), per packet, with no lock and no shared atomic:
 *   1. parse Ethernet (up to SLUICE_MAX_VLAN VLAN tags), IPv4 (options,
 *      fragments) or IPv6 (up to SLUICE_MAX_IPV6_EXT extension headers), and
 *      the L4 header far enough to know the destination port;
 *   2. classify: one array lookup in "cells" indexed by (port slot, port);
 *      only if that cell says source-prefix rules apply, one LPM lookup in
 *      prefix_v4/prefix_v6 keyed by (prefix group, source address). The cost
 *      does not grow with the number of rules: user space compiles the rules
 *      (first match wins, in config order) into these tables;
 *   3. admit or drop with the class's token bucket;
 *   4. count the packet in exactly one verdict counter;
 *   5. an admitted packet of a class sent "away" (CPU protection, below the
 *      maps) is redirected to another CPU's cpumap entry instead of passed;
 *   6. before the bucket (3): while a TCP class's SYN guard answers (a SYN
 *      flood), its SYNs are answered here with cookie SYN-ACKs (XDP_TX)
 *      and its ACKs and RSTs of no connection dropped; a tc ingress
 *      program checks the cookies (syncookie.h has the design).
 * In user space (the sluice daemon): compiling rules into the tables, the
 * per-CPU rate split (below), reading and serving counters, reloads.
 *
 * Token buckets without locks
 * ---------------------------
 * Each class has one bucket per CPU (per-CPU arrays "shares", written by the
 * daemon, and "class_state", written only here), so the per-packet path
 * touches only this CPU's memory. Tokens are fixed
 * point (1 packet = SLUICE_TOKEN_SCALE units) refilled from bpf_ktime_get_ns():
 * tokens += elapsed_ns * rate_pps, capped at burst * SCALE; a packet takes
 * SCALE units. No division and no floating point on the packet path: the
 * daemon precomputes fill_ns, the time after which the bucket is full anyway,
 * which also keeps the multiplication from overflowing.
 *
 * Reading the clock: bpf_ktime_get_ns() costs about 20 ns in this kind of VM,
 * as much as the rest of the gate. So the bucket is refilled lazily: while it
 * holds a whole token, a packet just takes it; the clock is read only when it
 * runs dry, and the refill then credits all the time since the last refill
 * (capped at the burst). Under a flood the bucket is dry and every packet
 * would read the clock, so after a refill that still leaves no token the next
 * clock_skip (< burst, at most SLUICE_CLOCK_SKIP) packets are dropped without
 * reading it. The long-run admitted count is unchanged: time is credited
 * exactly at the next read, and fewer than clock_skip tokens can accrue while
 * skipping (arrivals outpace tokens), which the burst holds without loss.
 * What changes is which packets go: if a flow pauses right after the bucket
 * ran dry, up to clock_skip packets after the pause are dropped before the
 * clock is read again, and the credit they did not use goes to the packets
 * after them. SLUICE_CLOCK_SKIP = 8 keeps that small; 32 would save another
 * ~3 ns per dropped packet (sluice bench gate) for bursts four times larger.
 *
 * Splitting a class's rate over CPUs: a class's total rate R must be divided
 * into per-CPU shares r_i with sum r_i = R. An even split (R/n each) fails
 * whenever traffic is uneven, which is the usual case (RSS hashes few flows to
 * few queues; veth runs NAPI on the sender's CPU): a CPU with all the traffic
 * would admit only R/n. So the daemon sets r_i in proportion to the arrivals
 * (seen packets) each CPU had over the last period, plus a small floor so a
 * CPU that starts receiving is not shut out until the next update. If the
 * class is under its limit, every CPU's share is at least its arrivals and
 * nothing is dropped; if it is over, the shares add up to R. The error is
 * bounded by how fast the traffic moves between CPUs compared to the update
 * period (the daemon's tick, 10 ms: src/tick.rs). This is user-space work
 * once per tick, not per packet.
 *
 * Source fairness (a limited class; the daemon's side is src/fair/mod.rs)
 * ---------------
 * One bucket per class lets a flood take the class's admission in proportion
 * to its arrivals. So while a class is limited the daemon turns on its
 * "fairness" entry and the class has two tiers:
 *   - known sources (the "known" map: clients the service answered while it
 *     was healthy, recorded on egress by sluice_learn below) take the class's
 *     bucket, which the daemon sizes to what they sent, with headroom, each
 *     only up to its own rate (SLUICE_KNOWN_HEADROOM times the rate it was
 *     answered at): past it, a known source's packets are an unknown one's;
 *   - every other source has an entry in the LRU "sources" map, keyed by its
 *     address cut to plen4/plen6 (/32 and /64, or /24 and /48, /16 and /32
 *     when the daemon aggregates), and is paced at its share (one packet
 *     every src_interval_ns, a GCRA: see SLUICE_SRC_BURST_* in sluice.h).
 *     Within its share it takes the unknown tier's bucket; over it, it may
 *     take only the top half of that bucket. So a light source finds tokens
 *     while heavy ones share what the light ones leave, and a lone heavy
 *     source still gets the whole rate (max-min fair and work-conserving).
 *     The daemon sets the share to the max-min one from last epoch's counts
 *     (settings.epoch, its tick: SRC_ACTIVE, SRC_OVER, UNDER_PKTS).
 * All per-packet: one LRU-hash lookup for the source (and an insert for a
 * new one; a clock read only for one that looks over its share), one hash
 * lookup in "known" (and a coarse clock read for a known one), no lock and
 * no atomic: two CPUs counting one source may each miss a count or a step
 * of the other.
 *
 * Verdicts for odd input (also in the README):
 *   - not IPv4/IPv6 (ARP, LLDP, ...): XDP_PASS, counted NON_IP_PASS;
 *   - frame too short for its Ethernet/VLAN header, IP header invalid or
 *     truncated, or IP packet truncated before a complete L4 header:
 *     settings.verdicts[].malformed_verdict (default XDP_DROP), counted MALFORMED_*;
 *   - more VLAN tags or IPv6 extension headers than the parse depth: the
 *     malformed verdict, counted DEPTH_EXCEEDED (info) and MALFORMED_* (its
 *     port is unknown: in the default class it would skip its port's
 *     class and its source's share);
 *   - non-first fragments (no ports): classified by protocol only.
 * In observe mode (settings.verdicts[].observe) every packet counted as dropped above
 * is passed instead, and counted OBSERVED_PASS too.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "sluice.h"
#include "classify.h"
#include "kernel.h"

char LICENSE[] SEC("license") = "GPL";


struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_share);
} shares SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_class_state);
} class_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_fair);
} fairness SEC(".maps");

/*
 * CPU protection (a class's cpu = "away"): while a higher-priority service
 * is in distress, the daemon writes a target CPU + 1 for the class here (0:
 * stay), and the class's admitted packets are redirected to that CPU's
 * entry of `cpus`: their skb is built and their stack work (IP, UDP/TCP,
 * the socket) done by the cpumap kthread there, not on the CPU that runs
 * this program. User space sizes `cpus` to the possible CPUs and fills
 * the entries it targets.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, __u32);
} away SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, 1); /* set to the possible CPUs at load */
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} cpus SEC(".maps");

/* Per-source counts of unknown sources; user space may resize it before load. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_SOURCES_DEFAULT);
	__type(key, struct sluice_src_key);
	__type(value, struct sluice_src);
} sources SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_KNOWN_ENTRIES);
	__type(key, struct sluice_src_key);
	__type(value, struct sluice_known);
} known SEC(".maps");

/*
 * When each peer last sent a learning class a packet (see
 * SLUICE_ASKED_WINDOW_MS): a direct-mapped table, one slot per hash of
 * (class, peer), holding the upper half of that hash as a tag and the gate
 * clock's low 32 bits (ms; they wrap in 49 days, differences do not). A
 * hash map costs this path a lookup with a key compare (measured: +49 ns a
 * packet by `sluice bench gate`); an array slot costs a multiply or two.
 * Two peers on one slot overwrite each other: a real client then loses its
 * note until it asks again (learned later), a peer that asked nothing never
 * gains one unless its 32-bit tag matches too.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_ASKED_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} asked SEC(".maps");

/*
 * Each class's part of "known" (struct sluice_known_part): the new entries
 * it may still make (one taken by the learner per new client) and the
 * entries it holds. One LRU map holds every class's known clients, so
 * without a part of its own a busy class (or whoever it answers) would
 * evict another class's clients. The daemon gives each class an equal part
 * of 90% of the map, and every scan removes a class's oldest entries past
 * its part (src/signals/known.rs, `bound`) and writes room and held again;
 * not yet written: no learning, and no lookup. A client learned between a
 * scan's read and its write is not counted in held until the next scan (5
 * s): if it is its class's only one, it is looked up from then on (it
 * needs a second of answers to be known anyway).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_known_part);
} known_part SEC(".maps");

/* Each TCP class's SYN guard (syncookie.h), written by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_syn_guard);
} syn_guard SEC(".maps");

/* The latest check_until_ms of any class's guard (the daemon writes it with
 * each guard): the checker's one look at a packet while no guard checks. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} syn_guard_any SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_GS_NR);
	__type(key, __u32);
	__type(value, __u64);
} global_stats SEC(".maps");

/* Classes whose arrivals passed their wake mark (sluice_share.wake_at): struct sluice_wake. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} wake SEC(".maps");

/* Run-time settings, written by the daemon through the mmap'ed .data map. */
volatile struct sluice_settings settings = {
	.verdicts = { { .malformed_verdict = XDP_DROP }, { .malformed_verdict = XDP_DROP } },
};

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#include "syncookie.h"

/* The daemon ticks slowly while all is calm: tell it, once per arming,
 * that a class's arrivals on this CPU jumped (its next tick comes at once). */
static __always_inline void wake_daemon(struct sluice_share *sh, __u32 cls)
{
	struct sluice_wake w = { .class_id = cls, .at_ns = bpf_ktime_get_ns() };

	sh->wake_at = 0;
	bpf_ringbuf_output(&wake, &w, sizeof(w), 0);
}

/*
 * Wake the daemon while it ticks slowly if this CPU's arrivals of the class
 * passed the armed count, or came in faster than the armed rate: every
 * SLUICE_WAKE_BATCH packets the clock is read, and a batch that took less
 * than wake_gap_ns wakes it. A count alone lets a class with calm traffic
 * be flooded for most of a calm tick before its mark is reached; the rate
 * costs one clock read per batch, and only while armed.
 */
static __always_inline void check_wake(struct sluice_share *sh, struct sluice_class_state *st, __u32 cls)
{
	__u64 seen = st->cnt[SLUICE_CS_SEEN_PKTS], now, last;

	if (!sh->wake_at)
		return;
	if (seen >= sh->wake_at) {
		wake_daemon(sh, cls);
		return;
	}
	if (!sh->wake_gap_ns || (seen & (SLUICE_WAKE_BATCH - 1)))
		return;
	now = bpf_ktime_get_ns();
	last = st->wake_batch_ns;
	st->wake_batch_ns = now;
	if (last && now - last < sh->wake_gap_ns)
		wake_daemon(sh, cls);
}

static __always_inline void global_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&global_stats, &idx);

	if (v)
		*v += 1;
}

/* What the parser found. */
enum parse_result {
	PARSE_OK,        /* IP packet, slot/port/source filled in */
	PARSE_NON_IP,    /* not IPv4/IPv6 */
	PARSE_MALFORMED, /* truncated or invalid */
	PARSE_DEPTH,     /* headers beyond the parse depth */
};


struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

/*
 * Each parser below promises: it reads only bytes it has checked against
 * data_end, and it either returns PARSE_OK with *pos advanced past the header
 * it parsed, or another parse_result with nothing else changed.
 */

/* Ethernet and up to SLUICE_MAX_VLAN tags. Sets *proto to the inner EtherType (network order). */
static __always_inline int parse_eth(void **pos, void *end, __be16 *proto)
{
	struct ethhdr *eth = *pos;
	void *p = eth + 1;
	__be16 h_proto;

	if (p > end)
		return PARSE_MALFORMED;
	h_proto = eth->h_proto;
#pragma unroll
	for (int i = 0; i < SLUICE_MAX_VLAN; i++) {
		struct vlan_hdr *vh = p;

		if (h_proto != bpf_htons(ETH_P_8021Q) && h_proto != bpf_htons(ETH_P_8021AD))
			break;
		if ((void *)(vh + 1) > end)
			return PARSE_MALFORMED;
		h_proto = vh->proto;
		p = vh + 1;
	}
	if (h_proto == bpf_htons(ETH_P_8021Q) || h_proto == bpf_htons(ETH_P_8021AD))
		return PARSE_DEPTH;
	*pos = p;
	*proto = h_proto;
	return PARSE_OK;
}

/*
 * Destination port of a UDP or TCP header at pos, or the slot/protocol for
 * port-less. pos past the end means the headers before it claimed more bytes
 * than the packet has (an IPv6 extension header's length): malformed.
 */
static __always_inline int parse_l4(void *pos, void *end, __u8 proto, struct pkt *pk, int egress)
{
	__u32 port_off = egress ? 0 : 2;

	if (pos > end)
		return PARSE_MALFORMED;
	switch (proto) {
	case IPPROTO_UDP:
		if (pos + SLUICE_UDP_HLEN > end)
			return PARSE_MALFORMED;
		pk->slot = SLUICE_SLOT_UDP;
		pk->port = bpf_ntohs(*(__be16 *)(pos + port_off));
		return PARSE_OK;
	case IPPROTO_TCP:
		if (pos + SLUICE_TCP_HLEN > end)
			return PARSE_MALFORMED;
		pk->slot = SLUICE_SLOT_TCP;
		pk->port = bpf_ntohs(*(__be16 *)(pos + port_off));
		pk->tcp_flags = *(__u8 *)(pos + 13);
		return PARSE_OK;
	case IPPROTO_ICMP:
		if (pos + SLUICE_ICMP_HLEN > end)
			return PARSE_MALFORMED;
		break;
	case IPPROTO_ICMPV6:
		if (pos + SLUICE_ICMPV6_HLEN > end)
			return PARSE_MALFORMED;
		break;
	}
	pk->slot = SLUICE_SLOT_PORTLESS;
	pk->port = proto;
	return PARSE_OK;
}

static __always_inline int parse_ipv4(void *pos, void *end, struct pkt *pk, int egress)
{
	struct iphdr *ip = pos;
	__u32 hlen;

	if ((void *)(ip + 1) > end)
		return PARSE_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;
	hlen = ip->ihl * 4;
	if (pos + hlen > end)
		return PARSE_MALFORMED;
	pk->family = 4;
	pk->peer4 = egress ? ip->daddr : ip->saddr;
	if (ip->frag_off & bpf_htons(0x1fff)) {
		/* Non-first fragment: no L4 header, classify by protocol only. */
		pk->fragment = 1;
		pk->slot = SLUICE_SLOT_PORTLESS;
		pk->port = ip->protocol;
		return PARSE_OK;
	}
	return parse_l4(pos + hlen, end, ip->protocol, pk, egress);
}

struct ipv6_opt_hdr_min {
	__u8 nexthdr;
	__u8 hdrlen;
};

static __always_inline int parse_ipv6(void *pos, void *end, struct pkt *pk, int egress)
{
	struct ipv6hdr *ip6 = pos;
	__u8 nexthdr;
	void *p;

	if ((void *)(ip6 + 1) > end)
		return PARSE_MALFORMED;
	if (ip6->version != 6)
		return PARSE_MALFORMED;
	pk->family = 6;
	pk->peer6 = egress ? ip6->daddr : ip6->saddr;
	nexthdr = ip6->nexthdr;
	p = ip6 + 1;

#pragma unroll
	for (int i = 0; i < SLUICE_MAX_IPV6_EXT; i++) {
		struct ipv6_opt_hdr_min *eh = p;

		switch (nexthdr) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if ((void *)(eh + 1) > end)
				return PARSE_MALFORMED;
			nexthdr = eh->nexthdr;
			p += (eh->hdrlen + 1) * 8;
			break;
		case IPPROTO_AH:
			if ((void *)(eh + 1) > end)
				return PARSE_MALFORMED;
			nexthdr = eh->nexthdr;
			p += (eh->hdrlen + 2) * 4;
			break;
		case IPPROTO_FRAGMENT: {
			/* 8 bytes: nexthdr, reserved, frag_off (13 bits offset, 2 reserved, M). */
			__be16 *fo = p + 2;

			if (p + 8 > end)
				return PARSE_MALFORMED;
			nexthdr = eh->nexthdr;
			if (*fo & bpf_htons(0xfff8)) {
				pk->fragment = 1;
				pk->slot = SLUICE_SLOT_PORTLESS;
				pk->port = nexthdr;
				return PARSE_OK;
			}
			p += 8;
			break;
		}
		default:
			return parse_l4(p, end, nexthdr, pk, egress);
		}
	}
	switch (nexthdr) {
	case IPPROTO_HOPOPTS:
	case IPPROTO_ROUTING:
	case IPPROTO_DSTOPTS:
	case IPPROTO_AH:
	case IPPROTO_FRAGMENT:
		return PARSE_DEPTH;
	}
	return parse_l4(p, end, nexthdr, pk, egress);
}


/* Credit the time since the last refill (capped at the burst); the tokens now held. */
static __always_inline __u64 bucket_refill(const struct sluice_share *sh, struct sluice_bucket *b)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 cap = sh->burst * SLUICE_TOKEN_SCALE;
	__u64 elapsed = now - b->last_ns;
	__u64 tokens;

	b->last_ns = now;
	if (elapsed >= sh->fill_ns) {
		tokens = cap;
	} else {
		tokens = b->tokens + elapsed * sh->rate_pps;
		if (tokens > cap)
			tokens = cap;
	}
	b->tokens = tokens;
	return tokens;
}

/*
 * Take one token from this CPU's bucket if that leaves at least `reserve`
 * units in it; 1 if it did. The clock is read only when the bucket holds too
 * little (see "Reading the clock"). reserve is 0 but for packets of a
 * source over its share, which may use only the top half of the unknown
 * tier's bucket (see "Source fairness").
 */
static __always_inline int bucket_take_above(const struct sluice_share *sh, struct sluice_bucket *b, __u64 reserve)
{
	__u64 need = reserve + SLUICE_TOKEN_SCALE;

	if (b->tokens >= need) {
		b->tokens -= SLUICE_TOKEN_SCALE;
		return 1;
	}
	if (b->skip) {
		b->skip--;
		return 0;
	}
	if (bucket_refill(sh, b) >= need) {
		b->tokens -= SLUICE_TOKEN_SCALE;
		return 1;
	}
	b->skip = sh->clock_skip;
	return 0;
}

static __always_inline int bucket_take(const struct sluice_share *sh, struct sluice_bucket *b)
{
	return bucket_take_above(sh, b, 0);
}

/* Ethernet, then IPv4 or IPv6 and the L4 header. */
static __always_inline int parse(void *data, void *end, struct pkt *pk, int egress)
{
	void *pos = data;
	__be16 proto = 0;
	int res;

	res = parse_eth(&pos, end, &proto);
	if (res != PARSE_OK)
		return res;
	if (proto == bpf_htons(ETH_P_IP))
		return parse_ipv4(pos, end, pk, egress);
	if (proto == bpf_htons(ETH_P_IPV6))
		return parse_ipv6(pos, end, pk, egress);
	return PARSE_NON_IP;
}

/*
 * The peer's key at prefix length plen (32/64 for one address): the class,
 * the family and the address with the bits past plen cleared. plen is a
 * multiple of 8 (the daemon writes 16, 24, 32, 48 or 64).
 */
static __always_inline void src_key(struct sluice_src_key *k, const struct pkt *pk, __u32 cls, __u32 plen)
{
	k->class_id = cls;
	k->family = pk->family;
	k->plen = plen;
	if (pk->family == 4) {
		__u32 a = bpf_ntohl(pk->peer4);

		a = plen >= 32 ? a : a & ~(0xffffffffU >> plen);
		*(__u32 *)k->addr = bpf_htonl(a);
		return;
	}
	__builtin_memcpy(k->addr, &pk->peer6, 8);
	if (plen < 64)
		*(__u32 *)&k->addr[4] = plen >= 48 ? *(__u32 *)&k->addr[4] & bpf_htonl(0xffff0000) : 0;
}

/* The peer's known entry, if it is known now (answered over the span, within the ttl). */
static __always_inline struct sluice_known *known_entry(const struct pkt *pk, __u32 cls)
{
	struct sluice_src_key k = {};
	struct sluice_known *v;

	struct sluice_known_part *part = bpf_map_lookup_elem(&known_part, &cls);

	/* An array slot, inlined: a class that holds no known client skips the hash lookup. */
	if (!part || !part->held)
		return 0;
	src_key(&k, pk, cls, pk->family == 4 ? 32 : 64);
	v = bpf_map_lookup_elem(&known, &k);
	if (!v || v->last_ms - v->first_ms < SLUICE_KNOWN_SPAN_MS)
		return 0;
	/* Signed: a wall clock stepped back makes a recent answer look newer, not ancient. */
	if ((__s64)(settings.now_ms - v->last_ms) > (__s64)settings.known_ttl_ms)
		return 0;
	return v;
}

/*
 * Is a known source within its own rate (see SLUICE_KNOWN_HEADROOM)? A
 * GCRA on the entry's theoretical arrival time: each packet moves it on by
 * one interval of the source's rate; a packet that finds it more than the
 * burst ahead of now is over. Plain (not atomic) updates: two CPUs may each
 * miss the other's step.
 */
static __always_inline __u32 known_interval(const struct sluice_known *v)
{
	__u64 span = v->last_ms - v->first_ms;
	__u64 pps = (__u64)v->answers * 1000 / (span ? span : 1);
	__u64 interval;

	if (pps < SLUICE_KNOWN_MIN_PPS)
		pps = SLUICE_KNOWN_MIN_PPS;
	interval = 1000000000ULL / (pps * SLUICE_KNOWN_HEADROOM);
	return interval ? interval : 1; /* at most 25 ms: fits */
}

static __always_inline int known_within_rate(struct sluice_known *v)
{
	/* The coarse clock (jiffies) is cheaper to read and fine at the 100 ms tolerance. */
	__u64 now = bpf_ktime_get_coarse_ns(), interval, tolerance;

	/* Computed once per change of the entry's answers (the learner resets it). */
	if (!v->interval_ns)
		v->interval_ns = known_interval(v);
	interval = v->interval_ns;
	tolerance = SLUICE_KNOWN_BURST_MS * 1000000ULL;
	if (tolerance < SLUICE_KNOWN_BURST_PKTS * interval)
		tolerance = SLUICE_KNOWN_BURST_PKTS * interval;
	if (v->tat_ns < now)
		v->tat_ns = now;
	if (v->tat_ns - now > tolerance)
		return 0;
	v->tat_ns += interval;
	return 1;
}

/*
 * Is an unknown source within its share? A GCRA on its theoretical arrival
 * time, as known_within_rate, but on the fine clock: the share's interval is
 * far below the coarse clock's 4 ms tick. Over its share the pace is not
 * moved. The fine clock costs as much as the rest of this path (see
 * "Reading the clock"), so it is read only when a source looks over:
 *   - p->seen_ns is this CPU's last read (0: none yet, read now), and now
 *     is at least that, so a source whose pace is within the tolerance of
 *     seen_ns is within of now, and a light source (the legitimate case)
 *     reads no clock. The price: after a quiet spell with no read, a source
 *     may send one burst paced from the old seen_ns, then, once a read
 *     finds it behind the real now, a second one.
 *   - after a read that finds a source over, the next clock_skip over-share
 *     verdicts on this CPU take seen_ns as now, as the bucket does when it
 *     runs dry. Under a flood that is a few microseconds; its only error is
 *     a source that came back within its share in them going as over.
 */
static __always_inline int src_within_share(struct sluice_src *s, __u32 interval, struct sluice_pacer *p)
{
	__u64 now = p->seen_ns, tolerance;

	if (!interval)
		return 1;
	tolerance = SLUICE_SRC_BURST_PKTS * (__u64)interval;
	if (tolerance < SLUICE_SRC_BURST_NS)
		tolerance = SLUICE_SRC_BURST_NS;
	if (!now || s->tat_ns > now + tolerance) {
		if (p->skip) {
			p->skip--;
			return 0;
		}
		now = bpf_ktime_get_ns();
		p->seen_ns = now;
		if (s->tat_ns > now + tolerance) {
			p->skip = SLUICE_CLOCK_SKIP;
			return 0;
		}
	}
	if (s->tat_ns < now)
		s->tat_ns = now;
	s->tat_ns += interval;
	return 1;
}

/*
 * Count an unknown packet against its source: 1 if the source is within its
 * share, 2 if it is over but took a token from the spare half of the unknown
 * tier's bucket, 0 if it is to be dropped. A source the map has no room for
 * cannot be counted: it is within (the unknown tier's bucket still caps it)
 * and counted SRC_FULL. Over its share, s->drops counts the packet only if
 * it is then dropped.
 */
static __always_inline int within_share(const struct pkt *pk, __u32 cls, const struct sluice_fair *f,
					struct sluice_class_state *st)
{
	struct sluice_src_key k = {};
	__u32 epoch = settings.epoch;
	struct sluice_src *s, fresh = { .epoch = epoch, .over_epoch = epoch - 1 };

	src_key(&k, pk, cls, pk->family == 4 ? f->plen4 : f->plen6);
	s = bpf_map_lookup_elem(&sources, &k);
	if (!s) {
		st->cnt[SLUICE_CS_SRC_INSERTS] += 1;
		bpf_map_update_elem(&sources, &k, &fresh, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&sources, &k);
		if (!s) {
			st->cnt[SLUICE_CS_SRC_FULL] += 1;
			return 1;
		}
	}
	if (s->epoch != epoch) {
		s->epoch = epoch;
		s->pkts = 0;
	}
	/* Plain (not atomic) updates: two CPUs counting one source may lose a count. */
	s->pkts += 1;
	if (s->pkts == 1)
		st->cnt[SLUICE_CS_SRC_ACTIVE] += 1;
	if (src_within_share(s, f->src_interval_ns, &st->pacer))
		return 1;
	if (s->over_epoch != epoch) {
		s->over_epoch = epoch;
		st->cnt[SLUICE_CS_SRC_OVER] += 1;
	}
	/* Over its share: the top half of the unknown tier's bucket only. */
	if (bucket_take_above(&f->unknown, &st->unknown, f->unknown.burst * (SLUICE_TOKEN_SCALE / 2)))
		return 2;
	s->drops += 1;
	return 0;
}

/* Count a packet in one of the class's verdict pairs (packets, bytes). */
static __always_inline void verdict_add(struct sluice_class_state *st, __u32 idx, __u64 bytes)
{
	if (idx + 1 < SLUICE_CS_NR) {
		st->cnt[idx] += 1;
		st->cnt[idx + 1] += bytes;
	}
}

/*
 * A limited class: with source fairness on, known sources take the class's
 * bucket and unknown ones their share, then the unknown tier's bucket.
 * Returns the verdict counter pair (SLUICE_CS_*_PKTS) the packet lands in.
 */
static __always_inline __u32 admit_limited(const struct pkt *pk, __u32 cls, const struct sluice_share *sh,
					   struct sluice_class_state *st, struct sluice_fair *f)
{
	if (!f || !f->on || pk->family == 0)
		return bucket_take(sh, &st->bucket) ? SLUICE_CS_ADMIT_PKTS : SLUICE_CS_DROP_RATE_PKTS;
	struct sluice_known *v = known_entry(pk, cls);

	if (v && known_within_rate(v)) {
		st->cnt[SLUICE_CS_KNOWN_PKTS] += 1;
		if (!bucket_take(sh, &st->bucket))
			return SLUICE_CS_DROP_RATE_PKTS;
		st->cnt[SLUICE_CS_KNOWN_ADMIT_PKTS] += 1;
		return SLUICE_CS_ADMIT_PKTS;
	}
	if (v)
		st->cnt[SLUICE_CS_KNOWN_OVER_PKTS] += 1;
	st->cnt[SLUICE_CS_UNKNOWN_PKTS] += 1;
	switch (within_share(pk, cls, f, st)) {
	case 0:
		return SLUICE_CS_DROP_SHARE_PKTS;
	case 2:
		return SLUICE_CS_ADMIT_PKTS; /* over its share, from the spare half of the bucket */
	}
	st->cnt[SLUICE_CS_UNDER_PKTS] += 1;
	return bucket_take(&f->unknown, &st->unknown) ? SLUICE_CS_ADMIT_PKTS : SLUICE_CS_DROP_RATE_PKTS;
}

/* A 64-bit hash of a source key (class, family, the first 8 address bytes: an IPv4 address or an IPv6 /64). */
static __always_inline __u64 peer_hash(const struct sluice_src_key *k)
{
	__u64 h = *(const __u64 *)k->addr ^ ((__u64)k->class_id << 8 | k->family);

	/* The 64-bit finaliser of MurmurHash3: every input bit moves every output bit. */
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

/* The peer's slot in "asked", and the tag its note carries in the slot's upper half. */
static __always_inline __u64 *asked_slot(const struct pkt *pk, __u32 cls, __u32 *tag)
{
	struct sluice_src_key k = {};
	__u64 h;
	__u32 slot;

	src_key(&k, pk, cls, pk->family == 4 ? 32 : 64);
	h = peer_hash(&k);
	slot = h & (SLUICE_ASKED_SLOTS - 1);
	*tag = h >> 32;
	return bpf_map_lookup_elem(&asked, &slot);
}

/*
 * Note that the peer asked a learning class something (the learner then
 * takes the service's replies to it as answers). Written at most once per
 * SLUICE_ASKED_REFRESH_MS per peer. Nothing while the class does not learn
 * (a limited class, a flood).
 */
static __always_inline void note_asked(const struct pkt *pk, __u32 cls, const struct sluice_fair *f)
{
	__u32 now = settings.now_ms, tag;
	__u64 *v;

	if (!f || !f->learn || !settings.now_ms)
		return;
	v = asked_slot(pk, cls, &tag);
	if (v && ((__u32)(*v >> 32) != tag || now - (__u32)*v >= SLUICE_ASKED_REFRESH_MS))
		*v = (__u64)tag << 32 | now;
}

/* Did the peer ask the class something in the last SLUICE_ASKED_WINDOW_MS? */
static __always_inline int peer_asked(const struct pkt *pk, __u32 cls, __u64 now_ms)
{
	__u32 tag;
	__u64 *v = asked_slot(pk, cls, &tag);

	return v && (__u32)(*v >> 32) == tag && (__u32)now_ms - (__u32)*v <= SLUICE_ASKED_WINDOW_MS;
}

/*
 * SYN cookies at the driver (syncookie.h has the why and the cookie). The
 * cookie paths take TCP over IPv4 without options or IPv6 with TCP as the
 * first next header; anything else goes the normal way.
 */
#define COOKIE_L3_MAX (ETH_HLEN + 4 * SLUICE_MAX_VLAN)
#define SYNACK_TCP_LEN 40 /* the SYN-ACK's TCP header: 20 bytes and 20 of options */

#define COOKIE_NO_L3 0xffff

/*
 * Mask an offset already checked against COOKIE_L3_MAX, in an instruction
 * the compiler cannot drop: it knows the bound and would otherwise use the
 * unmasked copy, whose bound the verifier has lost through a spill.
 */
static __always_inline void cookie_bound(__u32 *off)
{
	__u32 v = *off;

	asm volatile("%[v] &= 0x1f" : [v] "+r"(v));
	*off = v;
}
/*
 * The IP header's offset in the frame (at most COOKIE_L3_MAX), or
 * COOKIE_NO_L3 if the cookie paths do not take the frame; *family 4 or 6.
 */
static __always_inline __u32 cookie_l3(void *data, void *end, __u32 *family)
{
	void *pos = data;
	__be16 proto = 0;

	if (parse_eth(&pos, end, &proto) != PARSE_OK)
		return COOKIE_NO_L3;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = pos;

		if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_TCP ||
		    (ip->frag_off & bpf_htons(0x3fff)))
			return COOKIE_NO_L3;
		*family = 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = pos;

		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_TCP)
			return COOKIE_NO_L3;
		*family = 6;
	} else {
		return COOKIE_NO_L3;
	}
	return pos - data;
}

/*
 * The TCP header of a frame the cookie paths take, its fixed 20 bytes
 * within the frame, or NULL. *l3 is then the IP header's offset (at most
 * COOKIE_L3_MAX, bounded for the verifier) and *family 4 or 6.
 */
static __always_inline struct tcphdr *cookie_tcp(void *data, void *end, __u32 *l3, __u32 *family)
{
	__u32 off = cookie_l3(data, end, family);
	struct tcphdr *th;

	if (off > COOKIE_L3_MAX)
		return NULL;
	cookie_bound(&off);
	th = data + off + (*family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr));
	if ((void *)(th + 1) > end)
		return NULL;
	*l3 = off;
	return th;
}

/* The client's and the server's addresses of a segment the client sent (ip: its IP header, bounds checked). */
static __always_inline void cookie_addrs_of(const void *ip, __u32 family, struct cookie_addrs *a)
{
	a->family = family;
	if (family == 4) {
		a->words[0] = ((const struct iphdr *)ip)->saddr;
		a->words[1] = ((const struct iphdr *)ip)->daddr;
		return;
	}
	__builtin_memcpy(a->words, &((const struct ipv6hdr *)ip)->saddr, 32);
}

/* The socket lookup's tuple of a segment the client sent; its size. */
static __always_inline __u32 cookie_tuple(const struct cookie_addrs *a, const struct tcphdr *th,
					  struct bpf_sock_tuple *t)
{
	if (a->family == 4) {
		t->ipv4.saddr = a->words[0];
		t->ipv4.daddr = a->words[1];
		t->ipv4.sport = th->source;
		t->ipv4.dport = th->dest;
		return sizeof(t->ipv4);
	}
	__builtin_memcpy(t->ipv6.saddr, &a->words[0], 16);
	__builtin_memcpy(t->ipv6.daddr, &a->words[4], 16);
	t->ipv6.sport = th->source;
	t->ipv6.dport = th->dest;
	return sizeof(t->ipv6);
}

/* Is this listening socket MPTCP's (the kernel refuses it a gate cookie's request socket)? */
static __always_inline int is_mptcp(struct bpf_sock *skc)
{
	struct tcp_sock *tp;

	if (!bpf_core_field_exists(struct tcp_sock, is_mptcp))
		return 0; /* a kernel without MPTCP */
	tp = bpf_skc_to_tcp_sock(skc);
	return tp && tp->is_mptcp;
}

/*
 * Does the socket lookup of a segment's 4-tuple find the listener itself?
 * For a SYN: the gate answers only then, and only for a listener that
 * takes a gate cookie (`for_cookie`: not MPTCP's). It finds another socket
 * for a SYN that reuses the 4-tuple of one in TIME_WAIT (a client cycling
 * connections fast): the kernel must take that SYN, as only it can retire
 * the old socket (a cookie's ACK would meet the TIME_WAIT socket and never
 * open the connection). It finds none for a closed port: the kernel's RST.
 */
static __always_inline int finds_listener(struct xdp_md *ctx, const struct cookie_addrs *a, const struct tcphdr *th,
					  int for_cookie)
{
	struct bpf_sock_tuple tuple = {};
	__u32 size = cookie_tuple(a, th, &tuple);
	struct bpf_sock *skc = bpf_skc_lookup_tcp(ctx, &tuple, size, BPF_F_CURRENT_NETNS, 0);
	int listener;

	if (!skc)
		return 0;
	listener = skc->state == BPF_TCP_LISTEN && !(for_cookie && is_mptcp(skc));
	bpf_sk_release(skc);
	return listener;
}

/*
 * Conntrack's view (the nf_conntrack kfuncs, Linux 6.0; absent without
 * nf_conntrack: then nothing is tracked and nothing is NATed). A segment
 * to a port the namespace DNATs elsewhere (a published container port
 * whose host side a proxy listens on) finds only that listener at the
 * socket lookup, its own socket being the NAT target's: conntrack holds
 * its connection. The opts in their first, 12-byte form, which every
 * kernel with the kfuncs takes.
 */
struct bpf_ct_opts___sl {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};
/* Never read here; a struct (not a forward declaration) for libbpf to match the kfuncs' types. */
struct nf_conn {
	__u64 _opaque;
};
extern struct nf_conn *bpf_xdp_ct_lookup(struct xdp_md *xdp_ctx, struct bpf_sock_tuple *bpf_tuple, __u32 tuple__sz,
					 struct bpf_ct_opts___sl *opts, __u32 opts__sz) __ksym __weak;
extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb_ctx, struct bpf_sock_tuple *bpf_tuple, __u32 tuple__sz,
					 struct bpf_ct_opts___sl *opts, __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *ct) __ksym __weak;

/* Does conntrack hold a connection of this segment's 4-tuple (XDP)? */
static __always_inline int xdp_tracked(struct xdp_md *ctx, const struct cookie_addrs *a, const struct tcphdr *th)
{
	struct bpf_ct_opts___sl opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = IPPROTO_TCP };
	struct bpf_sock_tuple tuple = {};
	__u32 size = cookie_tuple(a, th, &tuple);
	struct nf_conn *ct;

	if (!bpf_xdp_ct_lookup || !bpf_ct_release)
		return 0;
	ct = bpf_xdp_ct_lookup(ctx, &tuple, size, &opts, sizeof(opts));
	if (!ct)
		return 0;
	bpf_ct_release(ct);
	return 1;
}

/* The SYN-ACK's TCP header at t (40 bytes, bounds checked), checksum 0. */
static __always_inline void synack_tcp(struct tcphdr *t, const struct syn_opts *o, __be16 cport, __be16 sport,
				       __u32 isn, __u32 cookie, __u16 mss)
{
	__u8 *op = (__u8 *)(t + 1);

	t->source = sport;
	t->dest = cport;
	t->seq = bpf_htonl(cookie);
	t->ack_seq = bpf_htonl(isn + 1);
	((__u8 *)t)[12] = (SYNACK_TCP_LEN / 4) << 4;
	((__u8 *)t)[13] = TCP_FLAG_SYN | TCP_FLAG_ACK;
	t->window = bpf_htons(65535);
	t->check = 0;
	t->urg_ptr = 0;
	/* MSS (4), SACK-permitted or 2 NOPs, timestamps or 10 NOPs, NOP + window scale or 4 NOPs. */
	*(__be32 *)op = bpf_htonl(TCPOPT_MSS << 24 | 4 << 16 | mss);
	*(__be16 *)(op + 4) = bpf_htons(o->sack ? (TCPOPT_SACK_PERM << 8 | 2) : (TCPOPT_NOP << 8 | TCPOPT_NOP));
	if (o->ts) {
		*(__be16 *)(op + 6) = bpf_htons(TCPOPT_TIMESTAMP << 8 | 10);
		*(__be32 *)(op + 8) = bpf_htonl((__u32)settings.now_ms);
		*(__be32 *)(op + 12) = bpf_htonl(o->tsval);
	} else {
		*(__be16 *)(op + 6) = bpf_htons(TCPOPT_NOP << 8 | TCPOPT_NOP);
		*(__be32 *)(op + 8) = 0x01010101;
		*(__be32 *)(op + 12) = 0x01010101;
	}
	if (o->wscale != COOKIE_WSCALE_NONE)
		*(__be32 *)(op + 16) = bpf_htonl(TCPOPT_NOP << 24 | TCPOPT_WINDOW << 16 | 3 << 8 | SLUICE_COOKIE_WSCALE);
	else
		*(__be32 *)(op + 16) = 0x01010101;
}

/* The TCP checksum of the 40-byte header at t, given the pseudo header's address words summed. */
static __always_inline __sum16 synack_csum(struct tcphdr *t, __u64 pseudo)
{
	__s64 sum = bpf_csum_diff(0, 0, (__be32 *)t, SYNACK_TCP_LEN, 0);

	if (sum < 0)
		return 0;
	return ~csum_fold32(pseudo + (__u32)sum);
}

static __always_inline void swap_macs(struct ethhdr *eth)
{
	__u8 mac[ETH_ALEN];

	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
}

/* Turn the (resized) frame into the SYN-ACK, IPv4. 0 if it is too short (cannot happen after the resize). */
static __always_inline int synack_v4(void *data, void *end, __u32 l3, const struct syn_opts *o, __be16 cport,
				     __be16 sport, __u32 isn, __u32 cookie)
{
	struct iphdr *ip = data + l3;
	struct tcphdr *t = (void *)(ip + 1);
	__be32 client;
	__s64 sum;

	if ((void *)t + SYNACK_TCP_LEN > end || data + ETH_HLEN > end)
		return 0;
	swap_macs(data);
	client = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = client;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(*ip) + SYNACK_TCP_LEN);
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF */
	ip->ttl = 64;
	ip->check = 0;
	sum = bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0);
	ip->check = sum < 0 ? 0 : ~csum_fold32((__u32)sum);
	synack_tcp(t, o, cport, sport, isn, cookie, settings.syn_mss4 ? settings.syn_mss4 : 1460);
	t->check = synack_csum(t, (__u64)ip->saddr + ip->daddr + bpf_htons(IPPROTO_TCP) + bpf_htons(SYNACK_TCP_LEN));
	return 1;
}

static __always_inline int synack_v6(void *data, void *end, __u32 l3, const struct syn_opts *o, __be16 cport,
				     __be16 sport, __u32 isn, __u32 cookie)
{
	struct ipv6hdr *ip6 = data + l3;
	struct tcphdr *t = (void *)(ip6 + 1);
	struct in6_addr client;
	__u64 pseudo = bpf_htonl(SYNACK_TCP_LEN) + bpf_htonl(IPPROTO_TCP);

	if ((void *)t + SYNACK_TCP_LEN > end || data + ETH_HLEN > end)
		return 0;
	swap_macs(data);
	client = ip6->saddr;
	ip6->saddr = ip6->daddr;
	ip6->daddr = client;
	*(__be32 *)ip6 = bpf_htonl(0x60000000); /* version 6, no traffic class, no flow label */
	ip6->payload_len = bpf_htons(SYNACK_TCP_LEN);
	ip6->hop_limit = 64;
#pragma unroll
	for (int i = 0; i < 4; i++)
		pseudo += (__u64)ip6->saddr.in6_u.u6_addr32[i] + ip6->daddr.in6_u.u6_addr32[i];
	synack_tcp(t, o, cport, sport, isn, cookie, settings.syn_mss6 ? settings.syn_mss6 : 1440);
	t->check = synack_csum(t, pseudo);
	return 1;
}

/* Keep only the options the namespace lets a gate cookie carry (settings.syn_allow). */
static __always_inline void syn_opts_allowed(struct syn_opts *o)
{
	if (!(settings.syn_allow & SLUICE_SYN_SACK))
		o->sack = 0;
	if (!(settings.syn_allow & SLUICE_SYN_TS))
		o->ts = 0;
	if (!(settings.syn_allow & SLUICE_SYN_WSCALE))
		o->wscale = COOKIE_WSCALE_NONE;
}

/*
 * Answer a SYN with a cookie SYN-ACK built in its own frame (the caller
 * returns XDP_TX). 1 if the frame now holds the SYN-ACK; 0 if the SYN goes
 * the normal way: a header the cookie paths do not take, no gate clock or
 * key yet, no listener found for it (see finds_listener), a frame that
 * cannot be resized. A SYN's data, if any, is not
 * kept (the client sends it again, as after the kernel's own cookies).
 */
static __always_inline int syn_answer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct cookie_addrs a = {};
	struct syn_opts o = {};
	__u64 slot = cookie_slot();
	__u32 family = 0, iplen, isn, cookie, bits, len;
	__be16 cport, sport;
	struct tcphdr *th;
	__u32 l3;

	if (!slot || !(settings.syn_key[0] | settings.syn_key[1]))
		return 0;
	th = cookie_tcp(data, end, &l3, &family);
	if (!th || th->doff < 5)
		return 0;
	iplen = family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	if ((void *)th - data > COOKIE_L3_MAX + sizeof(struct ipv6hdr))
		return 0;
	cookie_addrs_of(data + l3, family, &a);
	if (!finds_listener(ctx, &a, th, 1))
		return 0;
	syn_opts_read(data, end, (void *)(th + 1) - data, (void *)th - data + th->doff * 4, &o);
	syn_opts_allowed(&o);
	isn = bpf_ntohl(th->seq);
	cport = th->source;
	sport = th->dest;
	bits = cookie_data(&o, family) | ((slot & 1) ? COOKIE_SLOT_BIT : 0);
	cookie = cookie_make(&a, cport, sport, isn, bits, slot);
	len = l3 + iplen + SYNACK_TCP_LEN;
	if (len != end - data && bpf_xdp_adjust_tail(ctx, (int)len - (int)(end - data)))
		return 0; /* a Linux SYN is the SYN-ACK's size already */
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (family == 4)
		return synack_v4(data, end, l3, &o, cport, sport, isn, cookie);
	return synack_v6(data, end, l3, &o, cport, sport, isn, cookie);
}

/* Does the gate answer this SYN (a class whose guard says answer, a client not known)? */
static __always_inline int syn_guarded(const struct pkt *pk, __u32 gen, __u32 cls, struct sluice_class_state *st)
{
	struct sluice_syn_guard *g;

	if (pk->slot != SLUICE_SLOT_TCP || (pk->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
		return 0;
	st->cnt[SLUICE_CS_SYN_PKTS] += 1;
	if (pk->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN))
		return 0; /* SYN+FIN, SYN+RST: the normal way (the kernel refuses them) */
	g = bpf_map_lookup_elem(&syn_guard, &cls);
	if (!g || !g->answer || settings.verdicts[gen].observe || !(settings.syn_allow & SLUICE_SYN_COOKIES))
		return 0; /* tcp_syncookies = 0: the listener would ignore the cookie's request socket */
	/* A known client takes the kernel's own path, with every option it offered. */
	return !known_entry(pk, cls);
}

/*
 * Does a valid cookie open the connection this ACK completes: the gate's
 * (the checker then hands the listener a request socket) or the kernel's
 * own (sent before the guard engaged, or to a known client)?
 */
static __always_inline int ack_has_cookie(void *ip, struct tcphdr *th, const struct cookie_addrs *a)
{
	__u32 bits;

	if (cookie_check(a, th->source, th->dest, bpf_ntohl(th->seq) - 1, bpf_ntohl(th->ack_seq) - 1, &bits))
		return 1;
	if (a->family == 4)
		return bpf_tcp_raw_check_syncookie_ipv4(ip, th) == 0;
	return bpf_tcp_raw_check_syncookie_ipv6(ip, th) == 0;
}

/*
 * While a class's SYN guard answers (a SYN flood, often with ACKs and RSTs
 * of random sequence numbers beside it), is this ACK or RST one of no
 * connection, to drop? It is if the socket lookup finds only the listener
 * and it is an RST, or an ACK with no valid cookie: the kernel would spend a
 * lookup and a RST on each. Packets of established, TIME_WAIT and
 * half-open connections find their own socket and pass; a closed port
 * finds none (the kernel's RST, as before); a connection NATed elsewhere
 * (its socket the NAT target's) is conntrack's, asked last (xdp_tracked).
 * Costs a socket lookup per TCP packet of the class, only while the guard
 * answers, and a conntrack lookup per packet it would drop.
 */
static __always_inline int no_connection(struct xdp_md *ctx, const struct pkt *pk, __u32 cls)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct sluice_syn_guard *g;
	struct cookie_addrs a = {};
	struct tcphdr *th;
	__u32 family = 0, l3;
	void *ip;

	if (pk->slot != SLUICE_SLOT_TCP || (pk->tcp_flags & TCP_FLAG_SYN) ||
	    !(pk->tcp_flags & (TCP_FLAG_ACK | TCP_FLAG_RST)))
		return 0;
	g = bpf_map_lookup_elem(&syn_guard, &cls);
	if (!g || !g->answer)
		return 0;
	th = cookie_tcp(data, end, &l3, &family);
	if (!th)
		return 0;
	ip = data + l3;
	if (ip + sizeof(struct ipv6hdr) > end)
		return 0;
	cookie_addrs_of(ip, family, &a);
	if (!finds_listener(ctx, &a, th, 0))
		return 0;
	if (!(pk->tcp_flags & TCP_FLAG_RST) && ack_has_cookie(ip, th, &a))
		return 0;
	/* Last, for what the rest would drop: a NATed connection's segments. */
	return !xdp_tracked(ctx, &a, th);
}

/* An admitted packet: passed here, or sent away (see `away`). */
static __always_inline int pass_or_away(__u32 cls, struct sluice_class_state *st)
{
	__u32 *to = bpf_map_lookup_elem(&away, &cls);

	if (!to || *to == 0 || *to - 1 == bpf_get_smp_processor_id())
		return XDP_PASS;
	st->cnt[SLUICE_CS_AWAY_PKTS] += 1;
	/* An empty target entry: XDP_PASS here (the low bits of flags). */
	return bpf_redirect_map(&cpus, *to - 1, XDP_PASS);
}

/*
 * A packet counted as dropped: XDP_DROP, or in observe mode (an operator
 * trying sluice out) XDP_PASS, counted OBSERVED_PASS: every counter then
 * says what enforcing would have done, and nothing is lost.
 */
static __always_inline int observe_drop(__u32 gen)
{
	if (!settings.verdicts[gen].observe)
		return XDP_DROP;
	global_inc(SLUICE_GS_OBSERVED_PASS);
	return XDP_PASS;
}

SEC("xdp")
int sluice_gate(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u64 bytes = end - data;
	struct pkt pk = {};
	__u32 gen = tables_in_force(), cls, idx;

	switch (parse(data, end, &pk, 0)) {
	case PARSE_OK:
		if (pk.fragment)
			global_inc(SLUICE_GS_FRAGMENTS);
		cls = classify(&pk, gen, settings.verdicts[gen].default_class);
		break;
	case PARSE_NON_IP:
		global_inc(SLUICE_GS_NON_IP_PASS);
		return XDP_PASS;
	case PARSE_DEPTH:
		/* Its port is unknown: classed, it would skip its port's class
		 * and its source's share. It is malformed input. */
		global_inc(SLUICE_GS_DEPTH_EXCEEDED);
		/* fall through */
	default:
		if (settings.verdicts[gen].malformed_verdict == XDP_PASS) {
			global_inc(SLUICE_GS_MALFORMED_PASS);
			return XDP_PASS;
		}
		global_inc(SLUICE_GS_MALFORMED_DROP);
		return observe_drop(gen);
	}

	cls &= SLUICE_CLASS_IDS - 1;
	struct sluice_share *sh = bpf_map_lookup_elem(&shares, &cls);
	struct sluice_class_state *st = bpf_map_lookup_elem(&class_state, &cls);
	/* This CPU's source fairness of the class: the learner's note and a limited class's tiers. */
	struct sluice_fair *f = bpf_map_lookup_elem(&fairness, &cls);

	if (!sh || !st)
		return XDP_PASS; /* cannot happen: cls < max_entries */

	st->cnt[SLUICE_CS_SEEN_PKTS] += 1;
	st->cnt[SLUICE_CS_SEEN_BYTES] += bytes;
	check_wake(sh, st, cls);
	if (pk.family)
		note_asked(&pk, cls, f);
	if (syn_guarded(&pk, gen, cls, st) && syn_answer(ctx)) {
		verdict_add(st, SLUICE_CS_SYNACK_PKTS, bytes);
		return XDP_TX;
	}
	if (no_connection(ctx, &pk, cls)) {
		verdict_add(st, SLUICE_CS_DROP_NOCONN_PKTS, bytes);
		return observe_drop(gen);
	}
	if (sh->mode == SLUICE_MODE_BLOCKED)
		idx = SLUICE_CS_DROP_BLOCKED_PKTS;
	else if (sh->mode == SLUICE_MODE_LIMITED)
		idx = admit_limited(&pk, cls, sh, st, f);
	else
		idx = SLUICE_CS_ADMIT_PKTS;
	verdict_add(st, idx, bytes);
	return idx == SLUICE_CS_ADMIT_PKTS ? pass_or_away(cls, st) : observe_drop(gen);
}

/*
 * The egress learner (TC, tcx egress of the gate's interface): a packet the
 * service sends from a port of a class to a client that asked the class
 * something (see SLUICE_ASKED_WINDOW_MS) makes that client known for the
 * class, while the class's fairness says learn (the daemon sets it after a
 * calm second: the class dropped nothing and its service was healthy). A
 * client first noted in a window the daemon did not confirm (taint_*_ms in
 * struct sluice_fair) starts its span again at its next answer. The
 * class is the one of the service's port (its cell), as ingress would
 * classify a packet to that port without source-prefix rules. For TCP only
 * a packet of a completed handshake counts: a SYN-ACK or RST proves nothing
 * (a spoofed SYN or ACK gets one) and is skipped. It never changes the
 * packet's fate.
 */
SEC("tc")
int sluice_learn(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct sluice_src_key k = {};
	struct sluice_known *v, fresh = {};
	struct sluice_known_part *part;
	struct pkt pk = {};
	__u32 cls;
	__u64 now;
	struct sluice_fair *f;
	struct sluice_cell *cell;

	if (parse(data, end, &pk, 1) != PARSE_OK || pk.slot == SLUICE_SLOT_PORTLESS)
		return TC_ACT_OK;
	if (pk.slot == SLUICE_SLOT_TCP && (pk.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_RST)))
		return TC_ACT_OK;
	cell = cell_of(tables_in_force(), pk.slot, pk.port);
	if (!cell)
		return TC_ACT_OK;
	cls = cell->class_id & (SLUICE_CLASS_IDS - 1);
	f = bpf_map_lookup_elem(&fairness, &cls);
	if (!f || !f->learn)
		return TC_ACT_OK;
	now = settings.now_ms;
	if (!now)
		return TC_ACT_OK; /* the daemon has not set the clock yet */
	src_key(&k, &pk, cls, pk.family == 4 ? 32 : 64);
	v = bpf_map_lookup_elem(&known, &k);
	/* A known source answered within SLUICE_LEARN_REFRESH_MS: the answer
	 * counts (the rate a client is known at is its answers over its span),
	 * nothing else is noted. A busy service's every reply would otherwise
	 * move its client's times (and look up who asked) on the service's own
	 * CPU. (Plain increment: two CPUs answering one client may lose one.) */
	if (v && now - v->last_ms < SLUICE_LEARN_REFRESH_MS) {
		if (v->answers != 0xffffffff)
			v->answers += 1;
		return TC_ACT_OK;
	}
	if (!peer_asked(&pk, cls, now)) {
		global_inc(SLUICE_GS_UNASKED);
		return TC_ACT_OK;
	}
	if (v) {
		if (v->first_ms >= f->taint_from_ms && v->first_ms <= f->taint_to_ms) {
			/* First noted in a window the daemon did not confirm: its span starts now. */
			v->first_ms = now;
			v->answers = 0;
		}
		v->last_ms = now;
		if (v->answers != 0xffffffff)
			v->answers += 1;
		v->interval_ns = 0; /* its own rate changed: the gate computes it again */
		return TC_ACT_OK;
	}
	part = bpf_map_lookup_elem(&known_part, &cls);
	if (!part || part->room <= 0)
		return TC_ACT_OK; /* the class's part of the map is full until the daemon's next scan */
	fresh.answers = 1;
	fresh.first_ms = now;
	fresh.last_ms = now;
	if (!bpf_map_update_elem(&known, &k, &fresh, BPF_NOEXIST)) {
		__sync_fetch_and_add(&part->room, -1);
		__sync_fetch_and_add(&part->held, 1);
	}
	return TC_ACT_OK;
}

/*
 * Did the loaded checker find the kfunc (1) or not (2; 0: never run)? The
 * daemon test-runs the checker once at start and reads this: libbpf leaves
 * a weak kfunc it cannot match to the kernel's at 0 without a word.
 */
volatile __u32 cookie_kfunc;

extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk, struct bpf_tcp_req_attrs *attrs,
				   int attrs__sz) __ksym __weak;

/* The request socket's options from a valid cookie's bits and the ACK's own options. */
static __always_inline void cookie_attrs(__u32 bits, __u32 family, const struct syn_opts *ack,
					 struct bpf_tcp_req_attrs *r)
{
	__u32 mssind = (bits >> COOKIE_MSS_SHIFT) & 3;

	r->mss = cookie_mss(family, mssind);
	r->snd_wscale = bits & COOKIE_WSCALE_NONE;
	r->wscale_ok = r->snd_wscale != COOKIE_WSCALE_NONE;
	if (!r->wscale_ok)
		r->snd_wscale = 0;
	r->rcv_wscale = r->wscale_ok ? SLUICE_COOKIE_WSCALE : 0;
	r->sack_ok = !!(bits & COOKIE_SACK);
	/* The SYN-ACK offered no timestamps where the namespace has them off. */
	r->tstamp_ok = ack->ts && (settings.syn_allow & SLUICE_SYN_TS);
	r->rcv_tsval = ack->tsval;
	r->rcv_tsecr = ack->tsecr;
}

/* Does conntrack hold a connection of this 4-tuple (tc)? */
static __always_inline int skb_tracked(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 size)
{
	struct bpf_ct_opts___sl opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = IPPROTO_TCP };
	struct nf_conn *ct;

	if (!bpf_skb_ct_lookup || !bpf_ct_release)
		return 0;
	ct = bpf_skb_ct_lookup(skb, tuple, size, &opts, sizeof(opts));
	if (!ct)
		return 0;
	bpf_ct_release(ct);
	return 1;
}

/* What the checker found in an ACK to a class whose guard checks them. */
enum cookie_verdict {
	COOKIE_NOT_LISTENER = -1, /* a connection's own ACK, or no socket: nothing to check */
	COOKIE_NONE = 0,          /* no gate cookie: the kernel decides (a RST, or its own cookie) */
	COOKIE_TAKEN = 1,         /* a valid gate cookie: the listener has its request socket */
	COOKIE_REFUSED = 2,       /* a valid gate cookie the kernel refused a request socket for */
};

/*
 * Check an ACK to a listening socket for a gate cookie; hand the listener a
 * request socket if it carries one. A refused one (an option or a listener
 * the kernel does not take: the gate's SYN-ACKs avoid both, see
 * syn_opts_allowed and is_mptcp) leaves the ACK to the kernel, as without
 * sluice.
 */
static __always_inline enum cookie_verdict cookie_ack(struct __sk_buff *skb, void *data, void *end, void *ip, struct tcphdr *th,
				      __u32 family)
{
	struct bpf_tcp_req_attrs r = {};
	struct bpf_sock_tuple tuple = {};
	struct cookie_addrs a = {};
	struct syn_opts o = {};
	struct bpf_sock *skc;
	struct tcp_sock *tp;
	__u32 size, bits = 0;
	enum cookie_verdict ret = COOKIE_NONE;

	cookie_addrs_of(ip, family, &a);
	size = cookie_tuple(&a, th, &tuple);
	skc = bpf_skc_lookup_tcp(skb, &tuple, size, BPF_F_CURRENT_NETNS, 0);
	if (!skc)
		return COOKIE_NOT_LISTENER; /* no socket: the kernel answers with a RST */
	if (skc->state != BPF_TCP_LISTEN) {
		bpf_sk_release(skc);
		return COOKIE_NOT_LISTENER;
	}
	if (!cookie_check(&a, th->source, th->dest, bpf_ntohl(th->seq) - 1, bpf_ntohl(th->ack_seq) - 1, &bits)) {
		if (skb_tracked(skb, &tuple, size))
			ret = COOKIE_NOT_LISTENER; /* a NATed connection's: its socket is the target's */
		goto out;
	}
	syn_opts_read(data, end, (void *)(th + 1) - data, (void *)th - data + th->doff * 4, &o);
	cookie_attrs(bits, family, &o, &r);
	tp = bpf_skc_to_tcp_sock(skc);
	ret = tp && !bpf_sk_assign_tcp_reqsk(skb, (struct sock *)tp, &r, sizeof(r)) ? COOKIE_TAKEN : COOKIE_REFUSED;
out:
	bpf_sk_release(skc);
	return ret;
}

/*
 * The cookie checker (TC, tcx ingress of the gate's interface): an ACK to a
 * class whose SYN guard is on (or was, within a cookie's life) that finds
 * only a listening socket is checked for a gate cookie. A valid one gets a
 * request socket with the options the cookie kept (the listener then
 * completes the connection as for its own cookie); any other goes on to
 * the kernel, counted. It never drops.
 */
SEC("tc")
int sluice_cookie_ack(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct sluice_class_state *st;
	struct sluice_syn_guard *g;
	struct pkt pk = {};
	struct tcphdr *th;
	__u32 gen, cls, family = 0, l3;
	enum cookie_verdict ok;

	__u32 kfunc = bpf_sk_assign_tcp_reqsk ? 1 : 2;
	__u32 zero = 0;
	__u64 *until;

	/* Written once: a word every CPU only reads stays in every cache. */
	if (cookie_kfunc != kfunc)
		cookie_kfunc = kfunc;
	if (!bpf_sk_assign_tcp_reqsk)
		return TC_ACT_OK; /* a kernel before 6.9: the daemon never turns answering on */
	/* No class's guard checks ACKs now (the usual case): nothing to parse. */
	until = bpf_map_lookup_elem(&syn_guard_any, &zero);
	if (!until || *until < settings.now_ms)
		return TC_ACT_OK;
	if (parse(data, end, &pk, 0) != PARSE_OK || pk.slot != SLUICE_SLOT_TCP ||
	    (pk.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) != TCP_FLAG_ACK)
		return TC_ACT_OK;
	gen = tables_in_force();
	cls = classify(&pk, gen, settings.verdicts[gen].default_class) & (SLUICE_CLASS_IDS - 1);
	g = bpf_map_lookup_elem(&syn_guard, &cls);
	if (!g || g->check_until_ms < settings.now_ms)
		return TC_ACT_OK;
	th = cookie_tcp(data, end, &l3, &family);
	if (!th)
		return TC_ACT_OK;
	ok = cookie_ack(skb, data, end, data + l3, th, family);
	st = bpf_map_lookup_elem(&class_state, &cls);
	if (st && ok == COOKIE_TAKEN)
		st->cnt[SLUICE_CS_COOKIE_OK] += 1;
	else if (st && ok == COOKIE_REFUSED)
		st->cnt[SLUICE_CS_COOKIE_REFUSED] += 1;
	else if (st && ok == COOKIE_NONE)
		st->cnt[SLUICE_CS_COOKIE_BAD] += 1;
	return TC_ACT_OK;
}

/* The floor for `sluice bench gate`: an XDP program that does nothing. */
SEC("xdp")
int sluice_noop(struct xdp_md *ctx)
{
	return XDP_PASS;
}
