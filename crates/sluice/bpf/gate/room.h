/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/room.h - room kept in a service's UDP socket for its known clients.
 *
 * A socket is one FIFO: once a flood has filled it, the kernel drops a
 * known client's datagram with the flood's, whatever the class's limit
 * (the daemon sees it as known_lost). A limit set every 10 ms cannot keep a
 * buffer of about 10 ms of reads from filling while the reader stalls. So
 * the gate looks at the socket a packet is going to (the kernel's own socket
 * lookup, the same reuseport choice the stack makes) and, while that socket
 * holds over SLUICE_ROOM_UNKNOWN_PCT of its receive buffer (the very count,
 * sk_rmem_alloc against sk_rcvbuf, the kernel drops on), admits only the
 * class's known clients within their own rate: the rest of the buffer is
 * theirs. Unknown sources' packets are dropped, counted DROP_ROOM. The
 * daemon counts those drops as the socket's own (they are its overflow,
 * made early), so its controller and the class's tiers see them as loss.
 * A class that holds no known client keeps no room (nobody to keep it for).
 *
 * When: the daemon keeps room (struct sluice_fair's room) for a while after
 * its tick saw a surge, and arms it (surge_pkts) in a class with a known
 * lane between surges. Armed, each CPU counts the class's arrivals and
 * marks a surge itself when surge_pkts of them came within
 * SLUICE_SURGE_WINDOW_NS (note_surge): from then, for SLUICE_SURGE_HOLD_NS
 * (renewed while the surge lasts), that CPU keeps room as if told to. A
 * socket fills in a few ms of a flood, before a tick of the daemon; the mark
 * comes within two windows of it. A count of packets, not of time: the
 * clock is read once every surge_pkts packets, and a mark lapses at the
 * first read after its hold.
 *
 * Cost: the socket lookup (and a known lookup while the socket is over) is
 * paid once every SLUICE_ROOM_EVERY admitted UDP packets on a CPU while the
 * socket had room at the last look, and for every one while it had none,
 * so that a socket that drains is seen at once; a socket that crosses the
 * line is seen at most SLUICE_ROOM_EVERY packets per CPU late. Skipped
 * (the packet keeps its verdict): frames the lookup paths do not take
 * (IPv4 options, IPv6 extension headers: see cookie_l3), a socket that is
 * not found, and kernels without the bpf_rdonly_cast kfunc (before 6.2),
 * whose socket the gate cannot read. Included by gate.bpf.c after
 * sources.h and synack.h.
 */
#ifndef SLUICE_GATE_ROOM_H
#define SLUICE_GATE_ROOM_H

/* Count an arrival of an armed class on this CPU; mark a surge (note above). */
static __always_inline void note_surge(const struct sluice_fair *f, struct sluice_class_state *st)
{
	if (!f || !f->surge_pkts) {
		if (st->surge_mark_ns)
			st->surge_mark_ns = 0;
		return;
	}
	if (++st->surge_cnt < f->surge_pkts)
		return;
	st->surge_cnt = 0;
	if (batch_within(&st->surge_from_ns, SLUICE_SURGE_WINDOW_NS)) {
		if (!st->surge_mark_ns)
			st->cnt[SLUICE_CS_SURGE_MARKS] += 1;
		st->surge_mark_ns = st->surge_from_ns;
	} else if (st->surge_from_ns - st->surge_mark_ns > SLUICE_SURGE_HOLD_NS) {
		st->surge_mark_ns = 0;
	}
}

/* Does this CPU keep room in the class's sockets now (told, or a surge it marked)? */
static __always_inline int room_kept(const struct sluice_fair *f, const struct sluice_class_state *st)
{
	return f && (f->room || st->surge_mark_ns);
}

/* Is the UDP socket this frame goes to over SLUICE_ROOM_UNKNOWN_PCT of its buffer? */
static __always_inline int socket_crowded(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct cookie_addrs a = {};
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	struct udphdr *uh;
	struct sock *s;
	__u32 family = 0, size;
	__u64 rmem, rcvbuf;
	void *ip;

	if (!bpf_ksym_exists(bpf_rdonly_cast))
		return 0;
	uh = lookup_l4(data, end, IPPROTO_UDP, 0, &family, &ip);
	if (!uh)
		return 0;
	cookie_addrs_of(ip, family, &a);
	size = cookie_tuple(&a, uh->source, uh->dest, &t);
	sk = bpf_sk_lookup_udp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	s = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock));
	rmem = (__u32)s->sk_backlog.rmem_alloc.counter;
	rcvbuf = (__u32)s->sk_rcvbuf;
	bpf_sk_release(sk);
	return rmem * 100 > rcvbuf * SLUICE_ROOM_UNKNOWN_PCT;
}

/*
 * Must this admitted UDP packet be dropped to keep its socket's room for
 * the class's known clients? `known`: 1 or 0 where the class's tiers
 * decided it (a known source within its own rate), -1 where nothing did.
 */
static __always_inline int keeps_room(struct xdp_md *ctx, const struct pkt *pk, __u32 cls,
				      struct sluice_class_state *st, int known)
{
	struct sluice_known_part *part;
	struct sluice_known *v;

	if (st->room_left && !st->room_full) {
		st->room_left -= 1;
		return 0;
	}
	st->room_left = SLUICE_ROOM_EVERY - 1;
	part = bpf_map_lookup_elem(&known_part, &cls);
	/* A class that holds no known client has nobody to keep room for. */
	st->room_full = part && part->held && socket_crowded(ctx);
	if (!st->room_full)
		return 0;
	if (known < 0) {
		v = known_entry(pk, cls);
		known = v && known_within_rate(v, pk);
	}
	return !known;
}

#endif /* SLUICE_GATE_ROOM_H */
