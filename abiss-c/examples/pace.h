/*
 * pace.h - the clock and the schedule shared by the examples play.c and record.c: a stream at
 * a byterate has byte offset B due at B / rate seconds after its start (an absolute schedule,
 * so one late step does not push back the ones after it).
 */
#ifndef ABISS_EXAMPLE_PACE_H
#define ABISS_EXAMPLE_PACE_H

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#define NS_PER_S 1000000000LL

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* When byte offset `bytes` of a stream at `rate` bytes/s is due, in ns after the start. */
static long long due_ns(unsigned long long bytes, unsigned long long rate)
{
	unsigned long long whole_s = bytes / rate;
	double rest_ns = (double)(bytes % rate) * (double)NS_PER_S / (double)rate;

	return (long long)whole_s * NS_PER_S + (long long)rest_ns;
}

/* Sleeps until the monotonic clock reads `deadline` (ns); returns at once if it has passed. */
static void sleep_until(long long deadline)
{
	for (;;) {
		long long left = deadline - now_ns();
		struct timespec ts;

		if (left <= 0)
			return;
		ts.tv_sec = (time_t)(left / NS_PER_S);
		ts.tv_nsec = (long)(left % NS_PER_S);
		if (nanosleep(&ts, NULL) == 0)
			return;
		if (errno != EINTR)
			return;
	}
}

static int parse_long(const char *text, long *value)
{
	char *end;

	errno = 0;
	*value = strtol(text, &end, 10);
	return errno == 0 && end != text && *end == '\0';
}

#endif
