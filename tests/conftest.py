import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_pair():
    """(tokenizer, target, drafter): tiny random Qwen2 models sharing a real BPE tokenizer."""
    from engine.tiny_models import build_pair

    return build_pair(seed=0)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own cache/data/log dirs unless it opts into the real ones."""
    if "TANDEM_REAL_HOME" not in os.environ:
        monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "tandem-home"))
