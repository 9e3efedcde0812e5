"""Folders the tests share across a whole run (cached exports, checkpoints), removed when the run ends."""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import tempfile


def run_folder(prefix: str) -> pathlib.Path:
    """A new folder under the system's temporary directory that lives until the interpreter exits
    (pytest's tmp_path_factory is a fixture, and these folders are made by cached module functions)."""
    folder, owner = pathlib.Path(tempfile.mkdtemp(prefix=prefix)), os.getpid()

    def remove():
        if os.getpid() == owner:  # not a forked child that inherited the handler
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    return folder
