/*
 * Rendezvous messages between two endpoints of one process, with every
 * combination of contiguous and scattered buffers at the two ends:
 *
 *   fi_iov_check
 *
 * A message above the eager limit moves by RDMA READ. A contiguous buffer
 * is lent to MetaRoCE in place; a scattered one (fi_sendv / fi_recvv with
 * several segments) goes through a staging region and a copy. Each case
 * checks every byte, the completion's length and flags; the provider's
 * counters at close (FI_METAROCE_STATS=1) tell which path each end took.
 * Exit status 0 and an "ok" line mean every check passed.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "../fi_check.h"

#define MSG_BYTES (200 * 1024 + 13) /* above the eager limit, odd length */
#define SEGS 3

struct side {
	struct fid_ep *ep;
	struct fid_cq *cq;
	fi_addr_t peer;
};

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_av *av;
static struct side a, b;

static void open_side(struct side *s)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .size = 64 };
	RC(fi_cq_open(domain, &cq_attr, &s->cq, NULL));
	RC(fi_endpoint(domain, info, &s->ep, NULL));
	RC(fi_ep_bind(s->ep, &av->fid, 0));
	RC(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	RC(fi_enable(s->ep));
}

static void setup(void)
{
	struct fi_info *hints = fi_allocinfo();
	hints->caps = FI_MSG | FI_TAGGED;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("metaroce");
	RC(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);
	CHECK(info->tx_attr->iov_limit >= SEGS, "iov_limit %zu", info->tx_attr->iov_limit);
	RC(fi_fabric(info->fabric_attr, &fabric, NULL));
	RC(fi_domain(fabric, info, &domain, NULL));
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	RC(fi_av_open(domain, &av_attr, &av, NULL));
	open_side(&a);
	open_side(&b);
	char name[64];
	size_t len = sizeof(name);
	RC(fi_getname(&b.ep->fid, name, &len));
	CHECK(fi_av_insert(av, name, 1, &a.peer, 0, NULL) == 1, "fi_av_insert of b");
	len = sizeof(name);
	RC(fi_getname(&a.ep->fid, name, &len));
	CHECK(fi_av_insert(av, name, 1, &b.peer, 0, NULL) == 1, "fi_av_insert of a");
}

/* One poll of `cq`: 1 and the entry in `e`, or 0; an error completion
 * fails the check, naming `what`. */
static int poll_one(struct fid_cq *cq, struct fi_cq_tagged_entry *e, const char *what)
{
	ssize_t n = fi_cq_read(cq, e, 1);
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry ee;
		memset(&ee, 0, sizeof(ee));
		fi_cq_readerr(cq, &ee, 0);
		fail(__LINE__, "%s completion error %d (%s)", what, ee.err, fi_strerror(ee.err));
	}
	CHECK(n == 1 || n == -FI_EAGAIN, "fi_cq_read(%s) = %zd", what, n);
	return n == 1;
}

/* Poll both queues (progress is manual) until each has one completion. */
static void both_done(struct fi_cq_tagged_entry *tx, struct fi_cq_tagged_entry *rx)
{
	int got_tx = 0, got_rx = 0;
	while (!got_tx || !got_rx) {
		if (!got_tx)
			got_tx = poll_one(a.cq, tx, "send");
		if (!got_rx)
			got_rx = poll_one(b.cq, rx, "receive");
	}
}

/* Split `buf` of `len` bytes into SEGS uneven segments. */
static void split(char *buf, size_t len, struct iovec *iov)
{
	size_t first = len / 5, second = len / 2;
	iov[0].iov_base = buf;
	iov[0].iov_len = first;
	iov[1].iov_base = buf + first;
	iov[1].iov_len = second;
	iov[2].iov_base = buf + first + second;
	iov[2].iov_len = len - first - second;
}

static void one_case(int send_scattered, int recv_scattered, uint64_t tag)
{
	char *src = malloc(MSG_BYTES), *dst = malloc(MSG_BYTES);
	CHECK(src && dst, "malloc");
	for (size_t i = 0; i < MSG_BYTES; i++)
		src[i] = (char)(i * 131 + tag);
	memset(dst, 0, MSG_BYTES);
	struct iovec siov[SEGS], riov[SEGS];
	split(src, MSG_BYTES, siov);
	split(dst, MSG_BYTES, riov);
	int rctx, sctx;
	if (recv_scattered)
		RC(fi_trecvv(b.ep, riov, NULL, SEGS, b.peer, tag, 0, &rctx));
	else
		RC(fi_trecv(b.ep, dst, MSG_BYTES, NULL, b.peer, tag, 0, &rctx));
	ssize_t rc;
	do {
		rc = send_scattered ? fi_tsendv(a.ep, siov, NULL, SEGS, a.peer, tag, &sctx)
				    : fi_tsend(a.ep, src, MSG_BYTES, NULL, a.peer, tag, &sctx);
		if (rc == -FI_EAGAIN) {
			struct fi_cq_tagged_entry none;
			fi_cq_read(a.cq, &none, 0);
			fi_cq_read(b.cq, &none, 0);
		}
	} while (rc == -FI_EAGAIN);
	CHECK(rc == 0, "send = %zd (%s)", rc, fi_strerror((int)-rc));
	struct fi_cq_tagged_entry tx, rx;
	both_done(&tx, &rx);
	CHECK(tx.op_context == &sctx, "send completion context");
	CHECK(rx.op_context == &rctx, "receive completion context");
	CHECK(rx.len == MSG_BYTES, "received %zu bytes, sent %d", rx.len, MSG_BYTES);
	CHECK(rx.tag == tag, "received tag %" PRIu64, (uint64_t)rx.tag);
	CHECK((rx.flags & (FI_RECV | FI_TAGGED)) == (FI_RECV | FI_TAGGED), "receive flags %#" PRIx64,
	      (uint64_t)rx.flags);
	for (size_t i = 0; i < MSG_BYTES; i++)
		CHECK(dst[i] == src[i], "send %s, receive %s: byte %zu is %d, sent %d",
		      send_scattered ? "scattered" : "contiguous",
		      recv_scattered ? "scattered" : "contiguous", i, dst[i], src[i]);
	free(src);
	free(dst);
}

int main(void)
{
	role = "fi_iov_check";
	setup();
	uint64_t tag = 1;
	for (int round = 0; round < 3; round++) {
		one_case(0, 0, tag++);
		one_case(1, 0, tag++);
		one_case(0, 1, tag++);
		one_case(1, 1, tag++);
	}
	fi_close(&a.ep->fid);
	fi_close(&b.ep->fid);
	fi_close(&a.cq->fid);
	fi_close(&b.cq->fid);
	fi_close(&av->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	printf("ok: %d checks\n", checks);
	return 0;
}
