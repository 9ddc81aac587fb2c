"""The metrics parser on the exposition formats vLLM and llama.cpp's server document
(fixtures in tests/engine/remote/remote_metrics/, written from their metric lists), and the
per-request difference of two scrapes."""
from __future__ import annotations

from pathlib import Path

from engine.remote.metrics import SpecCounters, parse_samples, spec_counters, spec_delta

FIXTURES = Path(__file__).parent / "remote_metrics"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_vllm_spec_decode_counters_sum_over_engines():
    counters = spec_counters(_read("vllm_spec_decode.prom"))
    assert counters.flavour == "vllm"
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (200, 600, 360)
    assert counters.accepted_per_position == (170, 120, 70)
    assert counters.generation_tokens == 750
    assert counters.reports_drafts


def test_histograms_and_gauges_parse_beside_the_counters():
    names = {s.name for s in parse_samples(_read("vllm_spec_decode.prom"))}
    assert "vllm:time_to_first_token_seconds_bucket" in names and "vllm:num_requests_running" in names


def test_llamacpp_exports_tokens_but_no_draft_counters():
    counters = spec_counters(_read("llamacpp_server.prom"))
    assert counters.flavour == "llama.cpp"
    assert counters.generation_tokens == 913
    assert not counters.reports_drafts
    assert spec_delta(counters, counters) is None  # acceptance must come from per-request timings


def test_delta_around_a_request():
    before = spec_counters(_read("vllm_spec_decode.prom"))
    grown = (_read("vllm_spec_decode.prom")
             .replace('vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 120.0',
                      'vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 130.0')
             .replace('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 360.0',
                      'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 390.0')
             .replace('vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 210.0',
                      'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 234.0')
             .replace('model_name="meta-llama/Llama-3.1-8B-Instruct",position="0"} 100.0',
                      'model_name="meta-llama/Llama-3.1-8B-Instruct",position="0"} 110.0'))
    delta = spec_delta(before, spec_counters(grown))
    assert (delta.drafts, delta.draft_tokens, delta.accepted) == (10, 30, 24)
    assert delta.accepted_per_position == (10, 0, 0)
    assert delta.acceptance_rate == 0.8
    assert delta.mean_accepted_length == 1 + 24 / 10


def test_a_restarted_server_gives_no_delta():
    before = SpecCounters(drafts=10, draft_tokens=30, accepted=20, flavour="vllm")
    after = SpecCounters(drafts=1, draft_tokens=3, accepted=2, flavour="vllm")
    assert spec_delta(before, after) is None


def test_a_new_position_appearing_counts_from_zero():
    before = SpecCounters(drafts=1, draft_tokens=2, accepted=1, accepted_per_position=(1,), flavour="vllm")
    after = SpecCounters(drafts=2, draft_tokens=5, accepted=3, accepted_per_position=(2, 1), flavour="vllm")
    assert spec_delta(before, after).accepted_per_position == (1, 1)


def test_absurd_counters_are_bounded_and_give_no_delta():
    """A position label of 100 million (a tuple that long before), and +Inf / NaN counters
    (int(round(nan)) raised before)."""
    text = ('vllm:spec_decode_num_drafts_total{model_name="m"} +Inf\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="m"} +Inf\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} NaN\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="100000000"} 1.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="x"} 1.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 2.0\n')
    counters = spec_counters(text)
    assert counters.accepted_per_position == (0.0, 2.0)
    assert spec_delta(counters, counters) is None
