"""Run every huggingface_hub / transformers / safetensors client call on one cache; print a JSON report.

Run as ``python hub_clients.py`` with ``HF_HUB_CACHE`` set to the cache (a
real one or a mount) and ``HF_HUB_OFFLINE=1``: these libraries read the
environment when imported, so each cache gets its own process.  Paths in
the report are relative to the cache, so the reports of two caches holding
the same repos compare equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

MODEL = "acme/tiny-bert"
DATASET = "acme/tiny-data"


def main() -> None:
    cache = Path(os.environ["HF_HUB_CACHE"])
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "run offline"
    from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download, try_to_load_from_cache
    from huggingface_hub.file_download import _CACHED_NO_EXIST

    def rel(path: str | Path) -> str:
        return str(Path(path).relative_to(cache))

    def digest(path: str | Path) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    report: dict[str, Any] = {}
    refs = cache / "models--acme--tiny-bert" / "refs"
    commits = {ref: (refs / ref).read_text() for ref in ("main", "v1.0", "refs/pr/1")}
    downloads = {}
    for rev in ("main", "v1.0", "refs/pr/1", commits["v1.0"]):
        for name in ("config.json", "model.safetensors", "notes/training.txt"):
            path = hf_hub_download(MODEL, name, revision=rev)
            downloads[f"{rev}:{name}"] = [rel(path), digest(path)]
    report["hf_hub_download"] = downloads
    report["dataset_download"] = rel(hf_hub_download(DATASET, "data/train.csv", repo_type="dataset"))
    cached = {}
    for rev in ("main", "v1.0", "refs/pr/1", commits["refs/pr/1"]):
        hit = try_to_load_from_cache(MODEL, "config.json", revision=rev)
        missing = try_to_load_from_cache(MODEL, "adapter_config.json", revision=rev)
        unknown = try_to_load_from_cache(MODEL, "never-heard-of.json", revision=rev)
        cached[rev] = [rel(hit) if isinstance(hit, str) else None, missing is _CACHED_NO_EXIST, unknown]
    report["try_to_load_from_cache"] = cached
    snapshots: dict[str, Any] = {}
    for rev in ("main", "v1.0"):
        folder = Path(snapshot_download(MODEL, revision=rev))
        snapshots[rev] = [rel(folder), sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())]
    snapshots["dataset"] = rel(snapshot_download(DATASET, repo_type="dataset"))
    report["snapshot_download"] = snapshots
    info = scan_cache_dir(cache)
    report["scan_cache_dir"] = {
        "size_on_disk": info.size_on_disk,
        "warnings": [str(w) for w in info.warnings],
        "repos": sorted(
            [r.repo_type, r.repo_id, r.size_on_disk, r.nb_files,
             sorted([rv.commit_hash, sorted(rv.refs), rv.nb_files, rv.size_on_disk] for rv in r.revisions)]
            for r in info.repos
        ),
    }  # fmt: skip
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(MODEL)
    report["AutoConfig"] = [type(config).__name__, config.hidden_size, config.vocab_size]
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    report["AutoTokenizer"] = [type(tokenizer).__name__, tokenizer("hello xet store offline mount")["input_ids"]]
    from safetensors import safe_open

    tensors = {}
    with safe_open(hf_hub_download(MODEL, "model.safetensors"), framework="np") as f:  # memory-maps the file
        for key in sorted(f.keys()):
            tensors[key] = hashlib.sha256(f.get_tensor(key).tobytes()).hexdigest()
    report["safe_open"] = tensors
    json.dump(report, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
