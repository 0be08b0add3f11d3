"""Data sets of the benchmark: hf_xet-written stores, and synthetic stores.

* ``dataset(data_dir, kind, size)``: a ``local://`` store written by hf_xet
  (one ``upload_files`` call per file, so the result is deterministic) with a
  main file of ``size`` bytes and four ``size / 4`` files for the parallel
  readers.  Kinds: ``random`` (incompressible, stored raw), ``text``
  (pseudo-words with a Zipf distribution, LZ4) and ``float32`` (a float32
  random walk, byte-grouped BG4 + LZ4).  The chunk schemes hf_xet actually used
  are counted by walking the xorbs' chunk headers.
* ``workload(data_dir, kind, size)``: a store of one file shaped like what
  users read: ``model``, a safetensors file of hundreds of float16 and
  float32 tensors of mixed sizes (a transformer's layers), and ``table``, a
  parquet file of several row groups and mixed column types.
* ``distinct_chunks(store, file_hash)``: how many distinct chunks a file
  is made of (the denominator of decode amplification).
* ``synthetic_files`` / ``synthetic_terms``: stores written by the test-only
  writer (``tests/helpers/writer.py``) for mount-time measurements.

Everything is built once under ``data_dir`` (keyed by its parameters) and
reused; a ``meta.json`` written last marks a finished build.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchkit.paths import REPO
from benchkit.util import log

if TYPE_CHECKING:
    import numpy as np

KINDS = ("random", "text", "float32")
EXPECTED_SCHEME = {"random": 0, "text": 1, "float32": 2}
SCHEME_NAMES = {0: "raw", 1: "LZ4", 2: "BG4-LZ4"}
PARALLEL_FILES = 4
DATA_VERSION = 1  # bump when the generators change
BATCH = 16 * 1024 * 1024


# -- content generators (deterministic per seed) ------------------------------------


def _random_batches(size: int, seed: int) -> Iterator[bytes]:
    import numpy as np

    rng = np.random.default_rng(seed)
    left = size
    while left > 0:
        n = min(BATCH, left)
        yield rng.bytes(n)
        left -= n


def _vocabulary() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """20,000 pseudo-words (letters by English frequency) with separators; Zipf weights."""
    import numpy as np

    rng = np.random.default_rng(12345)
    count = 20000
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    letter_p = 1 / np.arange(1, 27) ** 0.9
    letter_p /= letter_p.sum()
    lengths = rng.integers(2, 11, count)
    words = [bytes(rng.choice(letters, n, p=letter_p)) for n in lengths]
    seps = [b" "] * count
    for i in rng.choice(count, count // 12, replace=False):
        seps[i] = b". "
    for i in rng.choice(count, count // 15, replace=False):
        seps[i] = b",\n"
    vocab = [w + s for w, s in zip(words, seps, strict=True)]
    vlen = np.array([len(v) for v in vocab], dtype=np.int64)
    vstart = np.concatenate([[0], np.cumsum(vlen)[:-1]])
    vbytes = np.frombuffer(b"".join(vocab), dtype=np.uint8)
    weights = 1 / np.arange(1, count + 1) ** 1.1
    return vbytes, vstart, vlen, weights / weights.sum()


def _text_batches(size: int, seed: int) -> Iterator[bytes]:
    import numpy as np

    vbytes, vstart, vlen, weights = _vocabulary()
    rng = np.random.default_rng(seed)
    left = size
    while left > 0:
        idx = rng.choice(len(vlen), 2_000_000, p=weights)
        lens = vlen[idx]
        ends = np.cumsum(lens)
        pos = np.repeat(vstart[idx] - (ends - lens), lens) + np.arange(int(ends[-1]))
        data = vbytes[pos].tobytes()[:left]
        left -= len(data)
        yield data


def _float32_batches(size: int, seed: int) -> Iterator[bytes]:
    import numpy as np

    if size % 4:
        raise ValueError("float32 data needs a size that is a multiple of 4")
    rng = np.random.default_rng(seed)
    left, last = size, np.float32(0)
    while left > 0:
        n = min(BATCH, left) // 4
        walk = np.cumsum(rng.standard_normal(n, dtype=np.float32), dtype=np.float32) + last
        last = walk[-1]
        yield walk.tobytes()
        left -= 4 * n


GENERATORS: dict[str, Callable[[int, int], Iterator[bytes]]] = {
    "random": _random_batches,
    "text": _text_batches,
    "float32": _float32_batches,
}


def write_content(path: Path, kind: str, size: int, seed: int) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for batch in GENERATORS[kind](size, seed):
            f.write(batch)
    tmp.rename(path)


# -- files shaped like what users read ------------------------------------------------


def model_shapes(size: int, layers: int = 24) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) of a transformer of at most ``size`` bytes, in layer order.

    Per layer: attention and MLP weights in float16 (12 d^2 values), biases
    and norms in float32 (d values each); an embedding of 8 d rows (float16)
    and a head of d / 2 rows (float32).  ``d`` is the largest multiple of 64
    that keeps the total within ``size`` (64 at least).
    """
    d = max(64, int((size / (layers * 24 + 16 + 2)) ** 0.5) // 64 * 64)
    while True:
        shapes = _model(d, layers)
        total = sum((2 if dt == "float16" else 4) * math.prod(shape) for dt, shape in shapes.values())
        if total <= size or d == 64:
            return shapes
        d -= 64


def _model(d: int, layers: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    shapes: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": ("float16", (8 * d, d))}
    for i in range(layers):
        pre = f"model.layers.{i}"
        for w in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{pre}.self_attn.{w}.weight"] = ("float16", (d, d))
            shapes[f"{pre}.self_attn.{w}.bias"] = ("float32", (d,))
        shapes[f"{pre}.mlp.gate_proj.weight"] = ("float16", (4 * d, d))
        shapes[f"{pre}.mlp.up_proj.weight"] = ("float16", (2 * d, d))
        shapes[f"{pre}.mlp.down_proj.weight"] = ("float16", (d, 2 * d))
        shapes[f"{pre}.input_layernorm.weight"] = ("float32", (d,))
        shapes[f"{pre}.post_attention_layernorm.weight"] = ("float32", (d,))
    shapes["model.norm.weight"] = ("float32", (d,))
    shapes["lm_head.weight"] = ("float32", (d // 2, d))
    return shapes


def write_model(path: Path, size: int) -> None:
    """A safetensors file of the tensors ``model_shapes`` names, filled with small normal values."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(77)
    tensors = {
        name: (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)
        for name, (dtype, shape) in model_shapes(size).items()
    }
    save_file(tensors, str(path), metadata={"format": "np"})


TABLE_ROWS_PER_GROUP = 1 << 20


def write_table(path: Path, size: int) -> None:
    """A parquet file of about ``size`` bytes: row groups of 1 Mi rows (fewer for small sizes), mixed columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(78)
    vbytes, vstart, vlen, weights = _vocabulary()
    categories = pa.array([f"category-{i:02d}" for i in range(40)])
    rows = max(4096, min(TABLE_ROWS_PER_GROUP, size // 8 // 40))  # about 40 bytes a row: at least 8 row groups
    schema = _table_schema(pa)
    first = 0
    with pa.OSFile(str(path), "wb") as sink, pq.ParquetWriter(sink, schema, compression="snappy") as writer:
        while sink.tell() < size:
            idx = rng.choice(len(vlen), rows, p=weights)
            lens = vlen[idx]
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            pos = np.repeat(vstart[idx] - offsets[:-1], lens) + np.arange(int(offsets[-1]))
            words = pa.StringArray.from_buffers(
                rows, pa.py_buffer(offsets.tobytes()), pa.py_buffer(vbytes[pos].tobytes())
            )
            columns = [
                pa.array(np.arange(first, first + rows, dtype=np.int64)),
                pa.array(rng.integers(1_600_000_000_000_000, 1_700_000_000_000_000, rows), pa.timestamp("us")),
                pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 40, rows, dtype=np.int32)), categories),
                pa.array(rng.standard_normal(rows)),
                pa.array(rng.random(rows, dtype=np.float32)),
                pa.array(rng.random(rows) < 0.3),
                words,
            ]
            writer.write_batch(pa.record_batch(columns, schema=schema), row_group_size=rows)
            first += rows


def _table_schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("id", pa.int64()),
            ("ts", pa.timestamp("us")),
            ("category", pa.dictionary(pa.int32(), pa.string())),
            ("value", pa.float64()),
            ("score", pa.float32()),
            ("flag", pa.bool_()),
            ("word", pa.string()),
        ]
    )


WORKLOADS: dict[str, tuple[str, Callable[[Path, int], None]]] = {
    "model": ("model.safetensors", write_model),
    "table": ("table.parquet", write_table),
}


def workload(data_dir: Path, kind: str, size: int) -> Dataset:
    """The store of one ``model`` or ``table`` file of about ``size`` bytes, built on first use."""
    return dataset(data_dir, kind, size)


# -- hf_xet stores -------------------------------------------------------------------

_UPLOADER = """
import json, sys
import hf_xet
job = json.load(sys.stdin)
out = []
for path in job["paths"]:  # one call per file: deterministic xorbs and shards
    (info,) = hf_xet.upload_files([path], job["endpoint"], None, None, None, None)
    out.append([info.hash, info.file_size])
json.dump(out, sys.stdout)
"""


def hf_xet_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ, HF_XET_CACHE=str(cache_dir), HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    env.pop("HF_XET_XORB_COMPRESSION_POLICY", None)  # the default ("auto") picks the scheme per chunk
    return env


def upload(store: Path, paths: list[Path], cache_dir: Path) -> list[tuple[str, int]]:
    job = {"endpoint": f"local://{store.resolve()}", "paths": [str(p.resolve()) for p in paths]}
    proc = subprocess.run(
        [sys.executable, "-c", _UPLOADER],
        input=json.dumps(job).encode(),
        capture_output=True,
        env=hf_xet_env(cache_dir),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hf_xet upload into {store} failed ({proc.returncode}):\n{proc.stderr.decode()}")
    return [(h, int(n)) for h, n in json.loads(proc.stdout)]


def xorb_files(store: Path) -> list[Path]:
    """Every xorb file of a store (hf_xet layout or flat), without sidecars."""
    out = []
    for d in (store / "xet" / "xorbs" / "xorbs", store / "xorbs"):
        if d.is_dir():
            out += [p for p in sorted(d.iterdir()) if p.is_file() and not p.name.endswith(".tagset")]
    return out


def scheme_bytes(store: Path) -> dict[int, int]:
    """Uncompressed bytes per chunk scheme over all xorbs, from the 8-byte chunk headers."""
    counts: dict[int, int] = {}
    for path in xorb_files(store):
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(size - 4)
            (info_len,) = struct.unpack("<I", f.read(4))
            end = size - 4 - info_len if 0 < info_len < size else size
            pos = 0
            while pos + 8 <= end:
                f.seek(pos)
                w0, w1 = struct.unpack("<II", f.read(8))
                scheme, ulen, clen = w1 & 0xFF, w1 >> 8, w0 >> 8
                if w0 & 0xFF or clen == 0:
                    break  # not a chunk header (no footer and a short file, or damage)
                counts[scheme] = counts.get(scheme, 0) + ulen
                pos += 8 + clen
    return counts


@dataclass(frozen=True)
class StoredFile:
    name: str
    path: Path  # the original bytes
    hash: str
    size: int


@dataclass(frozen=True)
class Dataset:
    kind: str
    root: Path
    store: Path
    main: StoredFile
    parallel: tuple[StoredFile, ...]
    schemes: dict[int, int]  # uncompressed bytes per scheme
    stored_bytes: int
    original_bytes: int
    chunks: int  # distinct chunks of the main file

    @property
    def xorbs(self) -> list[Path]:
        return xorb_files(self.store)

    def scheme_summary(self) -> str:
        total = sum(self.schemes.values()) or 1
        parts = [
            f"{SCHEME_NAMES.get(s, s)} {n / total:.0%}" for s, n in sorted(self.schemes.items(), key=lambda x: -x[1])
        ]
        return ", ".join(parts)

    @property
    def scheme_ok(self) -> bool:
        total = sum(self.schemes.values()) or 1
        expected = EXPECTED_SCHEME.get(self.kind)
        return expected is None or self.schemes.get(expected, 0) / total >= 0.9


def distinct_chunks(store: Path, file_hash: str) -> int:
    """The number of distinct chunks (xorb, index) that make up a file, from the store's shards."""
    from xetfs.base.hashes import from_hex
    from xetfs.format.shard import parse_shard
    from xetfs.storage import index
    from xetfs.storage.store import Store

    s = Store.open(store)
    idx = index.build(parse_shard(s.read_shard(sf), where=sf.name) for sf in s.shard_files())
    entry = idx.get(from_hex(file_hash))
    if entry is None:
        raise RuntimeError(f"file {file_hash} is not in {store}")
    seen: set[tuple[bytes, int]] = set()
    for xorb, start, stop, _ in idx.terms_of(entry):
        seen.update((xorb, i) for i in range(start, stop))
    return len(seen)


def dataset(data_dir: Path, kind: str, size: int) -> Dataset:
    """The store of ``kind`` with a ``size``-byte main file, built on first use."""
    root = data_dir / "data" / f"{kind}-{size}-v{DATA_VERSION}"
    meta_path = root / "meta.json"
    if not meta_path.exists():
        _build_dataset(root, kind, size)
    meta = json.loads(meta_path.read_text())
    if "chunks" not in meta:  # built before chunks were counted
        meta["chunks"] = distinct_chunks(root / "store", meta["files"][0]["hash"])
        meta_path.write_text(json.dumps(meta, indent=1))
    files = [StoredFile(f["name"], root / "orig" / f["name"], f["hash"], f["size"]) for f in meta["files"]]
    return Dataset(
        kind=kind,
        root=root,
        store=root / "store",
        main=files[0],
        parallel=tuple(files[1:]),
        schemes={int(k): v for k, v in meta["schemes"].items()},
        stored_bytes=meta["stored_bytes"],
        original_bytes=meta["original_bytes"],
        chunks=meta["chunks"],
    )


def _build_dataset(root: Path, kind: str, size: int) -> None:
    if root.exists():
        shutil.rmtree(root)  # an interrupted build
    orig = root / "orig"
    orig.mkdir(parents=True)
    t0 = time.monotonic()
    if kind in WORKLOADS:
        name, write = WORKLOADS[kind]
        log(f"building the {kind} data set (about {size / 2**20:.0f} MiB) in {root}")
        write(orig / name, size)
        paths = [orig / name]
    else:
        part = (size // PARALLEL_FILES) & ~0xFFF
        specs = [("main.bin", size, 1)] + [(f"par{i}.bin", part, 100 + i) for i in range(PARALLEL_FILES)]
        sizes = f"{size / 2**20:.0f} MiB + {PARALLEL_FILES} x {part / 2**20:.0f} MiB"
        log(f"building the {kind} data set ({sizes}) in {root}")
        for name, n, seed in specs:
            write_content(orig / name, kind, n, seed + 1000 * KINDS.index(kind))
        paths = [orig / name for name, _, _ in specs]
    infos = upload(root / "store", paths, root / "hf_xet-cache")
    schemes = scheme_bytes(root / "store")
    stored = sum(p.stat().st_size for p in xorb_files(root / "store"))
    original = sum(n for _, n in infos)
    meta: dict[str, Any] = {
        "kind": kind,
        "files": [{"name": p.name, "hash": h, "size": n} for p, (h, n) in zip(paths, infos, strict=True)],
        "schemes": {str(k): v for k, v in schemes.items()},
        "stored_bytes": stored,
        "original_bytes": original,
        "chunks": distinct_chunks(root / "store", infos[0][0]),
        "build_seconds": round(time.monotonic() - t0, 1),
    }
    for p, (_, n) in zip(paths, infos, strict=True):
        if p.stat().st_size != n:
            raise RuntimeError(f"hf_xet reports {n} bytes for {p} ({p.stat().st_size} on disk)")
    (root / "meta.json").write_text(json.dumps(meta, indent=1))
    log(f"  {kind}: built in {meta['build_seconds']} s, stored/original {stored / original:.2f}")


# -- synthetic stores (test-only writer) ----------------------------------------------


def _writer() -> Any:
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from helpers import writer

    return writer


def _synthetic(data_dir: Path, name: str, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    root = data_dir / "synthetic" / name
    meta_path = root / "meta.json"
    if not meta_path.exists():
        if root.exists():
            shutil.rmtree(root)
        log(f"building the synthetic store {name} in {root} (once)")
        t0 = time.monotonic()
        counts = build(root / "store")
        counts["build_seconds"] = round(time.monotonic() - t0, 1)
        meta_path.write_text(json.dumps(counts))
        log(f"  {name}: built in {counts['build_seconds']} s")
    return root / "store", json.loads(meta_path.read_text())


def synthetic_files(data_dir: Path, files: int, shards: int) -> tuple[Path, dict[str, Any]]:
    """``files`` small files (one chunk each, 1-8 KiB) listed in ``shards`` shards."""

    def build(store: Path) -> dict[str, Any]:
        import numpy as np

        w = _writer()
        b = w.StoreBuilder(store)
        rng = np.random.default_rng(7)
        per_shard = -(-files // shards)
        for i in range(files):
            b.add_file(rng.bytes(int(rng.integers(1024, 8193))))
            if (i + 1) % per_shard == 0:
                b.flush_shard()
        b.finish()
        return {"files": files, "shards": len(b.shard_paths), "terms": files}

    return _synthetic(data_dir, f"files{files}-shards{shards}-v{DATA_VERSION}", build)


def synthetic_terms(data_dir: Path, terms: int, files: int = 100, shards: int = 10) -> tuple[Path, dict[str, Any]]:
    """``terms`` terms in all: ``files`` files of 64-byte chunks, one term per chunk."""

    def build(store: Path) -> dict[str, Any]:
        import numpy as np

        w = _writer()
        b = w.StoreBuilder(store)
        rng = np.random.default_rng(8)
        per_file = -(-terms // files)
        per_shard = -(-files // shards)
        written = 0
        for i in range(files):
            n = min(per_file, terms - written)
            if n <= 0:
                break
            b.add_file(rng.bytes(64 * n), chunk_size=64, chunks_per_term=1)
            written += n
            if (i + 1) % per_shard == 0:
                b.flush_shard()
        b.finish()
        return {"files": files, "shards": len(b.shard_paths), "terms": written}

    return _synthetic(data_dir, f"terms{terms}-files{files}-shards{shards}-v{DATA_VERSION}", build)


# -- stores packed with `xetfs pack` ---------------------------------------------------

SMALL_MIN, SMALL_MAX = 200, 20_000  # bytes per small file


def small_file_sizes(count: int, seed: int = 9) -> list[int]:
    """``count`` sizes between ``SMALL_MIN`` and ``SMALL_MAX`` bytes, log-uniform (most files are small)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(x) for x in np.exp(rng.uniform(math.log(SMALL_MIN), math.log(SMALL_MAX), count))]


@dataclass(frozen=True)
class PackedDir:
    """A directory of files and the store ``xetfs pack`` made of it (the files at the root of a mount)."""

    root: Path
    files: Path  # the directory packed: the original files
    store: Path
    names: tuple[str, ...]
    total_bytes: int

    @property
    def xorbs(self) -> list[Path]:
        return xorb_files(self.store)


def _pack(src: list[Path], store: Path, cache_dir: Path, *extra: str) -> None:
    env = hf_xet_env(cache_dir)
    proc = subprocess.run([sys.executable, "-m", "xetfs", "pack", *map(str, src), str(store), "--no-progress",
                           "--strict", *extra], capture_output=True, text=True, env=env, cwd=REPO,
                          check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"xetfs pack into {store} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")


def _packed_once(root: Path, build: Callable[[Path], dict[str, Any]]) -> PackedDir:
    """The packed directory at ``root``: ``build(root / "files")`` writes the files and packs them into
    ``root / "store"`` the first time, and returns its ``meta.json`` (``names`` and ``bytes`` at least)."""
    meta_path = root / "meta.json"
    if not meta_path.exists():
        if root.exists():
            shutil.rmtree(root)
        files = root / "files"
        files.mkdir(parents=True)
        meta_path.write_text(json.dumps(build(files)))
    meta = json.loads(meta_path.read_text())
    return PackedDir(root, root / "files", root / "store", tuple(meta["names"]), meta["bytes"])


def small_files(data_dir: Path, count: int) -> PackedDir:
    """``count`` files of ``SMALL_MIN``-``SMALL_MAX`` bytes (text-like and random, alternately) in one
    directory, and the store ``xetfs pack`` writes of it; built on first use."""
    root = data_dir / "data" / f"small{count}-v{DATA_VERSION}"

    def build(files: Path) -> dict[str, Any]:
        import numpy as np

        log(f"building {count:,} small files and their store in {root} (once)")
        t0 = time.monotonic()
        rng = np.random.default_rng(10)
        text = b"".join(_text_batches(SMALL_MAX * 64, 11))
        names = []
        for i, n in enumerate(small_file_sizes(count)):
            name = f"f{i:06d}.{'txt' if i % 2 else 'bin'}"
            if i % 2:
                at = int(rng.integers(0, len(text) - n))
                body = text[at : at + n]
            else:
                body = rng.bytes(n)
            (files / name).write_bytes(body)
            names.append(name)
        _pack([files], root / "store", root / "hf_xet-cache")
        total = sum((files / n).stat().st_size for n in names)
        return {"names": names, "bytes": total, "build_seconds": round(time.monotonic() - t0, 1)}

    return _packed_once(root, build)


def repo_store(data_dir: Path, ds: Dataset, repo: str) -> PackedDir:
    """The main file of ``ds`` (as ``data.bin``) packed as the ``main`` revision of Hub repo ``repo``: a store
    that ``xetfs serve`` serves; built on first use (the file is hard-linked, not copied)."""
    root = data_dir / "data" / f"repo-{ds.kind}-{ds.main.size}-v{DATA_VERSION}"

    def build(files: Path) -> dict[str, Any]:
        os.link(ds.main.path, files / "data.bin")
        log(f"packing {ds.kind} as the repo {repo} in {root} (once)")
        _pack([files], root / "store", root / "hf_xet-cache", "--repo", repo)
        return {"names": ["data.bin"], "bytes": ds.main.size, "repo": repo}

    return _packed_once(root, build)
