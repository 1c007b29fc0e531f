"""The docs site nbdev builds (`nbdev-docs` in .github/workflows/deploy.yaml): its preparation, run up to the Quarto call
(no Quarto here), on a copy of the project. The home page is the quick start (nbs/index.ipynb links to index.ipynb), and
every module notebook and tutorial is a page of the site, in its sidebar."""

import shutil, subprocess, sys

import nbformat
import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # nbdev processes every notebook: about 30 s

PREPARE = '''
import nbdev.quarto as quarto
quarto._ensure_quarto = lambda: None  # nbdev-docs would install Quarto here; the render is what this test leaves out
cache, cfg, path = quarto._pre_docs(n_workers=0)
print(cache)
'''


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
    project = tmp_path_factory.mktemp('site') / 'project'
    skip = shutil.ignore_patterns('.git', '.venv', '_proc', '_docs', 'runs', '.ipynb_checkpoints', '__pycache__')
    shutil.copytree(ROOT, project, ignore=skip, symlinks=True)
    run = subprocess.run([sys.executable, '-c', PREPARE], cwd=project, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return project, project / '_proc'


def test_the_home_page_is_the_quick_start(prepared):
    project, cache = prepared
    assert (project / 'nbs' / 'index.ipynb').is_symlink(), 'nbs/index.ipynb must link to ../index.ipynb'
    home = nbformat.read(cache / 'index.ipynb', as_version=4)
    quick_start = nbformat.read(ROOT / 'index.ipynb', as_version=4)
    heading = next(c.source for c in quick_start.cells if c.cell_type == 'markdown').splitlines()[0].lstrip('# ')
    assert any(heading in c.source for c in home.cells if c.cell_type == 'markdown'), heading
    sidebar = (cache / 'sidebar.yml').read_text()
    assert sidebar.split('contents:')[1].split()[:2] == ['-', 'index.ipynb'], sidebar[:300]


def test_every_notebook_and_tutorial_is_a_page(prepared):
    project, cache = prepared
    sources = [p for p in (ROOT / 'nbs').rglob('*.ipynb') if not p.is_symlink() and '.ipynb_checkpoints' not in p.parts]
    pages = [p.relative_to(ROOT / 'nbs') for p in sources]
    missing = [str(p) for p in pages if not (cache / p).exists()]
    assert not missing, f'not prepared for the site: {missing}'
    sidebar = (cache / 'sidebar.yml').read_text()
    assert all(str(p) in sidebar for p in pages), [str(p) for p in pages if str(p) not in sidebar]
    assert any(p.parts[0] == 'tutorials' for p in pages)
