"""Two real ``tandem serve`` servers on loopback for the remote-client tests: the same tiny
random model, one drafting with its draft model, one decoding plainly. Each has a Session of
its own, so the two can decode at the same time (a race)."""
from __future__ import annotations

import pytest
import torch


def tiny_session():
    from engine.core.settings import DrafterOptions
    from engine.models.loading.loader import LoadedModel
    from engine.session.session import Session
    from engine.testing.tiny_models import build_model, build_tokenizer, perturbed_copy

    tokenizer = build_tokenizer()
    target = build_model(len(tokenizer), hidden=64, layers=4, seed=0, max_positions=4096)
    drafter = perturbed_copy(target, 0.01, 1000)
    loaded = lambda name, model: LoadedModel(name, model, tokenizer, torch.device("cpu"), torch.float32, 0.0)
    session = Session(loaded("tiny-target", target), loaded("tiny-drafter", drafter), DrafterOptions(head="full"))
    session.eos_ids = set()  # every reply runs to max_tokens: lengths are exact
    return session


@pytest.fixture(scope="module")
def two_servers():
    """(speculating handle, plain handle), both serving model id "tiny-target"."""
    from engine.serving.server import ServerConfig, run_in_thread

    on = run_in_thread(tiny_session(), ServerConfig(port=0))
    off = run_in_thread(tiny_session(), ServerConfig(port=0, default_drafter="off"))
    yield on, off
    on.stop()
    off.stop()
