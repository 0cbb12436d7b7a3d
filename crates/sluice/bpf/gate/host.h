/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/host.h - what the host itself needs from its default class.
 *
 * The default class holds every packet no service's class names, and the
 * budget throttles it first (down to budget::FLOOR_PPS) while a service is
 * in distress. Among those packets are some the host cannot do without:
 *   - replies to its own connections: an upstream's answers to a
 *     resolver's queries, a backend's to a proxy, a package mirror's
 *     download. They come to the ephemeral port of a socket the host
 *     connected (TCP, or UDP after connect()). The kernel's own socket
 *     lookup finds that socket for the packet's exact 4-tuple only; a
 *     flood would have to guess the peer's address and port and the
 *     local port. A TCP segment counts where the socket is in a state a
 *     connection of the host's own reaches (SYN_SENT: the SYN-ACK of its
 *     connect(); ESTABLISHED; the closing states), not a listener's, a
 *     request's or TIME_WAIT's; a UDP datagram where its socket is
 *     connected. The socket must be the host's own: its owner root, a
 *     system user (a uid under settings.host_uid_min, UID_MIN) or a systemd
 *     dynamic user, as discovery trusts a service's owner; a login user's
 *     or nobody's connected socket would let its peer's packets through
 *     the throttle at any rate (kernels before 6.2, without
 *     bpf_rdonly_cast, cannot read the owner and take any). A SYN is no
 *     reply. A datagram in fragments (IPv4, or IPv6 with its fragment
 *     header first): its first fragment (the ports are in it) is looked
 *     up, while the class is limited whether or not its limit drops it,
 *     and a reply is marked in its datagram's note (gate/frags.h); the
 *     non-first fragments that find that note pass too.
 *   - IPv6 neighbour discovery (ICMPv6 133-137 with hop limit 255, which
 *     RFC 4861 requires: only a neighbour on the link can send it) and
 *     PMTU messages (ICMP fragmentation needed, ICMPv6 packet too big):
 *     without them the host loses its neighbours, and its TCP connections
 *     stall on a smaller path. These prove nothing about their sender, so
 *     they pass at most SLUICE_HOST_ICMP_PPS per CPU (a bucket of their
 *     own, host_icmp) beyond the class's limit.
 * Such a packet that the default class's limit would drop is passed
 * instead, admitted in the class and counted HOST_REPLY or HOST_ICMP. A
 * blocked default class (an operator's config) stays blocked.
 *
 * Frames that are not IPv4/IPv6 (ARP, LLDP, STP, ...) name no port either,
 * and IPv4 needs ARP as IPv6 needs ND; an ARP flood costs the kernel its
 * neighbour table's work. They pass unmetered, counted NON_IP_PASS, while
 * the default class is unlimited (no service in distress, no configured
 * rate: always with no flood); while it is limited or blocked, at most
 * SLUICE_HOST_LINK_PPS per CPU (a bucket of their own) pass, the rest are
 * dropped, counted NON_IP_DROP (`host_link_passes`). A blocked default
 * class meters them too: blocking every unnamed IP packet is no reason to
 * lose the link's neighbours. They are not the class's packets (no class
 * counts them).
 *
 * Cost: asked only for packets the default class's limit drops, so never
 * with no flood. A reply check is a socket lookup (the kernel's, about as
 * costly as the rest of a drop: `sluice bench gate`), made only for a
 * TCP or UDP packet to a port in the host's ephemeral range
 * (settings.ephemeral_lo/hi, net.ipv4.ip_local_port_range, read by the
 * daemon): a flood to one closed port outside the range pays nothing.
 * Not looked at (the packet keeps its drop): frames with IPv4 options or
 * IPv6 extension headers other than a first fragment's fragment header
 * right after the fixed one (l3_for_lookup), and the
 * sockets of other network namespaces (containers' and pods': their flows
 * are routed, not delivered here). Included by gate.bpf.c after
 * synack.h.
 */
#ifndef SLUICE_GATE_HOST_H
#define SLUICE_GATE_HOST_H

#define ICMP_FRAG_NEEDED_TYPE 3 /* destination unreachable ... */
#define ICMP_FRAG_NEEDED_CODE 4 /* ... fragmentation needed */
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_ND_FIRST 133 /* router solicitation */
#define ICMPV6_ND_LAST 137  /* redirect */
#define ND_HOP_LIMIT 255

/* The host's buckets on each CPU (entries of host_buckets). */
enum host_bucket {
	HOST_BUCKET_ICMP = 0, /* ND and PMTU messages */
	HOST_BUCKET_LINK = 1, /* frames that are not IPv4/IPv6 */
};

/* A bucket of `per_sec` packets a second, `depth` deep (clock_skip < the
 * depth, as dataplane::share::share sets it). */
#define HOST_SHARE(per_sec, depth)                                                              \
	{                                                                                       \
		.rate_pps = (per_sec), .burst = (depth), .fill_ns = (depth) * 1000000000ull / (per_sec), \
		.mode = SLUICE_MODE_LIMITED, .clock_skip = SLUICE_CLOCK_SKIP,                    \
	}

static const struct sluice_share host_icmp_share = HOST_SHARE(SLUICE_HOST_ICMP_PPS, SLUICE_HOST_ICMP_BURST);
static const struct sluice_share host_link_share = HOST_SHARE(SLUICE_HOST_LINK_PPS, SLUICE_HOST_LINK_BURST);

/* Is this TCP state one a connection the host opened reaches (not a listener's, a request's, TIME_WAIT's)? */
static __always_inline int host_tcp_state(__u32 state)
{
	switch (state) {
	case BPF_TCP_SYN_SENT:
	case BPF_TCP_ESTABLISHED:
	case BPF_TCP_FIN_WAIT1:
	case BPF_TCP_FIN_WAIT2:
	case BPF_TCP_CLOSE_WAIT:
	case BPF_TCP_CLOSING:
	case BPF_TCP_LAST_ACK:
		return 1;
	}
	return 0;
}

/* Is this socket (a full one: a UDP socket, or TCP in a host_tcp_state) owned by a trusted user? */
static __always_inline int host_owner_trusted(struct bpf_sock *sk)
{
	struct sock *s;
	__u32 uid;

	if (!bpf_ksym_exists(bpf_rdonly_cast))
		return 1;
	s = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock));
	uid = s->sk_uid.val;
	return uid < settings.host_uid_min || (uid >= SLUICE_DYNAMIC_UID_LO && uid <= SLUICE_DYNAMIC_UID_HI);
}

/* Is this TCP or UDP packet a reply to a connection of the host's own? */
static __always_inline int host_reply(struct xdp_md *ctx, const struct pkt *pk)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u8 l4 = pk->slot == SLUICE_SLOT_UDP ? IPPROTO_UDP : IPPROTO_TCP;
	struct bpf_sock_tuple t = {};
	struct cookie_addrs a = {};
	struct bpf_sock *sk;
	__u32 family = 0, size;
	__be16 *ports;
	void *ip;
	int ok;

	if (pk->slot == SLUICE_SLOT_TCP && (pk->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return 0;
	if (settings.ephemeral_hi && (pk->port < settings.ephemeral_lo || pk->port > settings.ephemeral_hi))
		return 0;
	ports = lookup_l4(data, end, l4, pk->first_fragment, &family, &ip);
	if (!ports)
		return 0;
	cookie_addrs_of(ip, family, &a);
	size = cookie_tuple(&a, ports[0], ports[1], &t);
	if (l4 == IPPROTO_UDP) {
		sk = bpf_sk_lookup_udp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return 0;
		ok = sk->state == BPF_TCP_ESTABLISHED; /* connect()ed */
	} else {
		sk = bpf_skc_lookup_tcp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return 0;
		ok = host_tcp_state(sk->state);
	}
	ok = ok && host_owner_trusted(sk);
	bpf_sk_release(sk);
	if (ok && pk->first_fragment)
		frag_note_reply(pk);
	return ok;
}

/* Is this ICMP packet IPv6 neighbour discovery or a PMTU message? */
static __always_inline int host_icmp_needed(struct xdp_md *ctx, const struct pkt *pk)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 family = 0;
	__u8 *icmp, type;
	void *ip;

	icmp = lookup_l4(data, end, pk->family == 4 ? IPPROTO_ICMP : IPPROTO_ICMPV6, 0, &family, &ip);
	if (!icmp)
		return 0;
	type = icmp[0];
	if (family == 4)
		return type == ICMP_FRAG_NEEDED_TYPE && icmp[1] == ICMP_FRAG_NEEDED_CODE;
	if (type == ICMPV6_PKT_TOOBIG)
		return 1;
	return type >= ICMPV6_ND_FIRST && type <= ICMPV6_ND_LAST &&
	       ((struct ipv6hdr *)ip)->hop_limit == ND_HOP_LIMIT;
}

/*
 * Must this packet of the default class, which its limit drops (`dropped`),
 * be passed as something the host needs? Counts it (HOST_REPLY, HOST_ICMP)
 * if so. Also asked, not dropped, for a first fragment while the class
 * is limited: if it is a reply, its other fragments are marked so.
 */
static __always_inline int host_needs(struct xdp_md *ctx, const struct pkt *pk, int dropped)
{
	__u32 which = HOST_BUCKET_ICMP;
	struct sluice_bucket *b;

	if (pk->fragment) {
		if (!pk->frag_reply)
			return 0;
		global_inc(SLUICE_GS_HOST_REPLY);
		return 1;
	}
	if (pk->slot == SLUICE_SLOT_UDP || pk->slot == SLUICE_SLOT_TCP) {
		if (!host_reply(ctx, pk))
			return 0;
		if (dropped)
			global_inc(SLUICE_GS_HOST_REPLY);
		return 1;
	}
	if (pk->port != IPPROTO_ICMP && pk->port != IPPROTO_ICMPV6)
		return 0;
	b = bpf_map_lookup_elem(&host_buckets, &which);
	if (!b || !host_icmp_needed(ctx, pk) || !bucket_take(&host_icmp_share, b))
		return 0;
	global_inc(SLUICE_GS_HOST_ICMP);
	return 1;
}

/*
 * May this frame, not IPv4/IPv6, pass? Yes while the default class `cls`
 * is unlimited; while it is limited or blocked, as long as this CPU's link
 * bucket has a token.
 */
static __always_inline int host_link_passes(__u32 cls)
{
	__u32 which = HOST_BUCKET_LINK;
	struct sluice_share *sh = share_here(cls);
	struct sluice_bucket *b;

	if (!sh || sh->mode == SLUICE_MODE_UNLIMITED)
		return 1;
	b = bpf_map_lookup_elem(&host_buckets, &which);
	return !b || bucket_take(&host_link_share, b);
}

#endif /* SLUICE_GATE_HOST_H */
