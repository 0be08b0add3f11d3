"""Rebuild the bundled sample store (``sample/store``) from generated files.

The files are made here, deterministically: a small "model" directory
(config, a tokenizer-like JSON text that compresses with LZ4, a safetensors
file of float32 weights that gets byte grouping), some random data (stored
raw), a README and an empty file.  They are packed with ``xetfs pack``,
which writes the store with hf_xet and records the names manifest.

    .venv/bin/python scripts/make_sample.py [--out sample/store]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

README = b"""# xetfs sample store

A tiny model-like tree, stored in the Xet format by the official hf_xet
client and served by xetfs as plain files.  Every byte you read through the
mount was checked against the chunk hashes recorded in the store.
"""


def safetensors(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    """A valid safetensors file (8-byte header length, JSON header, data)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(d for _, d in tensors.values())


def weights(rng: random.Random, count: int) -> bytes:
    """A float32 random walk: smooth values whose high bytes repeat (BG4 territory)."""
    value, out = 0.0, []
    for _ in range(count):
        value += rng.gauss(0.0, 0.01)
        out.append(value)
    return struct.pack(f"<{count}f", *out)


def make_files(root: Path) -> None:
    rng = random.Random(20261122)
    (root / "model").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "README.md").write_bytes(README)
    config = {"architectures": ["TinyModel"], "hidden_size": 256, "num_layers": 4, "vocab_size": 4096}
    (root / "model" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    vocab = {f"tok{i}_{rng.choice(['an', 'the', 'ing', 'er', 'tion'])}": i for i in range(4096)}
    (root / "model" / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}, indent=1) + "\n")
    tensors = {f"layers.{i}.weight": ([256, 256], weights(rng, 256 * 256)) for i in range(4)} | {
        "embed.weight": ([4096, 64], weights(rng, 4096 * 64))
    }
    (root / "model" / "model.safetensors").write_bytes(safetensors(tensors))
    (root / "data" / "random.bin").write_bytes(rng.randbytes(768 * 1024))
    (root / "data" / "empty.txt").write_bytes(b"")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "sample" / "store")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "sample"
        make_files(src)
        subprocess.run([sys.executable, "-m", "xetfs", "pack", "--no-progress", str(src), str(out)], check=True)
    # Client-side state that hf_xet leaves next to the store; xetfs never reads it.
    for junk in ("xet/shard-cache", "xet/shard-session", "xet/logs"):
        shutil.rmtree(out / junk, ignore_errors=True)
    for sidecar in [*out.rglob("*.tagset"), *out.rglob("*.redb")]:
        sidecar.unlink()
    print(f"sample store written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
