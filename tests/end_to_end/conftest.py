"""End-to-end tests on the real default pair (all marked slow): the app's real window and the
engine's real sessions and server, so they share the app tests' fixtures."""
from tests.app.conftest import app_settings, no_engine_thread_left, real_pair_window  # noqa: F401  (fixtures)
