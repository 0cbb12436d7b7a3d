/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gate/maps.h - the gate's maps and run-time settings (the design comment
 * atop gate.bpf.c says what each is for), and its global counters; the
 * known clients' maps are in known.h (the tracer shares them).
 * Included once, by gate.bpf.c.
 */
#ifndef SLUICE_GATE_MAPS_H
#define SLUICE_GATE_MAPS_H

/*
 * Each class's share of its limit on each CPU (struct sluice_share) and its
 * source fairness there (struct sluice_fair, below), laid out as
 * class_state is: the entry of class id c on CPU n at n * SLUICE_CLASS_IDS
 * + c, sized to the possible CPUs at load. The daemon writes them through
 * a mapping, and only the entries whose values changed: a per-CPU array's
 * update copied every possible CPU's value through the kernel for each
 * limited class at each tick (issue 51).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SLUICE_CLASS_IDS); /* times the possible CPUs, at load */
	__type(key, __u32);
	__type(value, struct sluice_share);
} shares SEC(".maps");

/*
 * Each class's buckets and counters on each CPU (struct sluice_class_state),
 * at cpu * SLUICE_CLASS_IDS + class id: written by that CPU only, each
 * entry whole cache lines of its own. User space sizes it to the possible
 * CPUs before load and reads it through a mapping of its own. A per-CPU
 * array would serve the gate the same, but each read of one of its entries
 * copies every possible CPU's value through the kernel: the daemon read
 * every class id in use times every possible CPU each 10 ms tick (issue
 * 51). It reads the entries `class_cpus` marks instead.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SLUICE_CLASS_IDS); /* times the possible CPUs, at load */
	__type(key, __u32);
	__type(value, struct sluice_class_state);
} class_state SEC(".maps");

/*
 * Which CPUs wrote a class's entries of class_state since the daemon last
 * took them: a bit per CPU, 64 CPUs a word, the word of CPUs 64w..64w+63
 * for class id c at w * SLUICE_CLASS_IDS + c. A CPU sets its bit (an
 * atomic or) at its first packet of the class in each of the daemon's
 * ticks; the tick's other packets only compare the entry's `marked` with
 * settings.epoch (class_state_here below).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SLUICE_CLASS_IDS); /* times the possible CPUs / 64, at load */
	__type(key, __u32);
	__type(value, __u64);
} class_cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SLUICE_CLASS_IDS); /* times the possible CPUs, at load */
	__type(key, __u32);
	__type(value, struct sluice_fair);
} fairness SEC(".maps");

/*
 * CPU protection (a class's cpu = "away"): while a higher-priority service
 * is in distress, the daemon writes a target CPU + 1 for the class here (0:
 * stay), and the class's admitted packets are redirected to that CPU's
 * entry of `cpus`: their skb is built and their stack work (IP, UDP/TCP,
 * the socket) done by the cpumap kthread there, not on the CPU that runs
 * this program. User space sizes `cpus` to the possible CPUs and fills
 * the entries it targets.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, __u32);
} away SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, 1); /* set to the possible CPUs at load */
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} cpus SEC(".maps");

/*
 * Unknown sources' pace and counts, direct-mapped (struct sluice_src_slot);
 * user space sets its size before load, and reads it through a read-only
 * mapping of its own (a scan walks memory: no syscall, no copy per slot).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SLUICE_SOURCES_DEFAULT);
	__type(key, __u32);
	__type(value, struct sluice_src_slot);
} sources SEC(".maps");

/*
 * When each peer last sent a learning class a packet, and how many it sent
 * (see SLUICE_ASKED_WINDOW_MS): a direct-mapped table, one slot per hash of
 * (class, peer), holding the upper half of that hash as a tag, the gate
 * clock's low 32 bits (ms; they wrap in 49 days, differences do not) and
 * the count (struct sluice_asked). A
 * hash map costs this path a lookup with a key compare (measured: +49 ns a
 * packet by `sluice bench gate`); an array slot costs a multiply or two.
 * Two peers on one slot overwrite each other: a real client then loses its
 * note until it asks again (learned later), a peer that asked nothing never
 * gains one unless its 32-bit tag matches too.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_ASKED_SLOTS);
	__type(key, __u32);
	__type(value, struct sluice_asked);
} asked SEC(".maps");

/*
 * What each "asked" slot's peers sent a learning class past
 * SLUICE_ASKS_PER_SEC in a second, on each CPU (a slot's index modulo
 * SLUICE_ASKS_OVER_SLOTS: heavy peers are few, and two on one entry only
 * over-count each other's requests). Written by the CPU the packet came
 * on, summed by the learner at a heavy peer's refresh (asks_of).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_ASKS_OVER_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} asks_over SEC(".maps");

/* The FIB lookup's 64 bytes (gate/synack.h, routed_through), off the stack:
 * the SYN paths' global functions share the 512 bytes with the gate's frame. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_fib_lookup);
} fib_scratch SEC(".maps");

/* Each TCP class's SYN guard (syncookie.h), written by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS);
	__type(key, __u32);
	__type(value, struct sluice_syn_guard);
} syn_guard SEC(".maps");

/* Client addresses that may hold a socket on an answering class's port, a
 * bit set of two halves: words 0.. the daemon's, SLUICE_SYN_PEER_WORDS..
 * the gate's (struct sluice_syn_guard has the why). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * SLUICE_SYN_PEER_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} syn_peers SEC(".maps");

/* The latest check_until_ms of any class's guard (the daemon writes it with
 * each guard): the checker's one look at a packet while no guard checks. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} syn_guard_any SEC(".maps");

/* The gate's own check times, written when it answers a SYN early (the
 * class's guard watching, not answering: struct sluice_syn_guard): each
 * class's, and at SLUICE_CLASS_IDS the latest of all. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLUICE_CLASS_IDS + 1);
	__type(key, __u32);
	__type(value, __u64);
} syn_early SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_GS_NR);
	__type(key, __u32);
	__type(value, __u64);
} global_stats SEC(".maps");

/* This CPU's buckets for what the host needs past its default class's
 * limit (gate/host.h, enum host_bucket): ND and PMTU messages, non-IP frames. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct sluice_bucket);
} host_buckets SEC(".maps");

/* Datagrams in fragments: the class their first fragment took (gate/frags.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SLUICE_FRAGS);
	__type(key, struct sluice_frag);
	__type(value, struct sluice_frag_class);
} frags SEC(".maps");

/* Classes whose arrivals passed their wake mark (sluice_share.wake_at): struct sluice_wake. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} wake SEC(".maps");

/* Run-time settings, written by the daemon through the mmap'ed .data map. */
volatile struct sluice_settings settings = {
	.verdicts = { { .malformed_verdict = XDP_DROP }, { .malformed_verdict = XDP_DROP } },
};

/* The key of class `cls`'s entry for `cpu` in class_state, shares and fairness. */
static __always_inline __u32 cpu_key(__u32 cpu, __u32 cls)
{
	return cpu * SLUICE_CLASS_IDS + (cls & (SLUICE_CLASS_IDS - 1));
}

/* The same for this CPU. */
static __always_inline __u32 here_key(__u32 cls)
{
	return cpu_key(bpf_get_smp_processor_id(), cls);
}

/* This CPU's share of class `cls`'s limit. */
static __always_inline struct sluice_share *share_here(__u32 cls)
{
	__u32 key = here_key(cls);

	return bpf_map_lookup_elem(&shares, &key);
}

/* This CPU's source fairness of class `cls`. */
static __always_inline struct sluice_fair *fair_here(__u32 cls)
{
	__u32 key = here_key(cls);

	return bpf_map_lookup_elem(&fairness, &key);
}

/*
 * This CPU's state of class `cls` (class_state), its bit in class_cpus set
 * at its first packet of each of the daemon's ticks (settings.epoch): the
 * rest of the tick's packets read a field of the entry they write anyway.
 */
static __always_inline struct sluice_class_state *class_state_here(__u32 cls)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 key = cpu_key(cpu, cls);
	struct sluice_class_state *st = bpf_map_lookup_elem(&class_state, &key);
	__u64 tick = (__u64)settings.epoch + 1;
	__u32 word;
	__u64 *w;

	if (!st || st->marked == tick)
		return st;
	st->marked = tick;
	word = (cpu / 64) * SLUICE_CLASS_IDS + (cls & (SLUICE_CLASS_IDS - 1));
	w = bpf_map_lookup_elem(&class_cpus, &word);
	if (w)
		__sync_fetch_and_or(w, 1ULL << (cpu % 64));
	return st;
}

static __always_inline void global_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&global_stats, &idx);

	if (v)
		*v += 1;
}

#endif /* SLUICE_GATE_MAPS_H */
