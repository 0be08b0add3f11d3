"""The project's exception hierarchy.

Every failure that xetfs reports on purpose is a ``XetfsError``.  Format errors
mean "these bytes are not what the Xet format allows"; ``IntegrityError`` means
"well-formed, but a hash does not match"; ``MissingObjectError`` means "a
reference points at an object the store does not have".  Messages always name
the object, the offset (when there is one) and what was wrong.
"""

from __future__ import annotations


class XetfsError(Exception):
    """Base class of every error xetfs raises deliberately."""

    # The file bytes ``[start, stop)`` a read could not get because of it, where the reader knows them (a read
    # may span several xorbs, and fail for one): None otherwise.
    file_range: tuple[int, int] | None = None


class FormatError(XetfsError):
    """Bytes that do not follow the Xet format."""


class ShardFormatError(FormatError):
    """A malformed shard (``*.mdb``)."""


class XorbFormatError(FormatError):
    """A malformed xorb: bad footer, bad chunk header or undecodable payload."""


class ManifestError(FormatError):
    """A names manifest that cannot be used at all."""


class IntegrityError(XetfsError):
    """Well-formed data whose hash (or size) does not match the recorded one."""


class MissingObjectError(XetfsError):
    """A reference to a xorb, chunk or file that the store does not hold."""


class ObjectReadError(XetfsError):
    """An object the store holds that could not be opened or read: no permission, a disk I/O error."""


class StoreError(XetfsError):
    """The store as a whole cannot be used (missing directory, no shards...)."""


class ServerUnreachableError(StoreError):
    """A remote store's server could not be reached (no connection), or was marked down after that."""


class NoRangeRequestsError(StoreError):
    """A web server sends whole objects for range requests (Python's ``http.server``, say): it serves a store's
    listing and shards, read whole, but no xorb."""


class StoreTimeoutError(XetfsError):
    """A read from the store did not finish within the configured bound."""


def describe(exc: BaseException) -> str:
    """One line for a user: ``path: reason`` for OS errors, the message otherwise."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


class CatalogueError(FormatError):
    """A Hub catalogue (``xetfs-hub.json``) that cannot be used at all."""
