"""A kernel load survives a process killed inside torch's extension loader: torch's lock file
(a plain file its holder removes on the way out) left behind by a dead process is cleared, while
a live loader is still waited for. Fresh processes, since a module is loaded once per process."""
from __future__ import annotations

import subprocess
import sys

import pytest
from filelock import FileLock

from kernels import build
from kernels.attention import cpu_avx2

LOAD = "from kernels.attention import cpu_avx2; cpu_avx2._module(); print('loaded')"
# The same load, telling on stderr (filelock's debug log) each time it finds the lock held.
LOAD_TELLING = ("import logging, sys; logging.basicConfig(stream=sys.stderr, format='%(message)s');"
                " logging.getLogger('filelock').setLevel(logging.DEBUG); " + LOAD)


@pytest.fixture(scope="module")
def build_dir():
    if not cpu_avx2.available():  # builds it here first, so the children only load it
        pytest.skip("no AVX2 on this CPU")
    folder = build.build_directory("tandem_attention_avx2", cpu_avx2.SOURCE, build.headers_for(cpu_avx2.SOURCE))
    assert (folder / "build.ninja").exists(), folder
    return folder


def _load_in_a_fresh_process(code: str = LOAD) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_lock_left_by_a_killed_loader_does_not_block_the_next_load(build_dir):
    stale = build_dir / build.TORCH_LOCK
    stale.touch()  # what a loader killed between torch's acquire and release leaves
    proc = _load_in_a_fresh_process()
    try:
        out, err = proc.communicate(timeout=120)  # torch alone would poll for this file forever
    finally:
        proc.kill()
        stale.unlink(missing_ok=True)
    assert proc.returncode == 0 and out.strip() == "loaded", err[-2000:]


def test_a_live_loader_is_waited_for_not_overrun(build_dir):
    held = FileLock(build_dir.with_name(build_dir.name + ".tandem-lock"))
    with held:  # this process plays one loading now
        (build_dir / build.TORCH_LOCK).touch()
        proc = _load_in_a_fresh_process(LOAD_TELLING)
        try:
            told = ""
            while "not acquired" not in told:  # until it has found the lock held (EOF: it never did)
                line = proc.stderr.readline()
                assert line, f"the loader ended without waiting for the holder: {told[-2000:]}"
                told += line
            assert proc.poll() is None, proc.communicate()  # it waits for the holder
            assert (build_dir / build.TORCH_LOCK).exists()  # and leaves the live holder's lock alone
        except BaseException:
            proc.kill()
            raise
        (build_dir / build.TORCH_LOCK).unlink()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "loaded", err[-2000:]
