"""The real clients against ``xetfs serve``: one scenario per run, a JSON report on stdout.

Run as ``python serve_clients.py SCENARIO [ARGS]`` with ``HF_ENDPOINT`` at
the server and ``HF_HUB_CACHE`` at a fresh cache: huggingface_hub reads
both when imported, so each run is its own process.  Paths in the report
are relative to the cache; digests are sha256.

* ``all``: ``hf_hub_download`` by branch, tag, ``refs/pr/1`` and commit;
  ``snapshot_download`` of two model revisions and the dataset;
  ``AutoConfig``, ``AutoTokenizer``; a ``safe_open`` of the weights; a
  missing repo, revision and file.
* ``get REPO_TYPE REPO FILE REVISION``: one ``hf_hub_download``, its digest
  or its error.
* ``browse``: what a data engineer asks of a dataset without downloading
  it: ``list_repo_refs``, ``get_paths_info``, ``dataset_info`` with file
  metadata, and ``HfFileSystem`` (``ls``, ``modified``, ``open``) under
  pyarrow and duckdb.
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


def digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def rel(path: str | Path) -> str:
    return str(Path(path).relative_to(os.environ["HF_HUB_CACHE"]))


def failure(exc: BaseException) -> dict[str, Any]:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return {"error": type(exc).__name__, "status": status, "message": str(exc)[:2000]}


def scenario_all(commit: str) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download, snapshot_download

    report: dict[str, Any] = {}
    downloads = {}
    for rev in ("main", "v1.0", "refs/pr/1", commit):
        for name in ("config.json", "model.safetensors", "notes/training.txt"):
            path = hf_hub_download(MODEL, name, revision=rev)
            downloads[f"{rev}:{name}"] = [rel(path), digest(path)]
    for name in ("data/train.csv", "data/train.parquet"):
        path = hf_hub_download(DATASET, name, repo_type="dataset")
        downloads[f"dataset:{name}"] = [rel(path), digest(path)]
    report["hf_hub_download"] = downloads
    snapshots = {}
    for key, kwargs in (("main", {"revision": "main"}), ("v1.0", {"revision": "v1.0"}),
                        ("dataset", {"repo_type": "dataset"})):  # fmt: skip
        repo = DATASET if key == "dataset" else MODEL
        folder = Path(snapshot_download(repo, **kwargs))  # type: ignore[call-overload]
        files = {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}
        snapshots[key] = [rel(folder), files]
    report["snapshot_download"] = snapshots
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(MODEL)
    report["AutoConfig"] = [type(config).__name__, config.hidden_size, config.vocab_size]
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    report["AutoTokenizer"] = [type(tokenizer).__name__, tokenizer("hello xet store offline mount")["input_ids"]]
    from safetensors import safe_open

    tensors = {}
    with safe_open(hf_hub_download(MODEL, "model.safetensors"), framework="np") as f:
        for key in sorted(f.keys()):
            tensors[key] = hashlib.sha256(f.get_tensor(key).tobytes()).hexdigest()
    report["safe_open"] = tensors
    errors: dict[str, Any] = {}
    for key, call in (
        ("repo", lambda: hf_hub_download("acme/no-such-model", "config.json")),
        ("revision", lambda: hf_hub_download(MODEL, "config.json", revision="no-such-branch")),
        ("file", lambda: hf_hub_download(MODEL, "no-such-file.json")),
        ("snapshot_revision", lambda: snapshot_download(MODEL, revision="no-such-branch")),
    ):
        try:
            call()  # type: ignore[no-untyped-call]
            errors[key] = {"error": None}
        except Exception as exc:
            errors[key] = failure(exc)
    report["errors"] = errors
    report["no_exist"] = sorted(rel(p) for p in Path(os.environ["HF_HUB_CACHE"]).glob("*/.no_exist/*/*"))
    return report


def scenario_browse() -> dict[str, Any]:
    import duckdb
    import pyarrow.csv
    from huggingface_hub import HfApi, HfFileSystem

    api, fs = HfApi(), HfFileSystem()
    refs = api.list_repo_refs(MODEL, include_pull_requests=True)
    report: dict[str, Any] = {
        "refs": {
            "branches": sorted((b.name, b.target_commit) for b in refs.branches),
            "pull_requests": sorted((b.name, b.target_commit) for b in refs.pull_requests or []),
        }
    }
    info = api.get_paths_info(DATASET, ["data", "data/train.parquet", "no/such/file"], repo_type="dataset")
    report["paths_info"] = sorted([type(e).__name__, e.path, getattr(e, "size", None)] for e in info)
    siblings = api.dataset_info(DATASET, files_metadata=True).siblings or []
    report["siblings"] = {s.rfilename: [s.size, s.blob_id, s.lfs.sha256 if s.lfs else None] for s in siblings}
    csv = f"datasets/{DATASET}/data/train.csv"  # (the test cache's parquet file is random bytes)
    report["ls"] = sorted(map(str, fs.ls(f"datasets/{DATASET}/data", detail=False)))
    report["modified"] = fs.modified(csv).isoformat()
    with fs.open(csv, "rb") as f:
        options = pyarrow.csv.ReadOptions(autogenerate_column_names=True)
        report["pyarrow_rows"] = pyarrow.csv.read_csv(f, read_options=options).num_rows
    con = duckdb.connect()
    con.register_filesystem(fs)
    rows = con.sql(f"SELECT count(*), sum(column0) FROM read_csv('hf://{csv}', header = false)").fetchall()
    report["duckdb"] = list(rows[0])
    return report


def scenario_get(repo_type: str, repo: str, name: str, revision: str) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo, name, revision=revision, repo_type=repo_type)
    except Exception as exc:
        return failure(exc)
    return {"path": rel(path), "sha256": digest(path)}


def main() -> None:
    name, *args = sys.argv[1:]
    report = scenario_all(*args) if name == "all" else scenario_browse() if name == "browse" else scenario_get(*args)
    json.dump(report, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
