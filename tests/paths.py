"""Where the tests find the repository, whatever folder depth a test module sits at."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
