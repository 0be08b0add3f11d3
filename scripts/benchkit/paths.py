"""Where the repository and its scripts are."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPTS = REPO / "scripts"
CEILING = SCRIPTS / "ceiling_fs.py"
