"""stdout for a command whose reader may stop reading (``hotfix status | head -1``): the rest is dropped quietly.

The command then ends with its own exit status and no BrokenPipeError traceback.
"""

from __future__ import annotations

import os


class QuietWhenReaderGone:
    """stdout for a command: once the reader has gone (``hotfix status | head -1``), the rest of the output is
    dropped instead of raising BrokenPipeError, so the command ends with its own exit status and no traceback.

    The descriptor is pointed at os.devnull, so the interpreter's last flush at exit finds nowhere to fail
    (the recipe of Python's signal documentation, "Note on SIGPIPE").
    """

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)
