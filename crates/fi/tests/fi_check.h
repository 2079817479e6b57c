/* The libfabric test programs' check: count it, and on failure name the
 * program's role, the line and what was wrong, then exit 1. RC checks a
 * libfabric call that returns 0 on success. Each program sets `role` and
 * prints `checks` at the end. */
#ifndef METAROCE_FI_CHECK_H
#define METAROCE_FI_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <rdma/fi_errno.h>

static const char *role = "?";
static int checks;

static void fail(int line, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: FAILED at line %d: ", role, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		checks++;                                                      \
		if (!(cond))                                                   \
			fail(__LINE__, __VA_ARGS__);                           \
	} while (0)
#define RC(call)                                                               \
	do {                                                                   \
		int rc_ = (int)(call);                                         \
		CHECK(rc_ == 0, "%s = %d (%s)", #call, rc_, fi_strerror(-rc_)); \
	} while (0)

#endif
