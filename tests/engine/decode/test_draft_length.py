"""The draft-length controller picks k from measured costs and acceptance."""
import pytest

from engine.decode.draft_length import DraftLengthController


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
    # Costs that would pay at high acceptance; the text is unpredictable at first.
    ctrl = feed(DraftLengthController(max_k=8, probe_every=4), 30, 0.2, 1.0, 0.1, 0.3)
    assert ctrl.next_k() == 0
    # The text became predictable: probes notice, speculation resumes (after a few probes: one
    # rejected probe backs off, and a probe must show a clear gain).
    feed(ctrl, 80, 0.98, 1.0, 0.1, 0.3)
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


def test_unsuccessful_probes_back_off():
    ctrl = feed(DraftLengthController(max_k=8, probe_every=4, max_probe_every=32), 30, 0.0, 1.0, 0.6, 1.0)
    probes = []
    for step in range(200):
        k = ctrl.next_k()
        probes.append(k)
        ctrl.record(k, 0, 1.0 + 0.6 * k, 1.0 * k, requested=k)
    gaps = [i for i, k in enumerate(probes) if k]
    waits = [b - a for a, b in zip(gaps, gaps[1:])]
    assert waits == sorted(waits) and waits[-1] == 33  # 4, 8, 16, 32 off steps between probes
    assert sum(probes) <= 10


def test_a_probe_must_show_a_clear_gain_to_resume():
    # Expected speedup just above 1: speculating would flap on and off around break-even.
    ctrl = DraftLengthController(max_k=1, probe_every=2, resume_margin=1.05)
    ctrl.record(0, 0, 1.0, 0.0, requested=0)  # calibration pass
    for _ in range(40):
        k = ctrl.next_k()
        n = k if k else 0  # every probe accepted...
        # ...but a draft step costs nearly a whole target step: S(1) ~ 2 / 1.95 ~ 1.03
        ctrl.record(k, n, 1.0 + 0.45 * k, 0.5 * k, requested=k)
    assert ctrl.expected_speedup(1) < 1.05
    assert ctrl.next_k() == 0


def test_accepted_probes_that_do_not_pay_back_off_too():
    """A probe whose token is accepted but whose costs still rule speculation out (an int4
    target: wide verification is dear) must not recur every probe_every tokens: each one costs
    the drafter's catch-up over every token since the last."""
    ctrl = DraftLengthController(max_k=4, probe_every=4, max_probe_every=32, resume_margin=1.05)
    ctrl.record(0, 0, 1.0, 0.0, requested=0)
    probes = []
    for step in range(200):
        k = ctrl.next_k()
        probes.append(k)
        # Every probe accepted, yet drafting (with its catch-up) costs more than a target step:
        # no k breaks even.
        ctrl.record(k, k, 1.0 + 0.6 * k, 1.2 * k, requested=k)
    gaps = [i for i, k in enumerate(probes) if k]
    waits = [b - a for a, b in zip(gaps, gaps[1:])]
    assert waits == sorted(waits) and waits[-1] == 33
    assert len(gaps) <= 10


def test_costs_from_an_earlier_request_seed_the_next():
    from engine.decode.draft_length import MeasuredCosts

    first = feed(DraftLengthController(max_k=8), 30, 0.9, 1.0, 0.05, 0.1)
    known = first.measured()
    assert known is not None and known.v0 == pytest.approx(1.0) and known.draft_step_s == pytest.approx(0.1)
    # Speculation pays with these costs: the next request drafts from its first step.
    assert DraftLengthController(max_k=8, known=known).next_k() > 0
    # Verification and drafting too dear for the acceptance seen: it starts off, and probes
    # later as usual. (S(1) at 70%: 1.7 / (1 + 0.5 + 0.3) < 1; at 95% it would pay.)
    assert DraftLengthController(max_k=8, known=MeasuredCosts(1.0, 0.5, 0.3, acceptance=0.95)).next_k() > 0
    dear = MeasuredCosts(v0=1.0, v1=0.5, draft_step_s=0.3, acceptance=0.7)
    ctrl = DraftLengthController(max_k=8, probe_every=4, known=dear)
    ks = []
    for _ in range(12):
        k = ctrl.next_k()
        ks.append(k)
        ctrl.record(k, 0, 1.0 + 0.5 * k, 0.3 * k, requested=k)
    assert ks[0] == 0 and 0 < sum(ks) <= 3


def test_a_low_acceptance_from_an_earlier_request_does_not_switch_the_next_one_off():
    """Prose (few drafts accepted) and then code on the same models: costs carry over, the
    acceptance starts again from the prior, so the code request drafts from its first step."""
    from engine.decode.draft_length import MeasuredCosts

    after_prose = MeasuredCosts(v0=1.0, v1=0.1, draft_step_s=0.1, acceptance=0.05, catch_up_per_token_s=0.2)
    ctrl = DraftLengthController(max_k=8, known=after_prose)
    assert ctrl.next_k() > 0 and not ctrl.drafter_can_wait
    assert ctrl.acceptance == pytest.approx(0.7)
    # A better acceptance than the prior is kept.
    assert DraftLengthController(max_k=8, known=MeasuredCosts(1.0, 0.1, 0.1, acceptance=0.9)).acceptance == pytest.approx(0.9)


def test_one_dear_first_pass_does_not_switch_speculation_off():
    """A request's first pass pays one-offs: its draft cost (here 3x the usual) must not decide
    alone. A second pass is measured, and the median of the two leaves speculation on."""
    ctrl = DraftLengthController(max_k=8)
    ctrl.record(0, 0, 1.0, 0.0, requested=0)  # v0
    k = ctrl.next_k()
    ctrl.record(k, 1, 1.0 + 0.1 * k, 0.6 * k, requested=k)  # 0.6 s a token: nothing would pay
    assert ctrl.next_k() == 1
    for _ in range(3):
        k = ctrl.next_k()
        ctrl.record(k, k, 1.0 + 0.1 * k, 0.1 * k, requested=k)  # the real cost, all accepted
    assert ctrl.measured().draft_step_s == pytest.approx(0.1)
    assert ctrl.next_k() > 1 and max(ctrl.expected_speedup(k) for k in range(1, ctrl.max_k + 1)) > 1.5


def test_a_fixed_length_ignores_known_costs():
    from engine.decode.draft_length import MeasuredCosts

    assert DraftLengthController(fixed=3, known=MeasuredCosts(1.0, 0.9, 0.6)).next_k() == 3


def test_probes_cost_at_most_a_small_share_of_the_off_steps():
    """A probe that pays a long catch-up (0.6 s here, 3 plain steps of 0.2 s) is followed by a
    wait long enough that probing costs ~5% of the time spent off: 0.6 / (0.05 * 0.2) = 60."""
    ctrl = DraftLengthController(max_k=4, probe_every=4, max_probe_every=128)
    ctrl.record(0, 0, 0.2, 0.0, requested=0)
    ks = []
    for _ in range(200):
        k = ctrl.next_k()
        ks.append(k)
        probe = k > 0 and any(ks[:-1])
        ctrl.record(k, 0, 0.2 * (1 + 0.8 * k), 0.1 * k, requested=k, catch_up_s=0.6 if probe else 0.0)
    gaps = [i for i, k in enumerate(ks) if k]
    # Passes 0 and 1 measure (one pass is no evidence); then probes, each after a long wait.
    assert gaps[:2] == [0, 1]
    assert all(b - a >= 60 for a, b in zip(gaps[2:], gaps[3:]))


def _drafting_gaps(ctrl, passes, catch_up_per_token, record_pass, read_at_most=None):
    """Run ``passes`` passes after a calibrating plain one; a drafting pass pays the drafter's
    catch-up, ``catch_up_per_token`` for every off step before it (for the last
    ``read_at_most`` of them, where given). ``record_pass(ctrl, k, ks, catch_up)`` records each
    pass (ks: the k of every pass so far). The passes between drafts."""
    ctrl.record(0, 0, 1.0, 0.0, requested=0)
    ks, off = [], 0
    for _ in range(passes):
        k = ctrl.next_k()
        ks.append(k)
        read = off if read_at_most is None else min(off, read_at_most)
        record_pass(ctrl, k, ks, catch_up_per_token * read if k else 0.0)
        off = 0 if k else off + 1
    at = [i for i, k in enumerate(ks) if k]
    return [b - a for a, b in zip(at, at[1:])]


def test_probing_stops_when_the_drafters_catch_up_eats_what_speculation_could_gain():
    """An int4 target here: even at 95% acceptance the best k gains ~1.2x, while every probe
    first pays the drafter's catch-up (~13% of a plain step per off token). Probes then wait
    the longest; with a cheap catch-up the same costs keep probing as usual."""

    def every_other_probe_accepted(ctrl, k, ks, catch_up):
        # Drafting 0.3 of a step per token and verification 0.35 more per row leave a ceiling
        # near 1.26x.
        n = k if sum(1 for x in ks if x) % 2 else 0
        ctrl.record(k, n, 1.0 + 0.35 * k, 0.3 * k, requested=k, catch_up_s=catch_up)

    def waits(catch_up_per_token):
        ctrl = DraftLengthController(max_k=4, probe_every=4, max_probe_every=64)
        return _drafting_gaps(ctrl, 300, catch_up_per_token, every_other_probe_accepted), ctrl

    cheap, cheap_ctrl = waits(0.01)
    dear, ctrl = waits(0.2)
    assert 1.0 < ctrl._ceiling() < 1.3
    assert cheap_ctrl.probing_pays() and not ctrl.probing_pays()
    # Once a probe has measured the catch-up, every wait is the longest; cheap ones stay short.
    assert dear[-3:] == [65, 65, 65] and max(cheap[-6:]) < 65 and len(dear) < len(cheap)
    assert ctrl.measured().catch_up_per_token_s == pytest.approx(0.2)


def test_a_request_seeded_with_dear_probes_lets_the_drafter_wait():
    from engine.decode.draft_length import MeasuredCosts

    dear = MeasuredCosts(v0=1.0, v1=0.35, draft_step_s=0.3, acceptance=0.6, catch_up_per_token_s=0.2)
    ctrl = DraftLengthController(max_k=4, probe_every=4, max_probe_every=64, known=dear)
    assert ctrl.drafter_can_wait and ctrl.next_k() == 0
    ks = []
    for _ in range(70):
        ks.append(ctrl.next_k())
        ctrl.record(ks[-1], 0, 1.0, 0.0, requested=ks[-1])
    assert ks.index(1) == 64  # the first probe only after the longest wait
    # A cheap catch-up: speculation still starts off at this acceptance, but probes as usual.
    cheap = DraftLengthController(max_k=4, probe_every=4, max_probe_every=64,
                                  known=MeasuredCosts(1.0, 0.35, 0.3, 0.6, catch_up_per_token_s=0.01))
    assert not cheap.drafter_can_wait and cheap.next_k() == 0


def _drive(ctrl, steps, accept_rate, verify, draft_step_s, first_plain_s=None):
    """Drive ``ctrl`` like the decoding loop: verify(k) seconds a pass, ``first_plain_s`` for the
    very first (plain) pass if given. Returns (k, switched_off) of every pass, as read before it."""
    passes = []
    for i in range(steps):
        k = ctrl.next_k()
        passes.append((k, ctrl.switched_off))
        n = 0
        while n < k and ((i * 7 + n * 13) % 100) / 100 < accept_rate:
            n += 1
        seconds = first_plain_s if (i == 0 and first_plain_s is not None) else verify(k)
        ctrl.record(k, n, seconds, draft_step_s * k, requested=k)
    return passes


def _run(ctrl, steps, accept_rate, verify, draft_step_s, first_plain_s=None):
    """As _drive; returns the k of every pass."""
    return [k for k, _ in _drive(ctrl, steps, accept_rate, verify, draft_step_s, first_plain_s)]


def test_a_slow_first_plain_pass_does_not_make_verification_look_free():
    # The first plain pass takes 1.5 (a busy moment); plain passes really cost 1.0, each drafted
    # row 0.25 more, a draft step 0.38, and half the drafts are accepted: speculation runs at
    # ~0.92x of plain and must switch off. Measured against a stale 1.5, verification would look
    # free and speculation would stay on.
    ctrl = DraftLengthController(max_k=8)
    ks = _run(ctrl, 60, 0.5, lambda k: 1.0 + 0.25 * k, 0.38, first_plain_s=1.5)
    assert ctrl.verify_cost(0) < 1.1
    assert ks[-10:].count(0) >= 8, ks


def test_no_pass_is_given_up_to_measuring_where_speculation_clearly_pays():
    ctrl = DraftLengthController(max_k=8)
    ks = _run(ctrl, 80, 0.95, lambda k: 1.0 + 0.05 * k, 0.1)
    assert ks[0] == 0 and 0 not in ks[1:], ks


def test_a_close_call_measures_plain_passes_again_and_carries_on():
    # Speculation gains ~1.1x: every REFRESH_EVERY passes one plain pass, then the same k again.
    from engine.decode.draft_length import REFRESH_EVERY

    ctrl = DraftLengthController(max_k=8)
    ks = _run(ctrl, 60, 0.72, lambda k: 1.0 + 0.1 * k, 0.3)
    plain = [i for i, k in enumerate(ks) if k == 0][1:]  # the first pass is the calibration
    assert plain, ks
    assert all(b - a > REFRESH_EVERY for a, b in zip(plain, plain[1:])), ks
    assert ks[-1] > 0 or ks[-2] > 0


def test_only_the_controllers_choice_counts_as_switched_off():
    """The reply's stats report plain passes as speculation switched off only where the
    controller chose them because drafting does not pay: not the pass that calibrates v(0),
    not the ones that refresh it while speculation stays on, not a fixed draft length."""
    passes = _drive(DraftLengthController(max_k=8), 60, 0.72, lambda k: 1.0 + 0.1 * k, 0.3)  # a close call
    plain = [i for i, (k, _) in enumerate(passes) if k == 0]
    assert plain[0] == 0 and len(plain) > 1, passes  # the calibration, then refreshes
    assert not any(off for _, off in passes), passes
    # Half the drafts accepted, speculation at ~0.92x of plain: it switches off, probing now and then.
    passes = _drive(DraftLengthController(max_k=8), 60, 0.5, lambda k: 1.0 + 0.25 * k, 0.38, first_plain_s=1.5)
    assert not passes[0][1]  # the calibration pass
    last = passes[-10:]
    assert [k for k, _ in last].count(0) >= 8, passes
    assert all(switched_off == (k == 0) for k, switched_off in last), passes
    assert not DraftLengthController(fixed=0, max_k=8).switched_off


def _request(ctrl, machine: dict, tokens: int = 96, prompt: int = 60) -> tuple[int, int]:
    """One request's passes on a simulated machine: ``machine`` gives v0, v1, the draft step and
    the drafter's catch-up per token (seconds) and the acceptance. A drafter that waited reads
    the prompt at its first draft, as the decoding loop's deferred prepare does. Returns
    (passes, passes with speculation off)."""
    produced, passes, off, unread = 0, 0, 0, prompt if ctrl.drafter_can_wait else 0
    i = 0
    while produced < tokens:
        k = ctrl.next_k()
        off += ctrl.switched_off
        catch_up = 0.0
        if k:
            catch_up, unread = machine["catch_up"] * unread, 0
        n = 0
        while n < k and ((i * 7 + n * 13) % 100) / 100 < machine["acceptance"]:
            n += 1
        i += 1
        unread += 0 if k else 1
        ctrl.record(k, n, machine["v0"] + machine["v1"] * k, machine["draft"] * k, requested=k, catch_up_s=catch_up)
        produced += n + 1
        passes += 1
    return passes, off


def test_a_busy_requests_costs_do_not_keep_speculation_off_once_the_machine_is_quiet():
    """A request beside other programs measured drafting too dear to pay and handed that on;
    on the quiet machine after it, drafting pays (acceptance 0.9). Speculation must come back
    within the first quiet request, not stay off for every later one."""
    from engine.decode.draft_length import MeasuredCosts

    busy = MeasuredCosts(v0=0.30, v1=0.10, draft_step_s=0.40, acceptance=0.5, catch_up_per_token_s=0.12)
    quiet = {"v0": 0.065, "v1": 0.004, "draft": 0.012, "catch_up": 0.005, "acceptance": 0.9}
    assert DraftLengthController(max_k=8, known=busy).next_k() == 0  # the seed rules drafting out
    known, offs = busy, []
    for _ in range(4):
        ctrl = DraftLengthController(max_k=8, known=known)
        passes, off = _request(ctrl, quiet)
        offs.append(off / passes)
        known = ctrl.measured()
    # The first quiet request sees its plain steps run 4.6x faster than the seed's: it probes
    # after probe_every tokens and speculates from there; the next ones from their first pass.
    assert offs[0] < 0.6 and max(offs[1:]) < 0.1, offs
    assert known.age == 0 and known.draft_step_s == pytest.approx(0.012)


def test_seeded_costs_follow_this_requests_plain_step_cost_until_it_drafts():
    from engine.decode.draft_length import MeasuredCosts

    seed = MeasuredCosts(v0=1.0, v1=0.5, draft_step_s=0.6, acceptance=0.5, catch_up_per_token_s=0.4)
    ctrl = DraftLengthController(max_k=8, probe_every=64, known=seed)
    assert ctrl.next_k() == 0
    for _ in range(40):  # the machine now runs every step 4x faster
        ctrl.record(0, 0, 0.25, 0.0, requested=0)
    costs = ctrl.measured()
    assert costs.v0 < 0.27  # a decayed average moving to 0.25
    # The seeded costs kept their ratios to v(0): a quarter of what the seed said, like v(0).
    assert costs.v1 / costs.v0 == pytest.approx(0.5) and costs.draft_step_s / costs.v0 == pytest.approx(0.6)
    assert costs.catch_up_per_token_s / costs.v0 == pytest.approx(0.4)
    assert costs.age == 1  # handed on unmeasured: older by one request


def test_costs_that_never_pay_are_measured_again_only_every_few_requests():
    """Where drafting truly never pays (an int4 target's dear verification), a request seeded
    with fresh costs starts off and does not probe; only a seed STALE_AFTER requests old buys
    one probe (its catch-up over the prompt) to measure again."""
    from engine.decode.draft_length import STALE_AFTER

    dear = {"v0": 0.1, "v1": 0.06, "draft": 0.05, "catch_up": 0.02, "acceptance": 0.5}
    first = DraftLengthController(max_k=8)
    _request(first, dear)
    known, probed = first.measured(), []
    for _ in range(3 * (STALE_AFTER + 1)):
        ctrl = DraftLengthController(max_k=8, known=known)
        passes, off = _request(ctrl, dear)
        probed.append(off < passes)
        known = ctrl.measured()
    assert sum(probed) <= 3 and any(probed)


def test_lookup_passes_while_off_count_toward_the_next_probe():
    """Tokens that prompt lookup verified while speculation was off count as off steps: the
    probe comes after as many tokens as it would after plain passes, so a request whose text
    turns predictable for the model can still switch speculation back on."""
    def switched_off():
        ctrl = feed(DraftLengthController(max_k=8, probe_every=8), 30, 0.0, 1.0, 0.6, 1.0)
        assert ctrl.next_k() == 0 and ctrl.switched_off
        return ctrl

    plain = switched_off()
    plain_steps = 0
    while plain.next_k() == 0:
        plain.record(0, 0, 1.0, 0.0, requested=0)
        plain_steps += 1

    looked_up = switched_off()
    tokens = 0
    while looked_up.next_k() == 0:
        looked_up.lookup_pass(3)  # two guessed tokens right and the target's own
        tokens += 3
        assert tokens < 10 * plain_steps, "lookup passes never brought a probe"
    assert looked_up.next_k() == 1
    assert plain_steps <= tokens < plain_steps + 3


def test_a_drafters_deferred_prefill_is_not_taken_for_its_catch_up_rate():
    """The first draft pays the drafter's prefill of the prompt (here 6 plain steps) after the
    one plain pass that measures v(0). Counted as catch-up it would price every probe at 6 plain
    steps per off token, and hand that on to the next request; it is a one-off."""
    ctrl = DraftLengthController(max_k=4)
    ctrl.record(0, 0, 1.0, 0.0, requested=0)
    k = ctrl.next_k()
    ctrl.settle(k, k, 1.0 + 0.2 * k, 6.0 + 0.1 * k, requested=k, prefill_s=6.0)
    assert ctrl.probing_pays()
    assert ctrl.measured().catch_up_per_token_s == 0.0
    assert ctrl.measured().draft_step_s == pytest.approx(0.1)


def test_probes_wait_the_longest_where_catching_up_alone_costs_more_than_the_probe_budget():
    """A catch-up grows with the off steps it reads: at 8% of a plain step per token no wait
    keeps probing within PROBE_BUDGET (5%) of the off steps' time, so after the probe that
    measured it every wait is the longest; at 1% a wait pays for the probe's fixed part."""

    def never_accepted(ctrl, k, ks, catch_up):
        # A draft step 0.2 of a plain one, verification 0.2 more a row.
        ctrl.settle(k, 0, 1.0 + 0.2 * k, 0.2 * k + catch_up, requested=k, catch_up_s=catch_up)

    def gaps(catch_up_per_token):
        ctrl = DraftLengthController(max_k=4, probe_every=8, max_probe_every=96)
        return _drafting_gaps(ctrl, 600, catch_up_per_token, never_accepted)

    dear, cheap = gaps(0.08), gaps(0.01)
    # Passes 0 and 1 measure drafting; the first probe after 8 off steps measures the catch-up.
    assert dear[:3] == cheap[:3] == [1, 1, 9]
    assert len(dear) > 5 and all(g == 97 for g in dear[3:])  # 96 off steps, then the probe
    assert cheap[3:6] == [17, 33, 65]  # failed probes double the wait, as without a catch-up


def test_a_catch_up_that_stops_growing_lets_probes_run_after_a_wait_past_it():
    """A draft model reads only the last window of a long off stretch (its catch_up_limit):
    past it, a probe's catch-up no longer grows with the wait, so a wait long enough pays for
    it. At 8% of a plain step per token read, and 20 tokens read at most: the wait after the
    probe that measured the rate is the one that keeps the next probe within PROBE_BUDGET,
    (0.4 fixed + 20 x 0.08) / 0.05 = 40 off steps, not the longest; later failed probes double it."""

    def never_accepted(ctrl, k, ks, catch_up):
        ctrl.settle(k, 0, 1.0 + 0.2 * k, 0.2 * k + catch_up, requested=k, catch_up_s=catch_up)

    def gaps(limit):
        ctrl = DraftLengthController(max_k=4, probe_every=8, max_probe_every=96, catch_up_limit=limit)
        return _drafting_gaps(ctrl, 600, 0.08, never_accepted, read_at_most=limit)

    limited, unlimited = gaps(20), gaps(None)
    assert unlimited[:3] == limited[:3] == [1, 1, 9]
    assert all(g == 97 for g in unlimited[3:])
    assert limited[3:6] == [41, 81, 97]
    # The rate is per token read: a 20-token catch-up after 40 off steps is still 0.08 a token.
    ctrl = DraftLengthController(max_k=4, probe_every=8, max_probe_every=96, catch_up_limit=20)
    _drafting_gaps(ctrl, 120, 0.08, never_accepted, read_at_most=20)
    assert ctrl.measured().catch_up_per_token_s == pytest.approx(0.08)


def test_a_long_request_whose_verification_is_unmeasured_drafts_one_token_first():
    """A verified row attends over the whole cache: at 4,096 tokens five rows cost 2.3-2.6
    plain steps on 2 cores. Where nothing measured that, the first draft is one token; a short
    request and a seed measured at about the request's context keep the usual first length."""
    from engine.decode.draft_length import LONG_CONTEXT, MeasuredCosts

    def first_draft(ctrl):
        if ctrl.next_k() == 0:  # the calibration pass
            ctrl.record(0, 0, 1.0, 0.0, requested=0)
        return ctrl.next_k()

    assert first_draft(DraftLengthController(max_k=8, context_tokens=100)) == 4
    assert first_draft(DraftLengthController(max_k=8, context_tokens=LONG_CONTEXT)) == 1
    here = MeasuredCosts(v0=1.0, v1=0.1, draft_step_s=0.1, acceptance=0.8, context=3500)
    assert first_draft(DraftLengthController(max_k=8, known=here, context_tokens=4000)) == 4
    shorter = MeasuredCosts(v0=1.0, v1=0.1, draft_step_s=0.1, acceptance=0.8, context=1000)
    assert first_draft(DraftLengthController(max_k=8, known=shorter, context_tokens=4000)) == 1


def test_a_seed_from_another_context_length_does_not_price_this_requests_verification():
    """v1 seeded at 1,000 tokens is far under v1 at 4,000: the request's first measurement
    replaces it (not a decayed blend with it), and what it hands on says where it measured.
    A seed from a long context, whose dear verification would start a short request off, is
    not used either: the short request drafts."""
    from engine.decode.draft_length import MeasuredCosts

    short_seed = MeasuredCosts(v0=1.0, v1=0.05, draft_step_s=0.1, acceptance=0.8, context=1000)
    ctrl = DraftLengthController(max_k=8, known=short_seed, context_tokens=4000)
    assert ctrl.next_k() == 0  # a plain pass measures v(0) at this context first
    ctrl.record(0, 0, 1.0, 0.0, requested=0)
    k = ctrl.next_k()
    ctrl.record(k, k, 1.0 + 0.5 * k, 0.1 * k, requested=k)
    assert ctrl.measured().v1 == pytest.approx(0.5) and ctrl.measured().context == 4000
    long_seed = MeasuredCosts(v0=1.0, v1=0.9, draft_step_s=0.3, acceptance=0.6, context=4000)
    assert DraftLengthController(max_k=8, known=long_seed, context_tokens=4000).next_k() == 0  # dear here: off
    short = DraftLengthController(max_k=8, known=long_seed, context_tokens=300)
    assert short.next_k() == 0 and not short.switched_off  # measuring v(0), not off
    short.record(0, 0, 1.0, 0.0, requested=0)
    assert short.next_k() > 0


def test_a_seed_from_another_context_length_does_not_price_this_requests_plain_step():
    """A plain step attends over the whole cache too, and v1 is what a verification costs over
    it: a 23-token request's v(0) taken for a 672-token request's made its first one-row
    verification look dear (one extra row 0.45 of a step where it cost ~0.15) and switched
    speculation off for the reply. The request's own plain pass replaces the seeded v(0)."""
    from engine.decode.draft_length import MeasuredCosts

    seed = MeasuredCosts(v0=1.0, v1=0.1, draft_step_s=0.25, acceptance=0.77, context=23)
    ctrl = DraftLengthController(max_k=8, known=seed, context_tokens=672)
    assert ctrl.next_k() == 0
    ctrl.record(0, 0, 1.25, 0.0, requested=0)
    assert ctrl.verify_cost(0) == pytest.approx(1.25)  # replaced, not blended with the seed's 1.0
    k = ctrl.next_k()
    assert k > 0
    ctrl.record(1, 0, 1.4, 0.25, requested=k)  # one draft, rejected
    assert ctrl.verify_cost(1) - ctrl.verify_cost(0) == pytest.approx(0.15)
    assert ctrl.next_k() > 0  # one rejected draft at these costs is no reason to stop
    # A seed from about this context keeps its v(0) and drafts at once.
    here = MeasuredCosts(v0=1.0, v1=0.1, draft_step_s=0.25, acceptance=0.77, context=600)
    assert DraftLengthController(max_k=8, known=here, context_tokens=672).next_k() == 4
