"""The engine sets OpenMP's spin count before torch loads (engine/__init__.py), unless the user
has: torch's idle pool thread then waits out a decode step's short gaps instead of sleeping."""
import os
import subprocess
import sys

PROBE = "import os, engine, torch; print(os.environ.get('GOMP_SPINCOUNT'))"


def _spin(env: dict) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    return subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_engine_sets_a_spin_count_and_a_users_own_wins():
    assert _spin({}) == "300000"
    assert _spin({"GOMP_SPINCOUNT": "1000"}) == "1000"


def test_the_app_sets_it_too_without_importing_torch():
    code = "import sys, os, app; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    clean = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["300000", "False"]
