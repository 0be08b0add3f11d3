"""Pure parsers for the Xet formats: bytes in, frozen records out.

Nothing in this package opens files, caches or logs; malformed input raises
``XorbFormatError`` or ``ShardFormatError`` with the object, the offset and
what was wrong.
"""
