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
 *   7. past the daemon's deadline (it stalled: daemon_stalled below), what
 *      3 and 6 would drop or answer is passed instead.
 * In user space (the sluice daemon): compiling rules into the tables, the
 * per-CPU rate split (below), reading and serving counters, reloads.
 *
 * Token buckets without locks
 * ---------------------------
 * Each class has one bucket per CPU (this CPU's entry of "shares", written
 * by the daemon, and of "class_state", written only here), so
 * the per-packet path writes only this CPU's memory. Tokens are fixed
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
 * period (the daemon's tick, 10 ms: src/daemon/tick/). This is user-space
 * work once per tick, not per packet. With source fairness (below) each tier
 * is split by its own arrivals (src/dataplane/share.rs, CpuArrivals): a
 * known client on a CPU the flood does not reach finds the known tier there.
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
 *   - every other source has a slot in the direct-mapped "sources" table,
 *     found by a hash of its address cut to plen4/plen6 (/32 and /64, or
 *     /24 and /48, /16 and /32 when the daemon aggregates), and is paced
 *     at its share (one packet every src_interval_ns, a GCRA: see
 *     SLUICE_SRC_BURST_* in sluice.h).
 *     Within its share it takes the unknown tier's bucket; over it, it may
 *     take only the top half of that bucket. So a light source finds tokens
 *     while heavy ones share what the light ones leave, and a lone heavy
 *     source still gets the whole rate (max-min fair and work-conserving).
 *     The daemon sets the share to the max-min one from last epoch's counts
 *     (settings.epoch, its tick: SRC_ACTIVE, SRC_OVER, UNDER_PKTS).
 *     While the unknown tier runs at a rate of its own (beside known
 *     clients, or the class limited for its late answers), its bucket and
 *     each source's pace count a TCP segment's data in work (a token per
 *     SLUICE_WORK_BYTES, struct sluice_fair's by_work): a keep-alive
 *     flood's one segment of pipelined requests is that many requests.
 * All per-packet: one array lookup for the source's slot (a new source
 * takes the slot over; a clock read only for one that looks over its
 * share), one hash lookup in "known" (and a coarse clock read for a known
 * one), no lock and no atomic: two CPUs counting one source may each miss
 * a count or a step of the other.
 *
 * What the host needs (the default class)
 * -------------------
 * A packet of the default class its limit would drop is passed if it is a
 * reply to a connection of the host's own (its socket found), or IPv6
 * neighbour discovery or a PMTU message (at most SLUICE_HOST_ICMP_PPS per
 * CPU): counted HOST_REPLY, HOST_ICMP (gate/host.h).
 *
 * Room in the socket (any class holding known clients, limited or not)
 * -------------------
 * An admitted UDP packet of an unknown source to a socket over
 * SLUICE_ROOM_UNKNOWN_PCT of its buffer is dropped, verdict DROP_ROOM: the
 * rest of the buffer is the known clients' (gate/room.h). Kept while the
 * daemon says so (after a surge its tick saw), and on a CPU that marked a
 * surge itself in a class whose room the daemon armed.
 *
 * Verdicts for odd input (also in the README):
 *   - not IPv4/IPv6 (ARP, LLDP, ...): XDP_PASS, counted NON_IP_PASS; while
 *     the default class is limited or blocked, over SLUICE_HOST_LINK_PPS per
 *     CPU: dropped, counted NON_IP_DROP (gate/host.h);
 *   - frame too short for its Ethernet/VLAN header, IP header invalid or
 *     truncated, or IP packet truncated before a complete L4 header (by the
 *     frame or by its own length field: the frame's padding is no header):
 *     settings.verdicts[].malformed_verdict (default XDP_DROP), counted MALFORMED_*;
 *   - more VLAN tags or IPv6 extension headers than the parse depth: the
 *     malformed verdict, counted DEPTH_EXCEEDED (info) and MALFORMED_* (its
 *     port is unknown: in the default class it would skip its port's
 *     class and its source's share);
 *   - non-first fragments (no ports): the class their datagram's first
 *     fragment took, where the gate saw it within SLUICE_FRAG_MS; else
 *     classified by protocol only (gate/frags.h).
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
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "sluice.h"
#include "classify.h"
#include "kernel.h"

char LICENSE[] SEC("license") = "GPL";

/* The parts by role, each included once here (each header says what it holds). */
#include "gate/maps.h"

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_PSH 0x08
#define TCP_FLAG_ACK 0x10

#include "syncookie.h"

#include "gate/parse.h"
#include "gate/frags.h"
#include "gate/lookup.h"
#include "gate/bucket.h"
#include "known.h"
#include "gate/sources.h"
#include "gate/delay.h"
#include "gate/synack.h"
#include "gate/room.h"
#include "gate/host.h"
#include "gate/checker.h"

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

/*
 * The daemon's deadline. Every limit, SYN answer and drop rule the gate
 * applies was set by the daemon for the traffic of its last tick, and it
 * writes settings.alive_until_ns at every tick. Past it (the daemon is
 * stopped, frozen in a cgroup, or stalled in reclaim) those rules are
 * stale: the gate fails open. A SYN guard answers nothing (its segments go
 * on to the bucket, then the kernel), and what the gate would drop is
 * passed, counted STALE_PASS (and admitted in its class). An admitted
 * packet of an unguarded class never asks.
 *
 * A clock read costs about 20 ns here, as much as a whole drop, so a class
 * on a CPU reads it once every SLUICE_STALE_EVERY drops and answers, and
 * at once when the deadline moved (a tick came: the daemon is back), the
 * answer held in between: a stall is seen at most that many drops late,
 * nothing beside the 2 s deadline. 0: no deadline (a gate no daemon
 * drives: the tests' and benches' own).
 */
static __always_inline int daemon_stalled(struct sluice_class_state *st)
{
	__u64 until = settings.alive_until_ns;

	if (!until)
		return 0;
	if (st->stale_left && st->stale_until == until) {
		st->stale_left -= 1;
		return st->stale;
	}
	st->stale_until = until;
	st->stale_left = SLUICE_STALE_EVERY - 1;
	st->stale = bpf_ktime_get_coarse_ns() > until;
	return st->stale;
}

static __always_inline int stale_pass(struct sluice_class_state *st, __u64 bytes)
{
	verdict_add(st, SLUICE_CS_ADMIT_PKTS, bytes);
	global_inc(SLUICE_GS_STALE_PASS);
	return XDP_PASS;
}

/* A frame that is not IPv4/IPv6: passed, or over the host's link bucket
 * while the default class is limited, dropped (gate/host.h). */
static __always_inline int non_ip(__u32 gen)
{
	__u32 cls = settings.verdicts[gen].default_class & (SLUICE_CLASS_IDS - 1);
	struct sluice_class_state *st;

	if (host_link_passes(cls)) {
		global_inc(SLUICE_GS_NON_IP_PASS);
		return XDP_PASS;
	}
	st = class_state_here(cls);
	if (st && daemon_stalled(st)) {
		global_inc(SLUICE_GS_NON_IP_PASS);
		global_inc(SLUICE_GS_STALE_PASS);
		return XDP_PASS;
	}
	global_inc(SLUICE_GS_NON_IP_DROP);
	return observe_drop(gen);
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
		cls = classify(&pk, gen, settings.verdicts[gen].default_class);
		/* A datagram's fragments go with its first (gate/frags.h). */
		if (pk.fragment) {
			global_inc(SLUICE_GS_FRAGMENTS);
			cls = frag_follow(&pk, gen, cls);
		} else if (pk.first_fragment) {
			frag_note(&pk, gen, cls);
		}
		break;
	case PARSE_NON_IP:
		return non_ip(gen);
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
	struct sluice_share *sh = share_here(cls);
	struct sluice_class_state *st = class_state_here(cls);
	/* This CPU's source fairness of the class: the learner's note and a limited class's tiers. */
	struct sluice_fair *f = fair_here(cls);

	if (!sh || !st)
		return XDP_PASS; /* cannot happen: cls < max_entries */

	st->cnt[SLUICE_CS_SEEN_PKTS] += 1;
	st->cnt[SLUICE_CS_SEEN_BYTES] += bytes;
	note_surge(f, st);
	check_wake(sh, st, cls);
	if (pk.family)
		note_asked(&pk, cls, f);
	sample_known(&pk, cls, st);
	struct sluice_syn_guard *g = syn_guarded(&pk, gen, cls, st);
	/* A stale guard answers nothing: the segment goes on to the bucket. */
	if (g && daemon_stalled(st))
		g = 0;
	if (g && !g->answer && !watch_due(st))
		g = 0;
	enum syn_answered answered = g ? syn_answer(ctx, g->answer, g->direct) : SYN_NOT_ANSWERED;

	if (answered != SYN_NOT_ANSWERED) {
		verdict_add(st, SLUICE_CS_SYNACK_PKTS, bytes);
		if (answered == SYN_DIRECT)
			st->cnt[SLUICE_CS_SYNACK_DIRECT] += 1;
		else if (answered == SYN_EARLY)
			note_early(cls, st);
		return XDP_TX;
	}
	/* While the guard answers: a SYN its headers kept it from answering
	 * (ODD_L3 in synack.h), an ACK or RST of no connection. */
	if ((g && g->answer && pk.odd_l3) || no_connection(ctx, &pk, cls)) {
		if (daemon_stalled(st))
			return stale_pass(st, bytes);
		if (pk.odd_l3)
			global_inc(SLUICE_GS_ODD_L3_DROP);
		verdict_add(st, SLUICE_CS_DROP_NOCONN_PKTS, bytes);
		return observe_drop(gen);
	}
	int known = -1;

	if (sh->mode == SLUICE_MODE_BLOCKED)
		idx = SLUICE_CS_DROP_BLOCKED_PKTS;
	else if (sh->mode == SLUICE_MODE_LIMITED)
		idx = admit_limited(&pk, cls, sh, st, f, &known);
	else
		idx = SLUICE_CS_ADMIT_PKTS;
	/* What the host needs is kept out of its default class's limit (gate/host.h). */
	if (cls == settings.verdicts[gen].default_class && sh->mode == SLUICE_MODE_LIMITED &&
	    (idx != SLUICE_CS_ADMIT_PKTS || pk.first_fragment) && host_needs(ctx, &pk, idx != SLUICE_CS_ADMIT_PKTS))
		idx = SLUICE_CS_ADMIT_PKTS;
	/* The last of the socket's buffer is its known clients' (gate/room.h). */
	if (idx == SLUICE_CS_ADMIT_PKTS && room_kept(f, st) && pk.slot == SLUICE_SLOT_UDP && !pk.fragment &&
	    keeps_room(ctx, &pk, cls, st, known))
		idx = SLUICE_CS_DROP_ROOM_PKTS;
	if (idx != SLUICE_CS_ADMIT_PKTS && daemon_stalled(st))
		return stale_pass(st, bytes);
	verdict_add(st, idx, bytes);
	if (idx != SLUICE_CS_ADMIT_PKTS)
		return observe_drop(gen);
	/* One admitted packet in SLUICE_DELAY_EVERY on this CPU (or in the
	 * daemon's delay_every) may stamp its request (gate/delay.h). */
	__u32 every = f && f->delay_every ? f->delay_every : SLUICE_DELAY_EVERY;

	if (!(st->cnt[SLUICE_CS_SEEN_PKTS] & (every - 1)))
		delay_stamp(&pk, gen, cls);
	return pass_or_away(cls, st);
}

/*
 * The egress learner (TC, tcx egress of the gate's interface): a packet the
 * service sends from a port of a class to a client that asked the class
 * something (see SLUICE_ASKED_WINDOW_MS) makes that client known for the
 * class, while the class's fairness says learn (the daemon sets it after a
 * calm second: the class dropped nothing and its service was healthy). A
 * client first noted in a window the daemon did not confirm (taint_*_ms in
 * struct sluice_fair) starts its span again at its next answer. The
 * class is the one the client's own packets to the service's port take
 * (its cell, and the source-prefix rules with the client's address: a
 * client of a class that `src` rules split off is learned there, not in the
 * port's fallback class). For TCP only
 * a packet of a completed handshake counts: a SYN-ACK or RST proves nothing
 * (a spoofed SYN or ACK gets one) and is skipped; and only the segment that
 * ends a write of the service's (PSH) is an answer, not every segment of a
 * download. A client's answers are held to its requests (count_answer):
 * a service that sends several datagrams per request teaches one answer
 * per request. Before any of that, it times the service's answer to the
 * flow's request (gate/delay.h), whatever the class's learning. It never
 * changes the packet's fate.
 */
SEC("tc")
int sluice_learn(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct sluice_src_key k = {};
	struct sluice_known *v;
	struct sluice_asked *a;
	__u32 slot;
	struct sluice_known_part *part;
	struct pkt pk = {};
	__u32 cls, gen;
	__u64 now;
	struct sluice_fair *f;
	struct sluice_cell *cell;

	if (parse(data, end, &pk, 1) != PARSE_OK || pk.slot == SLUICE_SLOT_PORTLESS)
		return TC_ACT_OK;
	if (pk.slot == SLUICE_SLOT_TCP && (pk.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_RST)))
		return TC_ACT_OK;
	gen = tables_in_force();
	cell = cell_of(gen, pk.slot, pk.port);
	if (!cell)
		return TC_ACT_OK;
	/* The class the client's own packets to this port take, source-prefix rules included. */
	cls = class_of_cell(&pk, gen, cell) & (SLUICE_CLASS_IDS - 1);
	/* The answer's delay, since the gate admitted the flow's request (gate/delay.h). */
	delay_answered(&pk, gen, cls);
	/* TCP: an answer is a write of the service's, the segment that ends it
	 * (PSH): counting every segment, a download taught its client's rate at
	 * its packet rate, and bought it four times that as known ingress. */
	if (pk.slot == SLUICE_SLOT_TCP && !(pk.tcp_flags & TCP_FLAG_PSH))
		return TC_ACT_OK;
	f = fair_here(cls);
	if (!f || !f->learn)
		return TC_ACT_OK;
	now = settings.now_ms;
	if (!now)
		return TC_ACT_OK; /* the daemon has not set the clock yet */
	src_key(&k, &pk, cls, pk.family == 4 ? 32 : 64);
	v = bpf_map_lookup_elem(&known, &k);
	/* A known source answered within SLUICE_LEARN_REFRESH_MS: the answer
	 * counts (the rate a client is known at is its answers over its span;
	 * held to its requests at the next refresh), nothing else is noted. A
	 * busy service's every reply would otherwise move its client's times
	 * (and look up who asked) on the service's own CPU. (Plain increment:
	 * two CPUs answering one client may lose one.) */
	if (v && now - v->last_ms < SLUICE_LEARN_REFRESH_MS) {
		if (v->answers != 0xffffffff)
			v->answers += 1;
		return TC_ACT_OK;
	}
	a = peer_asked(&pk, cls, now, &slot);
	if (!a) {
		global_inc(SLUICE_GS_UNASKED);
		return TC_ACT_OK;
	}
	if (v) {
		if (v->first_ms >= f->taint_from_ms && v->first_ms <= f->taint_to_ms) {
			/* First noted in a window the daemon did not confirm: its span starts now. */
			v->first_ms = now;
			v->answers = 0;
			v->answers_from = 0;
			v->paused_ms = 0;
		} else if (v->last_ms < f->learn_from_ms &&
			   f->learn_from_ms - v->last_ms < 0xffffffffULL - v->paused_ms) {
			/*
			 * Refreshed last before a pause of learning: its answers then
			 * went uncounted. (A sum past 32 bits is left out: the gap is
			 * then over any ttl.)
			 */
			v->paused_ms += f->learn_from_ms - v->last_ms;
		}
		v->last_ms = now;
		count_answer(v, asks_of(a, slot)); /* held to what it asked (issue 49, item 3) */
		v->interval_ns = 0; /* its own rate changed: the gate computes it again */
		return TC_ACT_OK;
	}
	part = bpf_map_lookup_elem(&known_part, &cls);
	if (!part || part->room <= 0)
		return TC_ACT_OK; /* the class's part of the map is full until the daemon's next scan */
	{
		/* Made here, not at entry: zeroing it cost every packet the learner saw. */
		struct sluice_known fresh = {
			.answers = 1,
			.first_ms = now,
			.last_ms = now,
			.asks_from = asks_mark(asks_of(a, slot)),
			.answers_from = 1, /* none before this one, plus one */
		};

		if (!bpf_map_update_elem(&known, &k, &fresh, BPF_NOEXIST)) {
			__sync_fetch_and_add(&part->room, -1);
			__sync_fetch_and_add(&part->held, 1);
		}
	}
	return TC_ACT_OK;
}

/*
 * The cookie checker (TC, tcx ingress of the gate's interface): an ACK to a
 * class whose SYN guard is on, or whose SYNs the gate answered early
 * (or did, within a cookie's life: syn_guard, syn_early), that finds
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
	__u32 zero = 0, any = SLUICE_CLASS_IDS;
	__u64 *until, *early;

	/* Written once: a word every CPU only reads stays in every cache. */
	if (cookie_kfunc != kfunc)
		cookie_kfunc = kfunc;
	if (!bpf_sk_assign_tcp_reqsk)
		return TC_ACT_OK; /* a kernel before 6.9: the daemon never turns answering on */
	/* No class's guard checks ACKs now (the usual case): nothing to parse. */
	until = bpf_map_lookup_elem(&syn_guard_any, &zero);
	early = bpf_map_lookup_elem(&syn_early, &any);
	if ((!until || *until < settings.now_ms) && (!early || *early < settings.now_ms))
		return TC_ACT_OK;
	if (parse(data, end, &pk, 0) != PARSE_OK || pk.slot != SLUICE_SLOT_TCP ||
	    (pk.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) != TCP_FLAG_ACK)
		return TC_ACT_OK;
	gen = tables_in_force();
	cls = classify(&pk, gen, settings.verdicts[gen].default_class) & (SLUICE_CLASS_IDS - 1);
	g = bpf_map_lookup_elem(&syn_guard, &cls);
	early = bpf_map_lookup_elem(&syn_early, &cls);
	if ((!g || g->check_until_ms < settings.now_ms) && (!early || *early < settings.now_ms))
		return TC_ACT_OK;
	th = cookie_tcp(data, end, &l3, &family);
	if (!th)
		return TC_ACT_OK;
	ok = cookie_ack(skb, data, end, data + l3, th, family);
	st = class_state_here(cls);
	if (st && ok == COOKIE_TAKEN)
		st->cnt[SLUICE_CS_COOKIE_OK] += 1;
	else if (st && ok == COOKIE_REFUSED)
		st->cnt[SLUICE_CS_COOKIE_REFUSED] += 1;
	else if (st && ok == COOKIE_NONE)
		st->cnt[SLUICE_CS_COOKIE_BAD] += 1;
	return TC_ACT_OK;
}
