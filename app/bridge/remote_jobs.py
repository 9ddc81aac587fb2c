"""A remote model as the window's model: chosen on the Models tab, chatted with like a local one.

"Using" a remote model is a job on the app's engine thread like a load: it frees the local
models (one model at a time, as with a load), checks the server lists the model, and says so
with a ModelLoaded whose precision is "remote". The chat job then streams from the server over
HTTP on that same thread, turning each chunk into the Tokens / Finished events the chat view
already shows; speed is measured from the stream, drafting is the server's own timings (when it
reports them).
"""
from __future__ import annotations

import time

from app.bridge.messages import ModelLoaded
from app.bridge.worker_state import RemoteChoice


def use_remote(url: str, api_key: str | None, model: str):
    def run(ctx) -> None:
        from engine.remote.client import RemoteClient, RemoteEndpoint

        start = time.perf_counter()
        with RemoteClient(RemoteEndpoint(url, api_key)) as client:
            ids = [m.id for m in client.list_models()]
        if model not in ids:
            raise ValueError(f"{url} does not serve {model!r} (it serves {', '.join(ids) or 'nothing'})")
        ctx.state.drop_model()  # the built-in server serves local models only: it stops too
        ctx.state.remote = RemoteChoice(url, api_key, model)
        ctx.emit(ModelLoaded(target=model, drafter=None, precision="remote", device=url,
                             seconds=time.perf_counter() - start, target_path=url, drafter_kind="remote",
                             note=f"runs on {url}: speed and drafting are the server's"))

    return run


def remote_chat(ctx, choice: RemoteChoice, messages: list[dict], settings) -> None:
    """Stream one chat reply from the remote model as the chat view's lane events."""
    from engine.core.events import Failed, Finished, RunStats, Tokens
    from engine.remote.client import RemoteClient, RemoteEndpoint, RemoteError, StreamEnd
    from engine.remote.race import reported_count, stream_rate
    from engine.session.chat import CHAT
    from engine.session.side_by_side import LaneEvent

    fields = {"max_tokens": settings.max_new_tokens}
    if settings.mode == "greedy":
        fields["temperature"] = 0
    else:
        fields.update(temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed)
    if settings.stop_strings:
        fields["stop"] = list(settings.stop_strings)
    wire = [{"role": m["role"], "content": m["content"]} for m in messages]
    last = time.perf_counter()
    try:
        with RemoteClient(RemoteEndpoint(choice.url, choice.api_key)) as client:
            for item in client.stream_chat(choice.model, wire, **fields):
                if isinstance(item, StreamEnd):
                    end = item
                    break
                ctx.emit(LaneEvent(CHAT, Tokens(item.text, (), (), 0, 0, (item.at - last) * 1000)))
                last = item.at
                if ctx.cancelled():
                    ctx.emit(LaneEvent(CHAT, Finished("cancelled", RunStats(), text="")))
                    return
    except RemoteError as exc:
        ctx.emit(LaneEvent(CHAT, Failed(str(exc))))
        return
    n, rate = stream_rate(end)
    seconds = (end.last_chunk_at or time.perf_counter()) - end.started
    timings = end.timings or {}
    # A server's counts are read as reported_count reads them: junk ("many", NaN) counts as none.
    drafted = reported_count(timings.get("draft_n")) or 0
    accepted = min(reported_count(timings.get("draft_n_accepted")) or 0, drafted)
    stats = RunStats(new_tokens=n, seconds=seconds, tok_per_s=n / seconds if seconds > 0 else 0.0,
                     ttft_s=(end.first_chunk_at - end.started) if end.first_chunk_at is not None else None,
                     decode_tok_per_s=rate, drafted=drafted, accepted=accepted,
                     acceptance=accepted / drafted if drafted else 0.0)
    reason = {"length": "max_new_tokens", "stop": "eos"}.get(end.finish_reason or "", end.finish_reason or "eos")
    ctx.emit(LaneEvent(CHAT, Finished(reason, stats, text=end.text)))
