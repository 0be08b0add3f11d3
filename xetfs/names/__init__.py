"""Names: the directory tree a mount shows (the named tree, and the Hub cache layout)."""
