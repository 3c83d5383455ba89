/*
 * record - write a file at a byterate through abiss, as a camera or broadcast recorder would.
 *
 *   record [-d] FILE BYTERATE BYTES [APP_BUFFER]
 *
 * Opens FILE with abiss_fopen(FILE, "w", BYTERATE, APP_BUFFER): a write stream, so abissd
 * writes what is written back to the disk at the stream's priority, at most about APP_BUFFER
 * bytes behind the writer (0 or absent for the default). With -d, abiss_fopen_opts() with
 * ABISS_DIRECT: the library writes past the page cache from a ring of APP_BUFFER bytes, by a
 * thread abissd raises, and the kernel's dirty-page throttle never paces the writes. Then writes BYTES in 64 KiB writes on
 * an absolute schedule, as a capture device hands them over: write i is due at
 * start + (i + 1) * 64 KiB / BYTERATE. Measures how long each abiss_fwrite takes and prints one
 * line:
 *
 *   record: stream=3 writes=48 bytes=3145728 max_latency_us=212 late=0 elapsed_ms=3000
 *
 * "late" counts writes that returned after the next write was due. Exits 0 on success, 1 when
 * abiss fails (with abiss_strerror()), 2 on bad arguments.
 *
 * Build: cc -std=c99 -I abiss-c/include record.c -L target/debug -labiss -Wl,-rpath,target/debug
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abiss.h"
#include "pace.h"

#define WRITE_BYTES (64 * 1024)

int main(int argc, char **argv)
{
	static unsigned char frame[WRITE_BYTES];
	long rate, total, app_buffer = 0, max_latency_ns = 0, writes = 0, late = 0;
	unsigned long long bytes = 0;
	long long start, elapsed;
	struct abiss_options opts = ABISS_OPTIONS_INIT;
	const char *program = argv[0];
	ABISS_FILE *fp;

	if (argc > 1 && strcmp(argv[1], "-d") == 0) {
		opts.flags = ABISS_DIRECT;
		argv++;
		argc--;
	}
	if (argc < 4 || argc > 5 || !parse_long(argv[2], &rate) || rate <= 0 ||
	    !parse_long(argv[3], &total) || total <= 0 ||
	    (argc == 5 && (!parse_long(argv[4], &app_buffer) || app_buffer < 0))) {
		fprintf(stderr, "usage: %s [-d] FILE BYTERATE BYTES [APP_BUFFER]\n"
				"  BYTERATE, BYTES and APP_BUFFER in bytes (per second); APP_BUFFER 0 for the default\n",
			program);
		return 2;
	}

	opts.app_buffer = app_buffer;
	fp = abiss_fopen_opts(argv[1], "w", rate, &opts);
	if (fp == NULL) {
		int error = errno;

		fprintf(stderr, "record: cannot record %s: %s (errno %d)\n", argv[1],
			abiss_strerror(), error);
		return 1;
	}

	memset(frame, 0x5a, sizeof(frame));
	start = now_ns();
	while (bytes < (unsigned long long)total) {
		size_t size = sizeof(frame);
		long long before, latency;

		if ((unsigned long long)total - bytes < size)
			size = (size_t)((unsigned long long)total - bytes);
		/* The frame is complete once its last byte has arrived. */
		sleep_until(start + due_ns(bytes + size, (unsigned long long)rate));
		before = now_ns();
		if (abiss_fwrite(frame, 1, size, fp) != size) {
			fprintf(stderr, "record: write failed after %llu bytes: %s\n", bytes,
				abiss_strerror());
			abiss_fclose(fp);
			return 1;
		}
		latency = now_ns() - before;
		writes++;
		bytes += size;
		if (latency > max_latency_ns)
			max_latency_ns = (long)latency;
		if (now_ns() > start + due_ns(bytes + sizeof(frame), (unsigned long long)rate))
			late++;
	}
	elapsed = now_ns() - start;

	printf("record: stream=%ld writes=%ld bytes=%llu max_latency_us=%ld late=%ld elapsed_ms=%lld\n",
	       abiss_stream_id(fp), writes, bytes, max_latency_ns / 1000, late, elapsed / 1000000);
	if (abiss_fclose(fp) != 0) {
		fprintf(stderr, "record: cannot detach %s: %s\n", argv[1], abiss_strerror());
		return 1;
	}
	return 0;
}
