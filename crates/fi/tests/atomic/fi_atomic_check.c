/*
 * Atomics (FI_ATOMIC) over the metaroce provider between processes.
 *
 *   fi_atomic_check target DIR CLIENTS   registers memory, writes its address
 *                                        and keys to DIR/target.addr, waits for
 *                                        CLIENTS "done" messages, then checks
 *                                        the memory the clients worked on
 *   fi_atomic_check client DIR INDEX     runs the atomics against the target
 *
 * Clients share two counters (fetch-add, and a compare-swap loop), so their
 * concurrent atomics must not lose an update; each also has its own slot and
 * array area for compare-swap, read, write, counts > 1, several datatypes,
 * inject and remote CQ data, and tries accesses the target must refuse (bad
 * key, missing rights, out of bounds) and requests the provider must refuse
 * (unsupported pairs, too many elements). Exit status 0 and an "ok" line
 * mean every check passed.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "../fi_check.h"

#define ITER 200
#define MEM_BYTES 4096
#define SHARED_ADD 0        /* u64: every client's fetch-adds */
#define SHARED_CAS 8        /* u64: every client's compare-swap increments */
#define SLOT(i) (16 + 8 * (i))          /* u64 per client */
#define AREA(i) (128 + 512 * (i))       /* 512 bytes per client */
#define INJECT_WORD(i) (3072 + 8 * (i)) /* u64 per client */
#define MAX_CLIENTS 4

static struct fi_info *info;
static struct fid_fabric *fabric;
static struct fid_domain *domain;
static struct fid_ep *ep;
static struct fid_cq *cq;
static struct fid_av *av;

static void setup(void)
{
	struct fi_info *hints = fi_allocinfo();
	hints->caps = FI_ATOMIC | FI_RMA | FI_MSG | FI_RMA_EVENT;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("metaroce");
	hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED;
	RC(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	CHECK(info->caps & FI_ATOMIC, "fi_getinfo did not grant FI_ATOMIC");
	fi_freeinfo(hints);
	RC(fi_fabric(info->fabric_attr, &fabric, NULL));
	RC(fi_domain(fabric, info, &domain, NULL));
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .size = 1024 };
	RC(fi_cq_open(domain, &cq_attr, &cq, NULL));
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	RC(fi_av_open(domain, &av_attr, &av, NULL));
	RC(fi_endpoint(domain, info, &ep, NULL));
	RC(fi_ep_bind(ep, &av->fid, 0));
	RC(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	RC(fi_enable(ep));
}

/* One completion: 0 and its entry, or the error entry's error and text. */
static int wait_one(struct fi_cq_data_entry *e, char *text, size_t len)
{
	for (;;) {
		ssize_t n = fi_cq_read(cq, e, 1);
		if (n == 1)
			return 0;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee;
			memset(&ee, 0, sizeof(ee));
			CHECK(fi_cq_readerr(cq, &ee, 0) == 1, "fi_cq_readerr");
			const char *s = fi_cq_strerror(cq, ee.prov_errno, ee.err_data, text, len);
			if (s && s != text)
				snprintf(text, len, "%s", s);
			e->op_context = ee.op_context;
			e->flags = ee.flags;
			return ee.err;
		}
		CHECK(n == -FI_EAGAIN, "fi_cq_read = %zd", n);
	}
}

/* Wait for the completion of the op with context `ctx`, which must succeed. */
static void done(void *ctx, uint64_t want_flags)
{
	struct fi_cq_data_entry e;
	char text[512] = "";
	int err = wait_one(&e, text, sizeof(text));
	CHECK(err == 0, "completion error %d (%s): %s", err, fi_strerror(err), text);
	CHECK(e.op_context == ctx, "completion for context %p, expected %p", e.op_context, ctx);
	CHECK((e.flags & want_flags) == want_flags, "completion flags %#" PRIx64 " lack %#" PRIx64,
	      (uint64_t)e.flags, want_flags);
}

/* Wait for an error completion; its error code, text in `text`. */
static int refused(void *ctx, char *text, size_t len)
{
	struct fi_cq_data_entry e;
	text[0] = 0;
	int err = wait_one(&e, text, len);
	CHECK(err != 0, "the op succeeded; expected an error completion");
	CHECK(e.op_context == ctx, "error for context %p, expected %p", e.op_context, ctx);
	return err;
}

/* ------------------------------------------------------------------ target */

static int run_target(const char *dir, int clients)
{
	static uint64_t mem[MEM_BYTES / 8];
	static uint64_t write_only[64];
	struct fid_mr *mr, *mr_wo;
	RC(fi_mr_reg(domain, mem, sizeof(mem), FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL));
	RC(fi_mr_reg(domain, write_only, sizeof(write_only), FI_REMOTE_WRITE, 0, 0, 0, &mr_wo, NULL));
	char name[64];
	size_t name_len = sizeof(name);
	RC(fi_getname(&ep->fid, name, &name_len));

	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s/target.addr", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	CHECK(f != NULL, "cannot write %s", tmp);
	for (size_t i = 0; i < name_len; i++)
		fprintf(f, "%02x", (unsigned char)name[i]);
	fprintf(f, " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", fi_mr_key(mr),
		(uint64_t)(uintptr_t)mem, fi_mr_key(mr_wo), (uint64_t)(uintptr_t)write_only);
	fclose(f);
	CHECK(rename(tmp, path) == 0, "rename %s", tmp);

	/* Progress is manual: the target applies atomics while it polls. */
	static uint64_t msgs[MAX_CLIENTS];
	for (int i = 0; i < clients; i++)
		RC(fi_recv(ep, &msgs[i], sizeof(msgs[i]), NULL, FI_ADDR_UNSPEC, &msgs[i]));
	int got = 0, cq_data = 0;
	uint64_t data_seen = 0;
	while (got < clients) {
		struct fi_cq_data_entry e;
		char text[512] = "";
		int err = wait_one(&e, text, sizeof(text));
		CHECK(err == 0, "target completion error %d: %s", err, text);
		if (e.flags & FI_RECV) {
			got++;
		} else if (e.flags & FI_REMOTE_CQ_DATA) {
			CHECK(e.flags & FI_ATOMIC, "remote CQ data without FI_ATOMIC: %#" PRIx64,
			      (uint64_t)e.flags);
			CHECK((e.data & ~0xfull) == 0xabc0, "remote CQ data %#" PRIx64, (uint64_t)e.data);
			data_seen |= 1ull << (e.data & 0xf);
			cq_data++;
		}
	}
	CHECK(cq_data == clients, "%d remote CQ data entries for %d clients", cq_data, clients);
	CHECK(data_seen == (1ull << clients) - 1, "remote CQ data from clients %#" PRIx64, data_seen);

	/* No update lost between the clients. */
	CHECK(mem[SHARED_ADD / 8] == (uint64_t)clients * ITER, "fetch-add counter %" PRIu64,
	      mem[SHARED_ADD / 8]);
	CHECK(mem[SHARED_CAS / 8] == (uint64_t)clients * ITER, "compare-swap counter %" PRIu64,
	      mem[SHARED_CAS / 8]);
	for (int c = 0; c < clients; c++) {
		CHECK(mem[SLOT(c) / 8] == 0xC0FFEE00u + c, "client %d slot %#" PRIx64, c,
		      mem[SLOT(c) / 8]);
		CHECK(mem[INJECT_WORD(c) / 8] == 35, "client %d inject word %" PRIu64, c,
		      mem[INJECT_WORD(c) / 8]);
		const uint32_t *a = (const uint32_t *)((char *)mem + AREA(c));
		for (int i = 0; i < 64; i++)
			CHECK(a[i] == ((uint32_t)(i + 1 > 32 ? i + 1 : 32) ^ 0xff), "client %d a[%d] = %u", c,
			      i, a[i]);
		const uint64_t *q = (const uint64_t *)((char *)mem + AREA(c) + 256);
		CHECK(q[0] == 1 && q[1] == 20 && q[2] == 3 && q[3] == 40, "client %d cswap array", c);
		const double *d = (const double *)((char *)mem + AREA(c) + 320);
		CHECK(d[0] == 2.0 && d[1] == 3.0 && d[2] == -0.5 && d[3] == 0.5, "client %d doubles", c);
		const int8_t *b = (const int8_t *)((char *)mem + AREA(c) + 384);
		CHECK(b[0] == -2 && b[1] == 5 && b[2] == -128, "client %d int8 %d %d %d", c, b[0], b[1],
		      b[2]);
	}
	/* Every client's permitted base atomic on the write-only region landed. */
	CHECK(write_only[0] == (uint64_t)clients, "write-only region %" PRIu64, write_only[0]);
	printf("target: ok (%d clients, %d checks)\n", clients, checks);
	fflush(stdout);
	fi_close(&mr->fid);
	fi_close(&mr_wo->fid);
	return 0;
}

/* ------------------------------------------------------------------ client */

static fi_addr_t target;
static uint64_t key, base, key_wo, base_wo;

static void read_address(const char *dir)
{
	char path[4096], hex[129];
	snprintf(path, sizeof(path), "%s/target.addr", dir);
	FILE *f = NULL;
	for (int i = 0; i < 600 && !(f = fopen(path, "r")); i++)
		usleep(50 * 1000);
	CHECK(f != NULL, "no %s after 30 s", path);
	CHECK(fscanf(f, "%128s %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, hex, &key, &base, &key_wo,
		     &base_wo) == 5,
	      "malformed %s", path);
	fclose(f);
	unsigned char name[64];
	size_t n = strlen(hex) / 2;
	for (size_t i = 0; i < n; i++)
		sscanf(hex + 2 * i, "%2hhx", &name[i]);
	CHECK(fi_av_insert(av, name, 1, &target, 0, NULL) == 1, "fi_av_insert");
}

static uint64_t fetch_u64(uint64_t offset, enum fi_op op, uint64_t operand)
{
	uint64_t old = 0;
	int ctx;
	RC(fi_fetch_atomic(ep, &operand, 1, NULL, &old, NULL, target, base + offset, key, FI_UINT64,
			   op, &ctx));
	done(&ctx, FI_ATOMIC | FI_READ);
	return old;
}

static uint64_t cswap_u64(uint64_t offset, uint64_t compare, uint64_t swap)
{
	uint64_t old = 0;
	int ctx;
	RC(fi_compare_atomic(ep, &swap, 1, NULL, &compare, NULL, &old, NULL, target, base + offset, key,
			     FI_UINT64, FI_CSWAP, &ctx));
	done(&ctx, FI_ATOMIC | FI_READ);
	return old;
}

static void write_elems(uint64_t offset, const void *v, size_t count, enum fi_datatype dt,
			enum fi_op op)
{
	int ctx;
	RC(fi_atomic(ep, v, count, NULL, target, base + offset, key, dt, op, &ctx));
	done(&ctx, FI_ATOMIC | FI_WRITE);
}

static void valid_queries(void)
{
	size_t count = 0;
	struct fi_atomic_attr attr;
	RC(fi_atomicvalid(ep, FI_UINT64, FI_SUM, &count));
	CHECK(count >= 64, "FI_UINT64 FI_SUM count %zu", count);
	RC(fi_fetch_atomicvalid(ep, FI_INT64, FI_SUM, &count));
	RC(fi_fetch_atomicvalid(ep, FI_UINT64, FI_ATOMIC_READ, &count));
	RC(fi_fetch_atomicvalid(ep, FI_UINT64, FI_ATOMIC_WRITE, &count));
	RC(fi_atomicvalid(ep, FI_UINT64, FI_ATOMIC_WRITE, &count));
	RC(fi_compare_atomicvalid(ep, FI_UINT64, FI_CSWAP, &count));
	size_t cswap_count = count;
	RC(fi_fetch_atomicvalid(ep, FI_UINT64, FI_SUM, &count));
	CHECK(cswap_count * 2 == count, "compare count %zu, fetch count %zu", cswap_count, count);
	RC(fi_atomicvalid(ep, FI_DOUBLE, FI_SUM, &count));
	RC(fi_atomicvalid(ep, FI_DOUBLE_COMPLEX, FI_PROD, &count));
	RC(fi_compare_atomicvalid(ep, FI_INT8, FI_MSWAP, &count));
	CHECK(fi_atomicvalid(ep, FI_UINT64, FI_ATOMIC_READ, &count) == -FI_EOPNOTSUPP,
	      "base FI_ATOMIC_READ offered");
	CHECK(fi_atomicvalid(ep, FI_UINT64, FI_CSWAP, &count) == -FI_EOPNOTSUPP,
	      "base FI_CSWAP offered");
	CHECK(fi_atomicvalid(ep, FI_LONG_DOUBLE, FI_SUM, &count) == -FI_EOPNOTSUPP,
	      "FI_LONG_DOUBLE offered");
	CHECK(fi_atomicvalid(ep, FI_DOUBLE, FI_BOR, &count) == -FI_EOPNOTSUPP,
	      "FI_BOR on FI_DOUBLE offered");
	CHECK(fi_compare_atomicvalid(ep, FI_FLOAT_COMPLEX, FI_CSWAP_LT, &count) == -FI_EOPNOTSUPP,
	      "ordered compare on complex offered");
	RC(fi_query_atomic(domain, FI_INT32, FI_MIN, &attr, FI_FETCH_ATOMIC));
	CHECK(attr.size == 4 && attr.count >= 64, "query FI_INT32: size %zu count %zu", attr.size,
	      attr.count);
	RC(fi_query_atomic(domain, FI_DOUBLE_COMPLEX, FI_CSWAP, &attr, FI_COMPARE_ATOMIC));
	CHECK(attr.size == 16, "query FI_DOUBLE_COMPLEX size %zu", attr.size);
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_CSWAP, &attr, 0) == -FI_EOPNOTSUPP,
	      "query: base FI_CSWAP offered");
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_SUM, &attr, FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC) ==
		      -FI_EINVAL,
	      "query with both fetch and compare accepted");
}

static void shared_counters(int idx)
{
	/* Fetch-add: this client's fetched values rise strictly; with the
	 * others' they are all distinct, which the target's total shows. */
	uint64_t prev = 0;
	for (int i = 0; i < ITER; i++) {
		uint64_t old = fetch_u64(SHARED_ADD, FI_SUM, 1);
		CHECK(i == 0 || old > prev, "fetch-add returned %" PRIu64 " after %" PRIu64, old, prev);
		prev = old;
	}
	/* Compare-swap loop: increment through FI_CSWAP, retrying on races. */
	uint64_t cur = fetch_u64(SHARED_CAS, FI_ATOMIC_READ, 0);
	int retries = 0;
	for (int i = 0; i < ITER;) {
		uint64_t old = cswap_u64(SHARED_CAS, cur, cur + 1);
		if (old == cur) {
			cur++;
			i++;
		} else {
			cur = old;
			retries++;
		}
	}
	printf("client %d: %d compare-swap retries\n", idx, retries);
}

static void slot_ops(int idx)
{
	uint64_t s = SLOT(idx);
	CHECK(cswap_u64(s, 0, 42) == 0, "cswap on a fresh slot");
	CHECK(cswap_u64(s, 0, 7) == 42, "failing cswap returned the wrong value");
	CHECK(fetch_u64(s, FI_ATOMIC_READ, 0) == 42, "a failed cswap changed the slot");
	uint64_t v = 0xC0FFEE00u + idx;
	write_elems(s, &v, 1, FI_UINT64, FI_ATOMIC_WRITE);
	CHECK(fetch_u64(s, FI_ATOMIC_READ, 0) == v, "atomic write did not land");
	CHECK(fetch_u64(s, FI_ATOMIC_WRITE, 5) == v, "swap returned the wrong value");
	CHECK(fetch_u64(s, FI_ATOMIC_READ, 0) == 5, "swap did not land");
	/* FI_ATOMIC_READ ignores its operand: a NULL buffer is allowed. */
	uint64_t old = 0;
	int ctx;
	RC(fi_fetch_atomic(ep, NULL, 1, NULL, &old, NULL, target, base + s, key, FI_UINT64,
			   FI_ATOMIC_READ, &ctx));
	done(&ctx, FI_ATOMIC | FI_READ);
	CHECK(old == 5, "read with a NULL operand: %" PRIu64, old);
	write_elems(s, &v, 1, FI_INT64, FI_ATOMIC_WRITE);
}

static void arrays(int idx)
{
	uint64_t a = AREA(idx);
	uint32_t u[64], r[64], m[64];
	for (int i = 0; i < 64; i++) {
		u[i] = i + 1;
		m[i] = 32;
	}
	write_elems(a, u, 64, FI_UINT32, FI_SUM);
	/* Read back through two result segments (fetch-atomicv, NULL operands). */
	memset(r, 0, sizeof(r));
	struct fi_ioc op_iov[2] = { { NULL, 32 }, { NULL, 32 } };
	struct fi_ioc res_iov[2] = { { r, 32 }, { r + 32, 32 } };
	int ctx;
	RC(fi_fetch_atomicv(ep, op_iov, NULL, 2, res_iov, NULL, 2, target, base + a, key, FI_UINT32,
			    FI_ATOMIC_READ, &ctx));
	done(&ctx, FI_ATOMIC | FI_READ);
	for (int i = 0; i < 64; i++)
		CHECK(r[i] == (uint32_t)i + 1, "r[%d] = %u", i, r[i]);
	/* Fetching FI_MAX of 64 elements: originals back, maxima in place. */
	RC(fi_fetch_atomic(ep, m, 64, NULL, r, NULL, target, base + a, key, FI_UINT32, FI_MAX, &ctx));
	done(&ctx, FI_ATOMIC | FI_READ);
	for (int i = 0; i < 64; i++)
		CHECK(r[i] == (uint32_t)i + 1, "max original r[%d] = %u", i, r[i]);
	uint32_t ff[64];
	for (int i = 0; i < 64; i++)
		ff[i] = 0xff;
	/* Vector base atomic from two segments. */
	struct fi_ioc x_iov[2] = { { ff, 10 }, { ff + 10, 54 } };
	RC(fi_atomicv(ep, x_iov, NULL, 2, target, base + a, key, FI_UINT32, FI_BXOR, &ctx));
	done(&ctx, FI_ATOMIC | FI_WRITE);

	/* Compare-swap of 4 elements, two of which match. */
	uint64_t q[4] = { 10, 20, 30, 40 }, cmp[4] = { 10, 0, 30, 0 }, sw[4] = { 1, 2, 3, 4 }, old[4];
	write_elems(a + 256, q, 4, FI_UINT64, FI_ATOMIC_WRITE);
	RC(fi_compare_atomic(ep, sw, 4, NULL, cmp, NULL, old, NULL, target, base + a + 256, key,
			     FI_UINT64, FI_CSWAP, &ctx));
	done(&ctx, FI_ATOMIC | FI_READ);
	CHECK(old[0] == 10 && old[1] == 20 && old[2] == 30 && old[3] == 40, "cswap originals");

	/* Doubles: write, then sum. */
	double d[4] = { 1.5, 2.5, -1.0, 0.0 }, half[4] = { 0.5, 0.5, 0.5, 0.5 };
	write_elems(a + 320, d, 4, FI_DOUBLE, FI_ATOMIC_WRITE);
	write_elems(a + 320, half, 4, FI_DOUBLE, FI_SUM);

	/* int8 through fi_atomicmsg with remote CQ data for the target. */
	int8_t b[3] = { 1, 5, 127 }, b2[3] = { -3, 0, 1 };
	write_elems(a + 384, b, 3, FI_INT8, FI_ATOMIC_WRITE);
	struct fi_ioc b_iov = { b2, 3 };
	struct fi_rma_ioc rma = { base + a + 384, 3, key };
	struct fi_msg_atomic msg = {
		.msg_iov = &b_iov,
		.iov_count = 1,
		.addr = target,
		.rma_iov = &rma,
		.rma_iov_count = 1,
		.datatype = FI_INT8,
		.op = FI_SUM,
		.context = &ctx,
		.data = 0xabc0 + idx,
	};
	RC(fi_atomicmsg(ep, &msg, FI_REMOTE_CQ_DATA | FI_COMPLETION));
	done(&ctx, FI_ATOMIC | FI_WRITE);
	/* 1 - 3 = -2, 5 + 0 = 5, 127 + 1 wraps to -128. */
}

static void injects(int idx)
{
	uint64_t seven = 7;
	for (int i = 0; i < 5; i++)
		RC(fi_inject_atomic(ep, &seven, 1, target, base + INJECT_WORD(idx), key, FI_UINT64,
				    FI_SUM));
	/* No completions for injects; a later fetch on the same path sees them all. */
	CHECK(fetch_u64(INJECT_WORD(idx), FI_ATOMIC_READ, 0) == 35, "injects not all applied");
}

static void refusals(void)
{
	char text[512];
	uint64_t one = 1, old = 0;
	int ctx;
	/* A key the target never handed out. */
	RC(fi_fetch_atomic(ep, &one, 1, NULL, &old, NULL, target, base, key ^ 0x5a5a5a, FI_UINT64,
			   FI_SUM, &ctx));
	int err = refused(&ctx, text, sizeof(text));
	CHECK(err == FI_EACCES, "bad key: error %d (%s): %s", err, fi_strerror(err), text);
	CHECK(strstr(text, "no memory region has key") && strstr(text, "refused by the target") &&
		      strstr(text, "peer 127.0.0.1:"),
	      "bad key: the error text does not name the peer and reason: %s", text);
	printf("%s: bad key refused: %s\n", role, text);
	/* A fetch needs remote read rights; a base atomic does not. */
	RC(fi_fetch_atomic(ep, &one, 1, NULL, &old, NULL, target, base_wo, key_wo, FI_UINT64, FI_SUM,
			   &ctx));
	err = refused(&ctx, text, sizeof(text));
	CHECK(err == FI_EACCES && strstr(text, "does not allow remote read"), "write-only: %d %s", err,
	      text);
	int ctx2;
	RC(fi_atomic(ep, &one, 1, NULL, target, base_wo, key_wo, FI_UINT64, FI_SUM, &ctx2));
	done(&ctx2, FI_ATOMIC | FI_WRITE);
	/* Past the end of the region. */
	RC(fi_atomic(ep, &one, 1, NULL, target, base + MEM_BYTES - 4, key, FI_UINT64, FI_SUM, &ctx));
	err = refused(&ctx, text, sizeof(text));
	CHECK(err == FI_EACCES && strstr(text, "outside"), "out of bounds: %d %s", err, text);
	/* Refused before anything is sent. */
	size_t max = 0;
	RC(fi_fetch_atomicvalid(ep, FI_UINT64, FI_SUM, &max));
	uint64_t *big = calloc(max + 1, 8), *big_res = calloc(max + 1, 8);
	CHECK(fi_fetch_atomic(ep, big, max + 1, NULL, big_res, NULL, target, base, key, FI_UINT64,
			      FI_SUM, &ctx) == -FI_EMSGSIZE,
	      "%zu elements accepted", max + 1);
	free(big);
	free(big_res);
	long double ld = 1;
	CHECK(fi_atomic(ep, &ld, 1, NULL, target, base, key, FI_LONG_DOUBLE, FI_SUM, &ctx) ==
		      -FI_EOPNOTSUPP,
	      "FI_LONG_DOUBLE accepted");
	CHECK(fi_atomic(ep, &one, 1, NULL, target, base, key, FI_UINT64, FI_CSWAP, &ctx) ==
		      -FI_EOPNOTSUPP,
	      "base FI_CSWAP accepted");
	CHECK(fi_atomic(ep, &one, 0, NULL, target, base, key, FI_UINT64, FI_SUM, &ctx) == -FI_EINVAL,
	      "zero elements accepted");
	/* The connection survives the refusals. */
	CHECK(fetch_u64(SHARED_ADD, FI_ATOMIC_READ, 0) > 0, "read after refusals");
}

static int run_client(const char *dir, int idx)
{
	read_address(dir);
	valid_queries();
	shared_counters(idx);
	slot_ops(idx);
	arrays(idx);
	injects(idx);
	refusals();
	uint64_t bye = idx;
	int ctx;
	RC(fi_send(ep, &bye, sizeof(bye), NULL, target, &ctx));
	done(&ctx, FI_SEND);
	printf("client %d: ok (%d checks)\n", idx, checks);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[1], "target") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: %s target DIR CLIENTS | client DIR INDEX\n", argv[0]);
		return 2;
	}
	static char who[32];
	int n = atoi(argv[3]);
	if (!strcmp(argv[1], "target")) {
		role = "target";
		if (n < 1 || n > MAX_CLIENTS) {
			fprintf(stderr, "1 to %d clients\n", MAX_CLIENTS);
			return 2;
		}
	} else {
		snprintf(who, sizeof(who), "client %d", n);
		role = who;
		if (n < 0 || n >= MAX_CLIENTS) {
			fprintf(stderr, "index 0 to %d\n", MAX_CLIENTS - 1);
			return 2;
		}
	}
	setup();
	int rc = !strcmp(argv[1], "target") ? run_target(argv[2], n) : run_client(argv[2], n);
	fi_close(&ep->fid);
	fi_close(&av->fid);
	fi_close(&cq->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	return rc;
}
