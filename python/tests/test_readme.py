"""The README's Python quick start, run as it is written (as tests/core checks the C++ API tour)."""

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart() -> str:
    text = README.read_text()
    m = re.search(r"<!-- python-quickstart:begin -->\n```python\n(.*?)```\n<!-- python-quickstart:end -->", text, re.S)
    assert m, "README.md has no python-quickstart block"
    return m.group(1)


def test_the_quickstart_block_is_there_and_uses_the_public_api():
    code = quickstart()
    assert "fairkv.plan(" in code and "fairkv.compact(" in code and "FairPress(" in code


def test_readme_quickstart_runs(capsys):
    if os.environ.get("FAIRKV_REQUIRE_KVPRESS") != "1":
        for module in ("torch", "transformers", "kvpress", "gguf"):
            pytest.importorskip(module)
    if not os.environ.get("FAIRKV_MODEL"):
        pytest.skip("FAIRKV_MODEL is not set (scripts/test_python.sh sets it to the bundled model)")
    exec(compile(quickstart(), str(README), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("<fairkv.Plan knorm x per_head x fair_with_whitelist") and out[0].endswith("[[50, 50, 50]]")
    assert len(out) >= 2  # the model's answer
