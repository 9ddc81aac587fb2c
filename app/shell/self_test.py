"""`--self-test [OUT.png]`: a build checks itself end to end, headless, in well under a minute.

It builds a tiny random model pair offline (no download, no model packages), loads it in the real
window through the real worker, runs the side-by-side demo greedy in fp32, and passes only when
the speculative output is token-identical to plain decoding, the window's icon and resources were
found and the screenshot was written. This is what proves a packaged app works: it exercises Qt
and its plugins, torch, transformers' lazily imported model code, tokenizers and the engine.
"""
from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
PROMPT = "for i in range(10):"
MAX_NEW_TOKENS = 32
DRAFT_LENGTH = 3  # fixed: the adaptive length may switch speculation off on random weights
TIMEOUT_S = 600  # a tiny model needs seconds; a hang must not block a build machine forever


class SelfTest:
    def __init__(self, args) -> None:
        """Build the tiny pair and point ``args`` at it (the --target/--demo/--screenshot path)."""
        from engine.core.paths import log_dir
        from engine.testing.tiny_models import save_pair  # imports torch: fine here, the run needs it anyway

        self.tmp = tempfile.TemporaryDirectory(prefix="tandem-self-test-")
        root = Path(self.tmp.name)
        args.target, args.drafter = save_pair(root / "models")
        args.demo = args.demo or PROMPT
        args.precision = "fp32"  # fp32: identity is guaranteed, so any difference is a real bug
        args.max_new_tokens = args.max_new_tokens or MAX_NEW_TOKENS
        args.screenshot = log_dir() / "self-test.png" if args.self_test is True else Path(args.self_test)
        args.timeout = min(args.timeout, TIMEOUT_S)
        self.args = args
        self.settings_path = root / "settings.ini"  # never touch the user's saved settings

    def settings(self):
        from PySide6.QtCore import QSettings

        from app.store.app_settings import AppSettings

        return AppSettings(QSettings(str(self.settings_path), QSettings.Format.IniFormat))

    def attach(self, window, script) -> None:
        self.window, self.script = window, script
        window.demo.controls.draft_length.setValue(DRAFT_LENGTH)
        window.demo_finished.connect(self.on_result)
        window.host.event.connect(self.on_event)

    def on_event(self, envelope) -> None:
        from app.bridge.messages import JobFailed

        if isinstance(envelope.payload, JobFailed):  # fail now rather than at the timeout
            self.fail(f"{envelope.kind} failed: {envelope.payload.message}")

    def on_result(self, result) -> None:
        problems = []
        plain, spec = result.plain, result.speculative
        for name, lane in (("plain", plain), ("speculative", spec)):
            if lane.reason not in ("eos", "max_new_tokens", "stop_string") or not lane.token_ids:
                problems.append(f"{name} run ended with {lane.reason!r} after {len(lane.token_ids)} tokens")
        if not spec.stats.accepted:
            problems.append("no drafted token was accepted: the speculative path was not exercised")
        if not result.identical:
            at = result.divergence.position if result.divergence else "?"
            problems.append(f"speculative output differs from plain decoding at token {at}")
        problems += self._resource_problems()
        if problems:
            self.fail("; ".join(problems))
            return
        report = (
            f"self-test: OK: plain and speculative outputs identical ({len(plain.token_ids)} tokens, "
            f"{spec.stats.accepted}/{spec.stats.drafted} drafted tokens accepted, "
            f"{spec.stats.target_passes} target passes instead of {plain.stats.target_passes}); "
            f"CPU kernels: {_cpu_kernels()}"
        )
        for line in (report, _where()):
            log.info(line)
            _say(line)
        self.script.done()

    def _resource_problems(self) -> list[str]:
        from PySide6.QtWidgets import QApplication

        from engine.core.paths import RESOURCES

        problems = []
        if not (RESOURCES / "prompts" / "bench.jsonl").exists():
            problems.append(f"resources not found at {RESOURCES}")
        if QApplication.instance().windowIcon().pixmap(64, 64).isNull():
            problems.append("window icon missing (resources/icons/tandem.svg or Qt's SVG plugins)")
        return problems

    def fail(self, why: str) -> None:
        log.error("self-test: FAILED: %s", why)
        _say(f"self-test: FAILED: {why}")
        self.script.done(failed=why)

    def cleanup(self) -> None:
        self.tmp.cleanup()


def _cpu_kernels() -> str:
    """The backend each CPU kernel runs on here ('cpu_avx2': compiled, or shipped prebuilt in a
    packaged app; 'reference': stock PyTorch). Reported, not required: the reference kernels are
    a correct fallback where the compiled ones cannot load."""
    try:
        from kernels import cpu_kernel_report

        return cpu_kernel_report()
    except Exception as exc:  # the report must not turn a passing self-test into a crash
        return f"unavailable ({type(exc).__name__}: {exc})"


def _where() -> str:
    """Where this build looks for models and writes logs: a packaged app must resolve the same
    folders as a source install (platformdirs, huggingface_hub's cache), or it would not find
    the models a user already has."""
    from engine.core.paths import RESOURCES, cache_dir, log_dir
    from engine.hub.cache import hub_cache_dir
    from engine.models.loading import default_pair

    ready = "ready" if default_pair.installed_paths() else "not prepared"
    return (f"self-test: cache {cache_dir()} (default model pair: {ready}), Hugging Face cache "
            f"{hub_cache_dir()}, logs {log_dir()}, resources {RESOURCES}")


def _say(line: str) -> None:
    if sys.stdout is not None:  # a windowed build on Windows/macOS has no console
        print(line, flush=True)
