#!/usr/bin/env bash
# Every test, in the order that fails fastest: the nbdev sync check, the notebooks, then tests/.
# Run inside the project's environment (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

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

echo "== notebooks (nbdev-test)"
nbdev-test --n-workers 2

echo "== tests/ (pytest)"
set +e
python -m pytest -q tests
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi
exit "$rc"
