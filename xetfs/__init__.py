"""xetfs: read Hugging Face Xet storage as plain files."""

__version__ = "0.1.0"
