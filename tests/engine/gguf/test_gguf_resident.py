"""Keeping a GGUF target's mapped weights in RAM (--mlock): locked where the limit allows,
a clear refusal where it does not, and the session's runs unchanged either way."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.gguf.reader import open_gguf
from engine.gguf.resident import CannotKeepResident, keep_resident
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="mlock is POSIX")


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    from engine.testing.tiny_gguf import write_gguf_pair

    target, _ = write_gguf_pair(tmp_path_factory.mktemp("resident"))
    return target


def _locked_kib() -> int | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmLck:")), None)


def test_the_whole_file_is_locked(tiny_target):
    file = open_gguf(tiny_target)
    before = _locked_kib()
    resident = keep_resident(file)
    assert resident.locked_bytes == tiny_target.stat().st_size
    assert "kept in RAM" in resident.describe()
    if before is not None:  # Linux says how much of this process is locked
        assert _locked_kib() - before >= tiny_target.stat().st_size // 1024


def test_a_limit_that_does_not_cover_the_file_is_a_clear_refusal(tiny_target):
    """In a child whose locked-memory limit is 0 (and, run as root, without root's privilege to
    pass it): refused, saying the limit and what to do; nothing stays locked."""
    child = textwrap.dedent(f"""
        import ctypes.util, os, resource
        from engine.gguf.reader import open_gguf
        from engine.gguf.resident import CannotKeepResident, keep_resident
        file = open_gguf({str(tiny_target)!r})  # mapped first: Python's own files may be root's alone
        if os.geteuid() == 0:
            os.setgroups([]); os.setgid(65534); os.setuid(65534)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
        try:
            keep_resident(file)
        except CannotKeepResident as exc:
            print("refused:", exc)
    """)
    repo = REPO_ROOT
    out = subprocess.run([sys.executable, "-c", child], cwd=repo, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:"), out.stdout + out.stderr
    assert tiny_target.name in out.stdout and "ulimit -l" in out.stdout and "--mlock" in out.stdout


def test_a_session_keeps_its_gguf_target_resident_and_says_when_it_cannot(tiny_target, tmp_path):
    from engine.core.settings import DecodeSettings
    from engine.session.compare import drain
    from engine.session.session import Session

    session = Session.load(tiny_target, None, precision="file")
    ids = session.encode("hello")
    before = drain(session.plain(ids, DecodeSettings(max_new_tokens=6)))
    assert session.keep_weights_resident().locked_bytes == tiny_target.stat().st_size
    session.forget_prefixes()
    assert drain(session.plain(ids, DecodeSettings(max_new_tokens=6))).token_ids == before.token_ids
    session.target = type(session.target)(**{**session.target.__dict__, "gguf_file": None})
    with pytest.raises(CannotKeepResident, match="already held in RAM"):
        session.keep_weights_resident()
