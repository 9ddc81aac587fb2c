"""A chi-square goodness-of-fit check with a stated tolerance (false alarm rate 1e-4)."""
from __future__ import annotations

import math

import torch


def chi2_critical(dof: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(dof) by Wilson-Hilferty; z = 3.719 is the 1e-4 tail."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def assert_same_distribution(samples: torch.Tensor, probs: torch.Tensor) -> None:
    """Samples (token ids) must be consistent with ``probs``. Cells with tiny expected counts
    are pooled so that the chi-square approximation holds."""
    n = samples.numel()
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * n
    assert counts[expected == 0].sum() == 0, "drew a token the target gives zero probability"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = max(1, int(keep.sum()) - 1)
    assert stat < chi2_critical(dof), f"chi2={stat:.1f} > {chi2_critical(dof):.1f} (dof={dof})"


def exact_law(target, prompt: list[int], n_tokens: int, temperature: float, top_k: int) -> dict[tuple[int, ...], float]:
    """{(t1, .., tn): probability} of the target's next ``n_tokens`` under sampling at
    ``temperature`` with ``top_k``, computed exactly (every branch), for the chi-square tests."""
    from kernels.sampling import process_logits

    law = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for seq, prob in law.items():
            with torch.inference_mode():
                logits = target(torch.tensor([prompt + list(seq)])).logits[0, -1]
            p = process_logits(logits, temperature, top_k)
            for t in torch.nonzero(p).flatten().tolist():
                nxt[seq + (t,)] = prob * float(p[t])
        law = nxt
    return law
