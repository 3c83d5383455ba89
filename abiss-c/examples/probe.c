/*
 * probe - exercise the abiss C API on one file, for tests and for checking a setup.
 *
 *   probe [--preroll N] [--flags N] [--hold] FILE MODE BYTERATE [APP_BUFFER]
 *       Opens FILE with abiss_fopen(), or with --preroll or --flags with abiss_fopen_opts()
 *       (those options, APP_BUFFER as app_buffer). On failure prints
 *           probe: errno=22 message=<abiss_strerror()>
 *       and exits 3. With --hold, prints
 *           probe: opened stream=3
 *       and waits until its standard input is closed, so that the caller can look at the
 *       stream as the open left it. Then checks abiss_fread/abiss_ftell/abiss_fseek/
 *       abiss_feof/abiss_position/abiss_stream_id on the stream, closes it and prints
 *           probe: stream=3 size=8388608 ok
 *       exiting 0, or 1 if a check fails.
 *   probe --null
 *       Calls every function with NULL pointers and checks each fails with EINVAL and a
 *       message; exits 0 if all do, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abiss.h"

static int failures;

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "probe: check failed: %s (errno %d, last message: %s)\n", what, errno,
			abiss_strerror());
		failures++;
	}
}

/* Each call with NULL must fail with EINVAL and leave a message naming the NULL pointer. */
static int null_arguments(void)
{
	char buffer[16];

#define EXPECT_EINVAL(call, failed)                                                        \
	do {                                                                               \
		errno = 0;                                                                 \
		check((call)failed && errno == EINVAL &&                                   \
			      strstr(abiss_strerror(), "NULL") != NULL,                    \
		      #call);                                                              \
	} while (0)

	EXPECT_EINVAL(abiss_fopen(NULL, "r", 1000, 0), == NULL);
	EXPECT_EINVAL(abiss_fopen("/etc/hostname", NULL, 1000, 0), == NULL);
	EXPECT_EINVAL(abiss_fopen_opts(NULL, "r", 1000, NULL), == NULL);
	EXPECT_EINVAL(abiss_fopen_opts("/etc/hostname", NULL, 1000, NULL), == NULL);
	EXPECT_EINVAL(abiss_fread(buffer, 1, sizeof(buffer), NULL), == 0);
	EXPECT_EINVAL(abiss_fseek(NULL, 0, SEEK_SET), == -1);
	EXPECT_EINVAL(abiss_ftell(NULL), == -1);
	EXPECT_EINVAL(abiss_position(NULL, 0), == -1);
	EXPECT_EINVAL(abiss_stream_id(NULL), == -1);
	EXPECT_EINVAL(abiss_feof(NULL), == 0);
	EXPECT_EINVAL(abiss_ferror(NULL), == 0);
	EXPECT_EINVAL(abiss_fclose(NULL), == EOF);
#undef EXPECT_EINVAL
	if (failures == 0)
		printf("probe: null arguments ok\n");
	return failures == 0 ? 0 : 1;
}

/* Reads, seeks and position messages on an open stream. */
static void stream_checks(ABISS_FILE *fp)
{
	static unsigned char buffer[4096];
	long size;

	check(abiss_stream_id(fp) > 0, "abiss_stream_id > 0");
	check(abiss_ftell(fp) == 0, "abiss_ftell == 0 after open");
	check(abiss_fread(buffer, 1024, 4, fp) == 4, "abiss_fread of 4 KiB");
	check(abiss_ftell(fp) == 4096, "abiss_ftell == 4096 after a 4 KiB read");
	check(abiss_fread(buffer, 1, 0, fp) == 0, "abiss_fread of 0 items");
	errno = 0;
	check(abiss_fread(NULL, 1, 16, fp) == 0 && errno == EINVAL, "abiss_fread into NULL");
	check(abiss_fseek(fp, 0, SEEK_END) == 0, "abiss_fseek to the end");
	size = abiss_ftell(fp);
	check(size > 4096, "abiss_ftell at the end is the size");
	check(abiss_fread(buffer, 1, sizeof(buffer), fp) == 0 && abiss_feof(fp) &&
		      !abiss_ferror(fp),
	      "abiss_fread at the end sets end-of-file only");
	errno = 0;
	check(abiss_fseek(fp, -1, SEEK_SET) == -1 && errno == EINVAL,
	      "abiss_fseek before the start fails with EINVAL");
	errno = 0;
	check(abiss_fseek(fp, 0, 42) == -1 && errno == EINVAL, "abiss_fseek with a bad whence");
	check(abiss_fseek(fp, -1000, SEEK_END) == 0 && !abiss_feof(fp),
	      "abiss_fseek back from the end clears end-of-file");
	/* A partial last item: 1000 bytes left, items of 600 bytes: one whole item. */
	check(abiss_fread(buffer, 600, 2, fp) == 1 && abiss_feof(fp),
	      "abiss_fread counts whole items at the end");
	check(abiss_ftell(fp) == size, "abiss_ftell after a partial item is the size");
	check(abiss_fseek(fp, 4096, SEEK_SET) == 0 && abiss_ftell(fp) == 4096,
	      "abiss_fseek to 4096");
	check(abiss_position(fp, 65536) == 0, "abiss_position(65536)");
	check(abiss_ftell(fp) == 4096, "abiss_position does not move the read position");
	errno = 0;
	check(abiss_position(fp, -1) == -1 && errno == EINVAL, "abiss_position(-1) fails");
	printf("probe: stream=%ld size=%ld", abiss_stream_id(fp), size);
}

int main(int argc, char **argv)
{
	struct abiss_options opts = ABISS_OPTIONS_INIT;
	int use_opts = 0, hold = 0;
	long rate;
	ABISS_FILE *fp;

	if (argc == 2 && strcmp(argv[1], "--null") == 0)
		return null_arguments();
	/* Values are passed on unchecked: refusing them is the library's job. */
	while (argc >= 3 && strncmp(argv[1], "--", 2) == 0) {
		if (strcmp(argv[1], "--hold") == 0) {
			hold = 1;
			argc -= 1;
			argv += 1;
		} else if (strcmp(argv[1], "--preroll") == 0) {
			opts.preroll = strtol(argv[2], NULL, 10);
			use_opts = 1;
			argc -= 2;
			argv += 2;
		} else if (strcmp(argv[1], "--flags") == 0) {
			opts.flags = strtoul(argv[2], NULL, 0);
			use_opts = 1;
			argc -= 2;
			argv += 2;
		} else {
			break;
		}
	}
	if (argc < 4 || argc > 5) {
		fprintf(stderr, "usage: probe [--preroll N] [--flags N] [--hold] FILE MODE BYTERATE "
				"[APP_BUFFER] | probe --null\n");
		return 2;
	}
	rate = strtol(argv[3], NULL, 10);
	if (argc == 5)
		opts.app_buffer = strtol(argv[4], NULL, 10);

	if (use_opts)
		fp = abiss_fopen_opts(argv[1], argv[2], rate, &opts);
	else
		fp = abiss_fopen(argv[1], argv[2], rate, opts.app_buffer);
	if (fp == NULL) {
		printf("probe: errno=%d message=%s\n", errno, abiss_strerror());
		return 3;
	}
	if (hold) {
		printf("probe: opened stream=%ld\n", abiss_stream_id(fp));
		fflush(stdout);
		while (getchar() != EOF)
			;
	}
	stream_checks(fp);
	check(abiss_fclose(fp) == 0, "abiss_fclose");
	printf(failures == 0 ? " ok\n" : " failed\n");
	return failures == 0 ? 0 : 1;
}
