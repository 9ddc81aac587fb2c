"""Every verify backend against the reference (the spec): same inputs and the same random
numbers must give the same verdict, bit for bit.

Backends: "mps" (vectorised torch ops) runs on CPU tensors everywhere and on MPS tensors on a
Mac; "triton" runs compiled on CUDA, or under Triton's interpreter (TRITON_INTERPRET=1) on CPU
tensors when there is no GPU. triton is in the test extra on Linux x86-64 (its wheels' home),
so there a missing triton fails these tests instead of skipping them; elsewhere they skip. The
interpreter is slow, so cases use small vocabularies; the device run (scripts/gpu_check.sh)
adds the real one.
"""
import importlib
import math
import os
import platform
import sys

import pytest
import torch

from kernels.verify import reference
from kernels.verify.reference import Randomness, draw_randomness

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def _triton_backend():
    """The triton backend module, compiled on CUDA, interpreted on CPU; None without triton."""
    if importlib.util.find_spec("triton") is None:
        return None
    if not HAS_CUDA:
        # Must be set before the @triton.jit decorators run (they pick the interpreter then).
        os.environ["TRITON_INTERPRET"] = "1"
    return importlib.import_module("kernels.verify.triton_cuda")


def _devices():
    devs = ["cpu"]
    if HAS_CUDA:
        devs.append("cuda")
    if HAS_MPS:
        devs.append("mps")
    return devs


def _cases():
    """(backend name, device) pairs that this machine can run."""
    cases = [pytest.param("mps", d, id=f"mps-{d}") for d in _devices()]
    triton_device = "cuda" if HAS_CUDA else "cpu"
    cases.append(pytest.param("triton", triton_device, id=f"triton-{triton_device}"))
    return cases


@pytest.fixture
def backend_module(request):
    name, _ = request.param
    if name == "mps":
        return importlib.import_module("kernels.verify.mps")
    module = _triton_backend()
    if module is None:
        if sys.platform == "linux" and platform.machine() == "x86_64":
            pytest.fail("triton is not installed, but the test extra installs it here: run scripts/setup.sh "
                        "(or pip install -e '.[test]')")
        pytest.skip(f"triton is not installed ({sys.platform} {platform.machine()}: not in the test extra)")
    return module


def _interpreted(device: str) -> bool:
    return device == "cpu"


# Interpreter runs are ~100x slower than torch ops: fewer, smaller cases there. On a device the
# real vocabulary size is included (151,936: the Qwen2.5 vocabulary, 75 chunks of 2048).
def _sizes(name: str, device: str):
    if name == "triton" and _interpreted(device):
        return [(64, 12), (300, 8), (2048 + 5, 3)]
    sizes = [(64, 60), (513, 40), (5000, 20)]
    if device != "cpu":
        sizes.append((151936, 10))
    return sizes


def _params():
    out = []
    for case in _cases():
        name, device = case.values
        out.append(pytest.param((name, device), id=case.id))
    return out


def random_case(gen, vocab, device, sharp=2.0, k_max=8):
    k = int(torch.randint(0, k_max + 1, (1,), generator=gen))
    p = (torch.randn(k + 1, vocab, generator=gen) * sharp).softmax(-1)
    # A drafter that is close to the target on some rows and far on others, so that accept,
    # reject at every position and full acceptance all occur.
    noise = float(torch.rand((), generator=gen)) * 3
    q = (p[:k].log() + noise * torch.randn(k, vocab, generator=gen)).softmax(-1)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(-1) if k else torch.zeros(0, dtype=torch.long)
    return drafts.to(device), q.to(device), p.to(device)


@pytest.mark.parametrize("backend_module", _params(), indirect=True)
def test_greedy_matches_reference(backend_module, request):
    name, device = request.node.callspec.params["backend_module"]
    gen = torch.Generator().manual_seed(11)
    for vocab, cases in _sizes(name, device):
        for _ in range(cases):
            k = int(torch.randint(0, 9, (1,), generator=gen))
            logits = torch.randn(k + 1, vocab, generator=gen)
            if float(torch.rand((), generator=gen)) < 0.3:  # ties: lowest index must win
                logits = logits.round()
            choice = logits.argmax(-1)
            drafts = choice[:k].clone()
            if k and float(torch.rand((), generator=gen)) < 0.7:
                j = int(torch.randint(0, k, (1,), generator=gen))
                drafts[j] = (drafts[j] + 1) % vocab
            expected = reference.verify_greedy(drafts, logits)
            got = backend_module.verify_greedy(drafts.to(device), logits.to(device))
            assert tuple(got) == tuple(expected), (vocab, k)


@pytest.mark.parametrize("backend_module", _params(), indirect=True)
@pytest.mark.parametrize("drafter", ["model", "deterministic"])
def test_sampled_matches_reference_given_the_same_randomness(backend_module, drafter, request):
    name, device = request.node.callspec.params["backend_module"]
    gen = torch.Generator().manual_seed(12)
    seen_n = set()
    for vocab, cases in _sizes(name, device):
        for _ in range(cases):
            drafts, q, p = random_case(gen, vocab, device)
            q = None if drafter == "deterministic" else q
            draws = draw_randomness(drafts.shape[0], vocab, gen, device)
            expected = reference.sampled_verdict(drafts, q, p, draws)
            got = backend_module.sampled_verdict(drafts, q, p, draws)
            assert tuple(got) == tuple(expected), (vocab, drafts.shape[0])
            seen_n.add((expected.n_accepted, expected.n_accepted == drafts.shape[0]))
    # Rejections and full acceptances both happened, or the test proved little.
    assert any(full for _, full in seen_n) and any(not full for _, full in seen_n)


@pytest.mark.parametrize("backend_module", _params(), indirect=True)
def test_sampled_edge_cases(backend_module, request):
    """No residual mass (p == q on the rejected row), a one-hot target, k = 0."""
    _, device = request.node.callspec.params["backend_module"]
    vocab = 32
    p = torch.zeros(3, vocab)
    p[:, 5] = 1.0
    cases = [
        # the target says only 5; the drafter proposed 3 with certainty: reject, emit 5
        (torch.tensor([3, 5]), torch.nn.functional.one_hot(torch.tensor([3, 5]), vocab).float(), p),
        # k = 0: a plain draw from p_1
        (torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab), p[:1]),
    ]
    # q >= p everywhere (q = 2p: not a distribution, but what rounding can approach): the draft
    # is rejected and max(0, p - q) has no mass, so the draw falls back to p itself.
    pq = torch.full((2, vocab), 1.0 / vocab)
    cases.append((torch.tensor([0]), 2 * pq[:1], pq))
    for drafts, q, p_ in cases:
        draws = Randomness(torch.full((drafts.shape[0],), 0.999), torch.rand(vocab, generator=torch.Generator().manual_seed(1)) + 0.5)
        for q_ in (q, None):
            d, qq, pp = drafts.to(device), None if q_ is None else q_.to(device), p_.to(device)
            dr = Randomness(draws.accept_u.to(device), draws.race.to(device))
            expected = reference.sampled_verdict(d, qq, pp, dr)
            assert tuple(backend_module.sampled_verdict(d, qq, pp, dr)) == tuple(expected)


@pytest.mark.parametrize("backend_module", _params(), indirect=True)
def test_verify_sampled_consumes_the_generator_like_the_reference(backend_module, request):
    """Same seed -> same verdicts over a sequence of calls, and the generator ends in the same
    state: the backends draw exactly what the reference draws."""
    _, device = request.node.callspec.params["backend_module"]
    data = torch.Generator().manual_seed(13)
    cases = [random_case(data, 128, device) for _ in range(6)]
    g_ref, g_backend = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for drafts, q, p in cases:
        assert tuple(backend_module.verify_sampled(drafts, q, p, g_backend)) == tuple(reference.verify_sampled(drafts, q, p, g_ref))
    assert torch.equal(g_ref.get_state(), g_backend.get_state())


def test_draw_randomness_shapes_and_ranges():
    draws = draw_randomness(4, 1000, torch.Generator().manual_seed(0))
    assert draws.accept_u.shape == (4,) and draws.accept_u.dtype == torch.float32
    assert draws.race.shape == (1000,) and draws.race.dtype == torch.float32
    assert bool((draws.accept_u >= 0).all() and (draws.accept_u < 1).all())
    assert bool(torch.isfinite(draws.race).all() and (draws.race > 0).all())


def test_race_weights_are_reciprocals_of_exponentials():
    """1/w follows Exp(1): a Kolmogorov-Smirnov distance over 20 draws of a 151,936-entry
    vocabulary, and the smallest values, which win races, as often as Exp(1) has them."""
    gen = torch.Generator().manual_seed(11)
    e = torch.cat([draw_randomness(2, 151_936, gen).race.double().reciprocal() for _ in range(20)])
    n = e.numel()
    cdf = -torch.expm1(-e.sort().values)
    empirical = torch.arange(1, n + 1, dtype=torch.float64) / n
    distance = float(torch.maximum((empirical - cdf).abs(), (empirical - 1.0 / n - cdf).abs()).max())
    assert distance < 1.95 / n**0.5  # the 0.1% critical value
    for x in (1e-2, 1e-3, 1e-4):
        expected = n * -math.expm1(-x)
        assert abs(int((e < x).sum()) - expected) < 5 * expected**0.5


def test_race_weights_follow_the_generator():
    """The same generator state draws the same weights, the next draw others, and a draw moves
    the generator on (a seeded request repeats; its passes do not repeat each other)."""
    a, b = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    first, again = draw_randomness(3, 5000, a), draw_randomness(3, 5000, b)
    assert torch.equal(first.race, again.race) and torch.equal(first.accept_u, again.accept_u)
    second = draw_randomness(3, 5000, a)
    assert not torch.equal(first.race, second.race)
    ranks = [w.argsort().argsort().double() for w in (first.race, second.race)]
    assert abs(float(torch.corrcoef(torch.stack(ranks))[0, 1])) < 0.05  # 5,000 entries: 3.5 sigma
    assert not torch.equal(a.get_state(), b.get_state())
    draw_randomness(3, 5000, b)
    assert torch.equal(a.get_state(), b.get_state())


def test_race_samples_the_normalised_weights():
    """argmax r * (1/E) is a draw from r / sum(r) (the exponential race)."""
    from tests.stats_helpers import assert_same_distribution

    gen = torch.Generator().manual_seed(3)
    r = torch.tensor([0.0, 3.0, 1.0, 0.5, 0.0, 2.5])  # unnormalised on purpose
    draws = [reference.race(r, draw_randomness(0, 6, gen).race) for _ in range(6000)]
    assert_same_distribution(torch.tensor(draws), r / r.sum())


def test_default_backend_choice_follows_the_device(monkeypatch):
    import kernels.verify as verify

    expected = "triton" if HAS_CUDA and "triton" in verify.available_backends() else ("mps" if HAS_MPS else "reference")
    monkeypatch.delenv("TANDEM_VERIFY_BACKEND", raising=False)
    assert verify._default_backend() == expected
    monkeypatch.setenv("TANDEM_VERIFY_BACKEND", "mps")
    assert verify._default_backend() == "mps"
    monkeypatch.setenv("TANDEM_VERIFY_BACKEND", "no-such")
    assert verify._default_backend() == expected
