/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/frags.h - a datagram's fragments take the class its first fragment
 * took.
 *
 * Only a datagram's first fragment carries its ports; the others carry its
 * protocol (IPv4) or a next header (IPv6) and nothing more. Classed by
 * that alone, a service's large datagram would go in pieces to two
 * classes: the first to its port's class, the rest to a protocol rule or
 * the default class, throttled first under a flood, and the kernel would
 * reassemble none of them. An IPv6 fragment's next header counts only in
 * the first fragment (RFC 8200: the kernel ignores it in the others), so a
 * sender can name any in the rest.
 *
 * So each first fragment notes its datagram (struct sluice_frag: sender,
 * IP id, IPv4's protocol) with the class it took, in the LRU map `frags`;
 * a non-first fragment that finds its datagram there within SLUICE_FRAG_MS,
 * in the same tables generation, takes that class. One that finds nothing
 * (it came before its first, or its entry was evicted by SLUICE_FRAGS
 * newer datagrams) keeps the class of its protocol, as before. The note
 * also carries whether the first was a reply to a connection of the host's
 * own (gate/host.h), which its default class then lets through.
 *
 * Cost: a map update for each first fragment and a lookup for each other
 * one; nothing for a packet that is not a fragment. A flood of first
 * fragments can only evict notes: its fragments' classes fall back to
 * their protocol's. Included by gate.bpf.c after parse.h.
 */
#ifndef SLUICE_GATE_FRAGS_H
#define SLUICE_GATE_FRAGS_H

/* The key of the datagram a fragment belongs to (ingress: pk's peer is its sender). */
static __always_inline void frag_key(const struct pkt *pk, struct sluice_frag *k)
{
	k->family = pk->family;
	k->id = pk->frag_id;
	if (pk->family == 6) {
		__builtin_memcpy(k->src, &pk->peer6, sizeof(k->src));
		return;
	}
	k->src[0] = pk->peer4;
	/* A non-first fragment's port is its protocol (parse.h); a first one's, its L4 port. */
	if (pk->fragment)
		k->proto = pk->port;
	else
		k->proto = pk->slot == SLUICE_SLOT_UDP ? IPPROTO_UDP : pk->slot == SLUICE_SLOT_TCP ? IPPROTO_TCP : pk->port;
}

/* A first fragment took class `cls` in generation `gen`: note it for the rest. */
static __always_inline void frag_note(const struct pkt *pk, __u32 gen, __u32 cls)
{
	struct sluice_frag_class v = { .at_ms = settings.now_ms, .cls = cls, .gen = gen };
	struct sluice_frag k = {};

	frag_key(pk, &k);
	bpf_map_update_elem(&frags, &k, &v, BPF_ANY);
}

/* The class of a non-first fragment: its first fragment's, where noted lately
 * in this generation (then pk->frag_reply says whether that was a reply of
 * the host's own), else `cls`, its protocol's. */
static __always_inline __u32 frag_follow(struct pkt *pk, __u32 gen, __u32 cls)
{
	struct sluice_frag k = {};
	struct sluice_frag_class *v;

	frag_key(pk, &k);
	v = bpf_map_lookup_elem(&frags, &k);
	if (!v || v->gen != gen || settings.now_ms - v->at_ms > SLUICE_FRAG_MS)
		return cls;
	pk->frag_reply = v->host_reply;
	return v->cls;
}

/* The first fragment `pk` is a reply to a connection of the host's own: its other fragments are too. */
static __always_inline void frag_note_reply(const struct pkt *pk)
{
	struct sluice_frag k = {};
	struct sluice_frag_class *v;

	frag_key(pk, &k);
	v = bpf_map_lookup_elem(&frags, &k);
	if (v)
		v->host_reply = 1;
}

#endif /* SLUICE_GATE_FRAGS_H */
