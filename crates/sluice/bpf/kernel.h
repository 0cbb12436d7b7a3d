/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * kernel.h - the few kernel structs and fields the BPF programs read
 * (included by gate.bpf.c, steer.bpf.c and trace.bpf.c), declared with
 * preserve_access_index: libbpf's
 * CO-RE finds each field's offset in the running kernel's BTF at load, so
 * no vmlinux.h is needed and only the fields a program touches must exist.
 */
#ifndef SLUICE_KERNEL_H
#define SLUICE_KERNEL_H

#include <linux/types.h>

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

/* possible_net_t: a struct net pointer (with network namespaces built in). */
struct sluice_possible_net {
	struct net *net;
} __attribute__((preserve_access_index));

struct net_device {
	int ifindex;
	struct sluice_possible_net nd_net;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	int skb_iif;
	__be16 protocol;
	__u16 mac_header;
	unsigned char *head;
	unsigned char *data;
} __attribute__((preserve_access_index));

struct sk_buff_head {
	struct sk_buff *prev;
	__u32 qlen;
} __attribute__((preserve_access_index));

struct sock_common {
	__u16 skc_num;
	struct sluice_possible_net skc_net;
	struct {
		__s64 counter;
	} skc_cookie;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
} __attribute__((preserve_access_index));

struct bpf_prog_aux {
	__u32 id;
} __attribute__((preserve_access_index));

struct bpf_prog {
	struct bpf_prog_aux *aux;
} __attribute__((preserve_access_index));

/* An SO_REUSEPORT group's shared part: its program, if any. */
struct sock_reuseport {
	struct bpf_prog *prog;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	/* sk_rmem_alloc is sk_backlog.rmem_alloc: the bytes a socket's queues
	 * charge; a UDP socket drops a datagram that finds it over sk_rcvbuf. */
	struct {
		struct {
			int counter;
		} rmem_alloc;
	} sk_backlog;
	int sk_rcvbuf;
	struct sk_buff_head sk_receive_queue;
	__u16 sk_protocol;
	struct sock_reuseport *sk_reuseport_cb;
	struct socket *sk_socket;
	/* The owner's uid (in the initial user namespace), set when the socket is made. */
	struct {
		__u32 val;
	} sk_uid;
	/* A listener's backlog: listen(2)'s, capped at net.core.somaxconn. */
	__u32 sk_max_ack_backlog;
} __attribute__((preserve_access_index));

/* UDP moves the receive queue to this one in a batch when a reader empties it. */
struct udp_sock {
	struct sk_buff_head reader_queue;
} __attribute__((preserve_access_index));

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

/* The context of an iter/udp program: one UDP socket of the reader's netns. */
struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

struct inet_sock {
	struct sock sk;
} __attribute__((preserve_access_index));

/* A listener's SYN queue: qlen counts its request sockets (half-open handshakes). */
struct request_sock_queue {
	struct {
		int counter;
	} qlen;
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	struct inet_sock icsk_inet;
	struct request_sock_queue icsk_accept_queue;
} __attribute__((preserve_access_index));

/*
 * The TCP socket: a listener's SYN queue and backlog (inet_conn), and
 * MPTCP's mark: the kernel refuses a gate cookie's request socket to an
 * MPTCP listener. A kernel built without MPTCP has no such field
 * (bpf_core_field_exists says so).
 */
struct tcp_sock {
	struct inet_connection_sock inet_conn;
	__u8 is_mptcp;
} __attribute__((preserve_access_index));

#endif /* SLUICE_KERNEL_H */
