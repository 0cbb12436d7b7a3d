/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * known.h - a source's key in the "sources" and "known" maps, the rule
 * that makes an answered client known, the maps that hold them and their
 * lookup: one copy for the gate (its known tier) and the tracer (known
 * clients' packets a socket dropped). Included after classify.h (struct
 * pkt).
 */
#ifndef SLUICE_KNOWN_H
#define SLUICE_KNOWN_H

/* The known clients, written by the gate's learner and the daemon; the
 * tracer shares the gate's by fd. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_KNOWN_ENTRIES);
	__type(key, struct sluice_src_key);
	__type(value, struct sluice_known);
} known SEC(".maps");

/*
 * Each class's part of "known" (struct sluice_known_part): the new entries
 * it may still make (one taken by the learner per new client) and the
 * entries it holds. One LRU map holds every class's known clients, so
 * without a part of its own a busy class (or whoever it answers) would
 * evict another class's clients. The daemon gives each class an equal part
 * of 90% of the map, and every scan removes a class's oldest entries past
 * its part (src/signals/known.rs, `bound`) and writes room and held again;
 * not yet written: no learning, and no lookup. A client learned between a
 * scan's read and its write is not counted in held until the next scan (5
 * s): if it is its class's only one, it is looked up from then on (it
 * needs a second of answers to be known anyway).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_known_part);
} known_part SEC(".maps");

/*
 * The peer's key at prefix length plen (32/64 for one address): the class,
 * the family and the address with the bits past plen cleared. plen is a
 * multiple of 8 (the daemon writes 16, 24, 32, 48 or 64).
 */
static __always_inline void src_key(struct sluice_src_key *k, const struct pkt *pk, __u32 cls, __u32 plen)
{
	__u32 w;

	k->class_id = cls;
	k->family = pk->family;
	k->plen = plen;
	/* Words in and out of addr by memcpy: the key is read whole as other
	 * types after (peer_hash, same_key), and a store through a cast
	 * pointer is one the compiler may take as not aliasing those reads. */
	if (pk->family == 4) {
		w = bpf_ntohl(pk->peer4);
		w = bpf_htonl(plen >= 32 ? w : w & ~(0xffffffffU >> plen));
		__builtin_memcpy(k->addr, &w, 4);
		return;
	}
	__builtin_memcpy(k->addr, &pk->peer6, 8);
	if (plen < 64) {
		__builtin_memcpy(&w, &k->addr[4], 4);
		w = plen >= 48 ? w & bpf_htonl(0xffff0000) : 0;
		__builtin_memcpy(&k->addr[4], &w, 4);
	}
}

/*
 * Was a client answered over SLUICE_KNOWN_SPAN_MS at least? Written so that
 * an entry whose last answer is dated before its first (the wall clock
 * stepped back) is not: a wrapping difference would make it known at once.
 */
static __always_inline int known_span(const struct sluice_known *v)
{
	return v->last_ms >= v->first_ms && v->last_ms - v->first_ms >= SLUICE_KNOWN_SPAN_MS;
}

/*
 * The peer's entry in "known" if it was answered over the span (its age is
 * the caller's to judge: the gate checks it against its clock's ttl). A
 * class that holds no known client costs one array lookup, inlined, and
 * skips the hash lookup.
 */
static __always_inline struct sluice_known *known_answered(const struct pkt *pk, __u32 cls)
{
	struct sluice_src_key k = {};
	struct sluice_known_part *part = bpf_map_lookup_elem(&known_part, &cls);
	struct sluice_known *v;

	if (!part || !part->held)
		return 0;
	src_key(&k, pk, cls, pk->family == 4 ? 32 : 64);
	v = bpf_map_lookup_elem(&known, &k);
	return v && known_span(v) ? v : 0;
}

#endif /* SLUICE_KNOWN_H */
