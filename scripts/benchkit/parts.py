"""The parts alone: read every xorb of a store, decode and hash every chunk, in one tight loop, each step timed.

    python scripts/benchkit/parts.py XORB [XORB ...]     # prints JSON on stdout

What a read path cannot do with less CPU in one Python process: each xorb
is read into one reused buffer (``readinto``: the copy out of the page
cache), then each chunk's header is parsed and its payload decoded with
xetfs' own format code (``xetfs.format.chunk``), then each decoded chunk
is hashed (``xetfs.base.hashes.chunk_hash``, BLAKE3 keyed).  The CPU time
(``time.thread_time``) of the three steps is summed separately over the
xorbs given; ``bytes`` is the decoded total, to divide by.  Runs standalone: the
benchmark starts it as a child process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from xetfs.base.hashes import chunk_hash
from xetfs.format.chunk import HEADER_SIZE, decode_chunk, parse_chunk_header
from xetfs.format.xorb import footer_length


def run(paths: list[Path]) -> dict[str, float]:
    clock = time.thread_time
    buf = bytearray(64 << 20)
    read_s = decode_s = hash_s = 0.0
    total = chunks = 0
    for path in paths:
        t0 = clock()
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size > len(buf):
                buf = bytearray(size)
            view = memoryview(buf)[:size]
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    raise SystemExit(f"{path}: short read at {got} of {size}")
                got += n
        t1 = clock()
        n_footer = footer_length(bytes(view[size - 4 :]), size)
        end = size - 4 - n_footer if n_footer else size
        decoded = []
        pos = 0
        while pos < end:
            h = parse_chunk_header(view, pos, where=path.name)
            payload_end = pos + HEADER_SIZE + h.compressed_length
            decoded.append(decode_chunk(h.scheme, view[pos + HEADER_SIZE : payload_end], h.uncompressed_length,
                                        where=path.name))  # fmt: skip
            pos = payload_end
        t2 = clock()
        for chunk in decoded:
            chunk_hash(chunk)
            total += len(chunk)
        t3 = clock()
        chunks += len(decoded)
        del decoded, view
        read_s += t1 - t0
        decode_s += t2 - t1
        hash_s += t3 - t2
    return {"bytes": total, "chunks": chunks, "read_s": read_s, "decode_s": decode_s, "hash_s": hash_s}


if __name__ == "__main__":
    json.dump(run([Path(a) for a in sys.argv[1:]]), sys.stdout)
