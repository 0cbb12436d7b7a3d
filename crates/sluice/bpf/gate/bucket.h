/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/bucket.h - per-CPU token buckets (a class's share of its rate on this
 * CPU, in SLUICE_TOKEN_SCALE units), and the wake marks that wake a calm
 * daemon when a class's arrivals jump. Included by gate.bpf.c.
 */
#ifndef SLUICE_GATE_BUCKET_H
#define SLUICE_GATE_BUCKET_H

/* The daemon ticks slowly while all is calm: tell it, once per arming,
 * that a class's arrivals on this CPU jumped (its next tick comes at once). */
static __always_inline void wake_daemon(struct sluice_share *sh, __u32 cls)
{
	struct sluice_wake w = { .class_id = cls, .at_ns = bpf_ktime_get_ns() };

	sh->wake_at = 0;
	bpf_ringbuf_output(&wake, &w, sizeof(w), 0);
}

/*
 * Read the clock at the end of a batch of arrivals on this CPU: did the
 * batch come within `gap_ns` of the last read (`*last_ns`, set to now)? A
 * rate mark at the cost of one clock read per batch: the wake marks below
 * and the room's surge mark (gate/room.h). The first batch (no last read)
 * never does.
 */
static __always_inline int batch_within(__u64 *last_ns, __u64 gap_ns)
{
	__u64 now = bpf_ktime_get_ns(), last = *last_ns;

	*last_ns = now;
	return last && now - last < gap_ns;
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
	__u64 seen = st->cnt[SLUICE_CS_SEEN_PKTS];

	if (!sh->wake_at)
		return;
	if (seen >= sh->wake_at) {
		wake_daemon(sh, cls);
		return;
	}
	if (!sh->wake_gap_ns || (seen & (SLUICE_WAKE_BATCH - 1)))
		return;
	if (batch_within(&st->wake_batch_ns, sh->wake_gap_ns))
		wake_daemon(sh, cls);
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
 * Take `cost` tokens (a packet's worth each) from this CPU's bucket if that
 * leaves at least `reserve` units in it; 1 if it did. The clock is read only
 * when the bucket holds too little (see "Reading the clock"). reserve is 0
 * but for packets of a source over its share, which may use only the top
 * half of the unknown tier's bucket (see "Source fairness"); cost is 1 but
 * for the unknown tier counted in work (tier_cost in gate/sources.h).
 */
static __always_inline int bucket_take_above(const struct sluice_share *sh, struct sluice_bucket *b, __u64 reserve,
					     __u64 cost)
{
	__u64 take = cost * SLUICE_TOKEN_SCALE;
	__u64 need = reserve + take;

	if (b->tokens >= need) {
		b->tokens -= take;
		return 1;
	}
	if (b->skip) {
		b->skip--;
		return 0;
	}
	if (bucket_refill(sh, b) >= need) {
		b->tokens -= take;
		return 1;
	}
	b->skip = sh->clock_skip;
	return 0;
}

static __always_inline int bucket_take(const struct sluice_share *sh, struct sluice_bucket *b)
{
	return bucket_take_above(sh, b, 0, 1);
}

#endif /* SLUICE_GATE_BUCKET_H */
