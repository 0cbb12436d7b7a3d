// SPDX-License-Identifier: GPL-2.0-only
/*
 * gen.bpf.c - sluice's traffic generator, the load side of `sluice bench`.
 *
 * What runs where
 * ---------------
 * User space (crates/sluice-bench/src/load/gen.rs) fills "gen_streams" with up to
 * SLUICE_GEN_MAX_STREAMS streams (rate, frame size, flows, a header template
 * with valid checksums), then makes ONE BPF_PROG_RUN call in live-frames mode
 * (BPF_F_TEST_XDP_LIVE_FRAMES) with a huge repeat count, from a thread inside
 * the generator's network namespace, pinned to the generator CPU. A timer
 * signal ends the call with EINTR. Every frame this program returns XDP_TX for
 * is transmitted out of the veth in ctx->ingress_ifindex; XDP_DROP sends
 * nothing. (Each call costs ~20 ms to set up, so pacing with many short calls
 * would not work.)
 *
 * Pacing: each run reads the clock and sends one frame of the stream whose due
 * time is the earliest of those already due, then moves that stream's due
 * time on by its interval (fixed point, ns << SLUICE_GEN_FP_SHIFT, so rates do
 * not round to whole ns). If nothing is due, the run returns XDP_DROP at once:
 * the loop spins on the clock between frames, which is what makes the sending
 * smooth. If the generator falls more than SLUICE_GEN_MAX_BURST frames behind
 * (preempted), the frames beyond that are counted "late" and not sent, so it
 * never bursts more than that; the bench marks a run whose achieved rate is
 * short of the asked one as invalid.
 *
 * Frames: the page pool of live-frames mode recycles pages without resetting
 * their content, so every frame gets its stream's template written over its
 * first bytes, then the per-frame fields: source address (srcs), source port
 * (flows), destination port, and a stamp (send time and sequence) that the echo service returns so
 * the bench can measure round trips. Checksums are updated incrementally
 * (RFC 1624) for the changed words: the IPv4 header checksum for the source
 * address, and over IPv6 the UDP checksum (IPv4 sends UDP checksum 0).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "gen.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_GEN_MAX_STREAMS);
	__type(key, __u32);
	__type(value, struct sluice_gen_stream);
} gen_streams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_GEN_MAX_STREAMS);
	__type(key, __u32);
	__type(value, struct sluice_gen_state);
} gen_state SEC(".maps");

/* One's complement checksum update for a 16-bit word changed from old to new. */
static __always_inline __u32 csum_add_change(__u32 sum, __u16 old, __u16 new)
{
	return sum + (__u16)~old + new;
}

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

/* Write a 16-bit value at a variable offset < SLUICE_GEN_TMPL, bounds-checked. */
static __always_inline int put16(void *data, void *end, __u32 off, __u16 v)
{
	void *p = data + (off & (SLUICE_GEN_TMPL - 1));

	if (p + 2 > end)
		return -1;
	*(__u16 *)p = v;
	return 0;
}

SEC("xdp")
int sluice_gen(struct xdp_md *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 now_fp = now << SLUICE_GEN_FP_SHIFT;
	__u64 best_due = ~0ULL;
	__u32 best = SLUICE_GEN_MAX_STREAMS;

#pragma unroll
	for (__u32 i = 0; i < SLUICE_GEN_MAX_STREAMS; i++) {
		__u32 k = i;
		struct sluice_gen_stream *st = bpf_map_lookup_elem(&gen_streams, &k);
		struct sluice_gen_state *s = bpf_map_lookup_elem(&gen_state, &k);

		if (!st || !s || !st->interval_fp)
			continue;
		if (!s->due_fp)
			s->due_fp = now_fp;
		if (s->due_fp <= now_fp && s->due_fp < best_due) {
			best_due = s->due_fp;
			best = i;
		}
	}
	if (best >= SLUICE_GEN_MAX_STREAMS)
		return XDP_DROP;

	struct sluice_gen_stream *st = bpf_map_lookup_elem(&gen_streams, &best);
	struct sluice_gen_state *s = bpf_map_lookup_elem(&gen_state, &best);

	if (!st || !s)
		return XDP_DROP;

	/* Never more than SLUICE_GEN_MAX_BURST frames behind: give up the rest. */
	__u64 window = SLUICE_GEN_MAX_BURST * st->interval_fp;
	if (now_fp - s->due_fp > window) {
		__u64 behind = now_fp - window - s->due_fp;
		__u64 skip = behind / st->interval_fp + 1;

		s->late += skip;
		s->due_fp += skip * st->interval_fp;
	}
	s->due_fp += st->interval_fp;

	/* Size the frame, then write the template over its first bytes. */
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	int delta = (int)st->len - (int)(end - data);

	if (delta && bpf_xdp_adjust_tail(ctx, delta)) {
		s->errors++;
		return XDP_DROP;
	}
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
#pragma unroll
	for (int i = 0; i < SLUICE_GEN_TMPL / 8; i++) {
		if (data + (i + 1) * 8 > end)
			break;
		((__u64 *)data)[i] = ((__u64 *)st->tmpl)[i];
	}

	__u64 seq = s->sent++;
	__u16 sport = bpf_htons(st->sport_base + (__u16)(seq % (st->flows ? st->flows : 1)));
	__u16 dport = bpf_htons(st->dport_base + (__u16)(seq % (st->dports ? st->dports : 1)));
	__u16 sport0 = bpf_htons(st->sport_base), dport0 = bpf_htons(st->dport_base);
	__u32 sum = 0;

	if (put16(data, end, st->sport_off, sport) || put16(data, end, st->sport_off + 2, dport))
		return XDP_DROP;
	sum = csum_add_change(sum, sport0, sport);
	sum = csum_add_change(sum, dport0, dport);

	if (st->srcs > 1) {
		__u16 *a = data + (st->saddr_off & (SLUICE_GEN_TMPL - 1));
		__u32 base, addr;
		__u16 o0, o1, n0, n1;

		if ((void *)(a + 2) > end)
			return XDP_DROP;
		o0 = a[0];
		o1 = a[1];
		base = bpf_ntohl(((__u32)o1 << 16 | o0));
		addr = bpf_htonl(base + (st->random ? bpf_get_prandom_u32() : (__u32)seq) % st->srcs);
		n0 = addr & 0xffff;
		n1 = addr >> 16;
		a[0] = n0;
		a[1] = n1;
		if (st->ipcsum_off) {
			__u16 *c = data + (st->ipcsum_off & (SLUICE_GEN_TMPL - 1));
			__u32 isum;

			if ((void *)(c + 1) > end)
				return XDP_DROP;
			isum = csum_add_change(csum_add_change((__u16)~*c, o0, n0), o1, n1);
			*c = ~csum_fold(isum);
		}
		/* The source address is in the L4 pseudo-header of both families. */
		sum = csum_add_change(csum_add_change(sum, o0, n0), o1, n1);
	}

	if (st->stamp_off) {
		void *p = data + (st->stamp_off & (SLUICE_GEN_TMPL - 1));

		if (p + SLUICE_GEN_STAMP_LEN > end)
			return XDP_DROP;
		__builtin_memcpy(p, &now, 8);
		__builtin_memcpy(p + 8, &seq, 8);
		/* The template's stamp bytes are zero. */
#pragma unroll
		for (int w = 0; w < SLUICE_GEN_STAMP_LEN / 2; w++)
			sum = csum_add_change(sum, 0, ((__u16 *)p)[w]);
	}

	if (st->csum_off) {
		void *p = data + (st->csum_off & (SLUICE_GEN_TMPL - 1));
		__u16 c;

		if (p + 2 > end)
			return XDP_DROP;
		c = ~csum_fold(sum + (__u16)~*(__u16 *)p);
		*(__u16 *)p = c ? c : 0xffff;
	}
	return XDP_TX;
}

/* The floor for `sluice bench gate`: an XDP program that does nothing,
 * test-run beside the gate (the daemon's object carries no such program). */
SEC("xdp")
int bench_noop(struct xdp_md *ctx)
{
	return XDP_PASS;
}
