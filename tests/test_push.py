"""``xetfs push``: a store copied to moto's S3 server and to a directory, incrementally, in order, re-runnably.

The Hub store is packed by ``xetfs pack --hub-cache`` from a cache written
with huggingface_hub's own functions; the store that is pushed while it
grows (and killed) is written by the test-only writer, for many small xorbs
and shards.  Nodes read the targets with xetfs itself (``verify``, ``ls``, a
mount), and nginx serves a directory target.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import hub_cache, oracle, servers
from helpers.mounting import mounted
from helpers.oracle import CliRunner, random_bytes
from helpers.processes import kill_when
from helpers.writer import StoreBuilder

from xetfs.base import hashes
from xetfs.base.exitstatus import ExitStatus
from xetfs.commands.credentials import CredentialsError, load_credentials, parse_credentials
from xetfs.commands.push import (
    LISTING,
    META,
    OTHER,
    SHARDS,
    XORBS,
    DirTarget,
    Item,
    PushError,
    open_target,
    own_damage,
    phase_of,
    push,
)
from xetfs.storage.catalogue import CATALOGUE_NAME
from xetfs.storage.layout import HF_XET_OWN
from xetfs.storage.remote import LISTING_NAME, Listing, local_listing
from xetfs.write.pack import MANIFEST_NAME

# The run's seed (tests/conftest.py): a failing case runs again with XETFS_TEST_SEED set to its id's number.
SEED = int(os.environ["XETFS_TEST_SEED"])

pytestmark = pytest.mark.fuse

BUCKET = "mirror"


def _xetfs(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "xetfs", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.fixture(scope="module")
def hub_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store packed from a Hugging Face cache (manifest, catalogue, listing)."""
    tmp = tmp_path_factory.mktemp("push-hub")
    spec = hub_cache.make_hub_cache(tmp / "cache")
    proc = _xetfs("pack", "--hub-cache", spec.root, tmp / "store", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    (tmp / "extra").mkdir()
    (tmp / "extra" / "notes.txt").write_bytes(random_bytes(300_000, 9))
    proc = _xetfs("pack", tmp / "extra", tmp / "store", "--no-progress")  # and a names manifest
    assert proc.returncode == 0, proc.stderr
    assert (tmp / "store" / CATALOGUE_NAME).is_file() and (tmp / "store" / MANIFEST_NAME).is_file()
    return tmp / "store"


@pytest.fixture(scope="module")
def s3() -> Iterator[servers.Server]:
    with servers.moto_s3() as server:
        servers.make_bucket(server.url, BUCKET)
        yield server


@pytest.fixture
def s3_env(s3: servers.Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The S3 variables, in this process (for ``cli``) and for subprocesses."""
    env = {**servers.S3_ENV, "AWS_ENDPOINT_URL": s3.url}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **env}


def _bucket_objects(url: str) -> dict[str, int]:
    return open_target(url).objects()


# -- to S3 ---------------------------------------------------------------------------------------


def test_push_to_s3_is_a_store_and_a_second_push_sends_nothing(
    hub_store: Path, s3: servers.Server, s3_env: dict[str, str], cli: CliRunner
) -> None:
    url = f"s3://{BUCKET}/hub"
    first = _xetfs("push", hub_store, url, env=s3_env)
    assert first.returncode == 0, first.stderr
    source = dict(local_listing(hub_store).objects)
    there = _bucket_objects(url)
    assert {n: s for n, s in there.items() if n != LISTING_NAME} == source
    # hf_xet's own files (its index, side files) stay home: no object of the store
    own = [p for p in hub_store.rglob("*") if HF_XET_OWN.fullmatch(p.name)]
    assert own and not [n for n in there if HF_XET_OWN.fullmatch(n.rsplit("/", 1)[-1])], sorted(there)
    listed = Listing.parse(open_target(url).read(LISTING_NAME) or b"", where=url)
    assert dict(listed.objects) == source
    for name in (MANIFEST_NAME, CATALOGUE_NAME):
        assert open_target(url).read(name) == (hub_store / name).read_bytes()
    # The server's ETags are MD5s, so every upload above was checked against the MD5 of what was sent.
    import obstore
    from obstore.store import from_url

    meta = obstore.head(from_url(url, client_options={"allow_http": True}), MANIFEST_NAME)
    assert (meta["e_tag"] or "").strip('"') == hashlib.md5((hub_store / MANIFEST_NAME).read_bytes()).hexdigest()
    assert f"{len(source) + 1} objects sent" in first.stderr, first.stderr
    report = cli("verify", "--no-progress", url, "--disk-cache-size", 0)
    assert report.returncode == 0 and report.stdout.startswith(b"OK:"), report.stdout.decode() + report.stderr
    local = cli("ls", "--json", "--files", hub_store)
    remote = cli("ls", "--json", "--files", url, "--disk-cache-size", 0)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)

    puts = servers.requests_logged(s3, "PUT")
    again = _xetfs("push", hub_store, url, env=s3_env)
    assert again.returncode == 0, again.stderr
    assert servers.requests_logged(s3, "PUT") == puts, again.stderr
    assert "0 objects sent (0 bytes)" in again.stderr, again.stderr
    assert again.stderr.count("\n") == 1  # one summary line, no bar (not a terminal)


def test_an_upload_that_fails_its_check_is_removed_and_the_next_push_sends_it(
    hub_store: Path, s3: servers.Server, s3_env: dict[str, str], cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ETag that is no MD5 of the bytes sent (as an S3 object encrypted with KMS has) has the object read
    back, and a good copy passes.  A xorb the server stored wrong fails: push names it and removes it, so that
    the next push sends it again rather than count it as there."""
    import obstore

    url = f"s3://{BUCKET}/bad-etag"
    objects = [name for name, _ in local_listing(hub_store).objects]
    victim = sorted(name for name in objects if "/xorbs/" in f"/{name}" and not name.endswith(".mdb"))[0]
    real_put = obstore.put

    def other_etag(store: object, name: str, data: bytes, **kwargs: Any) -> object:
        result = real_put(store, name, data, **kwargs)  # type: ignore[arg-type]
        return {**result, "e_tag": '"' + "0" * 32 + '"'} if name == victim else result

    def stored_wrong(store: object, name: str, data: bytes, **kwargs: Any) -> object:
        if name == victim:
            data = bytes([data[0] ^ 1]) + bytes(data[1:])  # (the same size)
        return real_put(store, name, data, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:
        patched.setattr(obstore, "put", other_etag)
        passed = cli("push", "--no-progress", hub_store, f"{url}-kms")
    assert passed.returncode == 0, passed.stderr
    with monkeypatch.context() as patched:
        patched.setattr(obstore, "put", stored_wrong)
        failed = cli("push", "--no-progress", hub_store, url)
    assert failed.returncode == ExitStatus.ERROR, failed.stderr
    assert f"{victim}: ETag " in failed.stderr and "the object read back differs from the" in failed.stderr
    assert "removed: push again to send it" in failed.stderr, failed.stderr
    assert victim not in _bucket_objects(url)
    again = cli("push", "--no-progress", hub_store, url)
    assert again.returncode == 0, again.stderr
    assert victim in _bucket_objects(url)
    report = cli("verify", "--no-progress", url, "--disk-cache-size", 0)
    assert report.returncode == 0 and report.stdout.startswith(b"OK:"), report.stdout.decode() + report.stderr


def test_push_check_repairs_a_damaged_xorb_that_a_plain_push_leaves(
    hub_store: Path, s3: servers.Server, s3_env: dict[str, str], cli: CliRunner
) -> None:
    """A xorb damaged in the bucket (same size): ``verify`` finds it, ``push`` passes it by name and size,
    ``push --check`` compares MD5 ETags and sends that one object again; then the target verifies."""
    import obstore
    from obstore.store import from_url

    url = f"s3://{BUCKET}/repair"
    assert _xetfs("push", hub_store, url, env=s3_env).returncode == 0
    name = max((n for n, s in local_listing(hub_store).objects if phase_of(n) == XORBS),
               key=lambda n: (hub_store / n).stat().st_size)  # fmt: skip
    data = bytearray((hub_store / name).read_bytes())
    data[len(data) // 3] ^= 0x40
    obstore.put(from_url(url, client_options={"allow_http": True}), name, bytes(data))
    bad = cli("verify", "--no-progress", url, "--disk-cache-size", 0)
    assert bad.returncode == 3, bad.stdout.decode() + bad.stderr
    plain = _xetfs("push", hub_store, url, env=s3_env)
    assert plain.returncode == 0 and "0 objects sent" in plain.stderr, plain.stderr
    puts = servers.requests_logged(s3, "PUT")
    checked = _xetfs("push", "--check", hub_store, url, env=s3_env)
    assert checked.returncode == 0, checked.stderr
    assert "1 objects sent" in checked.stderr and "1 of them in place of a damaged copy" in checked.stderr
    assert servers.requests_logged(s3, "PUT") == puts + 1, checked.stderr
    good = cli("verify", "--no-progress", url, "--disk-cache-size", 0)
    assert good.returncode == 0, good.stdout.decode() + good.stderr
    again = _xetfs("push", "--check", hub_store, url, env=s3_env)
    assert "0 objects sent" in again.stderr, again.stderr


def test_an_empty_store_pushed_to_a_bucket_is_an_empty_store(
    tmp_path: Path, s3: servers.Server, s3_env: dict[str, str], cli: CliRunner
) -> None:
    """An empty store pushed to a bucket is its listing alone: it opens as an empty store, to be mounted before
    anything is pushed into it."""
    empty = tmp_path / "empty"
    (empty / "shards").mkdir(parents=True)
    (empty / "xorbs").mkdir()
    url = f"s3://{BUCKET}/empty"
    assert _xetfs("push", empty, url, env=s3_env).returncode == 0
    assert _bucket_objects(url) == {LISTING_NAME: len(local_listing(empty).dump())}
    for command in ("ls", "verify"):
        out = cli(command, url, "--disk-cache-size", 0)
        assert out.returncode == 0, out.stderr


def test_push_to_a_bucket_that_does_not_exist_says_so(
    hub_store: Path, s3: servers.Server, s3_env: dict[str, str]
) -> None:
    out = _xetfs("push", hub_store, "s3://no-such-bucket/x", env=s3_env)
    assert out.returncode == 1, out.stderr
    assert "NoSuchBucket: The specified bucket does not exist (push does not create buckets" in out.stderr, out.stderr


def test_push_replaces_a_changed_manifest_and_nothing_else(
    hub_store: Path, s3: servers.Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    subprocess.run(["cp", "-a", str(hub_store), str(store)], check=True)
    url = f"s3://{BUCKET}/changed"
    assert _xetfs("push", store, url, env=s3_env).returncode == 0
    data = (store / MANIFEST_NAME).read_bytes()
    name = next(e for e in json.loads(data) if e["type"] == "file")["path"].encode()
    renamed = name[:-1] + (b"x" if name[-1:] != b"x" else b"y")
    (store / MANIFEST_NAME).write_bytes(data.replace(b'"' + name + b'"', b'"' + renamed + b'"'))  # same size
    assert len((store / MANIFEST_NAME).read_bytes()) == len(data)
    puts = servers.requests_logged(s3, "PUT")
    proc = _xetfs("push", store, url, env=s3_env)
    assert proc.returncode == 0, proc.stderr
    assert servers.requests_logged(s3, "PUT") == puts + 1, proc.stderr
    assert open_target(url).read(MANIFEST_NAME) == (store / MANIFEST_NAME).read_bytes()


# -- to a directory ------------------------------------------------------------------------------


def _files_state(top: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(top).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in top.rglob("*")
            if p.is_file()}  # fmt: skip


def test_push_to_a_directory_serves_and_a_second_push_writes_nothing(
    hub_store: Path, tmp_path: Path, cli: CliRunner
) -> None:
    target = tmp_path / "www" / "hub"
    proc = _xetfs("push", hub_store, target)
    assert proc.returncode == 0, proc.stderr
    assert not (target / ".xetfs-push").exists()
    assert cli("verify", "--no-progress", target).returncode == 0
    before = _files_state(target)
    assert set(before) == {n for n, _ in local_listing(hub_store).objects} | {LISTING_NAME}
    again = _xetfs("push", hub_store, target)
    assert again.returncode == 0, again.stderr
    assert "0 objects sent" in again.stderr
    assert _files_state(target) == before  # not one file written again (a new file would be a new inode)
    with servers.nginx(tmp_path / "www") as web:
        report = cli("verify", "--no-progress", f"{web.url}/hub", "--disk-cache-size", 0)
        assert report.returncode == 0 and report.stdout.startswith(b"OK:"), report.stdout.decode() + report.stderr


# -- order, and what push refuses ----------------------------------------------------------------


@dataclass
class RecordingTarget:
    """A target in memory that records the order of its uploads (a fake, for push's ordering alone)."""

    location: str = "memory"
    held: dict[str, bytes] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def objects(self) -> dict[str, int]:
        return {n: len(d) for n, d in self.held.items()}

    def read(self, name: str) -> bytes | None:
        return self.held.get(name)

    def same(self, name: str, data: bytes) -> bool:
        return self.held.get(name) == data

    def put(self, name: str, data: bytes) -> None:
        self.held[name] = data
        self.order.append(name)

    def clean(self) -> int:
        return 0


def test_push_order_is_xorbs_shards_listing_manifest_catalogue(hub_store: Path) -> None:
    target = RecordingTarget()
    report = push(hub_store, target, jobs=4)
    phases = [phase_of(name) for name in target.order]
    assert phases == sorted(phases), target.order
    assert {XORBS, SHARDS, LISTING, META} <= set(phases)
    assert target.order[-2:] == [MANIFEST_NAME, CATALOGUE_NAME]
    assert report.sent == len(target.order)
    again = push(hub_store, target, jobs=4)
    assert again.sent == 0 and target.order.count(MANIFEST_NAME) == 1
    shard = next(n for n in target.held if phase_of(n) == SHARDS)
    target.held[shard] = bytes(len(target.held[shard]))  # damaged, same size
    assert push(hub_store, target, jobs=4).sent == 0  # (by name and size)
    fixed = push(hub_store, target, jobs=4, check=True)
    assert (fixed.sent, fixed.replaced) == (1, 1) and target.held[shard] == (hub_store / shard).read_bytes()
    assert phase_of("xet/xorbs/shards/" + "a" * 64 + ".mdb") == SHARDS
    assert phase_of("xorbs/" + "b" * 64) == XORBS
    assert phase_of("README.md") == OTHER


def test_push_check_to_a_directory_repairs_and_never_sends_a_damaged_copy(hub_store: Path, tmp_path: Path) -> None:
    """``--check`` reads a directory target's copies back; an object whose copy differs is sent again from the
    store, unless the store's own copy fails its check too: then push stops and says so."""
    store, target_dir = tmp_path / "store", tmp_path / "target"
    shutil.copytree(hub_store, store)
    assert push(store, DirTarget(target_dir)).sent > 0
    xorb = max((n for n, _ in local_listing(store).objects if phase_of(n) == XORBS),
               key=lambda n: (store / n).stat().st_size)  # fmt: skip
    shard = next(n for n, _ in local_listing(store).objects if phase_of(n) == SHARDS)
    for name in (xorb, shard):
        oracle.flip_byte(target_dir / name, (target_dir / name).stat().st_size // 2)
    fixed = push(store, DirTarget(target_dir), check=True)
    assert (fixed.sent, fixed.replaced) == (2, 2)
    for name in (xorb, shard):
        assert (target_dir / name).read_bytes() == (store / name).read_bytes()
        item = Item(name, (store / name).stat().st_size, phase_of(name), path=store / name)
        assert own_damage(item, (store / name).read_bytes()) is None
    # the store's own copy damaged (and so differing from the target's): refused, the good copy kept
    oracle.flip_byte(store / xorb, (store / xorb).stat().st_size // 3)
    item = Item(xorb, (store / xorb).stat().st_size, XORBS, path=store / xorb)
    assert own_damage(item, (store / xorb).read_bytes()) is not None
    with pytest.raises(PushError, match="damaged too"):
        push(store, DirTarget(target_dir), check=True)
    assert (target_dir / xorb).read_bytes() == (hub_store / xorb).read_bytes()
    oracle.flip_byte(store / shard, 100)
    item = Item(shard, (store / shard).stat().st_size, SHARDS, path=store / shard)
    assert "hashes to" in (own_damage(item, (store / shard).read_bytes()) or "")


def test_push_refuses_http_and_a_target_inside_the_store(hub_store: Path, cli: CliRunner) -> None:
    out = cli("push", hub_store, "http://127.0.0.1:9/store")
    assert out.returncode == 1 and "cannot push there" in out.stderr
    out = cli("push", hub_store, hub_store / "copy")
    assert out.returncode == 1 and "inside the store" in out.stderr
    assert not (hub_store / "copy").exists()
    with pytest.raises(PushError, match="cannot push there"):
        open_target("ftp://host/x")


def test_directory_target_checks_what_it_wrote(tmp_path: Path) -> None:
    target = DirTarget(tmp_path / "t")
    target.put("a/b", b"hello")
    assert (tmp_path / "t/a/b").read_bytes() == b"hello"
    assert target.objects() == {"a/b": 5}
    (tmp_path / "t/.xetfs-push").mkdir(exist_ok=True)
    (tmp_path / "t/.xetfs-push/left.tmp").write_bytes(b"half")
    assert target.objects() == {"a/b": 5}  # temporaries are not objects
    assert target.clean() == 1 and not (tmp_path / "t/.xetfs-push").exists()


def test_credentials_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "# keys\nexport AWS_ACCESS_KEY_ID=abc\nAWS_SECRET_ACCESS_KEY = 'x=y z'\n\nXETFS_HTTP_TOKEN=\"t\"\n"
    assert parse_credentials(text, where="f") == {"AWS_ACCESS_KEY_ID": "abc", "AWS_SECRET_ACCESS_KEY": "x=y z",
                                                  "XETFS_HTTP_TOKEN": "t"}  # fmt: skip
    with pytest.raises(CredentialsError, match="f: line 2: not NAME=VALUE"):
        parse_credentials("A=1\nsecret-without-name\n", where="f")
    path = tmp_path / "creds"
    path.write_text("XETFS_TEST_CRED=42\n")
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="other users may read it"):
        load_credentials(path)
    path.chmod(0o600)
    monkeypatch.delenv("XETFS_TEST_CRED", raising=False)
    assert load_credentials(path) == {"XETFS_TEST_CRED": "42"}
    assert os.environ["XETFS_TEST_CRED"] == "42"
    monkeypatch.delenv("XETFS_TEST_CRED")
    with pytest.raises(CredentialsError, match="cannot read"):
        load_credentials(tmp_path / "missing")


# -- interrupted pushes --------------------------------------------------------------------------


@dataclass
class Growing:
    """A store that grows: ``files`` (name -> bytes) is what its manifest names now."""

    top: Path
    builder: StoreBuilder
    files: dict[str, bytes] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)

    def add(self, count: int, seed: int) -> None:
        """``count`` files of 60-200 KB, each in its own xorb, a shard every four files; then the manifest."""
        rnd = random.Random(seed)
        for n in range(count):
            name = f"part{seed}/file{n:03}.bin"
            data = random_bytes(rnd.randrange(60_000, 200_000), seed * 1000 + n)
            self.hashes[name] = hashes.to_hex(self.builder.add_file(data, chunk_size=16 * 1024))
            self.files[name] = data
            self.builder.seal_xorb()
            if n % 4 == 3:
                self.builder.flush_shard()
        self.builder.finish()
        entries = [{"type": "file", "path": n, "size": len(d), "xetHash": self.hashes[n]}
                   for n, d in sorted(self.files.items())]  # fmt: skip
        (self.top / MANIFEST_NAME).write_text(json.dumps(entries, indent=1))


def _grown(tmp_path: Path) -> Growing:
    store = Growing(tmp_path / "store", StoreBuilder(tmp_path / "store"))
    store.add(8, seed=1)
    return store


def _kill_during(cmd: list[str], env: dict[str, str], count: Any, low: int, high: int, seed: int) -> int:
    """Run ``cmd`` (a push) and SIGKILL it once ``count()`` objects are at the target, a random number in
    ``[low, high)``; returns that number.

    The push runs in slices (``helpers.processes.kill_when``), so it is killed where chosen however fast it
    runs, in the middle of an object or between.
    """
    stop_at = random.Random(seed).randrange(low, high)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    with proc.stderr:
        if not kill_when(proc, lambda: count() >= stop_at):
            pytest.fail(f"the push ended before {stop_at} objects were at the target: {proc.stderr.read()!r}")
    return stop_at


def _check_names(mnt: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (mnt / name).read_bytes() == data, name


@pytest.mark.parametrize("seed", [SEED])
def test_push_killed_at_a_random_point_then_again_gives_a_store_that_verifies(
    tmp_path: Path, s3: servers.Server, s3_env: dict[str, str], cli: CliRunner, seed: int
) -> None:
    store = _grown(tmp_path)
    url = f"s3://{BUCKET}/grown-{seed}"
    assert _xetfs("push", store.top, url, env=s3_env).returncode == 0
    old_files = dict(store.files)
    store.add(24, seed=2)  # 24 xorbs and 6 shards more, and a manifest that names them
    before = len(_bucket_objects(url))
    total = before + 24 + 6
    cmd = [sys.executable, "-m", "xetfs", "push", "--jobs", "1", str(store.top), url]
    killed_at = _kill_during(cmd, s3_env, lambda: len(_bucket_objects(url)), before + 1, total - 1, seed)
    assert before < len(_bucket_objects(url)) < total, killed_at  # (the old manifest and listing are still there)
    # A node that mounts now sees the old names, every one of them backed by its objects.
    with mounted(url, "--cache-dir", str(tmp_path / "cache")) as m:
        _check_names(m.path, old_files)
        assert not (m.path / "part2").exists()
        warnings = [line for line in m.log().splitlines() if "WARNING" in line]
        assert not warnings, warnings
    again = _xetfs("push", store.top, url, env=s3_env)
    assert again.returncode == 0, again.stderr
    report = cli("verify", "--no-progress", url, "--disk-cache-size", 0)
    assert report.returncode == 0 and report.stdout.startswith(b"OK:"), report.stdout.decode() + report.stderr
    with mounted(url, "--disk-cache-size", "0") as m:
        _check_names(m.path, store.files)


@pytest.mark.parametrize("seed", [SEED])
def test_push_to_a_directory_killed_then_again(tmp_path: Path, cli: CliRunner, seed: int) -> None:
    store = _grown(tmp_path)
    store.add(24, seed=3)
    target = tmp_path / "target"
    total = len(local_listing(store.top).objects)
    cmd = [sys.executable, "-m", "xetfs", "push", "--jobs", "1", str(store.top), str(target)]

    def count() -> int:
        return sum(1 for p in target.rglob("*") if p.is_file() and ".xetfs-push" not in p.parts)

    _kill_during(cmd, dict(os.environ), count, 1, total - 2, seed)  # before the listing and the manifest
    assert not (target / MANIFEST_NAME).exists() and not (target / LISTING_NAME).exists()
    left = list((target / ".xetfs-push").iterdir()) if (target / ".xetfs-push").is_dir() else []
    again = _xetfs("push", store.top, target)
    assert again.returncode == 0, again.stderr
    assert (f"{len(left)} temporary files of an interrupted push removed" in again.stderr) == bool(left)
    assert not (target / ".xetfs-push").exists()
    report = cli("verify", "--no-progress", target)
    assert report.returncode == 0, report.stdout.decode() + report.stderr
    with mounted(target) as m:
        _check_names(m.path, store.files)


def test_a_url_of_a_stores_xet_folders_names_the_store(hub_store: Path, s3_env: dict[str, str]) -> None:
    """hf_xet's layout puts the xorbs and shards under ``xet/xorbs``, the catalogue at the top: a URL of those
    folders would mount as bare hashes, so it is refused with the store's URL (as a prefix too shallow is)."""
    url = f"s3://{BUCKET}/deep"
    assert _xetfs("push", hub_store, url, env=s3_env).returncode == 0
    for inner in (f"{url}/xet", f"{url}/xet/xorbs/"):
        proc = _xetfs("ls", "--disk-cache-size", "0", inner, env=s3_env)
        assert proc.returncode == 1 and f"give {url}" in proc.stderr, proc.stderr
    assert _xetfs("ls", "--disk-cache-size", "0", url, env=s3_env).returncode == 0


def test_push_takes_its_keys_from_a_credentials_file(
    hub_store: Path, s3: servers.Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    url = f"s3://{BUCKET}/from-file"
    creds = tmp_path / "s3.env"
    creds.write_text("".join(f"{k}={v}\n" for k, v in {**servers.S3_ENV, "AWS_ENDPOINT_URL": s3.url}.items()))
    creds.chmod(0o600)
    without = _xetfs("push", hub_store, url, env=env)
    assert without.returncode == 1 and without.stderr.startswith("xetfs: error:"), without.stderr
    proc = _xetfs("push", "--credentials", creds, hub_store, url, env=env)
    assert proc.returncode == 0, proc.stderr
    assert servers.S3_ENV["AWS_SECRET_ACCESS_KEY"] not in proc.stderr + without.stderr
    assert MANIFEST_NAME in open_target(url).objects()
    # Every command that reads a store takes the same file (serve too: its workers inherit the environment).
    for command in ("ls", "verify"):
        assert _xetfs(command, url, env=env).returncode != 0
        read = _xetfs(command, "--credentials", creds, url, env=env)
        assert read.returncode == 0, (command, read.stderr)
