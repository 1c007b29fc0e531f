"""The local HTML docs (tools/render_docs.py) open in headless Chromium: every page loads, its figures load, it shows
as many figures as its notebook stores, and no page shows raw widget JSON or a widget placeholder."""

import os, subprocess, sys

import nbformat
import pytest

from conftest import CHROMIUM, CHROMIUM_ARGS, ROOT

sys.path.insert(0, str(ROOT / 'tools'))
from render_docs import for_readers, pages  # noqa: E402

pytestmark = pytest.mark.ui  # the rendered pages in Chromium

RAW_WIDGET = (
    'application/vnd.jupyter.widget-view+json',
    '"model_id"',
    'Loading widget',
    'VBox(children',
    'HBox(children',
)


def stored_figures(path):
    "How many figures a reader of the docs should see: image outputs of the cells the docs show."
    cells = for_readers(nbformat.read(path, as_version=4)).cells
    return sum('image/png' in out.get('data', {}) for c in cells if c.cell_type == 'code' for out in c.outputs)


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp('docs')
    subprocess.run([sys.executable, str(ROOT / 'tools' / 'render_docs.py'), '--out', str(out)], check=True, timeout=600)
    return out


@pytest.fixture(scope='module')
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            "Chromium is missing: apt-get install -y chromium chromium-driver (tools/test.sh does it when root)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope='module')
def tab(browser):
    "One tab for every page, as a reader follows links: a new tab each was a new renderer process (twice the time)."
    page = browser.new_page()
    yield page
    page.close()


def test_contents_page_links_every_notebook(site, tab):
    page = tab
    page.goto((site / 'index.html').as_uri())
    links = page.eval_on_selector_all('a', 'links => links.map(a => a.getAttribute("href"))')
    assert sorted(links) == sorted(p.as_posix() for p in pages().values())
    tutorials = sorted((ROOT / 'nbs' / 'tutorials').glob('*.ipynb'))
    assert [link for link in links if link.startswith('tutorials/')] == [f'tutorials/{p.stem}.html' for p in tutorials]


@pytest.mark.parametrize('source', list(pages()), ids=[p.name for p in pages()])
def test_page_shows_its_figures_and_no_widget_json(site, tab, source):
    target, page = site / pages()[source], tab
    page.goto(target.as_uri(), wait_until='load')
    images = page.eval_on_selector_all(
        '.jp-OutputArea-output img', 'imgs => imgs.map(i => [i.complete, i.naturalWidth])'
    )
    broken = [i for i, (complete, width) in enumerate(images) if not (complete and width > 0)]
    assert not broken, f'{target.name}: images {broken} did not load'
    assert len(images) >= stored_figures(source), (
        f'{target.name}: {len(images)} figures shown, {stored_figures(source)} stored'
    )
    text = page.inner_text('body')
    assert not [w for w in RAW_WIDGET if w in text], f'{target.name} shows raw widget output'
    for href in page.eval_on_selector_all('a[href$=".html"]', 'links => links.map(a => a.getAttribute("href"))'):
        if '://' not in href:
            assert (target.parent / href).exists(), f'{target.name} links to missing {href}'
