"""Tiny random models built offline in seconds, for the tests and the app's self-test."""
