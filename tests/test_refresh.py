"""``xetfs refresh``: a live mount loads what was added to its store, without a remount.

A store packed from a Hugging Face cache (written by huggingface_hub's own
functions) is mounted, locally and over nginx.  While a reader streams a
file and another process has read ``refs/main``, a new revision of the
model is packed into the store (on the server, for nginx) and the mount is
refreshed: the reader's bytes are unchanged, the new revision loads by repo
id through ``refs/main`` in the process that read the old ref, and inodes
handed out before keep their numbers.  A refresh against a stopped server
fails with a message and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import hub_cache, oracle, servers
from helpers.hub import Imported, xetfs
from helpers.mounting import Mount, mounted, wait_until
from helpers.oracle import hf_xet_env

from xetfs.base.settings import TAG_SETTLE_SECONDS
from xetfs.storage.catalogue import CATALOGUE_NAME
from xetfs.storage.layout import LISTING_NAME
from xetfs.storage.manifest import MANIFEST_NAME

pytestmark = pytest.mark.e2e

fuse = pytest.mark.fuse

# A client that reads refs/main, waits for a line on stdin, then reads it again and loads by repo id.
CLIENT = r"""
import json, sys
from pathlib import Path
from huggingface_hub import hf_hub_download
cache, repo = Path(sys.argv[1]), sys.argv[2]
ref = cache / ("models--" + repo.replace("/", "--")) / "refs" / "main"
print(json.dumps({"before": ref.read_text()}), flush=True)
sys.stdin.readline()
path = hf_hub_download(repo, "config.json")
print(json.dumps({"after": ref.read_text(), "config": Path(path).read_text()}), flush=True)
"""


@pytest.fixture
def imported(tmp_path: Path) -> Imported:
    spec = hub_cache.make_hub_cache(tmp_path / "cache")
    store = tmp_path / "store"
    return Imported(spec, store, tmp_path, xetfs(tmp_path, "pack", "--hub-cache", spec.root, store, "--no-progress"))


def _push(imported: Imported, target: Path) -> None:
    _push_store(imported.store, target)


def _push_store(store: Path, target: Path) -> None:
    pushed = subprocess.run([sys.executable, "-m", "xetfs", "push", str(store), str(target), "--no-progress"],
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr


def _new_revision(imported: Imported, push_to: Path | None = None) -> str:
    """Pack a new revision of the model (a changed config.json) as ``main``, and push it to ``push_to``; its
    commit id."""
    main = imported.spec.model_commits[-1]
    src = imported.spec.root / "models--acme--tiny-bert" / "snapshots" / main
    revision = imported.tmp / "rev4"
    shutil.copytree(src, revision, symlinks=False)
    config = json.loads((revision / "config.json").read_text())
    config["num_hidden_layers"] = 4
    (revision / "config.json").unlink()
    (revision / "config.json").write_text(json.dumps(config))
    (revision / "extra.txt").write_text("added in revision 4\n")
    commit = hashlib.sha1(b"tiny-bert rev 4").hexdigest()
    xetfs(imported.tmp, "pack", revision, imported.store, "--repo", hub_cache.MODEL, "--revision", "main",
          "--commit", commit, "--no-progress")  # fmt: skip
    if push_to is not None:
        _push(imported, push_to)
    return commit


def _refresh(m: Mount) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xetfs", "refresh", str(m.path)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def _while_reading(m: Mount, imported: Imported, push_to: Path | None = None) -> None:
    """Refresh while a file is being streamed and a client has read the old ref; check what each sees."""
    folder = m.path / "models--acme--tiny-bert"
    old_main = imported.spec.model_commits[-1]
    weights = folder / "snapshots" / old_main / "model.safetensors"
    expected = (imported.spec.root / weights.relative_to(m.path)).read_bytes()
    inode_before = os.stat(folder / "refs" / "main").st_ino
    env = dict(hf_xet_env(imported.tmp / "hf_xet"), HF_HUB_CACHE=str(m.path), HF_HUB_OFFLINE="1",
               HF_HOME=str(imported.tmp / "hf_home"))  # fmt: skip
    with subprocess.Popen([sys.executable, "-c", CLIENT, str(m.path), hub_cache.MODEL], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) as client:  # fmt: skip
        assert client.stdout is not None and client.stdin is not None
        assert json.loads(client.stdout.readline()) == {"before": old_main}
        with open(weights, "rb") as reader:
            head = reader.read(len(expected) // 3)
            commit = _new_revision(imported, push_to)
            done = _refresh(m)
            assert done.returncode == 0, done.stderr
            assert re.search(r"refreshed .*: 1 new shard, \d+ new files?, \d+ new names", done.stderr), done.stderr
            rest = reader.read()
        assert head + rest == expected  # the reader's bytes did not change
        client.stdin.write("go\n")
        client.stdin.flush()
        after = json.loads(client.stdout.readline())
        client.stdin.close()
        assert client.wait(30) == 0
    assert after["after"] == commit  # refs/main moved, for a process that had read it before
    assert json.loads(after["config"])["num_hidden_layers"] == 4
    assert (folder / "snapshots" / commit / "extra.txt").read_text() == "added in revision 4\n"
    assert os.stat(folder / "refs" / "main").st_ino == inode_before  # an inode keeps its number
    assert (folder / "snapshots" / old_main / "config.json").exists()  # the old revision stays
    stats = m.stats()
    assert stats["refresh"]["refreshes"] == 1 and stats["refresh"]["failures"] == 0, stats["refresh"]
    assert stats["refresh"]["files_added"] >= 1 and stats["refresh"]["last_refresh"] > 0
    assert stats["refresh"]["names_added"] >= 3, stats["refresh"]  # the snapshot, its extra.txt, a config...


@fuse
def test_refresh_of_a_local_mount(imported: Imported) -> None:
    with mounted(imported.store) as m:
        _while_reading(m, imported)


@fuse
def test_a_refresh_skips_a_bad_new_shard_and_takes_it_in_once_repaired(imported: Imported) -> None:
    """A new shard damaged where it still parses (a hash it records) is skipped with one warning, as a mount
    skips one, and the refresh goes on; repaired, the next refresh takes it in."""
    shards = next(imported.store.rglob("shards"))
    with mounted(imported.store) as m:
        before = set(shards.glob("*.mdb"))
        commit = _new_revision(imported)
        added = {path: path.read_bytes() for path in set(shards.glob("*.mdb")) - before}
        assert added
        for path in added:
            oracle.flip_byte(path, 48 + 48 + 5)  # (the first term's xorb hash: test_robustness.flipped_term_hash)
        extra = m.path / "models--acme--tiny-bert" / "snapshots" / commit / "extra.txt"
        for _ in range(2):
            skipped = _refresh(m)
            assert skipped.returncode == 0, skipped.stderr
        assert m.log().count("refresh: skipping shard") == len(added), m.log()  # (said once each)
        assert "not to its name" in m.log() and not extra.exists()
        for path, good in added.items():
            path.write_bytes(good)
        repaired = _refresh(m)
        assert repaired.returncode == 0 and "new shard" in repaired.stderr, repaired.stderr
        assert extra.read_text() == "added in revision 4\n"


@fuse
def test_refresh_over_http_and_a_stopped_server(imported: Imported) -> None:
    """The mirror: packed on one side, pushed to the directory nginx serves, mounted by URL on the other.  What
    the refresh read is kept in the disk cache: a mount made again with the server down shows the new revision."""
    served = imported.tmp / "served"
    _push(imported, served)
    port = servers.free_port()
    cache = ("--cache-dir", str(imported.tmp / "disk-cache"))
    with servers.nginx(served, port=port) as web, mounted(web.url, *cache) as m:
        _while_reading(m, imported, push_to=served)
        names = sorted(os.listdir(m.path / "models--acme--tiny-bert" / "snapshots"))
        web.stop()
        failed = _refresh(m)
        assert failed.returncode == 1
        assert "refresh failed, the mount is as it was: the store's server cannot be reached (" in failed.stderr
        assert "127.0.0.1" in failed.stderr, failed.stderr
        assert sorted(os.listdir(m.path / "models--acme--tiny-bert" / "snapshots")) == names
        stats = m.stats()
        assert stats["refresh"]["failures"] == 1 and stats["refresh"]["refreshes"] == 1, stats["refresh"]
        assert [_refresh(m).returncode for _ in range(2)] == [1, 1]  # (logged once: --refresh-every 1 would flood)
        assert m.log().count("refresh failed") == 1, m.log()
        with servers.nginx(served, port=port):  # (the server stays marked down for a moment: DOWN_SECONDS)
            wait_until(lambda: _refresh(m).returncode == 0, 30, "a refresh with the server back")
        assert re.search(r"refresh works again, after \d+ failed refreshes", m.log()), m.log()
    with mounted(web.url, *cache) as again:  # (the server is down: from the disk cache alone)
        assert sorted(os.listdir(again.path / "models--acme--tiny-bert" / "snapshots")) == names
        assert "is not in the store" not in again.log(), again.log()


@fuse
def test_refresh_every_loads_a_new_pack_by_itself(imported: Imported) -> None:
    with mounted(imported.store, "--refresh-every", "0.2") as m:
        folder = m.path / "models--acme--tiny-bert"
        commit = _new_revision(imported)

        wait_until(lambda: (folder / "refs" / "main").read_text() == commit, 20, "the periodic refresh")
        assert (folder / "snapshots" / commit / "extra.txt").read_text() == "added in revision 4\n"


@fuse
def test_a_ref_read_through_a_handle_opened_before_a_refresh_leaves_no_stale_bytes(imported: Imported) -> None:
    """A handle opened before the refresh still reads the old ref; were that read to go through the kernel's
    page cache, a handle opened later, before or after it, would be served those bytes."""
    with mounted(imported.store) as m:
        ref = m.path / "models--acme--tiny-bert" / "refs" / "main"
        old_main = imported.spec.model_commits[-1]
        with open(ref, "rb") as before:
            commit = _new_revision(imported)
            done = _refresh(m)
            assert done.returncode == 0, done.stderr
            with open(ref, "rb") as after:
                assert before.read() == old_main.encode()  # an open file keeps reading what it read
                assert after.read() == commit.encode()
        assert ref.read_text() == commit


@fuse
def test_a_refresh_that_finds_nothing_new_reads_no_catalogue_and_sees_a_moved_branch(imported: Imported) -> None:
    """Over nginx: a refresh with no new shard and the catalogue, manifest and listing as they were asks only for
    their tags (HEAD); one whose catalogue moved a branch, with no new shard, still builds the tree again."""
    served = imported.tmp / "served"
    _push(imported, served)
    servers.settled(served)
    with servers.nginx(served) as web, mounted(web.url, "--cache-dir", str(imported.tmp / "disk-cache")) as m:
        ref = m.path / "models--acme--tiny-bert" / "refs" / "main"
        first = _refresh(m)  # (the first refresh has nothing to compare with: it reads them)
        assert first.returncode == 0 and "no change" not in first.stderr, first.stderr
        mark = web.log_mark()
        again = _refresh(m)
        assert again.returncode == 0 and "no change" in again.stderr, again.stderr
        asked = web.requests_since(mark)
        assert asked and {method for method, _ in asked} == {"HEAD"}, asked
        # (the store has no manifest: one a later push adds is looked for, a HEAD answered 404)
        assert {path.rsplit("/", 1)[-1] for _, path in asked} == {LISTING_NAME, CATALOGUE_NAME, MANIFEST_NAME}
        stats = m.stats()["refresh"]
        assert (stats["refreshes"], stats["unchanged"]) == (2, 1), stats
        assert m.stats()["remote"]["errors"] == 0  # (the manifest's 404 is an answer, not a failed request)
        # main moves back to an older commit: the catalogue changes, no shard is added
        older = imported.spec.model_commits[0]
        assert ref.read_text() != older
        data = (served / CATALOGUE_NAME).read_bytes()  # (the same size: only a commit id changes)
        current = imported.spec.model_commits[-1]
        moved_main = re.sub(rb'("main":\s*")' + current.encode(), rb"\g<1>" + older.encode(), data, count=1)
        assert len(moved_main) == len(data) and moved_main != data
        (served / CATALOGUE_NAME).write_bytes(moved_main)
        moved = _refresh(m)
        said = "no new shard or file, no new name; the names were read again, so a ref or path that changed shows now"
        assert moved.returncode == 0 and said in moved.stderr, moved.stderr
        assert ref.read_text() == older


@fuse
def test_a_refresh_of_a_bucket_that_finds_nothing_new_lists_only_its_shards(
    imported: Imported, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a bucket: with no new shard and the catalogue as it was, a refresh lists ``shards/`` alone (and asks
    the catalogue's tag), not every xorb; a new pack then lists it all and is found."""
    with servers.moto_s3() as s3:
        env = {**servers.S3_ENV, "AWS_ENDPOINT_URL": s3.url}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        servers.make_bucket(s3.url, "mirror")
        url = "s3://mirror/hub"
        pushed = subprocess.run([sys.executable, "-m", "xetfs", "push", str(imported.store), url, "--no-progress"],
                                capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        settled = time.time() + TAG_SETTLE_SECONDS  # (the objects' times count seconds: a tag is trusted after it)
        wait_until(lambda: time.time() > settled, 2 * TAG_SETTLE_SECONDS, "the bucket's objects to settle")

        def lists() -> list[str]:
            log = s3.log.read_text(errors="replace") if s3.log else ""
            return re.findall(r'"GET /mirror\?[^"]*?prefix=([^&" ]*)', log)

        with mounted(url, "--cache-dir", str(imported.tmp / "disk-cache")) as m:
            assert _refresh(m).returncode == 0  # (the first: nothing to compare with)
            before = len(lists())
            again = _refresh(m)
            assert again.returncode == 0 and "no change" in again.stderr, again.stderr
            assert lists()[before:] == ["hub/xet/xorbs/shards/"], lists()[before:]  # (not "hub/")
            commit = _new_revision(imported)
            pushed = subprocess.run([sys.executable, "-m", "xetfs", "push", str(imported.store), url, "--no-progress"],
                                    capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
            assert pushed.returncode == 0, pushed.stderr
            found = _refresh(m)
            assert found.returncode == 0 and "1 new shard" in found.stderr, found.stderr
            assert (m.path / "models--acme--tiny-bert" / "refs" / "main").read_text() == commit


@fuse
def test_an_empty_mirror_mounted_before_the_first_push_shows_it_after_a_refresh(imported: Imported) -> None:
    """A mirror made empty (its listing alone, where shards will lie unknown), mounted, then pushed to in
    hf_xet's layout: a refresh finds the shards and shows the repos."""
    empty, served = imported.tmp / "empty", imported.tmp / "served"
    (empty / "shards").mkdir(parents=True)
    (empty / "xorbs").mkdir()
    _push_store(empty, served)
    with servers.nginx(served) as web, mounted(web.url, "--cache-dir", str(imported.tmp / "disk-cache")) as m:
        assert os.listdir(m.path) == []
        _push(imported, served)
        done = _refresh(m)
        assert done.returncode == 0 and "no change" not in done.stderr, done.stderr
        weights = (
            m.path / "models--acme--tiny-bert" / "snapshots" / imported.spec.model_commits[-1] / "model.safetensors"
        )
        assert weights.read_bytes() == (imported.spec.root / weights.relative_to(m.path)).read_bytes()
