"""Test-only helpers (not part of the xetfs package)."""
