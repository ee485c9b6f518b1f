#!/usr/bin/env bash
# The test command (README "Tests"). Installs everything the tests need on a fresh machine that has
# only Python 3.11, pip and gcc, then runs pytest, in two stages:
#
#   1. .venv-test/   torch 2.13.0 (CPU), hotfix installed FROM A BUILT WHEEL (so the .pth start-up path
#                    is the one users get), transformers 4.56.2, and the code-only releases of the matrix
#                    (unsloth-zoo, the forks, DeepSpeed); then the unit and contract tiers (minutes).  A failure stops
#                    here, before the long installs.
#   2. .matrix/      the rest of tests/matrix.txt, side by side (pip install --target), put first on
#                    PYTHONPATH by the tests, and two side torch venvs (installed while the tiers that do
#                    not need them run); then every other tier (versions, e2e, lab), the side_torch tests last.
#
# Extra arguments go to pytest in both stages, e.g.  bash scripts/test.sh -k whisper
# HOTFIX_TEST_WARM=0 starts every child interpreter fresh (by default a child whose test names what it imports first
# is forked from a warm interpreter of its environment: tests/support/warm_interpreter.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${HOTFIX_TEST_VENV:-.venv-test}
MATRIX=.matrix
pipq() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
# Run from tests/ so the source tree's hotfix/ is not importable: the tests exercise the installed wheel
# (tests/conftest.py checks this).  Status 5 (nothing selected by the caller's -k) is no failure.
# Two pytest-xdist workers (HOTFIX_TEST_WORKERS; 0 runs in one process), each test file whole in one worker
# (its module fixtures, often minutes of training, computed once), one thread each: most tests wait on child
# interpreters starting or on 2-rank launches, so two at once fill the 2 cores CI has.
WORKERS=${HOTFIX_TEST_WORKERS:-2}
# The run's time log (tests/conftest.py writes it; tools/hotfix_lab/bench/ci_time.py renders docs/ci-time.md): a JSON line per test
# phase and per child interpreter, in a folder emptied here.
export HOTFIX_CI_LOG=${HOTFIX_CI_LOG:-$PWD/.ci-log}
rm -rf "$HOTFIX_CI_LOG"
tier() { (cd tests && OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "../$VENV/bin/python" -m pytest -p no:cacheprovider \
          -n "$WORKERS" --dist loadfile "$@") || [ $? -eq 5 ]; }
# The releases of tests/matrix.txt whose names match $1 (a grep -E pattern), each installed once, side by side in
# .matrix/<name>-<version> (tools/hotfix_lab/infra/matrix_install.py: what each library needs to install so, as data); three
# at a time (each its own folder; mostly download and unpacking).
matrix() {
    grep -v '^#' tests/matrix.txt | grep -E "^($1) " \
        | xargs -r -n 2 -P "${HOTFIX_INSTALL_JOBS:-3}" "$VENV/bin/python" -P -m hotfix_lab.infra.matrix_install
}

# --- stage 1: the product's own tiers
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# torch pinned: a bare requirement would pull a multi-GB CUDA build.
pipq torch==2.13.0 numpy "wrapt>=1.14" "packaging>=21" pytest pytest-xdist==3.8.0 setuptools wheel build twine import-linter==2.17 \
    transformers==4.56.2 accelerate psutil peft==0.21.2 nbclient==0.10.2 nbformat==5.10.4 ipykernel==6.30.1 \
    hjson msgpack ninja py-cpuinfo "pydantic>=2" einops  # DeepSpeed's pure-Python dependencies (tests/matrix.txt)
"$VENV/bin/python" -c "import torch, transformers, wrapt, pytest, importlinter" # fail early if an install failed
# The lab (tools/hotfix_lab, never in the wheel) on the venv's path through a .pth file: its modules run as
# python -P -m hotfix_lab...; tests import them, children get tools/ on PYTHONPATH.
PYTHONPATH=tools "$VENV/bin/python" -P -m hotfix_lab.infra.pth

rm -rf dist build
"$VENV/bin/pip" wheel -q --no-deps --no-build-isolation -w dist . 2>&1 | grep -v "^WARNING: Location" || true
pipq --force-reinstall --no-deps dist/hotfix_checkpoint-*.whl

# code only, seconds (DeepSpeed: an sdist built without its ops, under a minute): the contract suite loads
# their targets, and runs deepspeed-zero3-frozen-recompute beside DeepSpeed 0.19.2 (its BESIDE)
matrix "unsloth-zoo|llamafactory|axolotl|deepspeed"
tier -m "unit or contract" "$@"

# --- stage 2: the rest of the release matrix, the side torches, and every other tier
matrix "[^ ]+"  # every other entry (those of stage 1 are installed)
# Two more torch lines, each in a venv of its own (.matrix/torch-<version>: PyPI's CUDA build, it runs on
# the CPU; installed by the census's installer, hotfix from the same wheel; the libraries come from
# .matrix/ on PYTHONPATH): torch.compile over reentrant checkpointing on torch 2.11 and 2.7 (tests/versions/
# test_torch_lines.py) and the census's torch-line subset (the tests marked side_torch).  About 3.5 minutes and
# 5 GB each on a cold cache, mostly download and unpacking: they install in the background while the other tests
# run, and the side_torch tests run after.  Where the disk has less than about 9 GiB free for one, it is not
# installed and its tests skip, saying so.
side_torches() {
    for torch_line in 2.11.0 2.7.1; do
        "$VENV/bin/python" -P -m hotfix_lab.census.census --install-torch "$torch_line" --wheel dist/hotfix_checkpoint-*.whl \
            2>&1 | grep -v "^WARNING: Location" || true
        [ -f "$MATRIX/torch-$torch_line.no-disk" ] && continue
        # fail loudly if the install failed (its tests would only skip, saying it is not installed)
        [ -f "$MATRIX/torch-$torch_line/.complete" ] || { echo "side torch $torch_line: not installed (above)"; return 1; }
        "$MATRIX/torch-$torch_line/bin/python" -I -c "import torch, wrapt, hotfix"
    done
    # beside torch 2.11: PyPI's torchvision for it, timm and open_clip (tools/hotfix_lab/infra/matrix_install.py BESIDE_TORCH)
    if [ -f "$MATRIX/torch-2.11.0/.complete" ]; then
        "$VENV/bin/python" -P -m hotfix_lab.infra.matrix_install --beside-torch 2.11.0 2>&1 | grep -v "^WARNING: Location" || true
    fi
}
side_torches > "$MATRIX/side-torches.log" 2>&1 &
installing=$!

tier -m "not unit and not contract and not side_torch" "$@"
if ! wait "$installing"; then
    cat "$MATRIX/side-torches.log"
    echo "scripts/test.sh: installing the side torches failed (above)" >&2
    exit 1
fi
cat "$MATRIX/side-torches.log"
tier -m "side_torch" "$@"
