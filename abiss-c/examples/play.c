/*
 * play - read a file at its byterate through abiss, as a media player would.
 *
 *   play [--preroll PREROLL] FILE BYTERATE [APP_BUFFER]
 *
 * Attaches FILE to abissd at BYTERATE bytes/s (with a playout buffer of APP_BUFFER bytes, 0 or
 * absent for the default; with --preroll, its first PREROLL bytes loaded at once, as a player's
 * start-up probe wants them), then reads it to the end in 64 KiB reads on an absolute schedule:
 * read i is due at start + i * 64 KiB / BYTERATE, so a late read does not push back the
 * ones after it. Measures how long each abiss_fread takes and prints one line:
 *
 *   play: stream=3 reads=128 bytes=8388608 max_latency_us=412 late=0 elapsed_ms=2080
 *
 * "late" counts reads that finished after the next read was due. Exits 0 on success, 1 when
 * abiss fails (with abiss_strerror()), 2 on bad arguments.
 *
 * Build: cc -std=c99 -I abiss-c/include play.c -L target/debug -labiss -Wl,-rpath,target/debug
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abiss.h"
#include "pace.h"

#define READ_BYTES (64 * 1024)

int main(int argc, char **argv)
{
	static unsigned char buffer[READ_BYTES];
	struct abiss_options opts = ABISS_OPTIONS_INIT;
	long rate, max_latency_ns = 0, reads = 0, late = 0;
	unsigned long long bytes = 0;
	long long start, elapsed;
	const char *path;
	ABISS_FILE *fp;
	int bad = 0;

	if (argc >= 3 && strcmp(argv[1], "--preroll") == 0) {
		bad = !parse_long(argv[2], &opts.preroll) || opts.preroll < 0;
		argc -= 2;
		argv += 2;
	}
	if (bad || argc < 3 || argc > 4 || !parse_long(argv[2], &rate) || rate <= 0 ||
	    (argc == 4 && (!parse_long(argv[3], &opts.app_buffer) || opts.app_buffer < 0))) {
		fprintf(stderr, "usage: play [--preroll PREROLL] FILE BYTERATE [APP_BUFFER]\n"
				"  in bytes (per second); APP_BUFFER 0 for the default\n");
		return 2;
	}
	path = argv[1];

	fp = abiss_fopen_opts(path, "rb", rate, &opts);
	if (fp == NULL) {
		int error = errno;

		fprintf(stderr, "play: cannot stream %s: %s (errno %d)\n", path, abiss_strerror(),
			error);
		return 1;
	}

	start = now_ns();
	for (;;) {
		long long due = start + due_ns(bytes, (unsigned long long)rate);
		long long before, latency;
		size_t got;

		sleep_until(due);
		before = now_ns();
		got = abiss_fread(buffer, 1, sizeof(buffer), fp);
		latency = now_ns() - before;
		if (got > 0) {
			reads++;
			bytes += got;
			if (latency > max_latency_ns)
				max_latency_ns = (long)latency;
			if (now_ns() > start + due_ns(bytes, (unsigned long long)rate))
				late++;
		}
		if (got < sizeof(buffer)) {
			if (abiss_ferror(fp)) {
				fprintf(stderr, "play: read failed after %llu bytes: %s\n", bytes,
					abiss_strerror());
				abiss_fclose(fp);
				return 1;
			}
			break; /* end of file */
		}
	}
	elapsed = now_ns() - start;

	printf("play: stream=%ld reads=%ld bytes=%llu max_latency_us=%ld late=%ld elapsed_ms=%lld\n",
	       abiss_stream_id(fp), reads, bytes, max_latency_ns / 1000, late,
	       elapsed / 1000000);
	if (abiss_fclose(fp) != 0) {
		fprintf(stderr, "play: cannot detach %s: %s\n", path, abiss_strerror());
		return 1;
	}
	return 0;
}
