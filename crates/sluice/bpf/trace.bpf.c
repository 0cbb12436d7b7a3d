// SPDX-License-Identifier: GPL-2.0-only
/*
 * trace.bpf.c - where each packet of a class goes after the gate, and how
 * long each receive stage holds it (the capture-cost study's method, on tracepoints only:
 * this kernel allows neither kprobes nor fentry).
 *
 * Stages and the tracepoints that see them (tp_btf: typed kernel pointers):
 *   driver   napi_gro_receive_entry, netif_receive_skb_entry,
 *            netif_receive_skb_list_entry (cpumap), netif_rx_entry:
 *            the driver (or the gate's cpumap redirect) hands over an skb;
 *   stack    netif_receive_skb: the stack takes it, after GRO and, with
 *            RPS, after the per-CPU backlog;
 *   queued   sk_data_ready: it sits in a socket's receive queue (the newest
 *            skb of the queue is the one just added);
 *   read     sock_recv_length: a reader took a datagram (TCP: a read).
 * Each stage counts packets in per class (`stage_in`); kfree_skb counts
 * drops per class and the kernel's drop reason (`drops`). User space (src/trace/)
 * adds the gate's own verdicts and closes the ledger: admitted = dropped
 * somewhere + read + still queued.
 *
 * Which packets: skbs on settings.ifindex in the network namespace whose
 * inode is settings.netns (sockets: in that namespace, and for the queued
 * stage the skb arrived on that interface). A packet's class is looked up in
 * the same tables as the gate's (classify.h); at the read stage only the
 * socket is known, so it is classed by its port alone (no source prefix).
 *
 * Latency: one skb in settings.sample_every at the driver stage is
 * timestamped in `inflight` (keyed by the skb's address); the stack stage adds
 * its time and records driver->stack. At a UDP socket's queue the sample moves to `waiting`, keyed by
 * (socket, the datagram's number in that socket's queue): a UDP socket is a
 * FIFO, so when its reader takes datagram number n (`sockseqs` counts both
 * ends) the other two intervals go into `latency`: count, sum, sum of
 * squares (so user space gets a mean and a 95% interval, as the capture-cost study did)
 * and a log2 histogram (for p50/p99). Not the skb's free: since 6.18 UDP
 * frees a datagram read on another CPU later, on the CPU that allocated it.
 * A sampled skb that is dropped or merged is forgotten; as the kernel reuses
 * skbs, an unsampled skb at the driver stage clears any entry left at its
 * address. With sample_every = 0 the stages do no lookup at all.
 *
 * The daemon loads only trace_drop, for the per-reason drop counters in
 * `sluice status` and the backlog drops, and the softirq pair below; `sluice trace` loads the
 * stages, the latency and trace_drop for its duration.
 *
 * Receive work per CPU (`cpu_rx`, the daemon's signals of the receive path,
 * each one the kernel's own work on this host's CPUs, which no local user
 * can raise by writing to their own sockets):
 * - rx_ns: time in NET_RX softirq on each CPU (softirq_entry/exit), whatever
 *   task was current: the share of a CPU that receive work takes from the
 *   services that run there;
 * - backlog_drops: skbs of the traced interface dropped at a CPU's backlog
 *   (kfree_skb, reason CPU_BACKLOG), softnet_stat's "dropped" for this
 *   interface alone;
 * - stack_pkts, iface_pkts: skbs the stack took in on each CPU, all and
 *   the traced interface's: the share of rx_ns the gate can act on;
 * - daemon_ns: softirq time charged to the daemon. This kernel has no
 *   IRQ_TIME_ACCOUNTING, so softirq work run on the way out of an interrupt
 *   counts as the system time of whatever thread is current, and a daemon
 *   thread on a CPU that receives a flood (RPS, the cpumap) pays for packets
 *   it never touches. The daemon shows its CPU time with this part separated.
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

#include "sluice.h"
#include "kernel.h"
#include "classify.h"
#include "known.h"

char LICENSE[] SEC("license") = "GPL";

struct sluice_trace_settings settings SEC(".data") = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_TRACE_CLASSES * SLUICE_STAGE_NR);
	__type(key, __u32);
	__type(value, __u64);
} stage_in SEC(".maps");

/* Known clients' packets lost for want of room, by class (sluice.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, __u64);
} known_lost SEC(".maps");

/* Key: class << 16 | reason. A hash, so user space reads only the pairs seen. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS * SLUICE_IV_NR);
	__type(key, __u32);
	__type(value, struct sluice_latency);
} latency SEC(".maps");

/* A sampled skb on its way: when it passed each stage (0 = not yet). */
struct flight {
	__u64 at[SLUICE_STAGE_READ]; /* driver, stack, queued */
	__u32 class_id;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct flight);
} inflight SEC(".maps");

/* Datagrams queued to and read from a UDP socket since tracing saw it
 * first: a UDP socket is a FIFO, so the datagram queued as number n is the
 * n-th one read. */
struct sockseq {
	__u64 queued;
	__u64 read;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct sockseq);
} sockseqs SEC(".maps");

/* A sampled datagram in a socket's queue: (socket, its queue number). */
struct waiting_key {
	__u64 sk;
	__u64 seq;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct waiting_key);
	__type(value, struct flight);
} waiting SEC(".maps");

/* Skbs seen at the driver stage on this CPU since the last sample. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} since_sample SEC(".maps");

static __always_inline int in_netns(struct net *net)
{
	return net && net->ns.inum == settings.netns;
}

static __always_inline int on_iface(struct sk_buff *skb)
{
	struct net_device *dev = skb->dev;

	if (!dev)
		return skb->skb_iif == (int)settings.ifindex;
	return dev->ifindex == (int)settings.ifindex && in_netns(dev->nd_net.net);
}

/*
 * Fill `pk` from the skb's IP header, found right after the Ethernet header
 * the driver marked (mac_header, kept at every later stage); an skb without
 * one is read at `data`. Not the network header: the stack sets it only in
 * __netif_receive_skb_core, and an skb built from an XDP frame has it at 0
 * until then. Returns 0, or -1 if the headers cannot be read.
 */
static __always_inline int skb_pkt(struct sk_buff *skb, struct pkt *pk)
{
	__u16 mh = skb->mac_header;
	unsigned char *l3 = mh == (__u16)~0U ? skb->data : skb->head + mh + ETH_HLEN;
	unsigned char *l4;
	__u8 proto;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_probe_read_kernel(&ip, sizeof(ip), l3) || ip.version != 4 || ip.ihl < 5)
			return -1;
		pk->family = 4;
		pk->peer4 = ip.saddr;
		proto = ip.protocol;
		l4 = ip.frag_off & bpf_htons(0x1fff) ? NULL : l3 + ip.ihl * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_probe_read_kernel(&ip6, sizeof(ip6), l3) || ip6.version != 6)
			return -1;
		pk->family = 6;
		__builtin_memcpy(&pk->peer6, &ip6.saddr, 16);
		proto = ip6.nexthdr;
		l4 = l3 + sizeof(ip6);
	} else {
		return -1;
	}
	if (l4 && (proto == IPPROTO_UDP || proto == IPPROTO_TCP)) {
		__be16 ports[2];

		if (bpf_probe_read_kernel(ports, sizeof(ports), l4))
			return -1;
		pk->slot = proto == IPPROTO_UDP ? SLUICE_SLOT_UDP : SLUICE_SLOT_TCP;
		pk->port = bpf_ntohs(ports[1]);
	} else {
		/* Non-first fragments and other protocols; IPv6 extension
		 * headers are not walked here (the gate walks them). */
		pk->slot = SLUICE_SLOT_PORTLESS;
		pk->port = proto;
	}
	return 0;
}

/* The skb's class, with its headers in `pk` (unclassified: pk unset). */
static __always_inline __u32 skb_class_pkt(struct sk_buff *skb, struct pkt *pk)
{
	if (skb_pkt(skb, pk))
		return SLUICE_TRACE_UNCLASSIFIED;
	__u32 cls = classify(pk, tables_in_force(), settings.default_class);
	return cls < SLUICE_CLASS_IDS ? cls : SLUICE_TRACE_UNCLASSIFIED;
}

static __always_inline __u32 skb_class(struct sk_buff *skb)
{
	struct pkt pk = {};

	return skb_class_pkt(skb, &pk);
}

/* A socket's class by its local port alone (the read stage has no packet). */
static __always_inline __u32 sock_class(struct sock *sk)
{
	__u32 slot = sk->sk_protocol == IPPROTO_UDP ? SLUICE_SLOT_UDP : SLUICE_SLOT_TCP;
	struct sluice_cell *cell = cell_of(tables_in_force(), slot, sk->__sk_common.skc_num);
	__u32 cls = cell ? cell->class_id : settings.default_class;

	return cls < SLUICE_CLASS_IDS ? cls : SLUICE_TRACE_UNCLASSIFIED;
}

static __always_inline void count_in(__u32 cls, __u32 stage)
{
	__u32 key = cls * SLUICE_STAGE_NR + stage;
	__u64 *c = bpf_map_lookup_elem(&stage_in, &key);

	if (c)
		*c += 1;
}

static __always_inline __u32 log2_bucket(__u64 v)
{
	__u32 b = 0;

	for (int i = 0; i < SLUICE_HIST_BUCKETS - 1; i++) {
		if (v < 2)
			break;
		v >>= 1;
		b++;
	}
	return b;
}

static __always_inline void record(__u32 cls, __u32 iv, __u64 from, __u64 to)
{
	if (!from || to < from || cls >= SLUICE_CLASS_IDS)
		return;
	__u32 key = cls * SLUICE_IV_NR + iv;
	struct sluice_latency *l = bpf_map_lookup_elem(&latency, &key);
	if (!l)
		return;
	__u64 d = to - from, q = d >> SLUICE_SQ_SHIFT;
	__u32 b = log2_bucket(d);

	l->count += 1;
	l->sum_ns += d;
	l->sum_sq += q * q;
	if (b < SLUICE_HIST_BUCKETS)
		l->hist[b] += 1;
}

/* The driver stage: count, and start timing one skb in sample_every. */
static __always_inline void at_driver(struct sk_buff *skb)
{
	if (!on_iface(skb))
		return;
	__u32 cls = skb_class(skb);
	count_in(cls, SLUICE_STAGE_DRIVER);
	if (!settings.sample_every || cls >= SLUICE_CLASS_IDS)
		return;
	__u32 zero = 0, *n = bpf_map_lookup_elem(&since_sample, &zero);
	__u64 key = (__u64)skb;
	if (!n || ++*n < settings.sample_every) {
		/* The kernel reuses skbs: forget a sample this address had
		 * before, if it was freed where no tracepoint saw it. */
		bpf_map_delete_elem(&inflight, &key);
		return;
	}
	*n = 0;
	struct flight f = { .at = { bpf_ktime_get_ns() }, .class_id = cls };
	bpf_map_update_elem(&inflight, &key, &f, BPF_ANY);
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sluice_cpu_rx);
} cpu_rx SEC(".maps");

#define NET_RX_SOFTIRQ 3 /* enum in linux/interrupt.h: HI, TIMER, NET_TX, NET_RX, ... */
/* One vector's run is bounded by its budget (2 ms for NET_RX); longer is a stale start. */
#define SOFTIRQ_MAX_NS 100000000ULL

static __always_inline int in_daemon(void)
{
	return settings.tgid && bpf_get_current_pid_tgid() >> 32 == settings.tgid;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(trace_softirq_entry, unsigned int vec_nr)
{
	__u32 zero = 0;
	struct sluice_cpu_rx *c;
	int daemon = in_daemon();

	if (vec_nr != NET_RX_SOFTIRQ && !daemon)
		return 0;
	c = bpf_map_lookup_elem(&cpu_rx, &zero);
	if (!c)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (vec_nr == NET_RX_SOFTIRQ)
		c->rx_start = now;
	if (daemon)
		c->daemon_start = now;
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(trace_softirq_exit, unsigned int vec_nr)
{
	__u32 zero = 0;
	struct sluice_cpu_rx *c = bpf_map_lookup_elem(&cpu_rx, &zero);

	if (!c || (!c->rx_start && !c->daemon_start))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	/* A start older than a softirq can run was left by a detach between an
	 * entry and its exit (the daemon attaches the pair on demand): dropped. */
	if (vec_nr == NET_RX_SOFTIRQ && c->rx_start) {
		if (now - c->rx_start < SOFTIRQ_MAX_NS)
			c->rx_ns += now - c->rx_start;
		c->rx_start = 0;
	}
	if (c->daemon_start) {
		if (now - c->daemon_start < SOFTIRQ_MAX_NS)
			c->daemon_ns += now - c->daemon_start;
		c->daemon_start = 0;
	}
	return 0;
}

/* Which share of a CPU's receive work is the traced interface's: each skb
 * its stack takes in, and whether it came in there. Loopback and other
 * interfaces run in the same NET_RX softirq (a local process sending to
 * 127.0.0.1 raises rx_ns of its CPU), and the gate can relieve none of it.
 * Attached with the softirq pair, on demand. */
SEC("tp_btf/netif_receive_skb")
int BPF_PROG(trace_cpu_pkts, struct sk_buff *skb)
{
	__u32 zero = 0;
	struct sluice_cpu_rx *c = bpf_map_lookup_elem(&cpu_rx, &zero);

	if (!c)
		return 0;
	c->stack_pkts += 1;
	if (on_iface(skb))
		c->iface_pkts += 1;
	return 0;
}

SEC("tp_btf/napi_gro_receive_entry")
int BPF_PROG(trace_gro, struct sk_buff *skb)
{
	at_driver(skb);
	return 0;
}

SEC("tp_btf/netif_receive_skb_entry")
int BPF_PROG(trace_rx_entry, struct sk_buff *skb)
{
	at_driver(skb);
	return 0;
}

SEC("tp_btf/netif_receive_skb_list_entry")
int BPF_PROG(trace_list_entry, struct sk_buff *skb)
{
	at_driver(skb);
	return 0;
}

SEC("tp_btf/netif_rx_entry")
int BPF_PROG(trace_netif_rx, struct sk_buff *skb)
{
	at_driver(skb);
	return 0;
}

/* A sampled skb reached the stack: time it, and record driver->stack (every
 * sample that gets this far, whether a socket takes it or not). */
static __always_inline void stamp_stack(struct sk_buff *skb)
{
	if (!settings.sample_every)
		return;
	__u64 key = (__u64)skb, now = bpf_ktime_get_ns();
	struct flight *f = bpf_map_lookup_elem(&inflight, &key);
	if (!f)
		return;
	f->at[SLUICE_STAGE_STACK] = now;
	record(f->class_id, SLUICE_IV_DRIVER_STACK, f->at[SLUICE_STAGE_DRIVER], now);
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(trace_stack, struct sk_buff *skb)
{
	if (!on_iface(skb))
		return 0;
	count_in(skb_class(skb), SLUICE_STAGE_STACK);
	stamp_stack(skb);
	return 0;
}

/* This datagram's number in its UDP socket's queue (numbers start after
 * what was queued when tracing first saw the socket). */
static __always_inline __u64 queue_number(struct sock *sk)
{
	__u64 key = (__u64)sk;
	struct sockseq *q = bpf_map_lookup_elem(&sockseqs, &key);

	if (q)
		return ++q->queued;
	__u64 queued = sk->sk_receive_queue.qlen + BPF_CORE_READ((struct udp_sock *)sk, reader_queue.qlen);
	struct sockseq fresh = { .queued = queued };
	bpf_map_update_elem(&sockseqs, &key, &fresh, BPF_NOEXIST);
	return 0; /* not numbered: no sample can wait on it */
}

/* A sampled skb reached a UDP socket's queue: it waits there under its number. */
static __always_inline void enqueue_sample(struct sock *sk, struct sk_buff *skb, __u64 seq)
{
	__u64 key = (__u64)skb;
	struct flight *f = bpf_map_lookup_elem(&inflight, &key);

	if (!f)
		return;
	if (seq) {
		struct waiting_key w = { .sk = (__u64)sk, .seq = seq };
		struct flight copy = *f;

		copy.at[SLUICE_STAGE_QUEUED] = bpf_ktime_get_ns();
		bpf_map_update_elem(&waiting, &w, &copy, BPF_ANY);
	}
	bpf_map_delete_elem(&inflight, &key);
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(trace_queued, struct sock *sk)
{
	if (!in_netns(sk->__sk_common.skc_net.net))
		return 0;
	int udp = sk->sk_protocol == IPPROTO_UDP;
	__u64 seq = udp && settings.sample_every ? queue_number(sk) : 0;
	struct sk_buff *skb = sk->sk_receive_queue.prev;
	/* An empty queue's prev points at the queue head itself: a reader took
	 * the datagram (UDP moves the queue to its reader_queue) between the
	 * enqueue and this call. Count it by its socket. */
	if (!skb || (void *)skb == (void *)&sk->sk_receive_queue) {
		if (udp)
			count_in(sock_class(sk), SLUICE_STAGE_QUEUED);
		return 0;
	}
	if (skb->skb_iif != (int)settings.ifindex)
		return 0;
	count_in(skb_class(skb), SLUICE_STAGE_QUEUED);
	if (udp && settings.sample_every)
		enqueue_sample(sk, skb, seq);
	return 0;
}

/* A reader took the next datagram of a UDP socket: if it was a sampled one, its times are complete. */
static __always_inline void dequeue_sample(struct sock *sk)
{
	__u64 key = (__u64)sk;
	struct sockseq *q = bpf_map_lookup_elem(&sockseqs, &key);

	if (!q)
		return;
	struct waiting_key w = { .sk = key, .seq = ++q->read };
	struct flight *f = bpf_map_lookup_elem(&waiting, &w);
	if (!f)
		return;
	__u64 now = bpf_ktime_get_ns();
	record(f->class_id, SLUICE_IV_STACK_QUEUED, f->at[SLUICE_STAGE_STACK], f->at[SLUICE_STAGE_QUEUED]);
	record(f->class_id, SLUICE_IV_QUEUED_READ, f->at[SLUICE_STAGE_QUEUED], now);
	bpf_map_delete_elem(&waiting, &w);
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(trace_read, struct sock *sk, int ret, int flags)
{
	if (ret < 0 || (flags & 2 /* MSG_PEEK */) || !in_netns(sk->__sk_common.skc_net.net))
		return 0;
	if (sk->sk_protocol != IPPROTO_UDP && sk->sk_protocol != IPPROTO_TCP)
		return 0;
	count_in(sock_class(sk), SLUICE_STAGE_READ);
	if (sk->sk_protocol == IPPROTO_UDP && settings.sample_every)
		dequeue_sample(sk);
	return 0;
}

/* A packet the receive path dropped for want of room: count it if its
 * source is one of its class's known clients (a class that holds none
 * costs one array lookup). */
static __always_inline void count_known_lost(const struct pkt *pk, __u32 cls)
{
	__u64 *n;

	if (cls >= SLUICE_CLASS_IDS || !known_answered(pk, cls))
		return;
	n = bpf_map_lookup_elem(&known_lost, &cls);
	if (n)
		*n += 1;
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(trace_drop, struct sk_buff *skb, void *location, __u32 reason)
{
	if (settings.sample_every) {
		__u64 k = (__u64)skb;
		bpf_map_delete_elem(&inflight, &k);
	}
	if (!on_iface(skb))
		return 0;
	/* An skb the gate dropped on veth's skb path is freed with reason
	 * NOT_SPECIFIED before the stack set skb_iif: the gate counted it. */
	if (reason == 2 /* SKB_DROP_REASON_NOT_SPECIFIED */ && skb->skb_iif != (int)settings.ifindex)
		return 0;
	if (reason == settings.backlog_reason && reason) {
		__u32 zero = 0;
		struct sluice_cpu_rx *c = bpf_map_lookup_elem(&cpu_rx, &zero);

		if (c)
			c->backlog_drops += 1;
	}
	struct pkt pk = {};
	__u32 cls = skb_class_pkt(skb, &pk);
	if (reason && (reason == settings.rcvbuf_reason || reason == settings.proto_mem_reason ||
		       reason == settings.backlog_reason))
		count_known_lost(&pk, cls);
	__u32 r = reason < SLUICE_TRACE_REASONS ? reason : SLUICE_TRACE_REASONS - 1;
	__u32 key = cls << 16 | r;
	__u64 *c = bpf_map_lookup_elem(&drops, &key), one = 1;
	if (c)
		*c += 1;
	else
		bpf_map_update_elem(&drops, &key, &one, BPF_NOEXIST);
	return 0;
}
