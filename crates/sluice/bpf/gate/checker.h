/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/checker.h - SYN cookies at the driver, the tc ingress side: the ACK
 * that carries a gate cookie becomes a request socket the kernel takes
 * (bpf_sk_assign_tcp_reqsk). Included by gate.bpf.c before its program.
 */
#ifndef SLUICE_GATE_CHECKER_H
#define SLUICE_GATE_CHECKER_H

/*
 * Did the loaded checker find the kfunc (1) or not (2; 0: never run)? The
 * daemon test-runs the checker once at start and reads this: libbpf leaves
 * a weak kfunc it cannot match to the kernel's at 0 without a word.
 */
volatile __u32 cookie_kfunc;

extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk, struct bpf_tcp_req_attrs *attrs,
				   int attrs__sz) __ksym __weak;

/* The request socket's options from a valid cookie's bits and the ACK's own options. */
static __always_inline void cookie_attrs(__u32 bits, __u32 family, const struct syn_opts *ack,
					 struct bpf_tcp_req_attrs *r)
{
	__u32 mssind = (bits >> COOKIE_MSS_SHIFT) & 3;

	r->mss = cookie_mss(family, mssind);
	r->snd_wscale = bits & COOKIE_WSCALE_NONE;
	r->wscale_ok = r->snd_wscale != COOKIE_WSCALE_NONE;
	if (!r->wscale_ok)
		r->snd_wscale = 0;
	r->rcv_wscale = r->wscale_ok ? SLUICE_COOKIE_WSCALE : 0;
	r->sack_ok = !!(bits & COOKIE_SACK);
	/* The SYN-ACK offered no timestamps where the namespace has them off. */
	r->tstamp_ok = ack->ts && (settings.syn_allow & SLUICE_SYN_TS);
	r->rcv_tsval = ack->tsval;
	r->rcv_tsecr = ack->tsecr;
}

/* Does conntrack hold a connection of this 4-tuple (tc)? */
static __always_inline int skb_tracked(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 size)
{
	struct bpf_ct_opts___sl opts = { .netns_id = BPF_F_CURRENT_NETNS, .l4proto = IPPROTO_TCP };
	struct nf_conn *ct;

	if (!bpf_skb_ct_lookup || !bpf_ct_release)
		return 0;
	ct = bpf_skb_ct_lookup(skb, tuple, size, &opts, sizeof(opts));
	if (!ct)
		return 0;
	bpf_ct_release(ct);
	return 1;
}

/* What the checker found in an ACK to a class whose guard checks them. */
enum cookie_verdict {
	COOKIE_NOT_LISTENER = -1, /* a connection's own ACK, or no socket: nothing to check */
	COOKIE_NONE = 0,          /* no gate cookie: the kernel decides (a RST, or its own cookie) */
	COOKIE_TAKEN = 1,         /* a valid gate cookie: the listener has its request socket */
	COOKIE_REFUSED = 2,       /* a valid gate cookie the kernel refused a request socket for */
};

/*
 * Check an ACK to a listening socket for a gate cookie; hand the listener a
 * request socket if it carries one. A refused one (an option or a listener
 * the kernel does not take: the gate's SYN-ACKs avoid both, see
 * syn_opts_allowed and is_mptcp) leaves the ACK to the kernel, as without
 * sluice.
 */
static __always_inline enum cookie_verdict cookie_ack(struct __sk_buff *skb, void *data, void *end, void *ip, struct tcphdr *th,
				      __u32 family)
{
	struct bpf_tcp_req_attrs r = {};
	struct bpf_sock_tuple tuple = {};
	struct cookie_addrs a = {};
	struct syn_opts o = {};
	struct bpf_sock *skc;
	struct tcp_sock *tp;
	__u32 size, bits = 0;
	enum cookie_verdict ret = COOKIE_NONE;

	cookie_addrs_of(ip, family, &a);
	size = cookie_tuple(&a, th->source, th->dest, &tuple);
	skc = bpf_skc_lookup_tcp(skb, &tuple, size, BPF_F_CURRENT_NETNS, 0);
	if (!skc)
		return COOKIE_NOT_LISTENER; /* no socket: the kernel answers with a RST */
	if (skc->state != BPF_TCP_LISTEN) {
		bpf_sk_release(skc);
		return COOKIE_NOT_LISTENER;
	}
	if (!cookie_check(&a, th->source, th->dest, bpf_ntohl(th->seq) - 1, bpf_ntohl(th->ack_seq) - 1, &bits)) {
		if (skb_tracked(skb, &tuple, size))
			ret = COOKIE_NOT_LISTENER; /* a NATed connection's: its socket is the target's */
		goto out;
	}
	syn_opts_read(data, end, (void *)(th + 1) - data, (void *)th - data + th->doff * 4, &o);
	cookie_attrs(bits, family, &o, &r);
	tp = bpf_skc_to_tcp_sock(skc);
	ret = tp && !bpf_sk_assign_tcp_reqsk(skb, (struct sock *)tp, &r, sizeof(r)) ? COOKIE_TAKEN : COOKIE_REFUSED;
out:
	bpf_sk_release(skc);
	return ret;
}

#endif /* SLUICE_GATE_CHECKER_H */
