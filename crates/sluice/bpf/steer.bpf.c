// SPDX-License-Identifier: GPL-2.0-only
/*
 * steer.bpf.c - which reader of a service gets each datagram.
 *
 * A service that reads with several threads can give each its own socket in
 * an SO_REUSEPORT group (the shared-socket study: threads sharing one socket serialise on
 * its locks). The kernel then picks a socket by a hash of the 4-tuple, which
 * keeps a few heavy flows on a few readers and keeps feeding a reader that
 * has stalled. This file lets the daemon choose instead:
 *
 *   steer         (SK_REUSEPORT, attached to the group through one of its
 *                 sockets) picks a slot of the `readers` sockarray by the
 *                 group's policy: round-robin (a per-CPU turn: exact on each
 *                 CPU), least-loaded (the reader the flow's hash names, as
 *                 the kernel would, until that reader has
 *                 SLUICE_STEER_STALL_DEPTH datagrams queued; then the one
 *                 with the fewest: a flow stays on its reader, and its
 *                 per-socket state with it, unless the reader is behind), or
 *                 hash (returns without choosing: the kernel's own pick).
 *   steer_queued  (tp_btf sk_data_ready: a datagram was queued to a socket)
 *   steer_read    (tp_btf sock_recv_length: a reader took one)
 *                 record the queue length of a group's socket, found by its
 *                 socket cookie in `slot_of`; least-loaded reads them.
 *   reuseport_socks (iter/udp) lists the reuseport sockets and their
 *                 group's program, so sluice leaves a service's own alone.
 *
 * User space (src/steer/) finds the groups, takes a duplicate of each socket
 * from the service (pidfd_getfd), fills `readers`, `slot_of` and `groups`,
 * attaches `steer`, and closes its duplicates: it never holds the service's
 * sockets open. A socket that closes leaves its slot empty (the kernel clears
 * it); a datagram steered there falls back to the kernel's hash (counted as
 * MISSED) until the daemon's next look at the group. If the daemon stops
 * writing `alive_until` (it died), every datagram falls back to the hash,
 * so stale queue lengths cannot pin a group to one reader.
 *
 * No locks, no atomics: queue lengths are plain stores of the kernel's own
 * counts, counters are per CPU.
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "sluice.h"
#include "kernel.h"

char LICENSE[] SEC("license") = "GPL";

struct sluice_steer_settings settings SEC(".data") = {};

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__uint(max_entries, SLUICE_READER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} readers SEC(".maps");

/* Indexed by local UDP port; n == 0: not a steered group. An array (1 MiB)
 * and not a hash: its lookup is an inlined load, on every datagram. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct sluice_group);
} groups SEC(".maps");

/* Socket cookie -> slot, for the tracepoints. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_READER_SLOTS);
	__type(key, __u64);
	__type(value, __u32);
} slot_of SEC(".maps");

/* Datagrams queued at each slot's socket, as last seen by a tracepoint. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_READER_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} depth SEC(".maps");

/* Datagrams steered to each slot. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_READER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} steered SEC(".maps");

/* enum sluice_steer_stat per group. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_GROUPS_MAX * SLUICE_SS_NR);
	__type(key, __u32);
	__type(value, __u64);
} group_stats SEC(".maps");

/* Each CPU's turn within each group (round-robin). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_GROUPS_MAX);
	__type(key, __u32);
	__type(value, __u32);
} turn SEC(".maps");

static __always_inline void count(__u32 group, __u32 stat)
{
	__u32 key = group * SLUICE_SS_NR + stat;
	__u64 *c = bpf_map_lookup_elem(&group_stats, &key);

	if (c)
		*c += 1;
}

/* The reader with the fewest queued datagrams, looking from `start` on (so
 * `start` wins a tie). */
static __always_inline __u32 least_loaded(__u32 base, __u32 n, __u32 start)
{
	__u32 best = start, best_depth = 0xffffffff;

	for (__u32 i = 0; i < SLUICE_READERS_MAX; i++) {
		if (i >= n)
			break;
		__u32 j = start + i;
		if (j >= n)
			j -= n;
		__u32 slot = base + j;
		__u32 *d = bpf_map_lookup_elem(&depth, &slot);
		if (d && *d < best_depth) {
			best_depth = *d;
			best = j;
		}
	}
	return best;
}

SEC("sk_reuseport")
int steer(struct sk_reuseport_md *ctx)
{
	struct bpf_sock *sk = ctx->sk;

	if (!sk || ctx->ip_protocol != 17 /* IPPROTO_UDP */)
		return SK_PASS;
	__u32 port = sk->src_port & 0xffff;
	struct sluice_group *g = bpf_map_lookup_elem(&groups, &port);
	if (!g || g->n == 0)
		return SK_PASS;
	__u32 index = g->index, n = g->n;
	if (index >= SLUICE_GROUPS_MAX)
		return SK_PASS;
	if (g->policy == SLUICE_READERS_HASH || n == 0 || n > SLUICE_READERS_MAX ||
	    bpf_ktime_get_coarse_ns() > settings.alive_until) {
		count(index, SLUICE_SS_HASHED);
		return SK_PASS;
	}
	__u32 pick;
	if (g->policy == SLUICE_READERS_LEAST_LOADED) {
		/* The kernel's own pick by hash (reciprocal_scale), as the slots
		 * are in join order (the daemon orders them by inode). */
		__u32 own = (__u32)(((__u64)ctx->hash * n) >> 32);
		__u32 own_slot = index * SLUICE_READERS_MAX + own;
		__u32 *d = bpf_map_lookup_elem(&depth, &own_slot);

		if (d && *d < SLUICE_STEER_STALL_DEPTH)
			pick = own;
		else
			pick = least_loaded(index * SLUICE_READERS_MAX, n, own);
	} else {
		__u32 *t = bpf_map_lookup_elem(&turn, &index);
		if (!t)
			return SK_PASS;
		pick = *t % n;
		*t += 1;
	}
	__u32 slot = index * SLUICE_READERS_MAX + pick;
	if (bpf_sk_select_reuseport(ctx, &readers, &slot, 0)) {
		count(index, SLUICE_SS_MISSED);
		return SK_PASS;
	}
	__u64 *c = bpf_map_lookup_elem(&steered, &slot);
	if (c)
		*c += 1;
	return SK_PASS;
}

/* Record the queue length of `sk` if it is one of the groups' readers. */
static __always_inline void note_depth(struct sock *sk)
{
	__u64 cookie = BPF_CORE_READ(sk, __sk_common.skc_cookie.counter);

	if (!cookie) /* the kernel gives a cookie on first ask: every reader was asked */
		return;
	__u32 *slot = bpf_map_lookup_elem(&slot_of, &cookie);
	if (!slot)
		return;
	__u32 q = BPF_CORE_READ(sk, sk_receive_queue.qlen);
	if (BPF_CORE_READ(sk, sk_protocol) == 17 /* IPPROTO_UDP */)
		q += BPF_CORE_READ((struct udp_sock *)sk, reader_queue.qlen);
	__u32 *d = bpf_map_lookup_elem(&depth, slot);
	if (d)
		*d = q;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(steer_queued, struct sock *sk)
{
	note_depth(sk);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(steer_read, struct sock *sk, int ret, int flags)
{
	note_depth(sk);
	return 0;
}

/* Every UDP socket of the reading process's netns that is in an SO_REUSEPORT
 * group, with the group's program: user space attaches `steer` to a group
 * only when it has no program or `steer` itself, and detaches only its own,
 * so a service's own reuseport program (eBPF or classic) is never replaced. */
SEC("iter/udp")
int reuseport_socks(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;

	if (!sk)
		return 0;
	struct sock_reuseport *r = BPF_CORE_READ(sk, sk_reuseport_cb);
	if (!r)
		return 0;
	struct bpf_prog *prog = BPF_CORE_READ(r, prog);
	struct sluice_reuseport_sock rec = {
		.inode = BPF_CORE_READ(sk, sk_socket, file, f_inode, i_ino),
		.port = BPF_CORE_READ(sk, __sk_common.skc_num),
		.has_prog = prog ? 1 : 0,
	};
	if (prog)
		rec.prog_id = BPF_CORE_READ(prog, aux, id);
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}
