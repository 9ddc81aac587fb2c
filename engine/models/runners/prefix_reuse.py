"""Keep the key/value cache of earlier requests, so a request that continues one (a chat's next
turn, regenerate, an edited last message, the server's next request in a conversation) prefills
only the tokens it does not share with it.

A runner records the token at each cached position (``tokens``); the cache for a prefix depends
on that prefix alone, so keeping the longest common prefix of the cached tokens and the new
prompt and feeding the rest computes what a fresh prefill computes. On the runners whose every
row is batch-invariant (GgufRunner, FusedRunner) that holds bit for bit.

``RunnerPool`` keeps a few runners (one per recent conversation), leases the one that shares the
longest prefix with a prompt, and drops the least recently used beyond its bounds in count and
in key/value bytes.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

#: Key/value memory the idle caches of other conversations may hold together, beyond the one a
#: chat continues (always kept). The memory fit budgets one conversation (engine.models.planning.memory_fit);
#: this is what serving several at once may add: at the default target's 8k context, fp16, about
#: four conversations.
KEPT_CACHE_BYTES = 1 << 30


def common_prefix(cached: Sequence[int | None], prompt: Sequence[int]) -> int:
    """How many first tokens the two sequences share."""
    n = 0
    for a, b in zip(cached, prompt):
        if a != b:
            break
        n += 1
    return n


def reusable_prefix(runner, prompt_ids: Sequence[int]) -> int:
    """How many of ``prompt_ids``' first tokens ``runner``'s cache can keep: their common prefix,
    less the prompt's last token, which is always fed (its logits choose the first new one)."""
    n = common_prefix(runner.tokens, prompt_ids[: len(prompt_ids) - 1])
    if n < runner.length and not runner.can_crop:
        return 0
    return n


def keep_common_prefix(runner, prompt_ids: Sequence[int]) -> int:
    """Crop ``runner``'s cache to the prefix it shares with ``prompt_ids`` (reset it where none
    can be kept); return the number of prompt tokens that need no prefill."""
    n = reusable_prefix(runner, prompt_ids)
    if n == 0:
        runner.reset()
    else:
        runner.crop(n)
    return n


class RunnerPool:
    """Runners (KV caches) of recent requests on one model.

    ``make``: builds a new, empty runner. ``max_idle``: runners kept between requests.
    ``max_idle_bytes``: the most key/value memory they hold together (the least recently used
    go first; the one just released is always kept, as the next turn of a chat wants it)."""

    def __init__(self, make: Callable[[], object], max_idle: int = 4, max_idle_bytes: int = KEPT_CACHE_BYTES) -> None:
        self.make = make
        self.max_idle = max_idle
        self.max_idle_bytes = max_idle_bytes
        self._idle: list = []  # least recently used first
        self._lock = threading.Lock()

    def lease(self, prompt_ids: Sequence[int]):
        """The idle runner that shares the longest prefix with ``prompt_ids`` (a new one where none
        shares any); it is the caller's until ``release``."""
        with self._lock:
            best, best_n = None, 0
            for runner in self._idle:
                n = reusable_prefix(runner, prompt_ids)
                if n > best_n:
                    best, best_n = runner, n
            if best is None and len(self._idle) >= self.max_idle:
                best = self._idle[0]  # no prefix to share: reuse the oldest cache's memory
            if best is not None:
                self._idle.remove(best)
                return best
        return self.make()

    def release(self, runner) -> None:
        """``runner``'s request is over: keep its cache for the next one."""
        with self._lock:
            if runner in self._idle:
                return
            self._idle.append(runner)
            while len(self._idle) > self.max_idle:
                self._idle.pop(0)
            while len(self._idle) > 1 and sum(r.kv_bytes for r in self._idle) > self.max_idle_bytes:
                dropped = self._idle.pop(0)
                log.debug("dropped a kept cache of %d tokens", dropped.length)

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def kept_tokens(self) -> list[int]:
        """The cached length of each idle runner, least recently used first."""
        with self._lock:
            return [r.length for r in self._idle]
