/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/lookup.h - the frames the gate's socket lookups take, and the
 * lookup's tuple: for the SYN cookies (synack.h, checker.h), the room kept
 * in a socket (room.h) and the replies to the host's own connections
 * (host.h). They take IPv4 without options, IPv6 with the L4 header first
 * after the fixed one, and no fragment but, where asked, an IPv4 first
 * fragment; anything else keeps its verdict. Included by gate.bpf.c after
 * parse.h.
 */
#ifndef SLUICE_GATE_LOOKUP_H
#define SLUICE_GATE_LOOKUP_H

/* Reads a socket a lookup found as the kernel's struct sock (6.2 and later; room.h, host.h). */
extern void *bpf_rdonly_cast(const void *obj__ign, __u32 btf_id) __ksym __weak;

/* Where the IP header can start: after Ethernet and SLUICE_MAX_VLAN tags. */
#define COOKIE_L3_MAX (ETH_HLEN + 4 * SLUICE_MAX_VLAN)
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

/* Is this IPv6 packet (header bounds checked) a first fragment whose
 * fragment header follows the fixed one, with protocol `l4` after it? */
static __always_inline int first_fragment_of(struct ipv6hdr *ip6, void *end, __u8 l4)
{
	struct frag6_hdr *fh = (void *)(ip6 + 1);

	return ip6->nexthdr == IPPROTO_FRAGMENT && (void *)(fh + 1) <= end && fh->nexthdr == l4 &&
	       !(fh->frag_off & bpf_htons(FRAG6_OFFSET));
}

/*
 * The IP header's offset in the frame (at most COOKIE_L3_MAX), or
 * COOKIE_NO_L3 if the socket-lookup paths (the cookies', the room check's
 * in room.h, host.h's) do not take the frame: IPv4 with options or
 * fragmented (but for a first fragment where `first_fragment`: its L4
 * header is whole), IPv6 with an extension header (but, where
 * `first_fragment`, a first fragment's fragment header), or an L4 protocol
 * other than `l4`; *family 4 or 6.
 */
static __always_inline __u32 l3_for_lookup(void *data, void *end, __u32 *family, __u8 l4, int first_fragment)
{
	void *pos = data;
	__be16 proto = 0;

	if (parse_eth(&pos, end, &proto) != PARSE_OK)
		return COOKIE_NO_L3;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = pos;

		if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != l4 ||
		    (ip->frag_off & bpf_htons(first_fragment ? 0x1fff : 0x3fff)))
			return COOKIE_NO_L3;
		*family = 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = pos;

		if ((void *)(ip6 + 1) > end)
			return COOKIE_NO_L3;
		if (ip6->nexthdr != l4 && !(first_fragment && first_fragment_of(ip6, end, l4)))
			return COOKIE_NO_L3;
		*family = 6;
	} else {
		return COOKIE_NO_L3;
	}
	return pos - data;
}

/* l3_for_lookup of an unfragmented frame: the SYN cookies' and the room check's. */
static __always_inline __u32 cookie_l3(void *data, void *end, __u32 *family, __u8 l4)
{
	return l3_for_lookup(data, end, family, l4, 0);
}

/*
 * The L4 header of a frame the socket-lookup paths take (l3_for_lookup,
 * with L4 protocol `l4`), its first 8 bytes (ports, or ICMP's type and
 * code) within the frame, or NULL; *ip is then its IP header, *family 4 or 6.
 */
static __always_inline void *lookup_l4(void *data, void *end, __u8 l4, int first_fragment, __u32 *family, void **ip)
{
	__u32 off = l3_for_lookup(data, end, family, l4, first_fragment);
	void *h;

	if (off > COOKIE_L3_MAX)
		return NULL;
	cookie_bound(&off);
	*ip = data + off;
	h = *ip + (*family == 4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr));
	/* (Also bounds the IP header for the verifier, which lost its check in cookie_bound.) */
	if (h + 8 > end)
		return NULL;
	/* Past an IPv6 first fragment's fragment header (l3_for_lookup took it). */
	if (*family == 6 && ((struct ipv6hdr *)*ip)->nexthdr == IPPROTO_FRAGMENT)
		h += sizeof(struct frag6_hdr);
	if (h + 8 > end)
		return NULL;
	return h;
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

/* The socket lookup's tuple of a packet the client sent (its ports as in
 * its L4 header, TCP's or UDP's); its size. */
static __always_inline __u32 cookie_tuple(const struct cookie_addrs *a, __be16 sport, __be16 dport,
					  struct bpf_sock_tuple *t)
{
	if (a->family == 4) {
		t->ipv4.saddr = a->words[0];
		t->ipv4.daddr = a->words[1];
		t->ipv4.sport = sport;
		t->ipv4.dport = dport;
		return sizeof(t->ipv4);
	}
	__builtin_memcpy(t->ipv6.saddr, &a->words[0], 16);
	__builtin_memcpy(t->ipv6.daddr, &a->words[4], 16);
	t->ipv6.sport = sport;
	t->ipv6.dport = dport;
	return sizeof(t->ipv6);
}

#endif /* SLUICE_GATE_LOOKUP_H */
