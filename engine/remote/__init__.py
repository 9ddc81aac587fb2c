"""Clients for remote OpenAI-compatible engines (vLLM, llama.cpp's server, another ``tandem serve``).

    client   RemoteEndpoint, RemoteClient: list models, stream chat / completions with the time
             of every chunk, read usage and llama.cpp-style ``timings``, fetch /metrics
    metrics  Prometheus text -> samples; vLLM's spec-decode counters and llama.cpp's, and their
             difference around one request
    race     one measured request (speed from its own stream, acceptance from what the server
             reports), and two endpoints raced on the same prompt
    text     a server's text made safe for a terminal (control sequences shown as escapes)

Every read from a server is bounded in bytes and time (client.Limits).

It imports nothing from the rest of the engine but core: a remote server is only an address.
"""
