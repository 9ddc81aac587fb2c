import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))
# Without a GPU the Triton verify kernels run under Triton's interpreter (their parity tests,
# tests/kernels/test_verify_backends.py). It has to be chosen before triton is first imported,
# and transformers' model classes import it: so here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# huggingface_hub reads HF_HUB_OFFLINE once, when first imported, as a process started offline
# does. Imported here, its mode is this run's environment's, not that of whichever test
# happened to import it first while it set HF_HUB_OFFLINE for itself.
import huggingface_hub.constants  # noqa: E402, F401


@pytest.fixture
def one_torch_thread():
    """torch's CPU int4 op splits even a tiny call across its threads; on a loaded machine the
    wait for the second one cost ~5 ms a call (12 us on one thread, measured): run on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_pair():
    """(tokenizer, target, drafter): tiny random Qwen2 models sharing a real BPE tokenizer."""
    from engine.testing.tiny_models import build_pair

    return build_pair(seed=0)


@pytest.fixture(scope="session")
def default_pair_paths():
    """(target, drafter) folders of the real default pair; slow tests fail without the set-up."""
    from engine.models.loading import default_pair

    found = default_pair.installed_paths()
    if found is None:
        pytest.fail("default model pair not installed: run `make setup` first")
    return found


@pytest.fixture(autouse=True)
def isolated_home(request, tmp_path, monkeypatch):
    """Every test gets its own cache/data/log dirs. Slow tests share the user cache (the real
    default model pair the set-up installed there) but keep their data, logs and settings to
    themselves: a test's chats must never show up in the user's app."""
    from engine.core.paths import cache_dir

    home = tmp_path / "tandem-home"
    if request.node.get_closest_marker("slow") is not None:
        real_cache = cache_dir()
        home.mkdir(parents=True, exist_ok=True)
        (home / "cache").symlink_to(real_cache, target_is_directory=True)
    monkeypatch.setenv("TANDEM_HOME", str(home))
