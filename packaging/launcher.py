"""Entry point of the packaged app: PyInstaller runs this file as __main__.

A separate file rather than app/__main__.py so that ``app`` stays an ordinary package inside the
bundle (``app.__main__`` is imported by name, exactly as ``python -m app`` does).
"""
import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen child process must run its task, not a second app
    from app.__main__ import main

    sys.exit(main())
