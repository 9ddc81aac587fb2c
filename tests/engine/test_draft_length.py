"""The draft-length controller picks k from measured costs and acceptance."""
from engine.draft_length import DraftLengthController


def feed(ctrl, steps, accept_rate, step_s, verify_slope, draft_step_s):
    for i in range(steps):
        k = ctrl.next_k()
        n = 0
        while n < k and ((i * 7 + n * 13) % 100) / 100 < accept_rate:
            n += 1
        ctrl.record(k, n, step_s * (1 + verify_slope * k), draft_step_s * k, requested=k)
    return ctrl


def test_fixed_length_is_respected():
    ctrl = feed(DraftLengthController(fixed=3), 20, 0.1, 1.0, 1.0, 1.0)
    assert ctrl.next_k() == 3


def test_cheap_verification_and_high_acceptance_draft_long():
    ctrl = feed(DraftLengthController(max_k=8), 40, 0.95, 1.0, 0.05, 0.1)
    assert ctrl.next_k() >= 4
    assert ctrl.expected_speedup(ctrl.next_k()) > 1.5


def test_speculation_switches_off_when_it_cannot_pay():
    # Drafting costs as much as a target step and little is accepted.
    ctrl = feed(DraftLengthController(max_k=8), 30, 0.2, 1.0, 0.6, 1.0)
    assert ctrl.next_k() == 0


def test_switched_off_speculation_probes_again_and_comes_back():
    ctrl = feed(DraftLengthController(max_k=8, probe_every=4), 30, 0.2, 1.0, 0.6, 1.0)
    assert ctrl.next_k() == 0
    # The text became predictable and drafting cheap: a probe notices, speculation resumes.
    feed(ctrl, 40, 0.98, 1.0, 0.05, 0.05)
    assert ctrl.next_k() >= 2


def test_first_step_measures_a_plain_pass():
    ctrl = DraftLengthController(max_k=8, initial_k=4)
    assert ctrl.next_k() == 0
    ctrl.record(0, 0, 0.25, 0.0, requested=0)
    assert ctrl.next_k() == 4
    assert ctrl.verify_cost(0) == 0.25


def test_free_drafter_with_no_proposal_is_not_switched_off():
    ctrl = DraftLengthController(max_k=8, drafting_is_free=True)
    ctrl.record(0, 0, 1.0, 0.0, requested=4)  # prompt lookup found no match this step
    assert ctrl.next_k() > 0
