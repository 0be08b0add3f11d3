"""The circuit breaker of a remote store's fetches (xetfs/read/breaker.py), on trio's mock clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from xetfs.base.errors import ServerUnreachableError, StoreTimeoutError
from xetfs.read.breaker import StoreBreaker

pytestmark = pytest.mark.unit


def test_a_store_is_taken_for_hung_only_when_no_fetch_got_an_answer_meanwhile(caplog: pytest.LogCaptureFixture) -> None:
    """After a fetch ran out of time with no other answered since it began, fetches fail at once for
    ``hung_for``, then one at a time tries the store again, and an answer ends it.  A fetch that ran out of
    time while another got an answer (one slow object) takes nothing down."""
    breaker = StoreBreaker(5)
    calls: list[str] = []
    counted = breaker.counters

    async def stalls(name: str) -> None:
        calls.append(name)
        await trio.sleep(3)
        raise StoreTimeoutError(f"{name}: store read took more than 3 s")

    async def answers(name: str, wait: float = 0, until: trio.Event | None = None) -> None:
        calls.append(name)
        await trio.sleep(wait)
        if until is not None:
            await until.wait()

    async def fetch(fn: object, *args: object) -> str:
        try:
            await breaker.fetch("xorb x", fn, *args)  # type: ignore[arg-type]
        except StoreTimeoutError as exc:
            return "not requested" if "not requested" in str(exc) else "timed out"
        return "answered"

    async def main() -> None:
        async with trio.open_nursery() as nursery:  # a slow object while the store answers others
            nursery.start_soon(fetch, stalls, "slow")
            nursery.start_soon(fetch, answers, "other", 1.0)
        assert await fetch(answers, "next") == "answered"
        assert await fetch(stalls, "hangs") == "timed out"  # nothing answered meanwhile: hung
        assert await fetch(answers, "refused") == "not requested"
        await trio.sleep(4.9)
        assert await fetch(answers, "still refused") == "not requested"
        await trio.sleep(0.1)
        held = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch, answers, "trial", 0, held)  # one tries the store again...
            await trio.testing.wait_all_tasks_blocked()
            assert await fetch(answers, "meanwhile") == "not requested"  # ...the others still fail at once
            held.set()
        assert await fetch(answers, "after") == "answered"  # an answer ended it
        assert await fetch(stalls, "hangs again") == "timed out"
        await trio.sleep(5)
        assert await fetch(stalls, "trial times out") == "timed out"  # taken for hung again, from now
        assert await fetch(answers, "refused again") == "not requested"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sorted(calls[:2]) == ["other", "slow"]  # (started together: in either order)
    assert (counted.hung, counted.not_requested) == (2, 4)  # (hangs, hangs again; four fetches not asked)
    assert calls[2:] == ["next", "hangs", "trial", "after", "hangs again", "trial times out"]
    assert [r.getMessage() for r in caplog.records] == [
        "the store answered no request within 5 s: its reads fail at once for 5 s, then one at a time tries it again",
        "the store answers again (taken for hung 5 s ago: its reads failed at once meanwhile)",
        "the store answered no request within 5 s: its reads fail at once for 5 s, then one at a time tries it again",
    ]


def test_a_server_out_of_reach_is_neither_an_answer_nor_a_hang(caplog: pytest.LogCaptureFixture) -> None:
    """A fetch refused for want of a connection (the source marks the server down itself) leaves the breaker
    as it was: a hung store stays hung, and a store that answers is not taken for hung."""
    breaker = StoreBreaker(5)

    async def refused() -> None:
        raise ServerUnreachableError("xorb x: not requested: server marked down 0.1 s ago")

    async def stalls() -> None:
        await trio.sleep(3)
        raise StoreTimeoutError("xorb x: store read took more than 3 s")

    async def main() -> None:
        with pytest.raises(ServerUnreachableError):
            await breaker.fetch("xorb x", refused)
        with pytest.raises(StoreTimeoutError, match="took more than"):
            await breaker.fetch("xorb x", stalls)
        await trio.sleep(5)
        with pytest.raises(ServerUnreachableError):  # the trial: out of reach
            await breaker.fetch("xorb x", refused)
        await trio.sleep(5)
        with pytest.raises(StoreTimeoutError, match="took more than"):  # still hung: a trial, not all at once
            await breaker.fetch("xorb x", stalls)
        with pytest.raises(StoreTimeoutError, match="not requested"):
            await breaker.fetch("xorb x", stalls)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not any("answers again" in r.getMessage() for r in caplog.records)
