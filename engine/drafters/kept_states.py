"""The target's states a drafter reads (final hidden states, or the inputs of a few layers),
kept from each pass until the drafter's next proposal: the target's next pass replaces them."""
from __future__ import annotations

import torch


class KeptStates:
    def __init__(self, kept: int = 0) -> None:
        """``kept``: positions 0 .. kept - 1 already read (a cache kept from an earlier request)."""
        self.reset()
        self.kept = kept

    def reset(self) -> None:
        self.rows: list[torch.Tensor] = []
        #: Positions 0 .. kept - 1 have been kept (and read, or waiting in ``rows``).
        self.kept = 0

    def keep(self, states: torch.Tensor | None, start: int, upto: int, what: str) -> None:
        """Keep rows for positions kept .. upto - 1 of ``states``, whose row 0 is position ``start``."""
        if upto <= self.kept:
            return
        offset = self.kept - start
        if states is None or offset < 0:
            raise RuntimeError(f"the target pass did not keep {what} from position {self.kept}")
        self.rows.append(states[offset : upto - start])
        self.kept = upto

    def take(self) -> torch.Tensor:
        """Every kept row not read yet, in position order [n, width]."""
        rows = torch.cat(self.rows, dim=0)
        self.rows = []
        return rows


def keep_first(drafter, kept: int) -> int:
    """Cut a drafter made for the target back to its first ``kept`` positions (its cache and the
    states it has read), for a next request that shares them; nothing kept resets it. Returns
    ``kept``."""
    if kept <= 0:
        drafter.reset()
        return 0
    drafter.length = kept
    drafter._states = KeptStates(kept)
    return kept
