import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The fake runner under the real name (run with this interpreter), logging every invocation's argv."""
    from .fakes import FAKE

    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_RUNNER_LOG", str(log))
    monkeypatch.delenv("FAKE_RUNNER_FAIL", raising=False)
    wrapper = tmp_path / "fairkv-llama"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    return {"log": log, "out": tmp_path / "runs.jsonl", "bin": wrapper}
