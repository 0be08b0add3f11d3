"""Build the index of a store: read every shard, skip the bad ones.

A shard that cannot be read or parsed affects only the files it alone
describes: it is skipped with one warning naming it (or, with ``strict``,
the whole load fails).  The result says which shards were skipped and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from xetfs.errors import FormatError, StoreError
from xetfs.format.shard import parse_shard
from xetfs.index import Index
from xetfs.stats import IndexCounters
from xetfs.store import StoreLike

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


def load_index(store: StoreLike, *, strict: bool = False) -> LoadResult:
    """Index every shard of ``store``.

    Raises ``StoreError`` when the store has no shards, or, with ``strict``,
    the first shard error.
    """
    shard_files = store.shard_files()
    if not shard_files:
        raise StoreError(f"store {store.location}: no shards in {store.location}/shards")
    result = LoadResult(Index())
    for shard_file in shard_files:
        try:
            shard = parse_shard(store.read_shard(shard_file), where=f"shard {shard_file.name}")
        except (FormatError, StoreError) as exc:
            if strict:
                raise
            log.warning("skipping %s", exc)
            result.skipped.append(str(exc))
            continue
        result.index.add_shard(shard)
    return result
