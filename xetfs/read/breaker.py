"""A circuit breaker for a remote store's fetches: a store that answers nothing fails reads at once.

A hung server (one that takes connections and never answers) would cost
every read that fetches a whole ``--io-timeout``, one after another: a job
reading 300 files would wait hours before it failed.  So once a fetch ran
out of time with no other fetch answered since it began, the store is taken
for hung: fetches fail at once for ``hung_for`` seconds (``StoreTimeoutError``,
"not requested"), then one fetch at a time tries the store again while the
others still fail at once, and the first fetch that gets an answer (any
answer: an error the server sent is one) ends it.  A fetch that ran out of
time while others got answers (one slow object) takes nothing down.

Pure bookkeeping around the fetches the caller hands it; runs on one trio
thread.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from xetfs.base.errors import ServerUnreachableError, StoreTimeoutError, XetfsError
from xetfs.base.stats import RemoteCounters

T = TypeVar("T")
log = logging.getLogger(__name__)


class StoreBreaker:
    def __init__(self, hung_for: float, counters: RemoteCounters | None = None) -> None:
        """``counters``: the store's, where the times it was taken for hung and the fetches failed at once are
        counted (``hung``, ``not_requested``)."""
        self.hung_for = hung_for
        self.counters = counters or RemoteCounters()
        self._answered_at = -1e300  # (trio time) when a fetch last got an answer
        self._hung_at: float | None = None  # when the store was taken for hung, or a try of it last timed out
        self._hung_since = 0.0  # when it was taken for hung
        self._trying = False  # a fetch is trying a hung store again

    async def fetch(self, where: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``, a fetch of ``where`` (for the message), unless the store is taken for hung:
        then it fails at once, or is the one fetch that tries the store again.  A result that is a loader's
        ``(runs, errors)`` ran out of time if one of its errors says so."""
        now = trio.current_time()
        trial = self._hung_at is not None
        if self._hung_at is not None and (self._trying or now - self._hung_at < self.hung_for):
            self.counters.not_requested += 1
            raise StoreTimeoutError(f"{where}: not requested: the store answered no request within "
                                    f"{self.hung_for:g} s, {now - self._hung_at:.0f} s ago (one read at a time "
                                    f"tries it again)")  # fmt: skip
        self._trying = self._trying or trial
        try:
            got = await fn(*args)
        except StoreTimeoutError:
            self._timed_out(now)
            raise
        except ServerUnreachableError:  # (no answer, and no hang: the source marks the server down itself)
            raise
        except XetfsError:  # (an answer, if not the one wanted)
            self._answered()
            raise
        finally:
            self._trying = self._trying and not trial
        if isinstance(got, tuple) and any(isinstance(e, StoreTimeoutError) for e in got[1].values()):
            self._timed_out(now)
        else:
            self._answered()
        return got

    def _answered(self) -> None:
        now = trio.current_time()
        if self._hung_at is not None:
            log.warning("the store answers again (taken for hung %.0f s ago: its reads failed at once meanwhile)",
                        now - self._hung_since)  # fmt: skip
        self._answered_at, self._hung_at = now, None

    def _timed_out(self, began: float) -> None:
        """A fetch that began at ``began`` ran out of time: the store is hung unless another got an answer since."""
        if self._answered_at <= began:
            now = trio.current_time()
            if self._hung_at is None:
                log.warning("the store answered no request within %g s: its reads fail at once for %g s, then one "
                            "at a time tries it again", self.hung_for, self.hung_for)  # fmt: skip
                self._hung_since = now
                self.counters.hung += 1
            self._hung_at = now
