#!/usr/bin/env bash
# Every test, in the order that fails fastest: the nbdev sync check, the notebooks, then tests/.
# Run inside the project's environment (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

# The UI test drives JupyterLab in Debian's Chromium (never `playwright install`: it downloads, and fails offline).
if ! command -v chromium >/dev/null && ! command -v google-chrome >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing chromium for the UI test"
    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "chromium is missing: run 'sudo apt-get install -y chromium chromium-driver' (the UI test needs it)"; exit 1
  fi
fi

# Exporting and cleaning must change nothing: the notebooks are the source and were exported and cleaned.
snapshot() {
  git status --porcelain --untracked-files=all
  git ls-files -z --modified --others --exclude-standard | xargs -0 -r sha1sum
}
echo "== nbdev sync check"
before=$(snapshot) || { echo "the sync check needs a git checkout"; exit 1; }
nbdev-export
nbdev-clean
nbdev-clean --fname index.ipynb
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "FAIL: nbdev-export / nbdev-clean changed files. Run them and commit the result:"
  diff <(echo "$before") <(echo "$after") || true
  exit 1
fi
echo "in sync"

echo "== notebooks (nbdev-test, each in a fresh process)"
# One process per notebook: notebooks re-run the cells that attach methods to shared classes (Learner.fit_async, ...),
# and nbdev-test's worker pool would carry one notebook's definitions into the next.
find nbs -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort | xargs -P 2 -I{} sh -c 'nbdev-test "{}" >"$0/$(basename {}).log" 2>&1 && echo "ok   {}" || { echo "FAIL {}"; cat "$0/$(basename {}).log"; exit 1; }' "$(mktemp -d)"

echo "== tests/ (pytest)"
set +e
python -m pytest -q tests
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi
exit "$rc"
