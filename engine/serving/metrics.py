"""/metrics in Prometheus text format, read from the worker's counters at scrape time.

The speculative-decoding and request metrics use vLLM's names exactly (so dashboards and
scripts written for ``vllm serve`` read Tandem unchanged); each has a ``model_name`` label:

    vllm:spec_decode_num_drafts_total                target passes that verified a draft
    vllm:spec_decode_num_draft_tokens_total          tokens drafted
    vllm:spec_decode_num_accepted_tokens_total       drafted tokens the target accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   accepted at draft position i (0-based)
    vllm:num_requests_running / vllm:num_requests_waiting   (the latter is the queue depth)
    vllm:prompt_tokens_total, vllm:generation_tokens_total

What vLLM has no name for carries a ``tandem:`` prefix:

    tandem:generation_tokens_per_second   the last finished request's rate after its first token
    tandem:queue_capacity                 requests the queue holds before answering 429
    tandem:requests_total{outcome}        served, cancelled, failed, rejected (429)
    tandem:engine_busy_seconds_total      time the engine thread spent on requests
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.serving.worker import ServingWorker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _WorkerCollector:
    def __init__(self, worker: ServingWorker, model_name: str) -> None:
        self.worker = worker
        self.model_name = model_name

    def _one(self, family, name: str, doc: str, value: float):
        metric = family(name, doc, labels=["model_name"])
        metric.add_metric([self.model_name], value)
        return metric

    def collect(self):
        c = self.worker.counters()
        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        yield self._one(counter, "vllm:spec_decode_num_drafts", "Target passes that verified a draft.", c.num_drafts)
        yield self._one(counter, "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", c.num_draft_tokens)
        yield self._one(counter, "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", c.num_accepted_tokens)
        per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens per draft position.",
                          labels=["model_name", "position"])
        for position, n in enumerate(c.accepted_per_position):
            per_pos.add_metric([self.model_name, str(position)], n)
        yield per_pos
        yield self._one(gauge, "vllm:num_requests_running", "Requests being decoded.", c.running)
        yield self._one(gauge, "vllm:num_requests_waiting", "Requests waiting in the queue.", c.queue_depth)
        yield self._one(counter, "vllm:prompt_tokens", "Prompt tokens processed.", c.prompt_tokens)
        yield self._one(counter, "vllm:generation_tokens", "Tokens generated.", c.generation_tokens)
        yield self._one(gauge, "tandem:generation_tokens_per_second",
                        "The last finished request's tokens per second after its first token.", c.last_tok_per_s)
        yield self._one(gauge, "tandem:queue_capacity", "Requests the queue holds before refusing.", c.queue_capacity)
        requests = counter("tandem:requests", "Requests by outcome.", labels=["model_name", "outcome"])
        for outcome, n in (("served", c.requests_served), ("cancelled", c.requests_cancelled),
                           ("failed", c.requests_failed), ("rejected", c.requests_rejected)):
            requests.add_metric([self.model_name, outcome], n)
        yield requests
        yield self._one(counter, "tandem:engine_busy_seconds", "Seconds the engine spent on requests.", c.busy_seconds)


def metrics_registry(worker: ServingWorker, model_name: str) -> CollectorRegistry:
    """A registry of its own per server: several servers in one process (tests, the app) never
    share or clash over the global one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WorkerCollector(worker, model_name))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
