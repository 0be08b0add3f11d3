"""A small, real huggingface_hub cache, written by huggingface_hub's own cache-writing functions.

``hf_hub_download`` cannot run offline, so this drives the functions it
calls to write the cache: ``repo_folder_name`` (the folder name),
``_create_symlink`` (the relative ``snapshots/<commit>/<path>`` ->
``blobs/<name>`` link), ``_cache_commit_hash_for_specific_revision``
(``refs/<ref>``) and ``write_tree_cache`` (``trees/<commit>.json``).  What
it does itself, exactly as ``hf_hub_download`` does: the blob file is
written under its name (the sha256 for LFS files, the git blob sha1 for the
rest, computed here with hashlib), and a ``.no_exist/<commit>/<path>``
marker is an empty file (``Path.touch``).

The cache: ``acme/tiny-bert`` (a model) with three revisions whose
safetensors differ in one tensor each (tag ``v1.0`` -> rev 1, ``refs/pr/1``
-> rev 2, ``main`` -> rev 3), a fast tokenizer, a config, a nested text file
and ``.no_exist`` markers; ``acme/tiny-data`` (a dataset) with one revision
and its tree listing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MODEL = "acme/tiny-bert"
DATASET = "acme/tiny-data"
WORDS = ["hello", "world", "xet", "store", "cache", "model", "tensor", "deduplicated", "offline", "mount"]


def commit_of(label: str) -> str:
    return hashlib.sha1(label.encode()).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class CacheSpec:
    root: Path
    model_commits: list[str] = field(default_factory=list)  # rev 1, 2, 3
    dataset_commit: str = ""
    tensor_bytes: int = 0  # one revision's safetensors file
    files: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # (repo, commit, path) -> bytes


def tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1} | {w: i + 2 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return str(tok.to_str())


def safetensors_bytes(tensors: list[np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return bytes(save({f"layer.{i}.weight": t for i, t in enumerate(tensors)}))


def make_hub_cache(root: Path, *, tensors: int = 8, floats: int = 128 * 1024, seed: int = 7) -> CacheSpec:
    """Write the cache under ``root`` (``floats`` float32 values per tensor); returns what it holds."""
    from huggingface_hub.file_download import (
        _cache_commit_hash_for_specific_revision,
        _create_symlink,
        repo_folder_name,
    )

    rng = np.random.default_rng(seed)
    spec = CacheSpec(root)
    root.mkdir(parents=True, exist_ok=True)

    def add(repo_id: str, repo_type: str, commit: str, path: str, data: bytes, lfs: bool) -> None:
        folder = root / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
        blob = hashlib.sha256(data).hexdigest() if lfs else git_sha1(data)
        blob_path = folder / "blobs" / blob
        blob_path.parent.mkdir(parents=True, exist_ok=True)
        if not blob_path.exists():
            blob_path.write_bytes(data)
        pointer = folder / "snapshots" / commit / path
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob_path), str(pointer), new_blob=False)
        spec.files[(repo_id, commit, path)] = data

    layers = [rng.standard_normal(floats, dtype=np.float32) for _ in range(tensors)]
    config = {"model_type": "bert", "vocab_size": len(WORDS) + 2, "hidden_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]"}
    folder = root / repo_folder_name(repo_id=MODEL, repo_type="model")
    for rev in (1, 2, 3):
        commit = commit_of(f"tiny-bert rev {rev}")
        spec.model_commits.append(commit)
        if rev > 1:  # each revision retrains one tensor
            layers[rev * 2] = rng.standard_normal(floats, dtype=np.float32)
        weights = safetensors_bytes(layers)
        spec.tensor_bytes = len(weights)
        add(MODEL, "model", commit, "model.safetensors", weights, lfs=True)
        add(MODEL, "model", commit, "config.json", json.dumps(config, indent=1).encode(), lfs=False)
        add(MODEL, "model", commit, "tokenizer.json", tokenizer_json().encode(), lfs=False)
        add(MODEL, "model", commit, "tokenizer_config.json", json.dumps(tok_config).encode(), lfs=False)
        add(MODEL, "model", commit, "README.md", f"# tiny-bert\n\nrevision {rev}\n".encode(), lfs=False)
        add(MODEL, "model", commit, "notes/training.txt", f"trained {rev} epochs\n".encode(), lfs=False)
        for missing in ("adapter_config.json", "generation_config.json", "nested/absent.txt"):
            marker = folder / ".no_exist" / commit / missing
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
    c1, c2, c3 = spec.model_commits
    _cache_commit_hash_for_specific_revision(str(folder), "v1.0", c1)
    _cache_commit_hash_for_specific_revision(str(folder), "refs/pr/1", c2)
    _cache_commit_hash_for_specific_revision(str(folder), "main", c3)

    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    spec.dataset_commit = commit_of("tiny-data rev 1")
    rows = "".join(f"{i},{WORDS[i % len(WORDS)]}\n" for i in range(2000)).encode()
    entries: dict[str, TreeCacheEntry] = {}
    for path, data, lfs in (("README.md", b"# tiny-data\n", False), ("data/train.csv", rows, False),
                            ("data/train.parquet", rng.bytes(300_000), True)):  # fmt: skip
        add(DATASET, "dataset", spec.dataset_commit, path, data, lfs)
        sha = hashlib.sha256(data).hexdigest()
        entries[path] = TreeCacheEntry(len(data), git_sha1(data), sha if lfs else None, len(data) if lfs else None)
    data_folder = root / repo_folder_name(repo_id=DATASET, repo_type="dataset")
    write_tree_cache(str(data_folder), spec.dataset_commit, entries)
    _cache_commit_hash_for_specific_revision(str(data_folder), "main", spec.dataset_commit)
    return spec
