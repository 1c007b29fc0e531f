#!/usr/bin/env bash
# Every test: the nbdev sync check, ruff, the notebooks, then tests/ with pytest. A stage that fails does not stop the
# next: the summary at the end lists every failure of every stage, and the exit code is 1 if there was any.
#
#   bash tools/test.sh                      everything (what CI runs)
#   bash tools/test.sh --quick              the sync check, ruff, the core notebooks (nbs/00*) and the tests without a marker
#   bash tools/test.sh --repeat N -k EXPR   stress: the pytest tests EXPR selects (pytest's -k; -m MARKEXPR too), N
#                                           rounds, each beside two busy processes; says how many rounds passed
#
# Run inside the project's environment (see README.md). Markers (pyproject.toml): ui, kernel, distributed, slow, cuda.
set -uo pipefail
cd "$(dirname "$0")/.."

usage="usage: bash tools/test.sh [--quick | --repeat N [-k EXPR] [-m MARKEXPR]]"
quick=false repeat=0 pick=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=true ;;
    --repeat) repeat=${2:-}; shift ;;
    -k|-m) [ -n "${2:-}" ] || { echo "$usage"; exit 2; }; pick+=("$1" "$2"); shift ;;
    *) echo "$usage"; exit 2 ;;
  esac
  shift
done
if ! [[ "$repeat" =~ ^[0-9]+$ ]] || { [ "$repeat" = 0 ] && [ ${#pick[@]} -gt 0 ]; } || { $quick && [ "$repeat" != 0 ]; }; then
  echo "$usage"; exit 2
fi
jobs=$(nproc 2>/dev/null || echo 2)
# Tiny models, several processes at once: one torch thread each (a thread per core each makes them spin against each other)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# Stress mode: the selected tests, N rounds, each beside two processes that keep two cores busy (a laptop running a
# browser, a shared machine): a test that races the loop or waits for a guessed time fails here first. The busy
# processes are this script's and end with it, however it ends.
if [ "$repeat" != 0 ]; then
  busy=()
  trap 'kill "${busy[@]}" 2>/dev/null' EXIT
  trap 'exit 130' INT TERM
  for _ in 1 2; do yes >/dev/null & busy+=($!); done
  python -m compileall -q nbtrainer >/dev/null
  passed=0 logs=$(mktemp -d) started=$SECONDS
  for round in $(seq "$repeat"); do
    begun=$SECONDS
    echo "== round $round of $repeat (pytest ${pick[*]}, beside ${#busy[@]} busy processes)"
    python -m pytest tests "${pick[@]}" -n "$jobs" --dist loadfile --no-loadscope-reorder -q -rfE -p no:cacheprovider >"$logs/round-$round.log" 2>&1
    rc=$?
    tail -n 1 "$logs/round-$round.log"
    if [ "$rc" = 5 ]; then echo "pytest ${pick[*]} selected no tests"; exit 2; fi
    if [ "$rc" = 0 ]; then passed=$((passed + 1)); echo "round $round passed ($((SECONDS - begun)) s)"
    else grep -E '^(FAILED|ERROR) ' "$logs/round-$round.log"; echo "round $round FAILED ($((SECONDS - begun)) s): $logs/round-$round.log"; fi
  done
  echo
  echo "== $passed of $repeat rounds passed ($((SECONDS - started)) s; logs in $logs)"
  [ "$passed" = "$repeat" ]
  exit
fi
logs=$(mktemp -d)
failures=()
started=$SECONDS
stage() { echo; echo "== $1 ($((SECONDS - started)) s in)"; }

# The UI tests drive JupyterLab in Debian's Chromium (never `playwright install`: it downloads, and fails offline), and
# the registry's tests start a PostgreSQL server of their own (tests/postgres.py): Debian's packages, installed once.
packages=()
if ! $quick && ! command -v chromium >/dev/null && ! command -v google-chrome >/dev/null; then
  packages+=(chromium chromium-driver)
fi
if ! $quick && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  packages+=(postgresql)
fi
if [ "${#packages[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing ${packages[*]} for the UI and registry tests"
    apt-get update -qq && apt-get install -y -qq "${packages[@]}" >/dev/null || failures+=("apt-get install ${packages[*]} failed")
  else
    failures+=("missing: run 'sudo apt-get install -y ${packages[*]}' (the UI and registry tests need them)")
  fi
fi

# Exporting and cleaning must change nothing: the notebooks are the source and were exported and cleaned.
snapshot() {
  git status --porcelain --untracked-files=all
  git ls-files -z --modified --others --exclude-standard | xargs -0 -r sha1sum
}
stage "nbdev sync check"
if before=$(snapshot); then
  nbdev-export && nbdev-clean && nbdev-clean --fname index.ipynb || failures+=("sync check: nbdev-export or nbdev-clean failed")
  after=$(snapshot)
  if [ "$before" != "$after" ]; then
    echo "nbdev-export / nbdev-clean changed files. Run them and commit the result:"
    diff <(echo "$before") <(echo "$after")
    failures+=("sync check: nbdev-export / nbdev-clean changed files")
  else
    echo "in sync"
  fi
else
  failures+=("sync check: it needs a git checkout")
fi

# ruff over what people write (pyproject's [tool.ruff]: the notebooks' code cells, tests/, tools/, bench/; nbtrainer/ is
# generated from the notebooks). `ruff format nbs tests tools bench index.ipynb && nbdev-export` fixes the format.
stage "ruff check, ruff format --check"
sources=(nbs tests tools bench index.ipynb)
if command -v ruff >/dev/null; then
  ruff check -q "${sources[@]}" || failures+=("ruff check: lint errors (run: ruff check ${sources[*]})")
  ruff format --check -q "${sources[@]}" ||
    failures+=("ruff format --check: files to format (run: ruff format ${sources[*]} && nbdev-export)")
else
  failures+=("ruff is missing: pip install -e '.[dev]'")
fi

# Bytecode for the package, once: every notebook, kernel, worker and subprocess below imports it, and where
# PYTHONDONTWRITEBYTECODE is set (CI, some containers) each would compile its 14,000 lines again (0.2-0.3 s each).
python -m compileall -q nbtrainer >/dev/null || failures+=("python -m compileall nbtrainer failed")

# The notebooks as nbdev-test runs them, each in a process of its own (notebooks re-run the cells that attach methods to
# shared classes: a worker pool would carry one notebook's definitions into the next), forked from one that imported
# torch and nbdev once (tools/test_notebooks.py)
if $quick; then notebooks=$(ls nbs/00*.ipynb); else notebooks=$(find nbs -type f -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort); fi
stage "notebooks (nbdev's test_nb, $jobs at a time, each in a process of its own)"
# shellcheck disable=SC2086 - one path per word
python tools/test_notebooks.py -j "$jobs" $notebooks | tee "$logs/notebooks.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then
  mapfile -t failed < <(sed -n 's/^failed: //p' "$logs/notebooks.log")
  [ "${#failed[@]}" -gt 0 ] || failed=("the notebook runner failed (python tools/test_notebooks.py)")
  failures+=("${failed[@]/#/notebook }")
fi

stage "tests/ (pytest)"
if $quick; then selection=(-m 'not (ui or kernel or distributed or slow or cuda)'); else selection=(); fi
# --dist loadfile: a file's tests on one worker, so its module fixtures (the rendered docs, a trained FSDP run) run once
python -m pytest tests "${selection[@]}" -n "$jobs" --dist loadfile --no-loadscope-reorder -q -rfE --durations=15 2>&1 | tee "$logs/pytest.log"
rc=${PIPESTATUS[0]}
case "$rc" in
  0) ;;
  5) echo "pytest collected no tests" ;;
  *) mapfile -t failed < <(grep -E '^(FAILED|ERROR) ' "$logs/pytest.log")
     [ "${#failed[@]}" -gt 0 ] || failed=("pytest exited with code $rc")
     failures+=("${failed[@]/#/pytest: }") ;;
esac

echo
echo "== summary ($((SECONDS - started)) s)"
if [ "${#failures[@]}" -eq 0 ]; then echo "every stage passed"; exit 0; fi
echo "${#failures[@]} failure(s):"
printf '  %s\n' "${failures[@]}"
exit 1
