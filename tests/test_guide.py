"""docs/guide.md's figures are the code's: the notebook table and the Learner's sizes, written by tools/guide_figures.py."""

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / 'tools'))
import guide_figures  # noqa: E402


def test_the_guides_figures_are_the_codes():
    text = guide_figures.GUIDE.read_text()
    assert guide_figures.written(text) == text, (
        'docs/guide.md: its figures are stale: run `python tools/guide_figures.py`'
    )


def test_the_figures_follow_the_code():
    "The table has a row per module notebook, and a changed figure is found (the check can fail)."
    table = guide_figures.notebook_table()
    notebooks = [p for p in (ROOT / 'nbs').glob('*.ipynb') if not p.is_symlink()]
    assert len(table.splitlines()) == 2 + len(notebooks) and '`nbs/00f_parts.ipynb` | `nbtrainer.parts`' in table
    text = guide_figures.GUIDE.read_text().replace('`nbs/00f_parts.ipynb`', '`nbs/00f_gone.ipynb`', 1)
    assert guide_figures.written(text) != text
