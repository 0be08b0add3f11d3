"""The read path: read sessions, the reader, runs and their eviction, the loader and the decode workers."""
