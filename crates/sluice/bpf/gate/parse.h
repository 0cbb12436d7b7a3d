/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/parse.h - the packet parser the gate and its two tc programs share:
 * Ethernet and VLAN tags, IPv4 or IPv6 (extension headers to a fixed depth),
 * and the L4 header, into a struct pkt (classify.h). Included by gate.bpf.c.
 */
#ifndef SLUICE_GATE_PARSE_H
#define SLUICE_GATE_PARSE_H

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
 * port-less. The header must end within the frame (end) and within the IP
 * packet (lim: where its length field says it ends; bytes past it are the
 * frame's padding, which must not pose as a port, nor a SYN in it get a
 * SYN-ACK). pos past either means the headers before it claimed more bytes
 * than the packet has (an IPv6 extension header's length): malformed.
 * Both are checked: the verifier learns bounds only from end.
 */
static __always_inline int l4_fits(void *pos, void *end, void *lim, __u32 len)
{
	return pos + len <= end && pos + len <= lim;
}

static __always_inline int parse_l4(void *pos, void *end, void *lim, __u8 proto, struct pkt *pk, int egress)
{
	__u32 port_off = egress ? 0 : 2;

	if (pos > end || pos > lim)
		return PARSE_MALFORMED;
	switch (proto) {
	case IPPROTO_UDP:
		if (!l4_fits(pos, end, lim, SLUICE_UDP_HLEN))
			return PARSE_MALFORMED;
		pk->slot = SLUICE_SLOT_UDP;
		pk->port = bpf_ntohs(*(__be16 *)(pos + port_off));
		pk->peer_port = bpf_ntohs(*(__be16 *)(pos + (2 - port_off)));
		return PARSE_OK;
	case IPPROTO_TCP:
		if (!l4_fits(pos, end, lim, SLUICE_TCP_HLEN))
			return PARSE_MALFORMED;
		pk->slot = SLUICE_SLOT_TCP;
		pk->port = bpf_ntohs(*(__be16 *)(pos + port_off));
		pk->peer_port = bpf_ntohs(*(__be16 *)(pos + (2 - port_off)));
		pk->tcp_flags = *(__u8 *)(pos + 13);
		/* Stored, not compared: a branch here would split every way through the parser in two. */
		pk->tcp_hlen = *(__u8 *)(pos + 12) >> 4;
		pk->l4_len = lim - pos;
		return PARSE_OK;
	case IPPROTO_ICMP:
		if (!l4_fits(pos, end, lim, SLUICE_ICMP_HLEN))
			return PARSE_MALFORMED;
		break;
	case IPPROTO_ICMPV6:
		if (!l4_fits(pos, end, lim, SLUICE_ICMPV6_HLEN))
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
	__u32 hlen, tot;

	if ((void *)(ip + 1) > end)
		return PARSE_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;
	hlen = ip->ihl * 4;
	if (pos + hlen > end)
		return PARSE_MALFORMED;
	/* The packet's own length (0: a BIG TCP packet's, unset; then the frame's). */
	tot = bpf_ntohs(ip->tot_len);
	if (tot && tot < hlen)
		return PARSE_MALFORMED;
	pk->family = 4;
	pk->peer4 = egress ? ip->daddr : ip->saddr;
	pk->frag_id = ip->id;
	if (ip->frag_off & bpf_htons(0x1fff)) {
		/* Non-first fragment: no L4 header, classify by protocol only. */
		pk->fragment = 1;
		pk->slot = SLUICE_SLOT_PORTLESS;
		pk->port = ip->protocol;
		return PARSE_OK;
	}
	pk->odd_l3 = hlen != sizeof(struct iphdr);
	pk->first_fragment = (ip->frag_off & bpf_htons(0x2000)) != 0;
	return parse_l4(pos + hlen, end, tot ? pos + tot : end, ip->protocol, pk, egress);
}

struct ipv6_opt_hdr_min {
	__u8 nexthdr;
	__u8 hdrlen;
};

/* An IPv6 fragment header (8 bytes); frag_off holds the offset in 8-byte
 * units (FRAG6_OFFSET: not 0 in a non-first fragment) and the M flag. */
struct frag6_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 id;
};
#define FRAG6_OFFSET 0xfff8
#define FRAG6_MORE 0x0001

static __always_inline int parse_ipv6(void *pos, void *end, struct pkt *pk, int egress)
{
	struct ipv6hdr *ip6 = pos;
	__u8 nexthdr;
	void *p, *lim;

	if ((void *)(ip6 + 1) > end)
		return PARSE_MALFORMED;
	if (ip6->version != 6)
		return PARSE_MALFORMED;
	pk->family = 6;
	pk->peer6 = egress ? ip6->daddr : ip6->saddr;
	nexthdr = ip6->nexthdr;
	p = ip6 + 1;
	/* The packet's own end (payload length 0: a jumbogram's, in a hop-by-hop option; then the frame's). */
	lim = ip6->payload_len ? p + bpf_ntohs(ip6->payload_len) : end;

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
			struct frag6_hdr *fh = p;

			if ((void *)(fh + 1) > end)
				return PARSE_MALFORMED;
			nexthdr = fh->nexthdr;
			pk->frag_id = fh->id;
			if (fh->frag_off & bpf_htons(FRAG6_OFFSET)) {
				/* Its class is its first fragment's where the gate saw
				 * that (gate/frags.h); else by the next header it names. */
				pk->fragment = 1;
				pk->slot = SLUICE_SLOT_PORTLESS;
				pk->port = nexthdr;
				return PARSE_OK;
			}
			pk->first_fragment = (fh->frag_off & bpf_htons(FRAG6_MORE)) != 0;
			p = fh + 1;
			break;
		}
		default:
			pk->odd_l3 = i > 0;
			return parse_l4(p, end, lim, nexthdr, pk, egress);
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
	pk->odd_l3 = 1;
	return parse_l4(p, end, lim, nexthdr, pk, egress);
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

#endif /* SLUICE_GATE_PARSE_H */
