"""The base: errors, hashes, counters, settings, messages; imports nothing else of xetfs."""
