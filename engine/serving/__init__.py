"""An OpenAI-compatible HTTP server over one loaded Session (``tandem serve``).

    schemas      request bodies (pydantic) and the OpenAI error shape
    worker       the one engine thread: a bounded arrival-order queue, cancellation, counters
    responses    OpenAI response / chunk bodies with usage and llama.cpp-style timings
    openai_api   the routes (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics)
    metrics      Prometheus text with vLLM's spec-decode metric names
    server       ServerConfig, build_app, run_in_thread (a handle with .url, .stop(), counters)
"""
