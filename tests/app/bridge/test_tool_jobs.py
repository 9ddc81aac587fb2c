"""The chat's MCP servers on the real engine thread, with real stdio servers: a server that does
not start is a notice and the others' tools are offered; calls run, fail or are declined with a
result the model can read; one that died is started again for the next turn; the servers stop
with the engine thread."""
import sys

import psutil

from app.bridge import tool_jobs
from app.bridge.messages import JobEnded, ToolConfirm, ToolNotice
from app.bridge.worker import EngineHost
from engine.tools.calls import ToolCall
from engine.tools.mcp import McpServerConfig

GOOD = McpServerConfig("calc", sys.executable, ("-m", "tests.engine.tools.mcp_server", "--only", "add,die"))
BROKEN = McpServerConfig("broken", sys.executable, ("-m", "tests.engine.tools.mcp_server", "--exit-at-start"))


def _mcp_processes() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "tests.engine.tools.mcp_server" in " ".join(p.cmdline())}


def test_tools_offered_run_declined_and_stopped_with_the_engine(qtbot):
    host = EngineHost()
    seen = []
    host.event.connect(lambda envelope: seen.append(envelope.payload))
    outcomes = {}

    def turn(ctx) -> None:
        offered = tool_jobs.tools_for_turn(ctx, (GOOD, BROKEN))
        outcomes["offered"] = sorted(t.name for t in offered)
        run = tool_jobs.tool_runner(ctx, confirm=False)
        outcomes["add"] = run(ToolCall("add", '{"a": 2, "b": 3}'))
        outcomes["unknown"] = run(ToolCall("weather", '{"city": "Lisbon"}'))
        outcomes["not json"] = run(ToolCall("add", "{a: 2"))
        outcomes["asked"] = tool_jobs.tool_runner(ctx, confirm=True)(ToolCall("add", '{"a": 1, "b": 1}'))
        outcomes["first"] = _mcp_processes()
        outcomes["died"] = run(ToolCall("die", "{}"))
        # The next turn starts the server that died again.
        outcomes["offered again"] = sorted(t.name for t in tool_jobs.tools_for_turn(ctx, (GOOD,)))
        outcomes["running"] = _mcp_processes()

    def answer(envelope) -> None:
        if isinstance(envelope.payload, ToolConfirm):
            envelope.payload.answer.put(False)  # the person declines

    host.event.connect(answer)
    try:
        job = host.submit("chat", turn)
        qtbot.waitUntil(lambda: any(isinstance(p, JobEnded) for p in seen), timeout=120_000)
        assert job
    finally:
        assert host.shutdown(60_000)
    assert outcomes["offered"] == ["add", "die"]
    notices = [p.text for p in seen if isinstance(p, ToolNotice)]
    assert len(notices) == 1 and "'broken'" in notices[0] and "no configuration found" in notices[0]
    assert outcomes["add"].text == "5" and not outcomes["add"].is_error
    assert outcomes["unknown"].is_error and "no tool named 'weather'" in outcomes["unknown"].text
    assert outcomes["not json"].is_error and "not JSON" in outcomes["not json"].text
    confirm = next(p for p in seen if isinstance(p, ToolConfirm))
    assert (confirm.name, confirm.server) == ("add", "calc") and outcomes["asked"] is None  # declined
    assert outcomes["died"].is_error and "The tool failed" in outcomes["died"].text
    assert outcomes["first"] and outcomes["offered again"] == ["add", "die"]
    assert outcomes["running"] and not outcomes["running"] & outcomes["first"]  # a new process
    psutil.wait_procs([psutil.Process(p) for p in outcomes["running"] if psutil.pid_exists(p)], timeout=15)
    assert not {p for p in outcomes["running"] if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}  # stopped with the engine thread


def test_a_model_whose_template_has_no_tool_format_is_told_once_and_gets_no_tools(qtbot):
    from types import SimpleNamespace

    from engine.testing.tiny_models import build_tokenizer

    hermes = build_tokenizer()  # given a template that lists tools and writes calls as Qwen's does
    hermes.chat_template = ("{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
                            "{% for m in messages %}{% if m.tool_calls %}<tool_call>{{ m.tool_calls | tojson }}"
                            "</tool_call>{% else %}{{ m.content }}{% endif %}{% endfor %}")
    qwen = SimpleNamespace(tokenizer=hermes, target=SimpleNamespace(name="qwen"))
    plain = SimpleNamespace(tokenizer=build_tokenizer(), target=SimpleNamespace(name="tiny"))  # no chat template
    host = EngineHost()
    seen, answers = [], {}
    host.event.connect(lambda envelope: seen.append(envelope.payload))

    def turn(ctx) -> None:
        answers["qwen"] = tool_jobs.model_takes_tools(ctx, qwen)
        answers["tiny"] = [tool_jobs.model_takes_tools(ctx, plain) for _ in range(2)]

    try:
        host.submit("chat", turn)
        qtbot.waitUntil(lambda: any(isinstance(p, JobEnded) for p in seen), timeout=60_000)
    finally:
        assert host.shutdown(60_000)
    assert answers == {"qwen": True, "tiny": [False, False]}
    notices = [p.text for p in seen if isinstance(p, ToolNotice)]
    assert len(notices) == 1 and notices[0].startswith("tiny's chat template has no format for tool calls")
