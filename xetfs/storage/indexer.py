"""Build the index of a store: read every shard, skip the bad ones.

A shard that cannot be read or parsed, or whose bytes do not hash to its
name (damage that parsing cannot see: a flipped bit in a hash it records),
affects only the files it alone describes: it is skipped with one warning
naming it (or, with ``strict``, the whole load fails).  The result says which shards were skipped and why.
When shards were skipped and no file is left, the load fails: a view of
nothing would hide the damage.  A store with no shards at all is empty, not
damaged; one with xorbs but no shards has lost its shards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from xetfs.base.errors import FormatError, IntegrityError, StoreError
from xetfs.base.messages import plural
from xetfs.base.stats import IndexCounters
from xetfs.format.shard import Shard, parse_shard
from xetfs.storage.index import Index
from xetfs.storage.layout import shard_name_problem
from xetfs.storage.store import ShardFile, Store

log = logging.getLogger(__name__)


@dataclass
class LoadResult:
    index: Index
    skipped: list[str] = field(default_factory=list)  # one message per skipped shard

    def counters(self) -> IndexCounters:
        return IndexCounters(
            files=len(self.index),
            terms=self.index.terms,
            xorbs=len(self.index.all_xorbs),
            shards=self.index.shards,
            shards_skipped=len(self.skipped),
        )


def load_index(store: Store, *, strict: bool = False) -> LoadResult:
    """Index every shard of ``store``.

    Raises ``StoreError`` when the store has xorbs but no shards, when every
    shard was skipped and no file is left, or, with ``strict``, the first
    shard error.
    """
    shard_files = store.shard_files()
    problem = shards_missing(store, len(shard_files))
    if problem is not None:
        raise StoreError(problem)
    result = LoadResult(Index())
    for shard_file in shard_files:
        try:
            shard = read_shard(store, shard_file)
        except (FormatError, IntegrityError, StoreError) as exc:
            if strict:
                raise
            log.warning("skipping %s", exc)
            result.skipped.append(str(exc))
            continue
        result.index.add_shard(shard)
    if result.skipped and len(result.index) == 0:
        bad, total = len(result.skipped), len(shard_files)
        if bad == total:
            which = "its one shard is bad" if total == 1 else f"all {total} shards are bad"
        else:
            which = f"{bad} of {total} shards {'is' if bad == 1 else 'are'} bad, the rest empty"
        raise StoreError(f"store {store.location}: nothing to show: {which} (first: {result.skipped[0]})")
    return result


def read_shard(store: Store, shard_file: ShardFile) -> Shard:
    """A shard of ``store``, parsed and checked against its name: the hash of its bytes (docs/format.md
    section 1.7).  ``FormatError``, ``IntegrityError`` or ``StoreError`` name the shard.  A remote store's
    shard that fails is read once more from the server itself: the copy in the disk cache may be the damaged
    one (or the server's, since repaired), and a good one replaces it."""
    try:
        return _checked_shard(store.read_shard(shard_file), shard_file)
    except (FormatError, IntegrityError):
        if store.local:
            raise
    return _checked_shard(store.read_shard(shard_file, fresh=True), shard_file)


def _checked_shard(data: bytes, shard_file: ShardFile) -> Shard:
    where = f"shard {shard_file.name}"
    shard = parse_shard(data, where=where)
    problem = shard_name_problem(shard_file.name, data)
    if problem is not None:
        raise IntegrityError(f"{where}: {problem} (damaged, or renamed)")
    return shard


def shards_missing(store: Store, shards: int) -> str | None:
    """Why a store with ``shards`` shards is damaged as a whole, or None.

    A store with neither shards nor xorbs is empty, which is fine; xorbs
    without any shard mean the shards are lost.  ``mount`` and ``verify``
    judge by this one rule.
    """
    if shards:
        return None
    xorbs = sum(1 for _ in store.xorb_hashes())
    if not xorbs:
        return None
    where = store.location
    return f"store {where}: no shards in {where}/shards, but {plural(xorbs, 'xorb')}: the shards are missing"
