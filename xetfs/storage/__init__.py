"""The store: object sources (a directory, HTTP and buckets), the disk cache, the index, manifest and catalogue."""
