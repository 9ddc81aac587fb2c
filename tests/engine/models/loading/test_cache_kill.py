"""kill -9 while an int8 / int4 weight cache (a target's or a drafter's) is written, 20 times: afterwards the cache is
absent or complete and verified, never a half-written file taken for a cache, and no cache a
finished write left is lost. The temporaries the kills leave are removed by a later run.

The writers are forked from a forkserver that has imported torch but never run it, so each
child starts in milliseconds and safely (a fork of a process whose OpenMP threads ran can hang).
"""
import itertools
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from engine.quant import weight_cache

KILLS = 20
_MB = 1 << 20


def _tensors(kind: str, i: int) -> dict[str, torch.Tensor]:
    """16 MB shaped like one layer's cache entry, every value derived from ``i``."""
    if kind == "int8":
        return {"layer.q": torch.full((2048, 8192), i % 100, dtype=torch.int8), "layer.scale": torch.full((2048,), i + 1.0)}
    return {"layer.packed": torch.full((512, 256, 4, 32), i % 250, dtype=torch.uint8),
            "layer.scale": torch.full((2048, 256), i + 1.0, dtype=torch.float16),
            "layer.offset": torch.full((2048, 256), -1.0 - i, dtype=torch.float16)}


def _write_forever(home: str, model_dir: str, kind: str, acks: str, role: str) -> None:
    os.environ["TANDEM_HOME"] = home
    torch.set_num_threads(1)
    with open(acks, "a") as log:
        log.write("ready\n")
        log.flush()
        for i in itertools.count():
            weight_cache.save(Path(model_dir), _tensors(kind, i), kind, role=role)
            log.write(f"{i}\n")
            log.flush()


def _load(model_dir: Path, kind: str, role: str):
    """A target at precision ``kind``, or a drafter holding ``kind`` weights."""
    from engine.models.loading.loader import load_model

    if role == "drafter":
        return load_model(model_dir, "bf16", "cpu", role="drafter", weights=kind)
    return load_model(model_dir, kind, "cpu")


def _first_load(home: str, model_dir: str, kind: str, acks: str, role: str) -> None:
    """What a user's first load does: quantize, write the cache; then idle until killed."""
    os.environ["TANDEM_HOME"] = home
    torch.set_num_threads(1)
    weight_cache.cache_path(Path(model_dir), kind, role).unlink(missing_ok=True)
    with open(acks, "a") as log:
        log.write("ready\n")
        log.flush()
        _load(Path(model_dir), kind, role)
        log.write("0\n")
        log.flush()
    time.sleep(3600)


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    # This module and the model classes too: the children then start without importing anything
    # (transformers' lazy imports take ~7 s in a fresh process).
    ctx.set_forkserver_preload(["torch", "safetensors.torch", "engine.quant.weight_cache", "engine.models.loading.loader", __name__,
                                "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
                                "transformers.models.qwen2.modeling_qwen2"])
    return ctx


def _kill_repeatedly(ctx, target, args, acks: Path, rng: random.Random, max_delay: float, check) -> dict:
    counts = {"tried": 0, "absent": 0, "complete_verified": 0, "half_written_used": 0, "data_lost": 0}
    for _ in range(KILLS):
        acks.write_text("")
        proc = ctx.Process(target=target, args=args)
        proc.start()
        deadline = time.monotonic() + 60
        while not acks.read_text() and time.monotonic() < deadline:  # started: its writes begin now
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, max_delay))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        done = [int(line) for line in acks.read_text().split()[1:]]
        counts["tried"] += 1
        outcome = check(done)
        counts[outcome] += 1
    return counts


@pytest.mark.parametrize(("kind", "role"), [("int8", "target"), ("int4", "target"), ("int4", "drafter")])
def test_kill_9_during_cache_writes_never_leaves_a_half_written_cache(tmp_path, forkserver, kind, role):
    home, model_dir, acks = Path(os.environ["TANDEM_HOME"]), tmp_path / "model", tmp_path / "acks"  # the children are told
    model_dir.mkdir()
    path = weight_cache.cache_path(model_dir, kind, role)
    history = {"last_written": None}

    def check(done: list[int]) -> str:
        cached = weight_cache.load(model_dir, kind, role=role)  # verifies the digest; removes a bad file
        if cached is None:
            # Lost: a write that finished (acknowledged) left nothing that loads.
            return "data_lost" if done or history["last_written"] is not None else "absent"
        i = int(cached["layer.scale"].flatten()[0].item()) - 1
        if any(not torch.equal(cached[k], v) for k, v in _tensors(kind, i).items()):
            return "half_written_used"
        # The file holds the last acknowledged write or the one after it (renamed just before
        # the kill); with no write acknowledged, the previous run's or this run's first.
        allowed = (done[-1], done[-1] + 1) if done else (history["last_written"], 0)
        assert i in allowed, (done, i, history)
        history["last_written"] = i
        return "complete_verified"

    counts = _kill_repeatedly(forkserver, _write_forever, (str(home), str(model_dir), kind, str(acks), role), acks,
                              random.Random(7), 0.3, check)
    orphans = list(path.parent.glob("*.tmp*"))
    for orphan in orphans:  # as a later run finds them: untouched for a while, their writers dead
        then = time.time() - 3600
        os.utime(orphan, (then, then))
    freed = weight_cache.remove_stale_temporaries()
    print(f"\nkill -9 during {kind} {role} cache writes: {counts}; orphaned temporaries {len(orphans)}"
          f" ({freed / _MB:.0f} MiB), all removed by the next run")
    assert counts["tried"] == KILLS and counts["half_written_used"] == 0 and counts["data_lost"] == 0
    assert counts["complete_verified"] > 0  # the kills did land after some writes
    assert not list(path.parent.glob("*.tmp*"))


@pytest.mark.slow
@pytest.mark.parametrize("role", ["target", "drafter"])
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_kill_9_during_the_first_quantized_load(tmp_path, monkeypatch, forkserver, kind, role):
    """The user's case: killed while the first int8 / int4 load of a target or a drafter
    quantizes and caches (a tiny model, so each load takes a fraction of a second). The next
    load reads a verified cache or quantizes again; its output is the same either way."""
    from engine.models.runners.runner import ModelRunner
    from engine.testing.tiny_models import save_pair

    target, drafter = save_pair(tmp_path)
    model_dir = target if role == "target" else drafter
    home, acks = tmp_path / "own-home", tmp_path / "acks"
    monkeypatch.setenv("TANDEM_HOME", str(home))  # slow tests share the user's cache; this one needs none of it
    reference = _load(model_dir, kind, role)
    ids = reference.tokenizer("def add(a, b):")["input_ids"]
    expected = ModelRunner(reference.model).forward(ids)

    def check(done: list[int]) -> str:
        loaded = _load(model_dir, kind, role)
        if not torch.equal(ModelRunner(loaded.model).forward(ids), expected):
            return "half_written_used"
        if done and not loaded.from_cache:
            return "data_lost"  # the killed load had finished its cache, and it did not load
        return "complete_verified" if loaded.from_cache else "absent"

    counts = _kill_repeatedly(forkserver, _first_load, (str(home), str(model_dir), kind, str(acks), role), acks,
                              random.Random(11), 0.6, check)
    print(f"\nkill -9 during the first {kind} load of a tiny {role}: {counts}")
    assert counts["tried"] == KILLS and counts["half_written_used"] == 0
