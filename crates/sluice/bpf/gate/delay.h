/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/delay.h - how long a service takes to answer its clients, timed
 * where the gate sees both ends: the gate (XDP) stamps a flow's request
 * as it admits it, and the egress learner (tc) times the service's next
 * answer to that flow (see SLUICE_DELAY_* in sluice.h). The delay holds the
 * receive path, the wait in the socket and the service's own work: the
 * queue delay a client sees, whatever the service's reader does, read in
 * the kernel's own path (no socket is dumped). Included by gate.bpf.c
 * after sources.h (mix64).
 *
 * Not timed: the default class (its "requests" are replies to the host's
 * own connections), port-less traffic, fragments, and a request whose
 * slot holds another flow's unanswered request younger than
 * SLUICE_DELAY_STALE_NS (the first one stays: under a flood of requests
 * nobody answers, a slot turns over every SLUICE_DELAY_STALE_NS, and the
 * answered flows are timed in the slots they find free).
 *
 * Cost: the gate offers one admitted packet in SLUICE_DELAY_EVERY of a
 * class on a CPU (sluice.h; every one while the daemon says the class's
 * answers are slow, struct sluice_fair's delay_every), which costs one
 * hash, one array lookup and a clock read (the coarse one to find a slot
 * stale, the fine one to stamp); the learner one hash and one lookup per
 * answer, and a clock read to time one that matches. Plain stores: two
 * CPUs stamping one slot at once leave one stamp, and an answer timed
 * against the other's is one wrong sample among many.
 */
#ifndef SLUICE_GATE_DELAY_H
#define SLUICE_GATE_DELAY_H

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_DELAY_SLOTS);
	__type(key, __u32);
	__type(value, struct sluice_delay_slot);
} delay_slots SEC(".maps");

/*
 * The packet's flow slot, and its tag in *tag; NULL for a packet the gate
 * does not time (see the top of this file). parse() gives the service's
 * port, the peer's and the peer's address the same way for the request
 * (in) and the answer (out).
 */
static __always_inline struct sluice_delay_slot *delay_slot(const struct pkt *pk, __u32 gen, __u32 cls, __u32 *tag)
{
	__u64 lo = pk->peer4, hi = 0, h;
	__u32 slot;

	if (!pk->family || pk->slot == SLUICE_SLOT_PORTLESS || pk->fragment ||
	    cls == (settings.verdicts[gen & 1].default_class & (SLUICE_CLASS_IDS - 1)))
		return 0;
	/* A UDP datagram is a request or an answer; a TCP segment if it has data. */
	if (tcp_bare(pk))
		return 0;
	if (pk->family == 6) {
		__builtin_memcpy(&lo, &pk->peer6, 8);
		__builtin_memcpy(&hi, (void *)&pk->peer6 + 8, 8);
	}
	h = mix64(lo ^ settings.slot_seed) ^ hi ^ ((__u64)pk->port << 48 | (__u64)pk->peer_port << 32 | cls);
	h = mix64(h);
	slot = h & (SLUICE_DELAY_SLOTS - 1);
	*tag = h >> 32;
	return bpf_map_lookup_elem(&delay_slots, &slot);
}

/*
 * A request the gate admitted: stamp its flow's slot unless the slot holds
 * a request, this flow's or another's, younger than SLUICE_DELAY_STALE_NS
 * (a flow's earlier request still waits: the answer times that one).
 * Returns 1 if it stamped. A global function: checked once, not once per
 * way through the parser, its locals off the gate's stack (see syn_answer).
 */
__noinline int delay_stamp(const struct pkt *pk, __u32 gen, __u32 cls)
{
	struct sluice_delay_slot *s;
	__u32 tag;

	if (!pk)
		return 0;
	s = delay_slot(pk, gen, cls, &tag);
	if (!s)
		return 0;
	if (s->asked_ns && bpf_ktime_get_coarse_ns() - s->asked_ns < SLUICE_DELAY_STALE_NS)
		return 0;
	s->tag = tag;
	s->asked_ns = bpf_ktime_get_ns();
	return 1;
}

/* A timed answer `d` ns after its request: while the daemon ticks slowly,
 * count it if over the class's slow mark, and wake the daemon at the
 * SLUICE_SLOW_WAKE_ANSWERS-th on this CPU (struct sluice_share). */
static __always_inline void note_slow_answer(__u32 cls, __u64 d)
{
	struct sluice_share *sh = share_here(cls);

	if (!sh || !sh->wake_at || !sh->slow_wake_us || d <= (__u64)sh->slow_wake_us * 1000)
		return;
	if (++sh->slow_answers >= SLUICE_SLOW_WAKE_ANSWERS)
		wake_daemon(sh, cls);
}

/* An answer leaving: the delay since its flow's stamp, into the class's
 * buckets (per CPU, in the class's counters), and into its known clients'
 * if the client is known: a flood's own answers can hide what the known
 * clients wait (a flow that pipelines requests is answered at once, to an
 * earlier request). Returns 1 if it was timed. */
__noinline int delay_answered(const struct pkt *pk, __u32 gen, __u32 cls)
{
	struct sluice_class_state *st;
	struct sluice_delay_slot *s;
	__u64 d, asked, v;
	__u32 tag, b = 0;

	if (!pk)
		return 0;
	s = delay_slot(pk, gen, cls, &tag);
	if (!s || !s->asked_ns || s->tag != tag)
		return 0;
	asked = s->asked_ns;
	s->asked_ns = 0;
	d = bpf_ktime_get_ns() - asked;
	/* A stamp that old may be a request the service never answered (a
	 * datagram its socket dropped), and this the answer to a later one. */
	if (d > SLUICE_DELAY_STALE_NS)
		return 0;
	cls &= SLUICE_CLASS_IDS - 1;
	st = class_state_here(cls);
	if (!st)
		return 0;
	/* The bucket: how many powers of two past 2^SLUICE_DELAY_SHIFT0. */
	v = d >> SLUICE_DELAY_SHIFT0;
	for (int i = 0; i < SLUICE_DELAY_BUCKETS - 1 && v; i++) {
		b++;
		v >>= 1;
	}
	if (b >= SLUICE_DELAY_BUCKETS)
		return 0; /* cannot happen: the loop stops at the last bucket */
	note_slow_answer(cls, d);
	st->cnt[SLUICE_CS_DELAY_SAMPLES] += 1;
	st->cnt[SLUICE_CS_DELAY_NS] += d;
	st->cnt[SLUICE_CS_DELAY_BUCKET0 + b] += 1;
	if (known_entry(pk, cls)) {
		st->cnt[SLUICE_CS_DELAY_KNOWN_SAMPLES] += 1;
		st->cnt[SLUICE_CS_DELAY_KNOWN_NS] += d;
		st->cnt[SLUICE_CS_DELAY_KNOWN_BUCKET0 + b] += 1;
	}
	return 1;
}

#endif /* SLUICE_GATE_DELAY_H */
