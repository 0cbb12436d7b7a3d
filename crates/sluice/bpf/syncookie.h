/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * syncookie.h - SYN cookies at the driver: the gate answers a flooded TCP
 * listener's SYNs itself and the listener completes only the connections
 * whose ACK carries a valid cookie. Included by gate.bpf.c.
 *
 * Why this path (issue 22)
 * ------------------------
 * A SYN that reaches the kernel costs a listener lookup, a request or a
 * cookie in softirq on the service's CPU; under a flood that is most of the
 * CPU. Answering at XDP costs the parse, a hash and a rewrite of the frame
 * in place (XDP_TX). The kernel then has to accept the client's ACK:
 *   - the kernel's own cookies (bpf_tcp_raw_gen_syncookie_ipv4/6) are
 *     accepted by the listener only within two minutes of its own overflow
 *     (tcp_synq_no_recent_overflow); once the gate takes the SYNs the
 *     listener never overflows again and good ACKs get RSTs. The kernel's
 *     XDP selftest (xdp_synproxy) closes that gap with conntrack and an
 *     iptables SYNPROXY rule: a second stateful layer and a rule set sluice
 *     would have to own.
 *   - so the gate makes its own cookie (below) and a tc ingress program
 *     (sluice_cookie_ack) checks it and hands the listener a request socket
 *     with the options the cookie kept, through the bpf_sk_assign_tcp_reqsk
 *     kfunc (Linux 6.9; CONFIG_SYN_COOKIES; BTF). The listener then
 *     completes the handshake as for its own cookie. Without the kfunc the
 *     daemon never turns answering on: the host works as before.
 *
 * The cookie (the SYN-ACK's sequence number)
 * ------------------------------------------
 *   bits 31..9  23 bits of SipHash-2-4 (key: 128 random bits the daemon draws
 *               at start) over the addresses, the ports, the client's ISN,
 *               the time slot and bits 8..0;
 *   bit  8      the time slot's parity: a slot is SLUICE_COOKIE_SLOT_MS of
 *               the gate clock; a cookie is valid in its slot and the next
 *               (64 to 128 s, the kernel's own allow two minutes);
 *   bits 7..6   the client's MSS, as an index into the kernel's own table
 *               (the largest entry not above it);
 *   bit  4      the client offered SACK;
 *   bits 3..0   the client's window scale, 15 = none offered.
 * Timestamps need no bit: a client that offered them echoes ours in its
 * ACK. ECN is not kept (the SYN-ACK does not offer it). A guess succeeds
 * with odds of 1 in 2^23 per ACK; a replayed ACK of a finished connection
 * opens a new one within the cookie's life, as the kernel's cookies allow.
 */
#ifndef SLUICE_SYNCOOKIE_H
#define SLUICE_SYNCOOKIE_H

#include "sluice.h"

#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_MSS 2
#define TCPOPT_WINDOW 3
#define TCPOPT_SACK_PERM 4
#define TCPOPT_TIMESTAMP 8

#define COOKIE_WSCALE_NONE 0xf
#define COOKIE_SACK (1u << 4)
#define COOKIE_MSS_SHIFT 6
#define COOKIE_SLOT_BIT (1u << 8)
#define COOKIE_DATA_MASK 0x1ffu

/*
 * The kernel's own cookie MSS tables (net/ipv4/syncookies.c,
 * net/ipv6/syncookies.c), entry i of 4. A switch, not a const array: that
 * would be a constant pool section libbpf cannot load.
 */
static __always_inline __u16 cookie_mss(__u32 family, __u32 i)
{
	switch (i & 3) {
	case 0:
		return family == 4 ? 536 : 1220;
	case 1:
		return family == 4 ? 1300 : 1420;
	case 2:
		return family == 4 ? 1440 : 1440;
	}
	return family == 4 ? 1460 : 8940;
}

/* What a SYN offered, as the cookie keeps it. */
struct syn_opts {
	__u16 mss;    /* the client's MSS option, 0: none */
	__u8 wscale;  /* its window scale, COOKIE_WSCALE_NONE: none */
	__u8 sack;    /* 1: SACK permitted */
	__u8 ts;      /* 1: a timestamp option */
	__u32 tsval;  /* its TSval */
	__u32 tsecr;  /* its TSecr (in an ACK: the echo of the SYN-ACK's TSval) */
};

/* What bpf_sk_assign_tcp_reqsk (Linux 6.9) takes: the kernel's struct bpf_tcp_req_attrs. */
struct bpf_tcp_req_attrs {
	__u32 rcv_tsval;
	__u32 rcv_tsecr;
	__u16 mss;
	__u8 rcv_wscale;
	__u8 snd_wscale;
	__u8 ecn_ok;
	__u8 wscale_ok;
	__u8 sack_ok;
	__u8 tstamp_ok;
	__u8 usec_ts_ok;
	__u8 reserved[3];
};

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

/* SipHash's state: four words (scalars, not an array: an array initialiser
 * becomes a constant pool section libbpf cannot load). */
struct sip {
	__u64 v0, v1, v2, v3;
};

static __always_inline void sip_round(struct sip *s)
{
	s->v0 += s->v1;
	s->v1 = SIP_ROTL(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = SIP_ROTL(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = SIP_ROTL(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = SIP_ROTL(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = SIP_ROTL(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = SIP_ROTL(s->v2, 32);
}

/* One 64-bit message word of SipHash-2-4. */
static __always_inline void sip_word(struct sip *s, __u64 m)
{
	s->v3 ^= m;
	sip_round(s);
	sip_round(s);
	s->v0 ^= m;
}

/*
 * SipHash-2-4 of n whole 64-bit words and 7 bytes more, `tail` (below
 * 2^56): a message of n * 8 + 7 bytes, whose last block holds its length
 * and the tail, so the tail costs no block of its own (n a constant: the
 * loop unrolls).
 */
static __always_inline __u64 siphash_words(const volatile __u64 *key, const __u64 *m, int n, __u64 tail)
{
	struct sip s;

	s.v0 = key[0] ^ 0x736f6d6570736575ULL;
	s.v1 = key[1] ^ 0x646f72616e646f6dULL;
	s.v2 = key[0] ^ 0x6c7967656e657261ULL;
	s.v3 = key[1] ^ 0x7465646279746573ULL;
#pragma unroll
	for (int i = 0; i < n; i++)
		sip_word(&s, m[i]);
	sip_word(&s, (__u64)(n * 8 + 7) << 56 | (tail & 0xffffffffffffffULL));
	s.v2 ^= 0xff;
#pragma unroll
	for (int i = 0; i < 4; i++)
		sip_round(&s);
	return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

/* The addresses of a TCP segment as the client sent it (client first). */
struct cookie_addrs {
	__u32 family;
	__u32 words[8]; /* IPv4: client, server, 0...; IPv6: client (4), server (4) */
};

/*
 * The cookie for a client's ISN `isn`, ports (client, server, network
 * order), the options' bits `data` (bits 8..0) and time slot `slot`.
 */
static __always_inline __u32 cookie_make(const struct cookie_addrs *a, __be16 cport, __be16 sport, __u32 isn,
					 __u32 data, __u64 slot)
{
	__u64 m[5];
	__u64 ends = (__u64)isn << 32 | (__u32)cport << 16 | sport;
	/* The slot (below 2^40 for two million years: the tail's 56 bits hold it) and the options' 9 bits. */
	__u64 when = slot << 16 | data;
	__u64 h;

	m[0] = (__u64)a->words[0] << 32 | a->words[1];
	if (a->family == 4) {
		m[1] = ends;
		h = siphash_words(settings.syn_key, m, 2, when);
	} else {
		m[1] = (__u64)a->words[2] << 32 | a->words[3];
		m[2] = (__u64)a->words[4] << 32 | a->words[5];
		m[3] = (__u64)a->words[6] << 32 | a->words[7];
		m[4] = ends;
		h = siphash_words(settings.syn_key, m, 5, when);
	}
	return ((__u32)h & ~COOKIE_DATA_MASK) | data;
}

/* The options' bits (8..0 but the slot bit) of a cookie for these options. */
static __always_inline __u32 cookie_data(const struct syn_opts *o, __u32 family)
{
	__u32 mssind = 0, mss = o->mss ? o->mss : cookie_mss(family, 0);

#pragma unroll
	for (int i = 1; i < 4; i++)
		if (mss >= cookie_mss(family, i))
			mssind = i;
	return mssind << COOKIE_MSS_SHIFT | (o->sack ? COOKIE_SACK : 0) | (o->wscale & COOKIE_WSCALE_NONE);
}

/* The gate clock's slot: 0 while the daemon has not set the clock (then no cookie is made or taken). */
static __always_inline __u64 cookie_slot(void)
{
	return settings.now_ms / SLUICE_COOKIE_SLOT_MS;
}

/*
 * Is `cookie` (the ACK's ack_seq - 1) a cookie the gate made for this
 * client's ISN (its seq - 1) in this slot or the one before? Its options'
 * bits are then in *data.
 */
static __always_inline int cookie_check(const struct cookie_addrs *a, __be16 cport, __be16 sport, __u32 isn,
					__u32 cookie, __u32 *data)
{
	__u64 slot = cookie_slot();
	__u32 d = cookie & COOKIE_DATA_MASK;

	if (!slot)
		return 0;
	if (((slot & 1) ? COOKIE_SLOT_BIT : 0) != (d & COOKIE_SLOT_BIT))
		slot -= 1; /* made in the slot before (its parity differs) */
	if (cookie_make(a, cport, sport, isn, d, slot) != cookie)
		return 0;
	*data = d;
	return 1;
}

/*
 * bpf_loop's state while reading a segment's options. Offsets, not packet
 * pointers: the verifier prunes a callback's states on scalars it need not
 * track exactly, while a pointer that moves on makes each pass a new state.
 */
struct opt_walk {
	void *data;      /* the frame */
	void *end;       /* its end */
	__u32 off;       /* the next option's offset in the frame */
	__u32 hdr_end;   /* the end of the TCP header (doff), as an offset */
	struct syn_opts *o;
};

/* Frames longer than this are not read for options (the headers are far below it). */
#define OPT_MAX_OFF 0x1ff

/* One option (a bpf_loop callback: verified once, whatever the count). 1 stops the walk. */
static long opt_step(__u64 index, void *arg)
{
	struct opt_walk *w = arg;
	struct syn_opts *o = w->o;
	__u32 off = w->off;
	__u8 *p, kind, len;

	if (off >= w->hdr_end || off > OPT_MAX_OFF)
		return 1;
	asm volatile("%[v] &= 0x1ff" : [v] "+r"(off)); /* the bound above, kept for the verifier */
	p = w->data + off;
	if ((void *)(p + 10) > w->end) {
		/* Near the frame's end: only one-byte options and a closing MSS, SACK or window scale. */
		if ((void *)(p + 1) > w->end)
			return 1;
	}
	kind = p[0];
	if (kind == TCPOPT_EOL)
		return 1;
	if (kind == TCPOPT_NOP) {
		w->off = off + 1;
		return 0;
	}
	if ((void *)(p + 2) > w->end)
		return 1;
	len = p[1];
	if (len < 2 || off + len > w->hdr_end)
		return 1;
	if (kind == TCPOPT_MSS && len == 4 && (void *)(p + 4) <= w->end)
		o->mss = (__u16)p[2] << 8 | p[3];
	else if (kind == TCPOPT_WINDOW && len == 3 && (void *)(p + 3) <= w->end)
		o->wscale = p[2] > 14 ? 14 : p[2];
	else if (kind == TCPOPT_SACK_PERM && len == 2)
		o->sack = 1;
	else if (kind == TCPOPT_TIMESTAMP && len == 10 && (void *)(p + 10) <= w->end) {
		o->ts = 1;
		o->tsval = (__u32)p[2] << 24 | (__u32)p[3] << 16 | (__u32)p[4] << 8 | p[5];
		o->tsecr = (__u32)p[6] << 24 | (__u32)p[7] << 16 | (__u32)p[8] << 8 | p[9];
	}
	w->off = off + len;
	return 0;
}

static __always_inline __u32 be32_at(const __u8 *p)
{
	return (__u32)p[0] << 24 | (__u32)p[1] << 16 | (__u32)p[2] << 8 | p[3];
}

/*
 * The options as Linux lays them out, read without a walk (the walk's
 * callback costs more than the rest of a SYN's answer): a SYN's MSS,
 * SACK-permitted, timestamps, NOP, window scale (20 bytes), an ACK's NOP,
 * NOP, timestamps (12), or none. 1 if they were that, and are in *o.
 */
static __always_inline int opts_linux(void *data, void *end, __u32 opts, __u32 hdr_end, struct syn_opts *o)
{
	__u32 len = hdr_end - opts;
	__u8 *p;

	if (len == 0)
		return 1;
	if (opts > OPT_MAX_OFF)
		return 0;
	asm volatile("%[v] &= 0x1ff" : [v] "+r"(opts)); /* the bound above, kept for the verifier */
	p = data + opts;
	if (len == 12 && (void *)(p + 12) <= end && be32_at(p) == 0x0101080a) {
		o->ts = 1;
		o->tsval = be32_at(p + 4);
		o->tsecr = be32_at(p + 8);
		return 1;
	}
	if (len != 20 || (void *)(p + 20) > end || p[0] != TCPOPT_MSS || p[1] != 4 || be32_at(p + 4) != 0x0402080a ||
	    be32_at(p + 16) >> 8 != 0x010303)
		return 0;
	o->mss = (__u16)p[2] << 8 | p[3];
	o->sack = 1;
	o->ts = 1;
	o->tsval = be32_at(p + 8);
	o->tsecr = be32_at(p + 12);
	o->wscale = p[19] > 14 ? 14 : p[19];
	return 1;
}

/*
 * Read a segment's options: from offset `opts` of the frame to `hdr_end`
 * (the TCP header's end; at most 40 bytes). Stops at EOL, at a length
 * under 2 or past the header; an option cut short is not taken.
 */
static __always_inline void syn_opts_read(void *data, void *end, __u32 opts, __u32 hdr_end, struct syn_opts *o)
{
	struct opt_walk w = { .data = data, .end = end, .off = opts, .hdr_end = hdr_end, .o = o };

	o->wscale = COOKIE_WSCALE_NONE;
	if (opts_linux(data, end, opts, hdr_end, o))
		return;
	bpf_loop(40, opt_step, &w, 0);
}

/* A 32-bit word of packet data that may have been written through another type. */
typedef __u32 __attribute__((may_alias)) csum_word;

/*
 * The one's-complement sum of the n 32-bit words at p, not folded (0 if
 * they pass `end`): in place of bpf_csum_diff, whose call costs more than
 * the few words of a SYN-ACK's headers.
 */
static __always_inline __u64 csum_words(const void *p, const void *end, int n)
{
	__u64 sum = 0;

	/*
	 * The caller checked the bounds, but the compiler may rebuild p from a
	 * spilled offset whose bounds the verifier has lost: hide p from it, so
	 * that the loads use the register this check is made on.
	 */
	asm volatile("" : "+r"(p));
	if (p + n * 4 > end)
		return 0;

#pragma unroll
	for (int i = 0; i < n; i++)
		sum += ((const csum_word *)p)[i];
	return sum;
}

/* Fold a 32-bit one's-complement sum to 16 bits (not inverted). */
static __always_inline __u16 csum_fold32(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

#endif /* SLUICE_SYNCOOKIE_H */
