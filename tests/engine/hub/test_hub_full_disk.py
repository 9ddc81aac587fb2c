"""A disk that fills up mid-file (a real ENOSPC on a small tmpfs, tests/engine/hub/full_disk.py):
the download fails clearly, keeps what it wrote, installs nothing, and resumes once there is
space again."""
from __future__ import annotations

import pytest

from tests.engine.conftest import TARGET, WEIGHTS
from tests.engine.hub.full_disk import run_on_full_disk, tmpfs_available
from tests.engine.hub.test_hub import weights_gets

pytestmark = pytest.mark.timeout(120)


def test_a_disk_that_fills_mid_file_fails_clearly_and_the_next_run_resumes(fake_hub, tmp_path):
    if not tmpfs_available(tmp_path):
        pytest.skip("no unprivileged user+mount namespaces here (unshare -rm): cannot make a small disk")
    served = fake_hub.file(TARGET, WEIGHTS)
    fake_hub.rate_bps = 300_000  # ~2.7 s for the weights: time to fill the disk mid-file

    report = run_on_full_disk(tmp_path / "hf-home", TARGET, served.sha256)

    assert report["filled"] > 0
    assert report["first_kind"] == "disk_full", report
    assert "disk filled up" in report["first_error"] and f"{TARGET}/{WEIGHTS}" in report["first_error"]
    assert 100_000 < report["kept"] < len(served.data) and not report["installed_after_failure"]
    assert report["second_kind"] == "DownloadFinished" and report["second_bytes_match"] and report["installed"]
    assert report["started_from"] >= report["kept"]
    fake_hub.wait_idle()  # the first body's handler logs when it notices the client has gone
    resumed = [e for e in weights_gets(fake_hub) if e.status == 206]
    assert [e.range for e in resumed] == [f"bytes={report['kept']}-"]
    assert resumed[0].bytes_sent == len(served.data) - report["kept"]
