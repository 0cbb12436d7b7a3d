/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * gen.h - the bench's traffic generator: what gen.bpf.c and the bench's Rust
 * side (through bindgen in build.rs) share. The gate's header, sluice.h, is
 * the daemon's; the generator is only the bench's.
 */
#ifndef SLUICE_GEN_H
#define SLUICE_GEN_H

#include <linux/types.h>

/* An XDP program run by BPF_PROG_RUN in live-frames mode, paced by due times inside one long call. */
#define SLUICE_GEN_MAX_STREAMS 8
#define SLUICE_GEN_TMPL 128        /* template bytes written into every frame */
#define SLUICE_GEN_MIN_FRAME 60    /* without FCS */
#define SLUICE_GEN_MAX_FRAME 1514  /* Ethernet header + 1500 */
#define SLUICE_GEN_FP_SHIFT 8      /* due times and intervals are ns << SHIFT */
#define SLUICE_GEN_MAX_BURST 64    /* the generator never sends more than this many frames late */
#define SLUICE_GEN_STAMP_LEN 16    /* stamp: __u64 send time (CLOCK_MONOTONIC ns), __u64 sequence */

/* One stream ("gen_streams" array). Written by the bench before the run. */
struct sluice_gen_stream {
	__u64 interval_fp; /* ns between frames << SLUICE_GEN_FP_SHIFT; 0 = stream off */
	__u32 len;         /* frame length in bytes */
	__u32 flows;       /* source ports sport_base .. sport_base + flows - 1 */
	__u32 dports;      /* destination ports dport_base .. dport_base + dports - 1 */
	__u16 sport_base;  /* host order */
	__u16 dport_base;  /* host order */
	__u16 sport_off;   /* offset of the UDP source port in the frame */
	__u16 csum_off;    /* offset of the L4 checksum to update (TCP, UDP over IPv6); 0 = none (UDP over IPv4 sends 0) */
	__u16 stamp_off;   /* offset of the stamp in the payload; 0 = none */
	__u16 saddr_off;   /* offset of the 4 source-address bytes that vary: IPv4's last 4, IPv6's bytes 4-7 (distinct /64s) */
	__u16 ipcsum_off;  /* offset of the IPv4 header checksum; 0 = IPv6 (no header checksum) */
	__u16 _pad;
	__u32 srcs;        /* source addresses: the template's, plus 0 .. srcs - 1 on the 32 bits at saddr_off */
	__u32 random;      /* 1: each frame's source is drawn at random from those srcs (else in turn) */
	__u8 tmpl[SLUICE_GEN_TMPL]; /* the frame's first bytes, headers with valid checksums */
};

/* Run state of one stream ("gen_state" array). Written by the generator only. */
struct sluice_gen_state {
	__u64 due_fp; /* when the next frame is due, ns << SHIFT; 0 = not started */
	__u64 sent;   /* frames handed to XDP_TX */
	__u64 late;   /* frames given up because the generator fell SLUICE_GEN_MAX_BURST behind */
	__u64 errors; /* frames not sent because resizing failed */
};

#endif /* SLUICE_GEN_H */
