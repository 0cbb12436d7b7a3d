/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/sources.h - sources inside a limited class: the known clients (each
 * at its own rate), the unknown ones paced at their share (a GCRA per
 * source), the limited class's admission over both tiers, and who asked
 * a learning class (the learner learns only replies to them). Included by
 * gate.bpf.c after parse.h, bucket.h and known.h (the source's key, the
 * known maps and their lookup).
 */
#ifndef SLUICE_GATE_SOURCES_H
#define SLUICE_GATE_SOURCES_H

/*
 * The peer's known entry, if it is known now: answered over the span,
 * within the ttl, and not first noted in the window the daemon last did
 * not confirm (struct sluice_fair's taint_*_ms: a surge, distress or late
 * answers seen after it; the learner starts its span again at its next
 * answer, and until then it is not known).
 */
static __always_inline struct sluice_known *known_entry(const struct pkt *pk, __u32 cls)
{
	struct sluice_known *v = known_answered(pk, cls);
	struct sluice_fair *f;

	if (!v)
		return 0;
	/* Signed: a wall clock stepped back makes a recent answer look newer, not ancient. */
	if ((__s64)(settings.now_ms - v->last_ms) > (__s64)settings.known_ttl_ms)
		return 0;
	f = fair_here(cls);
	if (f && v->first_ms >= f->taint_from_ms && v->first_ms <= f->taint_to_ms)
		return 0;
	return v;
}

/*
 * Move a GCRA's theoretical arrival time (*tat, read as `seen`) on by one
 * step, from `now` where it had fallen behind. Atomic, because one source
 * may arrive on many CPUs at once (RSS spreads its flows over queues): with
 * a plain read and write, a CPU writes back a time that misses another's
 * step, and each such miss is a packet over the source's pace, up to one
 * per CPU per step. Only an admitted packet pays this; a source over its
 * pace is told so by the plain read alone.
 */
static __always_inline void pace_step(__u64 *tat, __u64 seen, __u64 now, __u64 step)
{
	if (seen < now && __sync_val_compare_and_swap(tat, seen, now + step) == seen)
		return;
	/* Ahead of now, or another CPU moved it first: after it. */
	__sync_fetch_and_add(tat, step);
}

/*
 * Is a known source within its own rate (see SLUICE_KNOWN_HEADROOM)? A
 * GCRA on the entry's theoretical arrival time: each packet moves it on by
 * one interval of the source's rate (a TCP segment without data, but a
 * SYN, by a fraction of one: SLUICE_KNOWN_BARE_SHIFT); a packet that finds it more
 * than the burst ahead of now is over. The step is atomic (pace_step):
 * a client whose packets arrive on several CPUs at once keeps to one rate.
 */
static __always_inline __u32 known_interval(const struct sluice_known *v)
{
	__u64 span = v->last_ms - v->first_ms, pps, interval;

	/* Learning's pauses counted none of its answers: not part of its span. */
	if (v->paused_ms < span)
		span -= v->paused_ms;
	pps = (__u64)v->answers * 1000 / (span ? span : 1);

	if (pps < SLUICE_KNOWN_MIN_PPS)
		pps = SLUICE_KNOWN_MIN_PPS;
	interval = 1000000000ULL / (pps * SLUICE_KNOWN_HEADROOM);
	return interval ? interval : 1; /* at most 25 ms: fits */
}

static __always_inline int known_within_rate(struct sluice_known *v, const struct pkt *pk)
{
	/* The coarse clock (jiffies) is cheaper to read and fine at the 100 ms tolerance. */
	__u64 now = bpf_ktime_get_coarse_ns(), interval, tolerance, tat;

	/* Computed once per change of the entry's answers (the learner resets it). */
	if (!v->interval_ns)
		v->interval_ns = known_interval(v);
	interval = v->interval_ns;
	tolerance = SLUICE_KNOWN_BURST_MS * 1000000ULL;
	if (tolerance < SLUICE_KNOWN_BURST_PKTS * interval)
		tolerance = SLUICE_KNOWN_BURST_PKTS * interval;
	tat = v->tat_ns;
	if (tat > now && tat - now > tolerance)
		return 0;
	pace_step(&v->tat_ns, tat, now,
		  tcp_bare(pk) && !(pk->tcp_flags & TCP_FLAG_SYN) ? interval >> SLUICE_KNOWN_BARE_SHIFT : interval);
	return 1;
}

/*
 * A 64-bit hash of a source key (class, family, the first 8 address bytes:
 * an IPv4 address or an IPv6 /64), seeded with a random word drawn at load,
 * so which sources share a slot of "sources" or "asked" cannot be worked
 * out from outside. The Rust side's copy is `dataplane::gate::slot_of`.
 */
/* The 64-bit finaliser of MurmurHash3: every input bit moves every output bit. */
static __always_inline __u64 mix64(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

static __always_inline __u64 peer_hash(const struct sluice_src_key *k)
{
	__u64 h;

	__builtin_memcpy(&h, k->addr, 8);
	return mix64(h ^ ((__u64)k->class_id << 8 | k->family) ^ settings.slot_seed);
}

/* Is the slot's key this one? Five words (the key is 20 bytes, 4-aligned). */
static __always_inline int same_key(const struct sluice_src_key *a, const struct sluice_src_key *b)
{
	__u32 x[5], y[5];

	__builtin_memcpy(x, a, sizeof(x));
	__builtin_memcpy(y, b, sizeof(y));
	return !((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4]));
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
static __always_inline int src_within_share(struct sluice_src *s, __u32 interval, __u64 cost, struct sluice_pacer *p)
{
	__u64 now = p->seen_ns, tolerance, tat = s->tat_ns;

	if (!interval)
		return 1;
	tolerance = SLUICE_SRC_BURST_PKTS * (__u64)interval;
	if (tolerance < SLUICE_SRC_BURST_NS)
		tolerance = SLUICE_SRC_BURST_NS;
	if (!now || tat > now + tolerance) {
		if (p->skip) {
			p->skip--;
			return 0;
		}
		now = bpf_ktime_get_ns();
		p->seen_ns = now;
		if (tat > now + tolerance) {
			p->skip = SLUICE_CLOCK_SKIP;
			return 0;
		}
	}
	pace_step(&s->tat_ns, tat, now, interval * cost);
	return 1;
}

/*
 * What an unknown packet takes from the unknown tier's bucket, in tokens:
 * one, or while the tier counts in work (struct sluice_fair's by_work) a
 * TCP segment's data in SLUICE_WORK_BYTES, rounded up. At most half the
 * bucket's burst, so a large segment can still pass a full bucket, over
 * its source's share too (which takes only the top half).
 */
static __always_inline __u64 tier_cost(const struct pkt *pk, const struct sluice_fair *f)
{
	__u64 cost, most = f->unknown.burst / 2;

	if (!f->by_work || pk->slot != SLUICE_SLOT_TCP || tcp_bare(pk))
		return 1;
	cost = (pk->l4_len - pk->tcp_hlen * 4 + SLUICE_WORK_BYTES - 1) / SLUICE_WORK_BYTES;
	if (cost > most)
		cost = most;
	return cost ? cost : 1;
}

/*
 * What one more packet adds to a source's count `n` (struct sluice_src,
 * SLUICE_SRC_EXACT): 1 while the count is small, then SLUICE_SRC_SAMPLE
 * for one packet in SLUICE_SRC_SAMPLE, else 0 (the slot not written). The
 * packet is picked by the CPU's count of the class's unknown packets
 * (st, counted before this one), spread by Knuth's multiplicative hash:
 * the picked counts are 8, 13 or 21 apart, 16 on average, so sources that
 * take turns on a CPU share the picks (a pick every 16th would count
 * every 16th packet to one of two sources that alternate).
 * bpf_get_prandom_u32 cost 18 ns a call here (`sluice bench gate`).
 */
static __always_inline __u32 src_count_step(__u64 n, const struct sluice_class_state *st)
{
	__u32 turn = (__u32)st->cnt[SLUICE_CS_UNKNOWN_PKTS] * 2654435761u;

	if (n < SLUICE_SRC_EXACT)
		return 1;
	return turn >> (32 - SLUICE_SRC_SAMPLE_BITS) ? 0 : SLUICE_SRC_SAMPLE;
}

/*
 * Count an unknown packet of `cost` tokens (tier_cost) against its source:
 * 1 if the source is within its share (its pace moved on by `cost`
 * intervals: while the tier counts in work, a source's share is of the
 * service's work, not of its packets), 2 if it is over but took a token
 * from the spare half of the unknown tier's bucket, 0 if it is to be
 * dropped. A source that finds another in
 * its slot takes the slot over with a fresh state (struct sluice_src_slot):
 * the other one's pace starts again when it next sends, so a heavy source
 * that shares a slot with a light one gets a fresh burst after each of the
 * light one's packets; the light one is never held back by it. Over its
 * share, s->drops counts the packet only if it is then dropped.
 */
static __always_inline int within_share(const struct pkt *pk, __u32 cls, const struct sluice_fair *f,
					struct sluice_class_state *st, __u64 cost)
{
	struct sluice_src_key k = {};
	__u32 epoch = settings.epoch, slot, step;
	struct sluice_src_slot *e;
	struct sluice_src *s;

	src_key(&k, pk, cls, pk->family == 4 ? f->plen4 : f->plen6);
	slot = peer_hash(&k) & settings.sources_mask;
	e = bpf_map_lookup_elem(&sources, &slot);
	if (!e)
		return 1; /* not reached: the mask keeps the slot inside the table */
	s = &e->v;
	if (!same_key(&e->key, &k)) {
		if (e->key.family && s->epoch == epoch)
			st->cnt[SLUICE_CS_SRC_COLLIDED] += 1;
		else
			st->cnt[SLUICE_CS_SRC_INSERTS] += 1;
		e->key = k;
		*s = (struct sluice_src){ .epoch = epoch, .over_epoch = epoch - 1 };
	}
	if (s->epoch != epoch) {
		s->epoch = epoch;
		s->pkts = 0;
	}
	/* Plain (not atomic) updates: two CPUs counting one source may lose a
	 * count; past SLUICE_SRC_EXACT, sampled. */
	if (!s->pkts)
		st->cnt[SLUICE_CS_SRC_ACTIVE] += 1;
	step = src_count_step(s->pkts, st);
	if (step)
		s->pkts += step;
	if (src_within_share(s, f->src_interval_ns, cost, &st->pacer))
		return 1;
	if (s->over_epoch != epoch) {
		s->over_epoch = epoch;
		st->cnt[SLUICE_CS_SRC_OVER] += 1;
	}
	/* Over its share: the top half of the unknown tier's bucket only. */
	if (bucket_take_above(&f->unknown, &st->unknown, f->unknown.burst * (SLUICE_TOKEN_SCALE / 2), cost))
		return 2;
	step = src_count_step(s->drops, st);
	if (step)
		s->drops += step;
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
 * Returns the verdict counter pair (SLUICE_CS_*_PKTS) the packet lands in;
 * *known is set 1 or 0 where the tiers told a known source within its rate
 * from the rest (left as it was without fairness).
 */
static __always_inline __u32 admit_limited(const struct pkt *pk, __u32 cls, const struct sluice_share *sh,
					   struct sluice_class_state *st, struct sluice_fair *f, int *known)
{
	if (!f || !f->on || pk->family == 0)
		return bucket_take(sh, &st->bucket) ? SLUICE_CS_ADMIT_PKTS : SLUICE_CS_DROP_RATE_PKTS;
	struct sluice_known *v = known_entry(pk, cls);
	__u64 cost;

	*known = v && known_within_rate(v, pk);
	if (*known) {
		st->cnt[SLUICE_CS_KNOWN_PKTS] += 1;
		if (!bucket_take(sh, &st->bucket))
			return SLUICE_CS_DROP_RATE_PKTS;
		st->cnt[SLUICE_CS_KNOWN_ADMIT_PKTS] += 1;
		return SLUICE_CS_ADMIT_PKTS;
	}
	if (v)
		st->cnt[SLUICE_CS_KNOWN_OVER_PKTS] += 1;
	st->cnt[SLUICE_CS_UNKNOWN_PKTS] += 1;
	cost = tier_cost(pk, f);
	switch (within_share(pk, cls, f, st, cost)) {
	case 0:
		return SLUICE_CS_DROP_SHARE_PKTS;
	case 2:
		return SLUICE_CS_ADMIT_PKTS; /* over its share, from the spare half of the bucket */
	}
	/* In the tier's unit: the daemon's quota is a share of the tier's tokens. */
	st->cnt[SLUICE_CS_UNDER_PKTS] += cost;
	return bucket_take_above(&f->unknown, &st->unknown, 0, cost) ? SLUICE_CS_ADMIT_PKTS : SLUICE_CS_DROP_RATE_PKTS;
}

/*
 * One packet in SLUICE_KNOWN_SAMPLE of a class on a CPU, in any mode: is
 * its source known? The daemon reads the known share of an unlimited
 * class's arrivals from these counts (a surge of sources it does not know
 * engages the class at once: policy::controller's Engage::Newcomers).
 */
static __always_inline void sample_known(const struct pkt *pk, __u32 cls, struct sluice_class_state *st)
{
	if (!pk->family || (st->cnt[SLUICE_CS_SEEN_PKTS] & (SLUICE_KNOWN_SAMPLE - 1)))
		return;
	st->cnt[SLUICE_CS_SAMPLED_PKTS] += 1;
	if (known_entry(pk, cls))
		st->cnt[SLUICE_CS_SAMPLED_KNOWN] += 1;
}

/* The peer's slot in "asked" (its index in *slot), and the tag its note carries. */
static __always_inline struct sluice_asked *asked_slot(const struct pkt *pk, __u32 cls, __u32 *tag, __u32 *slot)
{
	struct sluice_src_key k = {};
	__u64 h;

	src_key(&k, pk, cls, pk->family == 4 ? 32 : 64);
	h = peer_hash(&k);
	*slot = h & (SLUICE_ASKED_SLOTS - 1);
	*tag = h >> 32;
	return bpf_map_lookup_elem(&asked, slot);
}

/*
 * Note that the peer asked a learning class something (the learner then
 * takes the service's replies to it as answers, as many as it asked). Its
 * time is written at most once per SLUICE_ASKED_REFRESH_MS per peer, its
 * count in the slot at each packet up to SLUICE_ASKS_PER_SEC since (atomic:
 * one peer's flows reach several CPUs, and a lost count would hold its
 * answers below what it asked), and past that in this CPU's "asks_over"
 * (the slot's line is then only read), the slot marked `overflowed` once.
 * Nothing while the class does not learn (a limited class, a flood).
 */
static __always_inline void note_asked(const struct pkt *pk, __u32 cls, const struct sluice_fair *f)
{
	__u32 now = settings.now_ms, tag, slot, *over;
	struct sluice_asked *v;

	if (!f || !f->learn || !settings.now_ms)
		return;
	v = asked_slot(pk, cls, &tag, &slot);
	if (!v)
		return;
	if (v->tag != tag || now - v->ms >= SLUICE_ASKED_REFRESH_MS) {
		v->tag = tag;
		v->ms = now;
		v->asks_at_ms = v->asks;
	}
	if (v->asks - v->asks_at_ms < SLUICE_ASKS_PER_SEC) {
		__sync_fetch_and_add(&v->asks, 1);
		return;
	}
	if (!v->overflowed)
		v->overflowed = 1;
	slot &= SLUICE_ASKS_OVER_SLOTS - 1;
	over = bpf_map_lookup_elem(&asks_over, &slot);
	if (over)
		*over += 1;
}

/* The peer's slot (its index in *slot), if it asked the class something in the last SLUICE_ASKED_WINDOW_MS. */
static __always_inline struct sluice_asked *peer_asked(const struct pkt *pk, __u32 cls, __u64 now_ms, __u32 *slot)
{
	__u32 tag;
	struct sluice_asked *v = asked_slot(pk, cls, &tag, slot);

	return v && v->tag == tag && (__u32)now_ms - v->ms <= SLUICE_ASKED_WINDOW_MS ? v : 0;
}

/* The sum of one "asks_over" entry over the CPUs (a bpf_loop callback: verified once). */
struct asks_sum {
	__u32 key;
	__u32 sum;
};

static long asks_over_cpu(__u64 cpu, void *ctx)
{
	struct asks_sum *s = ctx;
	__u32 *c = bpf_map_lookup_percpu_elem(&asks_over, &s->key, cpu);

	if (!c)
		return 1; /* past the last CPU */
	s->sum += *c;
	return 0;
}

/*
 * The requests the slot counted: in it, and where it ever went past
 * SLUICE_ASKS_PER_SEC in a second (`overflowed`), in every CPU's
 * "asks_over" too (a heavy peer's refresh only: a lookup per CPU).
 */
static __always_inline __u32 asks_of(const struct sluice_asked *a, __u32 slot)
{
	struct asks_sum s = { .key = slot & (SLUICE_ASKS_OVER_SLOTS - 1), .sum = 0 };

	if (a->overflowed)
		bpf_loop(SLUICE_ASKS_MAX_CPUS, asks_over_cpu, &s, 0);
	return a->asks + s.sum;
}

/*
 * The "asked" mark of an entry set now, from the slot's requests so far
 * (`asks`): up to SLUICE_ASKS_IN_FLIGHT of them (this answer's among them)
 * are taken as still unanswered.
 */
static __always_inline __u32 asks_mark(__u32 asks)
{
	return asks - (asks < SLUICE_ASKS_IN_FLIGHT ? asks : SLUICE_ASKS_IN_FLIGHT);
}

/*
 * Count one answer to a known source at a refresh of its entry, and hold
 * its answers since the entry's marks to its slot's requests since
 * (`asks`, asks_of; see SLUICE_ASKED_REFRESH_MS). An entry with no marks
 * (the daemon wrote it, or its span starts again) takes them now.
 */
static __always_inline void count_answer(struct sluice_known *v, __u32 asks)
{
	__u32 answered, asked;

	if (v->answers != 0xffffffff)
		v->answers += 1;
	if (!v->answers_from) {
		v->asks_from = asks_mark(asks);
		v->answers_from = v->answers; /* the answers before this one, plus one */
		return;
	}
	answered = v->answers - (v->answers_from - 1);
	asked = asks - v->asks_from;
	if (answered > asked)
		v->answers = v->answers_from - 1 + asked;
}

#endif /* SLUICE_GATE_SOURCES_H */
