"""tools/hotfix_lab/bench/ci_time.py: the time log scripts/test.sh asks for, rendered (issue 52, part 2)."""

from __future__ import annotations

import json
import subprocess
import sys



def test_the_log_renders_tiers_files_and_children_by_environment(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    lines = [
        {"test": "tests/e2e/test_a.py::test_one", "phase": "setup", "s": 100.0, "outcome": "passed"},
        {"test": "tests/e2e/test_a.py::test_one", "phase": "call", "s": 20.0, "outcome": "passed"},
        {"test": "tests/unit/test_b.py::test_two", "phase": "call", "s": 1.5, "outcome": "passed"},
        {"child": "e2e/test_a.py::test_one", "wall_s": 60.0, "python": ".venv-test",
         "releases": ["transformers-4.56.2"], "upstream": True, "what": "whisper.py"},
        {"child": "e2e/test_a.py::test_one", "wall_s": 40.0, "python": ".venv-test",
         "releases": ["transformers-4.56.2"], "upstream": False, "what": "whisper.py", "warm": True},
    ]
    (log / "1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = subprocess.run([sys.executable, "-P", "-m", "hotfix_lab.bench.ci_time", str(log), "--wall", "90"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout
    assert "| e2e | 1 | 2:00 | 99 % |" in page and "| unit | 1 | 0:02 | 1 % |" in page, page
    assert "| e2e/test_a.py | 2:00 | 1:40 | 1:00 |" in page, page
    assert "| .venv-test | transformers-4.56.2 | upstream | 1 | 1:00 | 0 |" in page, page
    assert "| .venv-test | transformers-4.56.2 | hotfix | 1 | 0:40 | 1 |" in page, page
    assert "with hotfix off (upstream halves): 1:00 (60 %); forked from a warm interpreter" in page, page
    assert "warm_interpreter.py): 1, 0:40." in page, page
