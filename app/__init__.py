"""Tandem's Qt desktop app (PySide6). Never imports torch or transformers at module level:
the engine is loaded lazily on a worker thread, so the window appears before torch loads."""

import engine  # noqa: E402, F401  (no torch: it sets the OpenMP spin count before torch loads, see engine/__init__.py)
