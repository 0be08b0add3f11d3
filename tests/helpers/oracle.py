"""Reference stores written by the official client (hf_xet), and an independent look at them.

Owns: building ``local://`` stores with ``hf_xet.upload_files`` from files the
tests make (deterministic content), the standard stores the test suite shares,
a second, deliberately tiny reader of the on-disk format (docs/format.md 2.2, 2.4,
3.3) that does not import xetfs, and ``run_xetfs`` to run the command line.

Contract:

* ``make_store(tmp_dir, files, calls)`` writes ``files`` under
  ``tmp_dir/files``, uploads them into ``tmp_dir/store`` with one
  ``upload_files`` call per entry of ``calls`` (default: one call with all of
  them) and returns an ``OracleStore``.  hf_xet runs in a child process: it
  starts a tokio runtime with worker threads (forking the test process
  afterwards would be unsafe, and FUSE tests fork), it reads its settings
  from the environment once per process (so each store can pick its own
  compression policy), and its logs go to ``tmp_dir/hf_xet`` instead of
  ``~/.cache``.
* Multi-file uploads name xorbs and shards nondeterministically: assert on
  file hashes and content, never on object names.
* ``xorb_chunks``, ``shard_files``, ``store_terms`` and ``file_chunks`` parse
  the store with this module's own code, so tests can find chunk and term
  boundaries (and payload offsets to damage) without trusting xetfs.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import json
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
XETFS_TIMEOUT = 300.0  # seconds; a hung command fails the test instead of the whole run

# -- running hf_xet and xetfs ---------------------------------------------------------

_UPLOADER = """
import json, sys
import hf_xet
job = json.load(sys.stdin)
out = []
for paths in job["calls"]:
    for info in hf_xet.upload_files(paths, job["endpoint"], None, None, None, None):
        out.append([info.hash, info.file_size, info.sha256])
json.dump(out, sys.stdout)
"""


def hf_xet_env(cache_dir: Path) -> dict[str, str]:
    """The environment for an hf_xet child process: its cache (and logs) under ``cache_dir``, no telemetry."""
    return dict(os.environ, HF_XET_CACHE=str(cache_dir), HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")


def upload(
    store: Path, calls: Sequence[Sequence[Path]], *, policy: str | None = None, log_dir: Path
) -> list[tuple[str, int, str]]:
    """Run ``hf_xet.upload_files`` once per call in a child process.

    Returns ``(xet hash hex, size, sha256 as reported by hf_xet)`` per path,
    in call order.  ``policy`` sets ``HF_XET_XORB_COMPRESSION_POLICY``
    (``none``, ``lz4``, ``bg4-lz4``; default ``auto``).
    """
    env = hf_xet_env(log_dir)
    if policy is not None:
        env["HF_XET_XORB_COMPRESSION_POLICY"] = policy
    job = {"endpoint": f"local://{store.resolve()}", "calls": [[str(p.resolve()) for p in c] for c in calls]}
    proc = subprocess.run(
        [sys.executable, "-c", _UPLOADER],
        input=json.dumps(job).encode(),
        capture_output=True,
        env=env,
        timeout=XETFS_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hf_xet upload into {store} failed ({proc.returncode}):\n{proc.stderr.decode()}")
    return [(h, int(n), s) for h, n, s in json.loads(proc.stdout)]


def run_xetfs(*args: object, timeout: float = XETFS_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m xetfs ARGS`` and capture stdout/stderr as bytes (never raises on exit status)."""
    return subprocess.run(
        [sys.executable, "-m", "xetfs", *map(str, args)],
        capture_output=True,
        cwd=REPO_ROOT,
        timeout=timeout,
        check=False,
    )


# -- stores -------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleFile:
    """One uploaded file: where its original bytes are, and what hf_xet said about it."""

    path: Path
    hash: str  # xet hex form
    size: int
    sha256: str  # hashlib digest of the original (hf_xet reports zeros for an empty file)

    @property
    def name(self) -> str:
        return self.path.name

    def read(self) -> bytes:
        return self.path.read_bytes()


@dataclass(frozen=True)
class OracleStore:
    """A store written by hf_xet, with every file that went into it."""

    path: Path  # the ``local://`` directory (holds ``xet/xorbs/...``)
    files: tuple[OracleFile, ...]
    calls: tuple[tuple[str, ...], ...]  # names per upload call

    def __getitem__(self, name: str) -> OracleFile:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    def unique(self) -> list[OracleFile]:
        """One file per distinct hash (the store lists each content once)."""
        seen: dict[str, OracleFile] = {}
        for f in self.files:
            seen.setdefault(f.hash, f)
        return list(seen.values())

    @property
    def xorb_dir(self) -> Path:
        return self.path / "xet" / "xorbs" / "xorbs"

    @property
    def shard_dir(self) -> Path:
        return self.path / "xet" / "xorbs" / "shards"

    def xorb_path(self, xorb_hex: str) -> Path:
        return self.xorb_dir / f"default.{xorb_hex}"

    def xorb_paths(self) -> list[Path]:
        return sorted(p for p in self.xorb_dir.glob("default.*") if not p.name.endswith(".tagset"))

    def shard_paths(self) -> list[Path]:
        return sorted(self.shard_dir.glob("*.mdb"))

    def at(self, path: Path) -> OracleStore:
        """The same store description for a copy of the store at ``path``."""
        return OracleStore(path, self.files, self.calls)


def make_store(
    tmp_dir: Path,
    files: Mapping[str, bytes],
    calls: Sequence[Sequence[str]] | None = None,
    *,
    policy: str | None = None,
) -> OracleStore:
    """Write ``files`` (name -> content) and upload them with hf_xet into ``tmp_dir/store``.

    ``calls`` groups the names into separate ``upload_files`` calls (each adds
    a shard and deduplicates against earlier calls); every name must appear
    exactly once.  Default: one call with all files, in dict order.
    """
    bad = [n for n in files if not n or "/" in n or n in (".", "..")]
    if bad:
        raise ValueError(f"file names must be plain names, not paths: {bad}")
    calls = [list(files)] if calls is None else [list(c) for c in calls]
    listed = [n for c in calls for n in c]
    if sorted(listed) != sorted(files):
        raise ValueError(f"calls must name every file exactly once: {listed} vs {sorted(files)}")
    src = tmp_dir / "files"
    store = tmp_dir / "store"
    src.mkdir(parents=True)
    for name, data in files.items():
        (src / name).write_bytes(data)
    infos = upload(store, [[src / n for n in c] for c in calls], policy=policy, log_dir=tmp_dir / "hf_xet")
    out = []
    for name, (xet_hash, size, reported_sha) in zip(listed, infos, strict=True):
        data = files[name]
        sha = hashlib.sha256(data).hexdigest()
        if size != len(data) or reported_sha not in (sha, "0" * 64):
            raise RuntimeError(
                f"hf_xet reports {name} as {size} bytes, sha256 {reported_sha}; it has {len(data)} bytes, {sha}"
            )
        out.append(OracleFile(src / name, xet_hash, size, sha))
    return OracleStore(store, tuple(out), tuple(tuple(c) for c in calls))


def copy_store(store: OracleStore, dest: Path) -> OracleStore:
    """An exact copy of ``store`` at ``dest`` (modes kept: xorbs stay 0444; see ``flip_byte``)."""
    shutil.copytree(store.path, dest, symlinks=True)
    return store.at(dest)


def _writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


def flip_byte(path: Path, offset: int) -> None:
    """Invert every bit of the byte at ``offset`` (works on hf_xet's read-only files)."""
    _writable(path)
    with path.open("r+b") as f:
        f.seek(offset)
        (byte,) = f.read(1)
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


def truncate(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes."""
    _writable(path)
    os.truncate(path, size)


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: bytes
    stderr: str


CliRunner = Callable[..., CliResult]


# -- deterministic content ----------------------------------------------------------


def random_bytes(n: int, seed: int) -> bytes:
    """Incompressible bytes (stored with scheme 0)."""
    return random.Random(seed).randbytes(n)


def text_bytes(n: int, seed: int) -> bytes:
    """English-like lines of made-up words (compresses with LZ4, scheme 1)."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(2000)]
    out: list[str] = []
    size = 0
    while size < n:
        line = " ".join(rng.choices(words, k=rng.randint(4, 14))).capitalize() + ".\n"
        out.append(line)
        size += len(line)
    return "".join(out).encode()[:n]


def float32_walk(count: int, seed: int) -> bytes:
    """A float32 random walk (byte grouping pays off: scheme 2, BG4)."""
    rng = random.Random(seed)
    values = array.array("f", bytes(4 * count))
    x = 0.0
    gauss = rng.gauss
    for i in range(count):
        x += gauss(0.0, 1.0)
        values[i] = x
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


# -- the standard stores ------------------------------------------------------------

SMALL_SIZES = (1, 2, 3, 100, 1000, 4095, 4096, 8192, 20_000, 65_536, 100_000, 150_000)


def basic_files() -> dict[str, bytes]:
    """One upload: raw, LZ4 and BG4 content, an empty file, one byte, a dozen small files."""
    files = {
        "random.bin": random_bytes(3_000_000, 1),
        "text.txt": text_bytes(1_500_000, 2),
        "walk.f32": float32_walk(500_000, 3),
        "empty": b"",
        "one-byte": b"\x7f",
    }
    for i, size in enumerate(SMALL_SIZES):
        maker = text_bytes if i % 2 else random_bytes
        files[f"small-{i:02d}-{size}"] = maker(size, 100 + i)
    return files


# Multi store: one upload call per file, so later files deduplicate against
# earlier ones and their terms cross xorbs and shards.  EDITS: the byte
# offsets in a file where its content switches source (new bytes start or end).
A_SIZE = 2_000_000
EDITS = {
    "b.bin": (1_000_000, 1_300_000),
    "d.bin": (600_000, 700_000, 1_200_000),
}


def multi_files() -> dict[str, bytes]:
    a = random_bytes(A_SIZE, 10)
    b = a[:1_000_000] + random_bytes(300_000, 11) + a[1_000_000:]
    c = text_bytes(600_000, 12)
    d = b[:600_000] + random_bytes(100_000, 13) + a[1_500_000:] + c[:200_000]
    e = float32_walk(200_000, 14)
    return {"a.bin": a, "b.bin": b, "c.txt": c, "d.bin": d, "e.f32": e, "a-again.bin": a}


MULTI_CALLS = [["a.bin"], ["b.bin"], ["c.txt"], ["d.bin"], ["e.f32"], ["a-again.bin"]]

BIG_SIZE = 144_000_000  # > 2 x 64 MiB of new data: three xorbs


def big_files() -> dict[str, bytes]:
    return {"big.bin": random_bytes(BIG_SIZE, 20)}


def make_basic_store(tmp_dir: Path) -> OracleStore:
    return make_store(tmp_dir, basic_files())


def make_multi_store(tmp_dir: Path) -> OracleStore:
    return make_store(tmp_dir, multi_files(), MULTI_CALLS)


def make_big_store(tmp_dir: Path) -> OracleStore:
    return make_store(tmp_dir, big_files())


# -- an independent reader of the format --------------------------------------------


def xet_hex(raw: bytes) -> str:
    """Xet hex form: each 8-byte group printed byte-reversed (docs/format.md 1.1)."""
    return b"".join(raw[i : i + 8][::-1] for i in range(0, 32, 8)).hex()


@dataclass(frozen=True)
class Chunk:
    """Chunk ``index`` of a xorb: physical ``[phys_start, phys_end)`` (header included), decoded ``[ustart, uend)``."""

    index: int
    scheme: int
    phys_start: int
    phys_end: int
    ustart: int
    uend: int

    @property
    def payload_start(self) -> int:
        return self.phys_start + 8


@dataclass(frozen=True)
class Term:
    xorb: str  # hex
    start: int
    end: int
    size: int


@dataclass(frozen=True)
class ChunkLoc:
    """Where one chunk of a file lands: file bytes ``[start, end)``."""

    start: int
    end: int
    xorb: str
    chunk: int
    term: int


@cache
def _xorb_chunks(path: Path, mtime_ns: int, size: int) -> tuple[Chunk, ...]:
    data = path.read_bytes()
    (info_length,) = struct.unpack_from("<I", data, len(data) - 4)
    footer = len(data) - 4 - info_length
    if data[footer : footer + 7] != b"XETBLOB":
        raise ValueError(f"{path}: no footer")
    chunks: list[Chunk] = []
    pos = ustart = 0
    while pos < footer:
        w0, w1 = struct.unpack_from("<II", data, pos)
        clen, scheme, ulen = w0 >> 8, w1 & 0xFF, w1 >> 8
        end = pos + 8 + clen
        chunks.append(Chunk(len(chunks), scheme, pos, end, ustart, ustart + ulen))
        pos, ustart = end, ustart + ulen
    if pos != footer:
        raise ValueError(f"{path}: chunk walk ends at {pos}, footer at {footer}")
    return tuple(chunks)


def xorb_chunks(path: Path) -> tuple[Chunk, ...]:
    """Walk the chunk headers of a footered xorb file (cached per path and mtime)."""
    st = path.stat()
    return _xorb_chunks(path, st.st_mtime_ns, st.st_size)


def shard_files(path: Path) -> dict[str, list[Term]]:
    """File hash hex -> terms, from the file info section of one shard (docs/format.md 3.3)."""
    data = path.read_bytes()
    out: dict[str, list[Term]] = {}
    pos = 48
    while True:
        file_hash, flags, n = struct.unpack_from("<32sII", data, pos)
        if file_hash == b"\xff" * 32:
            return out
        pos += 48
        terms = []
        for _ in range(n):
            xorb, _flags, size, start, end = struct.unpack_from("<32sIIII", data, pos)
            terms.append(Term(xet_hex(xorb), start, end, size))
            pos += 48
        if flags & 0x80000000:
            pos += 48 * n
        if flags & 0x40000000:
            pos += 48
        out[xet_hex(file_hash)] = terms


def store_terms(store: OracleStore) -> dict[str, list[Term]]:
    """File hash hex -> terms over all shards (the first shard by name wins)."""
    out: dict[str, list[Term]] = {}
    for shard in store.shard_paths():
        for h, terms in shard_files(shard).items():
            out.setdefault(h, terms)
    return out


def shard_of(store: OracleStore, file_hash: str) -> list[Path]:
    """The shards that hold a record of ``file_hash``."""
    return [p for p in store.shard_paths() if file_hash in shard_files(p)]


def file_chunks(store: OracleStore, file_hash: str) -> list[ChunkLoc]:
    """Every chunk of a file in file order, with the file bytes it provides."""
    out = []
    pos = 0
    for t, term in enumerate(store_terms(store)[file_hash]):
        chunks = xorb_chunks(store.xorb_path(term.xorb))
        for c in chunks[term.start : term.end]:
            out.append(ChunkLoc(pos, pos + c.uend - c.ustart, term.xorb, c.index, t))
            pos += c.uend - c.ustart
    return out


def term_boundaries(chunks: Sequence[ChunkLoc]) -> list[int]:
    """File offsets where one term ends and the next begins."""
    return [b.start for a, b in itertools.pairwise(chunks) if a.term != b.term]


def scheme_counts(paths: Iterable[Path]) -> Counter[int]:
    """How many chunks use each compression scheme in the given xorb files."""
    return Counter(c.scheme for p in paths for c in xorb_chunks(p))
