"""Fixtures for the server tests: a tiny random pair in a Session, and a real uvicorn server on
127.0.0.1 with an ephemeral port."""
from __future__ import annotations

import pytest
import torch

WINDOW = 4096  # the tiny target's context window: room for long streams to cancel


@pytest.fixture(scope="session")
def tiny_session():
    """A Session on a tiny random Qwen2 target and a perturbed copy of it as drafter."""
    from engine.core.settings import DrafterOptions
    from engine.models.loading.loader import LoadedModel
    from engine.session.session import Session
    from engine.testing.tiny_models import build_model, build_tokenizer, perturbed_copy

    tokenizer = build_tokenizer()
    target = build_model(len(tokenizer), hidden=64, layers=4, seed=0, max_positions=WINDOW)
    drafter = perturbed_copy(target, 0.01, 1000)
    loaded = lambda name, model: LoadedModel(name, model, tokenizer, torch.device("cpu"), torch.float32, 0.0)
    return Session(loaded("tiny-target", target), loaded("tiny-drafter", drafter), DrafterOptions(head="full"))


@pytest.fixture
def endless_session(tiny_session):
    """The same session with no EOS token: every generation runs to its max_tokens, so lengths
    are exact and a long stream stays long."""
    saved = tiny_session.eos_ids
    tiny_session.eos_ids = set()
    yield tiny_session
    tiny_session.eos_ids = saved


@pytest.fixture
def start_server():
    """start_server(session, **ServerConfig fields) -> a running ServerHandle, stopped at teardown."""
    from engine.serving.server import ServerConfig, run_in_thread

    handles = []

    def start(session, **fields):
        fields.setdefault("port", 0)
        handle = run_in_thread(session, ServerConfig(**fields))
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()
