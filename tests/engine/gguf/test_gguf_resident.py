"""Keeping a GGUF target's mapped weights in RAM (--mlock): locked where the limit allows, a
private copy where it does not, a clear refusal where neither can hold them, and the session's
runs unchanged either way."""
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


def _in_a_child_without_the_lock_limit(tiny_target, body: str) -> str:
    """Run ``body`` in a child whose locked-memory limit is 0 (and, run as root, without root's
    privilege to pass it), ``file`` being the tiny target opened there; returns its stdout."""
    child = textwrap.dedent(f"""
        import json, os, resource
        from engine.gguf.reader import open_gguf
        from engine.gguf.resident import CannotKeepResident, keep_resident
        file = open_gguf({str(tiny_target)!r})  # mapped first: Python's own files may be root's alone
        if os.geteuid() == 0:
            os.setgroups([]); os.setgid(65534); os.setuid(65534)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    """) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", child], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_where_the_limit_forbids_locking_the_weights_become_a_private_copy(tiny_target):
    """The mapping's pages turn into the process's own (anonymous) memory, which the system cannot
    drop as page cache; the bytes read back unchanged."""
    out = _in_a_child_without_the_lock_limit(tiny_target, """
        before = bytes(file._maps[0])
        resident = keep_resident(file)
        base = file._maps[0].ctypes.data
        anonymous = 0
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start <= base < end or (start >= base and end <= base + len(before))
                elif inside and head == "Anonymous:":
                    anonymous += int(line.split()[1]) * 1024
        print(json.dumps({"how": resident.how, "text": resident.describe(), "bytes": resident.locked_bytes,
                          "anonymous": anonymous, "same": bytes(file._maps[0]) == before}))
    """)
    import json

    found = json.loads(out)
    size = tiny_target.stat().st_size
    assert found["how"] == "private copy" and found["bytes"] == size and found["same"]
    assert found["anonymous"] >= size // 4096 * 4096, found  # every whole page is the process's own now
    assert "private copy" in found["text"] and "ulimit -l" in found["text"], found["text"]


@pytest.mark.parametrize("case", ["no copy allowed", "no memory for a copy"])
def test_where_neither_lock_nor_copy_can_hold_them_the_refusal_says_why(tiny_target, case):
    """Refused, saying the limit and what to do; nothing stays locked."""
    call = "keep_resident(file, allow_copy=False)" if case == "no copy allowed" else "keep_resident(file, available=1 << 20)"
    out = _in_a_child_without_the_lock_limit(tiny_target, f"""
        try:
            {call}
        except CannotKeepResident as exc:
            print("refused:", exc)
    """)
    assert out.startswith("refused:"), out
    assert tiny_target.name in out and "ulimit -l" in out and "--mlock" in out
    if case == "no memory for a copy":
        assert "nor copy them: 1 MiB of memory is free" in out, out


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


def test_matrices_the_kernels_hold_in_their_own_layout_are_left_out(tiny_target):
    """Where the kernels computed a matrix into their own layout (the AVX2 tiles' copy), its whole
    pages of the file are neither locked nor read back; every other byte is held."""
    import mmap

    file = open_gguf(tiny_target)
    tensor = max(file.tensors.values(), key=lambda t: t.nbytes)
    view = tensor.data
    start, nbytes = view.data_ptr() - file._maps[0].ctypes.data, view.numel() * view.element_size()
    inside = (start + nbytes) // mmap.PAGESIZE - -(-start // mmap.PAGESIZE)  # whole pages inside the tensor
    assert inside >= 2, "the tiny target's largest tensor spans whole pages"
    before = _locked_kib()
    resident = keep_resident(file, held_elsewhere=[view])
    assert resident.locked_bytes == tiny_target.stat().st_size - inside * mmap.PAGESIZE
    assert resident.elsewhere_bytes == inside * mmap.PAGESIZE
    assert f"{inside * mmap.PAGESIZE / 2**20:,.0f} MiB more held as the CPU kernels' own layout" in resident.describe()
    if before is not None:  # Linux counts locked pages: the file's last one is partly past its end
        assert abs((_locked_kib() - before) * 1024 - resident.locked_bytes) < mmap.PAGESIZE
    # A range outside the file, or less than a page, changes nothing.
    assert keep_resident(open_gguf(tiny_target), held_elsewhere=[view[:1]]).locked_bytes == tiny_target.stat().st_size
