/*
 * abiss.h - the application API of abiss, after the ABISS slides ("API: request ABISS
 * service on file", "API: update playout point").
 *
 * abiss_fopen() opens a file and attaches it to the abissd daemon with a guaranteed byterate
 * and a playout buffer: the daemon keeps the next app_buffer bytes after the playout point
 * loaded and locked in memory, so reads at the byterate do not wait for the disk.
 * abiss_fread() reads like fread() and tells the daemon the new playout point;
 * abiss_position() sends the slides' "position" message explicitly; abiss_fclose() detaches.
 *
 * Link with -labiss (libabiss.so or libabiss.a; with the static library also -lpthread -ldl
 * -lm). The daemon's socket is taken from the ABISS_SOCKET environment variable, else
 * /run/abiss/abiss.sock. Files must be on a disk abissd manages (abissd --device).
 *
 * abiss_fopen_opts() is abiss_fopen() with a struct abiss_options for what the slides' call
 * has no argument for: a start-up preroll (abissctl attach --preroll) and a buffer abissd
 * sizes (ABISS_BUFFER_AUTO, abissctl attach --buffer auto).
 *
 * Units: byterate, app_buffer and preroll are plain integers, in bytes per second and bytes:
 * 1 MB/s is 1000000, 1 MiB/s is 1048576 (what abissctl reads as "1MiB/s" or "1M/s"), 8 Mbit/s
 * is 1000000. No function takes a rate or a size as text.
 *
 * Errors: every function returns its documented error value and sets errno; the one-sentence
 * reason is available from abiss_strerror() on the same thread. NULL pointers and arguments
 * out of range fail with EINVAL and never crash. An ABISS_FILE may be used by one thread at a
 * time.
 *
 * SPDX-License-Identifier: GPL-2.0-only
 */
#ifndef ABISS_H
#define ABISS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An attached file (opaque). */
typedef struct abiss_file ABISS_FILE;

/* Playout buffer used when abiss_fopen() gets app_buffer 0: 564 KiB, as in the ABISS slides'
 * measurements. */
#define ABISS_DEFAULT_APP_BUFFER (564L * 1024L)

/*
 * Opens path for reading and attaches it to abissd at byterate bytes per second, with a
 * playout buffer of app_buffer bytes (0 for ABISS_DEFAULT_APP_BUFFER; at least two batches of
 * 20 pages, 160 KiB, and at most 1 GiB).
 *
 * mode is "r" to read, or "w" (truncate) or "a" (append) to record: the file is opened for
 * writing, created if missing, and abissd writes what abiss_fwrite() wrote back to the disk
 * at the stream's priority, keeping at most about app_buffer bytes dirty behind the writer,
 * and allocates the file a few seconds ahead. "b" and "e" may follow; "+" may not (a stream
 * is read or written, not both).
 *
 * Returns the stream, or NULL with errno set:
 *   EINVAL        path or mode is NULL, mode is not a stream mode, byterate <= 0,
 *                 app_buffer < 0, the file is not a regular file or is empty, or the daemon
 *                 refused the request (e.g. app_buffer is out of range)
 *   ENODEV        the file is on a disk abissd does not manage
 *   ENOENT        path does not exist (or is empty); other open(2) errors (EACCES, ENOTDIR,
 *                 ELOOP, ...) as open(2) sets them
 *   EISDIR        path is a directory
 *   ECONNREFUSED  abissd is not running (no socket, or nobody answers on it)
 *   EACCES        this user may not use abissd
 *   EBUSY         admission control refused: the disk's real-time share cannot take this
 *                 byterate, or the file is already being recorded (writing)
 *   EIO           the connection to abissd broke, the daemon failed, or it speaks another
 *                 protocol version
 */
ABISS_FILE *abiss_fopen(const char *path, const char *mode, long byterate, long app_buffer);

/* The largest preroll abissd loads at a stream's start: 64 MiB. */
#define ABISS_MAX_PREROLL (64L * 1024L * 1024L)

/*
 * Options of abiss_fopen_opts(). Initialise every instance with ABISS_OPTIONS_INIT, which sets
 * size and gives every option its default, then set the fields you need:
 *
 *     struct abiss_options opts = ABISS_OPTIONS_INIT;
 *     opts.preroll = 6L * 1024L * 1024L;
 *     fp = abiss_fopen_opts(path, "r", 1100000L, &opts);
 *
 * (or memset() it to 0 and set size to sizeof(struct abiss_options)). Later versions of this
 * header may add fields at the end, never change or move these: size tells the library which
 * version the program was compiled with, so an old program keeps working with a newer library
 * (the fields it does not know take their defaults), and a program that sets a field an older
 * library does not know fails with E2BIG instead of silently getting less. There is no
 * initialising function on purpose: the library could only fill in its own, possibly larger,
 * struct. Every field is a size_t, long or unsigned long, so the struct has no padding.
 */
struct abiss_options {
	/* sizeof(struct abiss_options), as ABISS_OPTIONS_INIT sets it. */
	size_t size;
	/* Playout buffer in bytes, as abiss_fopen()'s app_buffer: 0 (the default) for
	 * ABISS_DEFAULT_APP_BUFFER, else at least 160 KiB and at most 1 GiB. With
	 * ABISS_BUFFER_AUTO: the application's own part, which abissd adds to the size it
	 * chooses (0 for none). */
	long app_buffer;
	/* Bytes of the file's head that abissd loads at once when the stream starts, beyond the
	 * playout buffer and outside the byterate: what a player reads before it plays (its
	 * start-up probe), and with it the file's last 512 KiB, which players read to find the
	 * duration. Locked in memory until the reader passes it, and released when it seeks
	 * away before that. 0 (the default) for none, at most ABISS_MAX_PREROLL; more than
	 * the file loads the whole file. Read streams only: a recording reads nothing ahead. It
	 * comes out of the user's start-up allowance (a smaller one is loaded when that is
	 * short) and counts against abissd's locked-memory budgets while it is locked. */
	long preroll;
	/* ABISS_* flags, or-ed: 0 (the default) for none; a bit this library does not know
	 * fails with EINVAL. */
	unsigned long flags;
};

/* Flag: abissd sizes the playout buffer (abissctl attach --buffer auto): twice the rate over
 * the real-time latency its disk shows, grown as that latency grows, and on a disk with a
 * model as large as the disk's admission needs to take the stream next to the others
 * (larger loads, fewer seeks), within abissd's locked-memory budgets. app_buffer is then the
 * application's own part on top. Read streams only: with "w" or "a" it fails with EINVAL. */
#define ABISS_BUFFER_AUTO 0x1UL

/* Flag: record past the page cache ("w" only). The file is opened with O_DIRECT; abiss_fwrite()
 * copies into a ring of app_buffer bytes of locked memory (ABISS_DEFAULT_APP_BUFFER for 0;
 * a few hundred milliseconds of the rate or more rides out the disk's slow moments) that a
 * thread of this library writes out in aligned pieces, a thread abissd raises to the stream's
 * level. Nothing waits for the kernel's dirty-page throttle, which every writer of the disk
 * shares; abiss_fwrite() waits only when the ring is full. abissd holds none of the data: if it
 * stops, the recording goes on at best effort and loses nothing. abiss_fclose() writes what is
 * left and truncates the file to the bytes written. Such a stream cannot seek (ESPIPE) and has
 * no playout point (abiss_set_playout_point() fails with EINVAL). abiss_fopen_opts() fails with
 * EOPNOTSUPP when the file system does no direct I/O (tmpfs, most FUSE file systems) and ENOSPC
 * when it has no room for the recording. */
#define ABISS_DIRECT 0x2UL

/* Initialiser of a struct abiss_options: this header's size, every option at its default. */
#define ABISS_OPTIONS_INIT { sizeof(struct abiss_options), 0L, 0L, 0UL }

/*
 * abiss_fopen() with options: opens path as mode ("r", "w" or "a", as for abiss_fopen()) and
 * attaches it at byterate bytes per second with the playout buffer and preroll of opts. NULL
 * opts means every option at its default, the same as abiss_fopen(path, mode, byterate, 0).
 * The options are checked before the file is touched: when this library refuses them (the
 * EINVAL and E2BIG cases below that are not the daemon's), nothing is attached, and a
 * recording's file is neither created nor truncated.
 *
 * Returns the stream, or NULL with errno set: as abiss_fopen(), and
 *   EINVAL  opts->size is smaller than the first struct abiss_options or not set (above
 *           4096), app_buffer < 0, preroll < 0, preroll > 0 or ABISS_BUFFER_AUTO with mode
 *           "w" or "a", flags has a bit this library does not know, or the daemon refused
 *           the request (e.g. preroll > ABISS_MAX_PREROLL, app_buffer out of range);
 *   E2BIG   opts is a later version's struct that sets fields this library does not know;
 *   EBUSY   as for abiss_fopen(), and when the preroll does not fit in abissd's locked-memory
 *           budgets next to the other streams.
 */
ABISS_FILE *abiss_fopen_opts(const char *path, const char *mode, long byterate,
			     const struct abiss_options *opts);

/*
 * Reads up to nmemb items of size bytes into ptr, as fread(3), and tells the daemon the new
 * playout point. Returns the number of whole items read: fewer than nmemb only at the end of
 * the file (abiss_feof() is then nonzero) or on an error (abiss_ferror() nonzero, errno set).
 * The bytes of a partial last item are stored and consumed. Returns 0 if size or nmemb is 0.
 *
 * Errors (errno): EINVAL  fp or ptr is NULL, or size * nmemb overflows;
 *                 read(2)'s errors; EIO (or as for abiss_fopen()) when the playout point
 *                 cannot be sent to abissd, in which case the bytes read are lost.
 */
size_t abiss_fread(void *ptr, size_t size, size_t nmemb, ABISS_FILE *fp);

/*
 * Writes nmemb items of size bytes from ptr to a stream opened with "w" or "a", as fwrite(3).
 * Returns the number of whole items written: fewer than nmemb only on an error (abiss_ferror()
 * nonzero, errno set). Returns 0 if size or nmemb is 0.
 *
 * Errors (errno): EINVAL  fp or ptr is NULL, or size * nmemb overflows;
 *                 EBADF   the stream was opened to read;
 *                 write(2)'s errors (ENOSPC, EDQUOT, ...).
 * abiss_fread() on a stream opened to record fails likewise with EBADF.
 */
size_t abiss_fwrite(const void *ptr, size_t size, size_t nmemb, ABISS_FILE *fp);

/*
 * Moves the read position as fseek(3) (whence: SEEK_SET, SEEK_CUR or SEEK_END), tells the
 * daemon the new playout point and clears the end-of-file flag. Returns 0, or -1 with errno:
 *   EINVAL  fp is NULL, whence is invalid, or the position would be before the start;
 *   EIO     the playout point could not be sent to abissd (the position is then unspecified).
 */
int abiss_fseek(ABISS_FILE *fp, long offset, int whence);

/*
 * The read position in bytes, or -1 with errno: EINVAL (fp is NULL), EOVERFLOW.
 */
long abiss_ftell(ABISS_FILE *fp);

/*
 * Tells abissd the playout point explicitly (the slides' "position" message) without moving
 * the read position: the daemon keeps the playout buffer loaded from offset on. Reads and
 * seeks send it on their own; use this when the application consumes data later than it
 * reads it. Returns 0, or -1 with errno:
 *   EINVAL  fp is NULL or offset < 0;
 *   EIO     the connection to abissd broke.
 */
int abiss_position(ABISS_FILE *fp, long offset);

/*
 * Gives the stream another guaranteed rate, byterate bytes per second (fast-forward, slow
 * motion), if its disk admits it; the playout buffer stays. Returns 0, or -1 with errno set,
 * and the stream then keeps its rate:
 *   EINVAL  fp is NULL, or the rate is not between 1 B/s and 1 TB/s;
 *   EBUSY   the disk's real-time share cannot take the new rate;
 *   EIO     the connection to abissd broke.
 */
int abiss_set_rate(ABISS_FILE *fp, long byterate);

/*
 * The daemon's id of the stream (as `abissctl list` shows it), or -1 with errno EINVAL (fp is
 * NULL).
 */
long abiss_stream_id(ABISS_FILE *fp);

/*
 * Nonzero once a read reached the end of the file (until the next successful seek), else 0.
 * Returns 0 with errno EINVAL if fp is NULL.
 */
int abiss_feof(ABISS_FILE *fp);

/*
 * Nonzero once a read failed, else 0. Returns 0 with errno EINVAL if fp is NULL.
 */
int abiss_ferror(ABISS_FILE *fp);

/*
 * Detaches the stream, closes the file and frees fp, which is invalid afterwards even if
 * this fails. Returns 0, or EOF (-1) with errno:
 *   EINVAL  fp is NULL;
 *   ENOENT  the daemon no longer knew the stream;
 *   EIO     the connection to abissd broke (the daemon ends the stream when the connection
 *           closes, so it is ended either way).
 */
int abiss_fclose(ABISS_FILE *fp);

/*
 * The reason of the last failed abiss call on the calling thread, one sentence (e.g. "abissd
 * is not running (no socket at /run/abiss/abiss.sock); start it as root ..."). Never NULL;
 * valid until the next failing abiss call on this thread. Successful calls do not clear it.
 */
const char *abiss_strerror(void);

#ifdef __cplusplus
}
#endif

#endif /* ABISS_H */
