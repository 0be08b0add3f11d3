"""Every tuning constant and default of the read path, the mount and the commands, defined once.

Modules import what they use from here (``from xetfs.base.settings import
RUN_BYTES``); the command-line defaults and ``MountConfig``'s come from
here too, so a default is changed in one line.  Limits that belong to a
format or a layout (the largest chunk, a shard's record size, file names)
stay with the code that parses them.  Sizes are in bytes, times in seconds.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's limit, ``taskset``), not the machine's."""
    return len(os.sched_getaffinity(0))


# -- the mount ---------------------------------------------------------------------------------
CACHE_SIZE = 512 * MiB  # --cache-size: decoded chunks kept, shared memory of the decode workers included
READ_AHEAD = 1 * MiB  # --read-ahead: the kernel's read-ahead for the mount
RACY_SECONDS = 2.0  # pack reads again a file that had changed less than this long before an earlier pack stamped it
LEAST_READ_AHEAD = 4 * KiB  # --read-ahead: at least this (one page)
MOST_READ_AHEAD = 64 * MiB  # --read-ahead: at most this (FUSE read requests are 1 MiB at most anyway)
IO_TIMEOUT = 30.0  # --io-timeout: a threaded or remote store read that takes longer fails
IO_MODE = "auto"  # --io-mode
LAYOUT = "auto"  # --layout
DISK_CACHE_SIZE = 10 * GiB  # --disk-cache-size: bound of the disk cache of remote stores
READY_TIMEOUT = 120.0  # the mounting command waits this long for the daemon to report
FAILED_DAEMON_EXIT = 5.0  # and this long for a daemon that failed to exit, before it tidies its log
JOB_TIMEOUT_MARGIN = 5.0  # a worker's job on a remote store may take this long past --io-timeout
MAX_REPORTED_WARNINGS = 20  # the mounting command prints this many of the daemon's warnings, then how many more
REFRESH_TIMEOUT = 600.0  # xetfs refresh --timeout: how long it waits for the mount's refresh to end
REFRESH_FAILURES_QUIET = 60.0  # refreshes that keep failing are logged again at most this often

# -- the FUSE adapter --------------------------------------------------------------------------
BLOCK_SIZE = 1 * MiB  # st_blksize: tells tools to read in large pieces
ENTRY_TIMEOUT = 3600.0  # the kernel keeps names and attributes this long; a refresh invalidates what it changes
REPEATS_QUIET = 10.0  # the same failed read is not logged again for this long
FAILED_READS_LOGGED = 256  # failed reads remembered for that (then the oldest are forgotten)
NAMES_KEPT = 1024  # paths of open files kept for messages (then all are forgotten)

# -- runs and store reads ----------------------------------------------------------------------
RUN_BYTES = 1 * MiB  # decoded bytes per store read at most (local store: a slot with workers; remote: below)
MAX_RUN_BYTES = 8 * MiB  # one store read covers at most this much of a xorb
# Where each store read is a request, a run takes in the chunks left in its gap when they decode to less than
# 1/RUN_TAIL_SHARE of a run, rather than make a request of their own.
RUN_TAIL_SHARE = 8
REMOTE_RUN_BYTES = 4 * MiB  # decoded bytes (about 64 chunks) per request to a remote store
REMOTE_FETCH_WIDTH = 8  # requests in flight to a remote store
TAIL_BYTES = 128 * KiB  # a remote xorb's footer is read with one request for this much of its end
# Small files read whole in the order they were packed read ahead in their xorb: first this many decoded bytes,
# twice as many with every read that goes on, up to a store read (``read.readahead``).
READ_AHEAD_FIRST = 256 * KiB
READ_AHEAD_XORBS = 4096  # xorbs whose last read the read-ahead remembers (then it forgets them all)
MAX_OPEN_FILES = 64  # xorb files kept open, by the daemon and by each worker
LAYOUT_CACHE_SIZE = 32 * MiB  # xorb layouts (footers) kept by the reader
BAD_LAYOUT_SECONDS = 30.0  # a layout that failed its check is not checked again for this long
BAD_LAYOUTS_KEPT = 1024  # failed layouts remembered for that
EXTENTS_LIMIT = 65536  # held runs the reader finds by position
PAGED_MAX = 256 * KiB  # extents up to this size are also found by page: small random reads' runs

# -- decode workers ----------------------------------------------------------------------------
# Decoded bytes per job at most: the size of a sequential reader's run.  Each step up from 1 MiB halved the
# jobs, and the 1 MiB FUSE replies that span two runs (a copy): at 2 MiB the daemon's CPU per GiB of a cold
# read fell by a fifth; at 4 MiB, with MIN_SLOT_RUN kept at 1 MiB, by 2-16 % more, the workers' unchanged.
SLOT_SIZE = 4 * MiB
# A shorter run is copied out of its slot (the daemon's work), so that a held run fills a good part of a slot.
MIN_SLOT_RUN = 1 * MiB
SLOTS_PER_WORKER = 3  # jobs in flight per worker: one decoding, the next ones queued behind it
# Free slots keep their pages, up to as many as a full set of jobs in flight needs plus this many (16 MiB);
# the pages of the rest are returned.
KEEP_FREE_SLOTS = 4
MIN_JOB_BYTES = 256 * KiB  # smaller runs are decoded in the daemon
IOV_MAX = 1024  # buffers one preadv or writev may take (Linux)
EXIT_GRACE = 0.25  # when the mount stops, a decode worker has this long to end its job before it is killed
KILLED_WORKER_WAIT = 2.0  # and then this long to exit once killed (one that does not is left, with a warning)
WATCHDOG_PERIOD = 1.0  # jobs are looked at for one over its timeout this often (and at least 4 times per timeout)
FENCED_POLL = 0.1  # a killed worker whose slots are fenced off is looked at this often until it has exited
MAX_WORKERS = 8  # --workers by default: one per CPU, at most this many
MOST_WORKERS = 256  # --workers: at most this many (more than the CPUs only adds processes: a warning says so)
WORKER_RESTARTS = 3  # decode workers that died on their own are started again, unless more died within
WORKER_RESTARTS_WINDOW = 60.0  # this many seconds (workers that cannot run: the daemon decodes)
WORKER_FETCHES = 4  # fetches of a remote store under way at once, per worker (and remote jobs sent to it)
STORE_READ_THREADS = 64  # threads the daemon's own store reads may hold at once (stuck ones included)

# -- prefetch ----------------------------------------------------------------------------------
PREFETCH_INITIAL = 2 * MiB  # a sequential stream's first prefetch window
PREFETCH_MAXIMUM = 16 * MiB  # its largest (32 MiB: the same 1 GiB model load time, 3 % more worker CPU)
# How far prefetch may run ahead of a reader of a remote store whose range requests wait SLOW_REQUEST or more for
# their answers, on average (an object store, a server far away): enough to keep REMOTE_FETCH_WIDTH requests in flight.
# A nearer one gets PREFETCH_MAXIMUM, as a local store: a deeper window only holds more memory, and touching fresh
# pages of shared memory costs about 0.75 CPU s/GiB.
REMOTE_PREFETCH = 64 * MiB
# A loopback server's answers waited 1-5 ms on average over 8 requests, on a busy 2-core machine; an object store's
# first bytes wait 20 ms or more.
SLOW_REQUEST = 0.010
SLOW_SAMPLE = 16  # range requests the choice is made from, and made again after
PREFETCH_SLACK = 4 * MiB
PREFETCH_MIN_STREAM = 256 * KiB
PREFETCH_STREAMS = 8
PREFETCH_SINGLES = 16
PREFETCH_SMALL = 64 * KiB  # reads shorter than this that continue nothing are singles
# A stream that did not start at the file's first byte, in a file whose first read took its tail (a parquet reader
# reads the footer first, then column chunks, and skips the columns it does not need), prefetches no further ahead
# than 1/16 of what it has read: what it decodes past where it stops is at most 1/16 of its reads.
PREFETCH_JUMP_SHARE = 16
PREFETCH_FILES_KEPT = 4096  # files whose first read (tail or not) is remembered once their last handle closed
PREFETCH_TASKS = 2  # prefetch windows of one file decoding at once: the next starts while the last finishes
MIN_CACHE_FOR_PREFETCH = 64 * MiB  # with a smaller --cache-size, nothing is prefetched
PREFETCH_CACHE_SHARE = 4  # a window is at most 1/4 of --cache-size, so that what it decodes stays until it is read

# -- the disk cache of remote stores --------------------------------------------------------
DISK_CACHE_LOW_WATER = 0.9  # eviction deletes the oldest entries until the cache is below this share of its bound
# Eviction takes a meta/ entry (a listing, manifest, shard or footer: what a mount needs to start with the server
# down) as if it had been used this much later than it was: chunk ranges go first, unless the entry is stale.
META_EVICTION_GRACE = 30 * 24 * 3600.0
STALE_TMP_SECONDS = 3600.0  # a temporary file older than this is a crashed writer's
DISK_CACHE_RECOUNT_SHARE = 20  # other mounts write too: the cache is counted again after 1/20 of it was written here
DISK_CACHE_RESCAN_SECONDS = 1.0  # a xorb's entries are read again before a fetch, this often at most
# A decode worker writes entries with O_DIRECT (``storage.entryfile``), in blocks of DIRECT_IO_ALIGN.  Its direct
# writes are judged by DIRECT_IO_WINDOW bytes at a time: slower than DIRECT_IO_MIN_RATE (bytes a second), the disk
# would hold back the reads whose bytes it keeps, so the next DIRECT_IO_RETRY bytes are ordinary writes (the page
# cache absorbs them), and then O_DIRECT is tried again.
DIRECT_IO_ALIGN = 4 * KiB
DIRECT_IO_MIN_RATE = 128 * MiB
DIRECT_IO_WINDOW = 32 * MiB
DIRECT_IO_RETRY = 1 * GiB

# -- memory of the daemon and its workers (glibc malloc) ----------------------------------------
MALLOC_TRIM_THRESHOLD = 64 * MiB  # freed memory up to this much is kept, not handed back to the kernel
MALLOC_MMAP_THRESHOLD = 8 * MiB  # buffers up to this size come from the heap, not from mmap

# -- remote stores -----------------------------------------------------------------------------
REQUEST_TIMEOUT = 10.0  # one request, when no --io-timeout says otherwise
MESSAGE_CHARS = 300  # a remote service's error is quoted up to this long (cut at a word)
SHOWN_CHARS = 120  # a bad value in a names manifest or catalogue is quoted up to this long
CONNECT_TIMEOUT = 5.0
PROBE_TIMEOUT = 5.0  # a question a store need not answer (are its names a level up?) gives up after this long
RESOLVE_TIMEOUT = 1.0  # umount resolves the symlinks of a mount point's parent for this long at most (a hung mount)
DAEMON_TIMEOUT = 10.0  # umount, stats, refresh and ls give up on a mount's daemon that does not answer in this time
HTTP_IDLE_CONNECTIONS = 16  # kept-alive connections to a plain HTTP(S) server kept per process
DOWN_SECONDS = 2.0  # a store that failed is not asked again for this long
FAILED_READS_KEPT = 16  # per file: reads the store failed, failed again at once for DOWN_SECONDS when asked again
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0
# An object changed less than this long ago may change again within its time's resolution (a server's ETag and
# Last-Modified count seconds), keeping its size: its tag (``ObjectSource.tag``) is not trusted, so it is read.
TAG_SETTLE_SECONDS = 2.0

# -- the commands ------------------------------------------------------------------------------
CAT_BLOCK = 8 * MiB  # xetfs cat: bytes read per step
CAT_CACHE_SIZE = 64 * MiB  # xetfs cat: decoded chunks kept
VERIFY_BLOCK = 8 * MiB  # xetfs verify: bytes read per step
VERIFY_CACHE_SIZE = 256 * MiB  # xetfs verify: decoded chunks kept
SERVE_CACHE_SIZE = 256 * MiB  # xetfs serve: decoded chunks kept for plain downloads
PUSH_JOBS = 4  # xetfs push --jobs: objects sent at once
PUSH_MAX_COMPARED_BYTES = 256 * MiB  # push: a file other than a xorb or shard larger than this is compared by size
PACK_ROUND_MIN_SIZE = 1 * MiB  # pack --hub-cache: smaller files are a few chunks, not worth a round of their own

# -- xetfs serve -------------------------------------------------------------------------------
SERVE_HOST = "127.0.0.1"  # this machine only
SERVE_PORT = 8080
SERVE_TOKEN_TTL = 3600  # seconds a Xet access token lives
SERVE_URL_TTL = 3600  # seconds a signed xorb-range URL lives
SERVE_KEEP_ALIVE = 75  # seconds an idle client connection is kept open
SERVE_BLOCK = 8 * MiB  # xetfs serve: bytes read from the store per step of a plain download
SERVE_MAX_FETCH = 8 * MiB  # serialized bytes of a xorb range in a reconstruction answer
SERVE_CHECKS = 8  # xorb ranges read and checked at the same time, per server process
SERVE_WORKERS_MAX = 4  # --workers default: one server process per core, at most this many
SERVE_WORKERS = max(1, min(usable_cpus(), SERVE_WORKERS_MAX))
SERVE_TREE_PAGE = 1000  # entries per page of a tree listing, as the Hub
SERVE_RESCAN = 2.0  # --rescan for a directory; and a URL that missed something is loaded again at most this often
SERVE_REMOTE_RESCAN = 30.0  # --rescan for a URL: its catalogue is fetched again this often (a moved branch)


def user_home() -> Path:
    """Where the defaults under a home go (the disk cache, the mount's log, the AWS files): ``$HOME``, unless
    a user other than root runs with another user's (``mount`` runs a ``user`` line of /etc/fstab so, with
    root's): then the home the password database gives."""
    home = Path.home()
    uid = os.getuid()
    if uid != 0:
        try:
            if home.stat().st_uid != uid:
                return Path(pwd.getpwuid(uid).pw_dir)
        except (OSError, KeyError):
            pass
    return home
