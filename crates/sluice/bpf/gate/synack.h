/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/synack.h - SYN cookies at the driver, the XDP side: finding the
 * listener, building the SYN-ACK in place, and the ACKs and RSTs of no
 * connection while a class's guard answers. The cookie itself is in
 * syncookie.h; the tc checker that hands valid cookies to the kernel is
 * gate/checker.h; the frames the lookups take, gate/lookup.h. Included by
 * gate.bpf.c after sources.h and lookup.h.
 */
#ifndef SLUICE_GATE_SYNACK_H
#define SLUICE_GATE_SYNACK_H

/*
 * SYN cookies at the driver (syncookie.h has the why and the cookie). The
 * cookie paths take TCP over IPv4 without options or IPv6 with TCP as the
 * first next header; anything else goes the normal way.
 */
#define SYNACK_TCP_LEN 40 /* the SYN-ACK's TCP header: 20 bytes and 20 of options */

/*
 * A segment's addresses, options and socket lookup tuple while syn_answer
 * or segment_of_no_connection looks at it, off the stack: these global
 * functions' frames add to the gate's own within the verifier's 512 bytes
 * (as fib_scratch in gate/maps.h). One per CPU; neither runs inside the other.
 */
struct seg_scratch {
	struct cookie_addrs a;
	struct syn_opts o;
	struct bpf_sock_tuple tuple;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct seg_scratch);
} seg_scratch SEC(".maps");

/* This CPU's seg_scratch, zeroed (NULL: never, for an array's one key). */
static __always_inline struct seg_scratch *scratch(void)
{
	__u32 zero = 0;
	struct seg_scratch *sc = bpf_map_lookup_elem(&seg_scratch, &zero);

	if (sc)
		__builtin_memset(sc, 0, sizeof(*sc));
	return sc;
}

/* The address families of struct bpf_fib_lookup (sys/socket.h's, which BPF code does not include). */
#define SL_AF_INET 2
#define SL_AF_INET6 10

/*
 * The TCP header of a frame the cookie paths take, its fixed 20 bytes
 * within the frame, or NULL. *l3 is then the IP header's offset (at most
 * COOKIE_L3_MAX, bounded for the verifier) and *family 4 or 6.
 */
static __always_inline struct tcphdr *cookie_tcp(void *data, void *end, __u32 *l3, __u32 *family)
{
	__u32 off = cookie_l3(data, end, family, IPPROTO_TCP);
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
 * Does this listener hold half its backlog or more in request sockets
 * (half-open handshakes)? The kernel answers a SYN with its own cookie once
 * they pass the backlog (inet_csk_reqsk_queue_is_full); at half, a flood
 * is filling the queue (a service's own clients hold a request socket for
 * one round trip each), and the gate answers from there on, before the
 * kernel has to (`early` in struct sluice_syn_guard, bpf/sluice.h). A
 * listener with backlog 0 counts from its first request socket.
 */
static __always_inline int listener_filling(struct bpf_sock *skc)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	__u32 qlen, backlog;

	if (!tp)
		return 0;
	qlen = tp->inet_conn.icsk_accept_queue.qlen.counter;
	backlog = tp->inet_conn.icsk_inet.sk.sk_max_ack_backlog;
	return qlen && 2 * qlen >= backlog;
}

/* A client address's bit in each half of syn_peers (IPv4 hashed as ::ffff:a.b.c.d). */
static __always_inline __u32 syn_peer_bit_of(const struct cookie_addrs *a)
{
	struct sluice_syn_peer k;

	if (a->family == 4) {
		k.addr[0] = 0;
		k.addr[1] = 0;
		k.addr[2] = bpf_htonl(0xffff);
		k.addr[3] = a->words[0];
	} else {
		__builtin_memcpy(k.addr, a->words, sizeof(k.addr));
	}
	return syn_peer_bit(&k);
}

/* May this client address hold a socket on an answering class's port (its bit in either half of syn_peers)? */
static __always_inline int syn_peer_held(const struct cookie_addrs *a)
{
	__u32 bit = syn_peer_bit_of(a), word = bit / 64;
	__u64 *daemon, *gate;

	daemon = bpf_map_lookup_elem(&syn_peers, &word);
	word += SLUICE_SYN_PEER_WORDS;
	gate = bpf_map_lookup_elem(&syn_peers, &word);
	if (!daemon || !gate)
		return 1; /* cannot happen: the index is below max_entries; looked up, to be safe */
	return ((*daemon | *gate) >> (bit % 64)) & 1;
}

/* This client address holds a socket, or is about to: set its bit in the gate's half of syn_peers. */
static __always_inline void syn_peer_mark(const struct cookie_addrs *a)
{
	__u32 bit = syn_peer_bit_of(a), word = SLUICE_SYN_PEER_WORDS + bit / 64;
	__u64 *w = bpf_map_lookup_elem(&syn_peers, &word);

	/* Read first: a word every CPU only reads stays in every cache. */
	if (w && !((*w >> (bit % 64)) & 1))
		__sync_fetch_and_or(w, 1ULL << (bit % 64));
}

/* What the socket lookup of a segment's 4-tuple found. */
enum lookup_found {
	FOUND_NONE = 0,     /* no socket: a closed port (the kernel's RST) */
	FOUND_LISTENER = 1, /* the listener itself (one that takes a gate cookie, if asked) */
	FOUND_OTHER = 2,    /* another socket of the 4-tuple (open, half-open, TIME_WAIT), or an MPTCP listener */
	FOUND_ROOMY = 3,    /* for an early SYN: the listener, its SYN queue not filling (listener_filling) */
};

/* What a lookup is for. */
enum lookup_for {
	FOR_SEGMENT = 0,   /* an ACK or RST while the guard answers (no_connection) */
	FOR_SYN = 1,       /* a SYN the guard answers: the listener must take a gate cookie (not MPTCP's) */
	FOR_EARLY_SYN = 2, /* the same, the guard only watching: and its SYN queue must be filling */
};

/*
 * Look a segment's 4-tuple up. For a SYN the lookup decides (struct
 * sluice_syn_guard says where the daemon and syn_peers decide instead),
 * the gate answers only when it finds the listener, and only one that
 * takes a gate cookie (FOR_SYN: not MPTCP's). Another socket is found
 * for a SYN that reuses the 4-tuple of one in TIME_WAIT (a client cycling
 * connections fast): the kernel must take that SYN, as only it can retire
 * the old socket (a cookie's ACK would meet the TIME_WAIT socket and never
 * open the connection). None is found for a closed port: the kernel's RST.
 * A client whose segment finds another socket gets its bit in syn_peers
 * while the guard answers.
 */
static __always_inline enum lookup_found look_up(struct xdp_md *ctx, struct seg_scratch *sc, const struct tcphdr *th,
						 enum lookup_for why)
{
	const struct cookie_addrs *a = &sc->a;
	__u32 size = cookie_tuple(a, th->source, th->dest, &sc->tuple);
	struct bpf_sock *skc = bpf_skc_lookup_tcp(ctx, &sc->tuple, size, BPF_F_CURRENT_NETNS, 0);
	enum lookup_found found;

	if (!skc)
		return FOUND_NONE;
	if (skc->state != BPF_TCP_LISTEN) {
		found = FOUND_OTHER;
		if (why != FOR_EARLY_SYN)
			syn_peer_mark(a); /* watching, no guard answers: the daemon's read when one starts holds it */
	} else {
		found = why != FOR_SEGMENT && is_mptcp(skc) ? FOUND_OTHER : FOUND_LISTENER;
		if (why == FOR_EARLY_SYN && found == FOUND_LISTENER && !listener_filling(skc))
			found = FOUND_ROOMY;
	}
	bpf_sk_release(skc);
	return found;
}

/*
 * Would the kernel forward this segment to another machine? Asked only where
 * the gate's interface forwards the family (SLUICE_SYN_ROUTES_*): a wildcard
 * listener matches any destination at the socket lookup, so without this the
 * gate would answer a SYN routed through the host in the name of the machine
 * it is for, and drop the ACKs of that machine's connections. Forwarded: the
 * FIB has a route (the neighbour is not looked up). Not forwarded: local
 * delivery, no route, or forwarding off on the device after all.
 */
static __always_inline int routed_through(struct xdp_md *ctx, const struct cookie_addrs *a, const struct tcphdr *th)
{
	__u32 zero = 0;
	struct bpf_fib_lookup *p;
	long ret;

	if (!(settings.syn_allow & (a->family == 4 ? SLUICE_SYN_ROUTES_V4 : SLUICE_SYN_ROUTES_V6)))
		return 0;
	p = bpf_map_lookup_elem(&fib_scratch, &zero);
	if (!p)
		return 0;
	__builtin_memset(p, 0, sizeof(*p));
	p->ifindex = ctx->ingress_ifindex;
	p->l4_protocol = IPPROTO_TCP;
	p->sport = th->source;
	p->dport = th->dest;
	if (a->family == 4) {
		p->family = SL_AF_INET;
		p->ipv4_src = a->words[0];
		p->ipv4_dst = a->words[1];
	} else {
		p->family = SL_AF_INET6;
		__builtin_memcpy(p->ipv6_src, &a->words[0], 16);
		__builtin_memcpy(p->ipv6_dst, &a->words[4], 16);
	}
	ret = bpf_fib_lookup(ctx, p, sizeof(*p), BPF_FIB_LOOKUP_SKIP_NEIGH);
	return ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH || ret == BPF_FIB_LKUP_RET_FRAG_NEEDED;
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
static __always_inline int xdp_tracked(struct xdp_md *ctx, struct seg_scratch *sc, const struct tcphdr *th)
{
	struct bpf_ct_opts___sl opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = IPPROTO_TCP };
	__u32 size = cookie_tuple(&sc->a, th->source, th->dest, &sc->tuple);
	struct nf_conn *ct;

	if (!bpf_xdp_ct_lookup || !bpf_ct_release)
		return 0;
	ct = bpf_xdp_ct_lookup(ctx, &sc->tuple, size, &opts, sizeof(opts));
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
static __always_inline __sum16 synack_csum(struct tcphdr *t, void *end, __u64 pseudo)
{
	return ~csum_fold32(pseudo + csum_words(t, end, SYNACK_TCP_LEN / 4));
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
	ip->check = ~csum_fold32(csum_words(ip, end, sizeof(*ip) / 4));
	synack_tcp(t, o, cport, sport, isn, cookie, settings.syn_mss4 ? settings.syn_mss4 : 1460);
	t->check = synack_csum(t, end, (__u64)ip->saddr + ip->daddr + bpf_htons(IPPROTO_TCP) + bpf_htons(SYNACK_TCP_LEN));
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
	t->check = synack_csum(t, end, pseudo);
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

/* How syn_answer answered a SYN, if it did. */
enum syn_answered {
	SYN_NOT_ANSWERED = 0, /* the SYN goes the normal way */
	SYN_LOOKED_UP = 1,    /* answered after the socket lookup found the listener */
	SYN_DIRECT = 2,       /* answered without the lookup (struct sluice_syn_guard) */
	SYN_EARLY = 3,        /* the guard only watches, the listener's SYN queue was filling (`early`) */
};

/*
 * Answer a SYN with a cookie SYN-ACK built in its own frame (the caller
 * returns XDP_TX), for a class whose guard answers (`answer`, with
 * `direct` its SLUICE_SYN_DIRECT_* families that skip the lookup), or only
 * watches (answer 0; `early` in struct sluice_syn_guard): the SYN is then
 * answered only if the lookup finds its listener's SYN queue filling
 * (listener_filling). Returns an enum syn_answered.
 * A global function: the verifier checks it once, on its own, rather than
 * once for each way through the parser that reaches it (the gate was at
 * 900k of the verifier's 1M instructions with it inlined).
 * The SYN goes the normal way (SYN_NOT_ANSWERED) for a header the cookie
 * paths do not take, no gate clock or key yet, a frame that cannot be
 * resized, a SYN the kernel would forward to another machine
 * (routed_through), and, where the lookup decides, no listener found for
 * it (see look_up). A SYN's data, if any, is not kept (the client sends it
 * again, as after the kernel's own cookies).
 */
__noinline int syn_answer(struct xdp_md *ctx, __u32 answer, __u32 direct)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct seg_scratch *sc;
	__u64 slot = cookie_slot();
	__u32 family = 0, iplen, isn, cookie, bits, len;
	__be16 cport, sport;
	struct tcphdr *th;
	__u32 l3;
	int skip;

	if (!slot || !(settings.syn_key[0] | settings.syn_key[1]))
		return SYN_NOT_ANSWERED;
	sc = scratch();
	if (!sc)
		return SYN_NOT_ANSWERED;
	th = cookie_tcp(data, end, &l3, &family);
	if (!th || th->doff < 5)
		return SYN_NOT_ANSWERED;
	iplen = family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	if ((void *)th - data > COOKIE_L3_MAX + sizeof(struct ipv6hdr))
		return SYN_NOT_ANSWERED;
	cookie_addrs_of(data + l3, family, &sc->a);
	if (routed_through(ctx, &sc->a, th))
		return SYN_NOT_ANSWERED;
	skip = answer && (direct & (family == 4 ? SLUICE_SYN_DIRECT_V4 : SLUICE_SYN_DIRECT_V6)) && !syn_peer_held(&sc->a);
	if (!skip && look_up(ctx, sc, th, answer ? FOR_SYN : FOR_EARLY_SYN) != FOUND_LISTENER)
		return SYN_NOT_ANSWERED;
	syn_opts_read(data, end, (void *)(th + 1) - data, (void *)th - data + th->doff * 4, &sc->o);
	syn_opts_allowed(&sc->o);
	isn = bpf_ntohl(th->seq);
	cport = th->source;
	sport = th->dest;
	bits = cookie_data(&sc->o, family) | ((slot & 1) ? COOKIE_SLOT_BIT : 0);
	cookie = cookie_make(&sc->a, cport, sport, isn, bits, slot);
	len = l3 + iplen + SYNACK_TCP_LEN;
	if (len != end - data && bpf_xdp_adjust_tail(ctx, (int)len - (int)(end - data)))
		return SYN_NOT_ANSWERED; /* a Linux SYN is the SYN-ACK's size already */
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (!(family == 4 ? synack_v4(data, end, l3, &sc->o, cport, sport, isn, cookie)
			  : synack_v6(data, end, l3, &sc->o, cport, sport, isn, cookie)))
		return SYN_NOT_ANSWERED;
	return !answer ? SYN_EARLY : skip ? SYN_DIRECT : SYN_LOOKED_UP;
}

/*
 * A SYN of class `cls` was answered early (SYN_EARLY): the checker looks at
 * the class's ACKs for SLUICE_SYN_CHECK_MS from now (syn_early; written at
 * most once a second per class, and the latest of all beside it), and this
 * CPU looks up each of the class's next SLUICE_WATCH_ALL SYNs.
 */
static __always_inline void note_early(__u32 cls, struct sluice_class_state *st)
{
	__u32 any = SLUICE_CLASS_IDS;
	__u64 until = settings.now_ms + SLUICE_SYN_CHECK_MS;
	__u64 *mine = bpf_map_lookup_elem(&syn_early, &cls);
	__u64 *all = bpf_map_lookup_elem(&syn_early, &any);

	if (mine && *mine + 1000 < until)
		*mine = until;
	if (all && *all + 1000 < until)
		*all = until;
	st->watch_all = SLUICE_WATCH_ALL;
	st->cnt[SLUICE_CS_SYNACK_EARLY] += 1;
}

/*
 * Is this SYN of a watching guard's class one to look up (sluice.h,
 * SLUICE_WATCH_EVERY)? Each after an early answer on this CPU, else one in
 * SLUICE_WATCH_EVERY (syn_guarded counted it in SYN_PKTS).
 */
static __always_inline int watch_due(struct sluice_class_state *st)
{
	if (st->watch_all) {
		st->watch_all -= 1;
		return 1;
	}
	return !(st->cnt[SLUICE_CS_SYN_PKTS] & (SLUICE_WATCH_EVERY - 1));
}

/*
 * The guard of this SYN's class if the gate may answer it (a class whose
 * guard answers, or watches its listeners' SYN queues: `early`;
 * a client not known or over its own rate), else NULL.
 */
static __always_inline struct sluice_syn_guard *syn_guarded(const struct pkt *pk, __u32 gen, __u32 cls,
							    struct sluice_class_state *st)
{
	struct sluice_syn_guard *g;

	if (pk->slot != SLUICE_SLOT_TCP || (pk->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
		return NULL;
	st->cnt[SLUICE_CS_SYN_PKTS] += 1;
	if (pk->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN))
		return NULL; /* SYN+FIN, SYN+RST: the normal way (the kernel refuses them) */
	g = bpf_map_lookup_elem(&syn_guard, &cls);
	if (!g || !(g->answer || g->early) || settings.verdicts[gen].observe ||
	    !(settings.syn_allow & SLUICE_SYN_COOKIES))
		return NULL; /* tcp_syncookies = 0: the listener would ignore the cookie's request socket */
	/* A known client takes the kernel's own path, with every option it
	 * offered, within its own rate (as in the known tier): past it, or
	 * from an address that only shares its /64, a SYN flood spoofing it
	 * gets cookies like anyone's. */
	struct sluice_known *v = known_entry(pk, cls);

	return v && known_within_rate(v, pk) ? NULL : g;
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
 * The lookups of no_connection (below) for an ACK (`rst` 0) or RST of a
 * class whose guard answers: 1 if it belongs to no connection. A global
 * function, as syn_answer (the verifier checks it once, and its frame is
 * not the gate's).
 */
__noinline int segment_of_no_connection(struct xdp_md *ctx, __u32 rst)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct seg_scratch *sc = scratch();
	struct tcphdr *th;
	__u32 family = 0, l3;
	void *ip;

	if (!sc)
		return 0;
	th = cookie_tcp(data, end, &l3, &family);
	if (!th)
		return 0;
	ip = data + l3;
	if (ip + sizeof(struct ipv6hdr) > end)
		return 0;
	cookie_addrs_of(ip, family, &sc->a);
	if (routed_through(ctx, &sc->a, th) || look_up(ctx, sc, th, FOR_SEGMENT) != FOUND_LISTENER)
		return 0;
	if (!rst && ack_has_cookie(ip, th, &sc->a)) {
		syn_peer_mark(&sc->a); /* the connection the cookie opens */
		return 0;
	}
	/* Last, for what the rest would drop: a NATed connection's segments. */
	return !xdp_tracked(ctx, sc, th);
}

/*
 * ODD_L3. While a class's SYN guard answers, a SYN, ACK or RST whose TCP header
 * follows IPv4 options or IPv6 extension headers: the cookie paths take
 * neither (they build the SYN-ACK in the SYN's own frame, and the
 * checker's cookie check reads a plain header), so such a segment could be
 * neither answered nor checked, and a flood of them reached the kernel
 * whole. No TCP stack sends them unasked (Linux only with IP_OPTIONS or
 * IPv6 ancillary headers set by the application; RFC 7126 advises routers
 * to drop most IPv4 options), so while the guard answers they are dropped,
 * counted ODD_L3_DROP (by the gate, which drops them: gate.bpf.c). A
 * connection using them stalls while the guard answers (seconds) and goes
 * on after.
 *
 * While a class's SYN guard answers (a SYN flood, often with ACKs and RSTs
 * of random sequence numbers beside it), is this ACK or RST one of no
 * connection, to drop? It is if the socket lookup finds only the listener
 * and it is an RST, or an ACK with no valid cookie: the kernel would spend a
 * lookup and a RST on each. Packets of established, TIME_WAIT and
 * half-open connections find their own socket and pass; a closed port
 * finds none (the kernel's RST, as before); a connection NATed elsewhere
 * (its socket the NAT target's) is conntrack's, asked last (xdp_tracked).
 * A segment the kernel would forward to another machine is its (see
 * routed_through). The client of a segment that finds its own socket, or
 * of an ACK with a valid cookie, gets its bit in syn_peers: its next SYN
 * is looked up.
 * Costs a socket lookup per TCP packet of the class, only while the guard
 * answers, and a conntrack lookup per packet it would drop.
 */
static __always_inline int no_connection(struct xdp_md *ctx, const struct pkt *pk, __u32 cls)
{
	struct sluice_syn_guard *g;

	if (pk->slot != SLUICE_SLOT_TCP || (pk->tcp_flags & TCP_FLAG_SYN) ||
	    !(pk->tcp_flags & (TCP_FLAG_ACK | TCP_FLAG_RST)))
		return 0;
	g = bpf_map_lookup_elem(&syn_guard, &cls);
	if (!g || !g->answer)
		return 0;
	if (pk->odd_l3)
		return 1; /* ODD_L3, above */
	return segment_of_no_connection(ctx, pk->tcp_flags & TCP_FLAG_RST);
}

#endif /* SLUICE_GATE_SYNACK_H */
