"""Render the notebooks to a local HTML site in `_docs/`, with no Quarto: what a reader of the docs would see.

    python tools/render_docs.py              # writes _docs/index.html (the contents), _docs/quickstart.html, ...
    python tools/render_docs.py --out site

The published site is built by nbdev and Quarto (`.github/workflows/deploy.yaml`) where the network allows. This render
uses `nbconvert` alone, so it runs offline and in CI. Like nbdev's docs it shows the stored outputs (it runs nothing),
leaves out `#| hide` cells, and drops the `#|` directive lines. Links between notebooks are rewritten to the pages.
"""

import argparse, html, re
from pathlib import Path
from urllib.parse import urldefrag

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'


def pages():
    "Each notebook and the page it renders to, relative to the site root: the quick start, tutorials, then modules."
    tutorials = sorted((NBS / 'tutorials').glob('*.ipynb'))
    modules = sorted(p for p in NBS.glob('*.ipynb') if not p.is_symlink())  # nbs/index.ipynb: the quick start
    return {
        ROOT / 'index.ipynb': Path('quickstart.html'),
        **{p: p.relative_to(NBS).with_suffix('.html') for p in tutorials + modules},
    }


def title(nb, path):
    "The notebook's first `# ` heading, else its file name."
    for cell in nb.cells:
        found = cell.cell_type == 'markdown' and re.search(r'(?m)^# (.+)$', cell.source)
        if found:
            return found.group(1).strip()
    return path.stem


def for_readers(nb):
    "The notebook as the docs show it: no hidden cells, no directive lines."
    nb.cells = [c for c in nb.cells if not (c.cell_type == 'code' and re.match(r'\s*#\|\s*hide\b', c.source))]
    for cell in nb.cells:
        if cell.cell_type == 'code':
            cell.source = re.sub(r'(?m)^#\|.*\n?', '', cell.source)
    return nb


def rewrite_links(body, source, page, site):
    "Point links to other notebooks at their pages (`../nbs/tutorials/x.ipynb#part` -> `tutorials/x.html#part`)."

    def replace(match):
        target, fragment = urldefrag(match.group(2))
        linked = (source.parent / target).resolve()
        if linked not in site:
            return match.group(0)
        href = Path(*(['..'] * (len(page.parts) - 1)), site[linked]).as_posix()
        return f'{match.group(1)}"{href}{"#" + fragment if fragment else ""}"'

    return re.sub(r'(href=)"([^":#]+\.ipynb(?:#[^"]*)?)"', replace, body)


def contents(entries):
    "The index page: links to every page, grouped as a reader looks for them."
    groups = {'Start here': [], 'Tutorials': [], 'Modules': []}
    for page, name in entries:
        group = (
            'Start here'
            if page.name == 'quickstart.html'
            else 'Tutorials'
            if page.parts[0] == 'tutorials'
            else 'Modules'
        )
        groups[group].append(f'<li><a href="{page.as_posix()}">{html.escape(name)}</a></li>')
    sections = ''.join(f'<h2>{g}</h2><ul>{"".join(items)}</ul>' for g, items in groups.items() if items)
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>nbtrainer docs</title></head>'
        f'<body><h1>nbtrainer</h1>{sections}</body></html>'
    )


def unless_highlighted(clean_html):
    """nbconvert's lab template passes every code cell's highlighted source through bleach (`clean_html`), whatever
    `sanitize_html` says, for HTML Pygments escapes by construction (44 s of render without this, 30 s with it, idle). Other HTML (raw
    cells, inline SVG) is still cleaned; the prefix test is safe only because these are our own notebooks. The class
    starts with a space when the notebook names its language (`<div class=" highlight hl-ipython3">`)."""

    def clean(html):
        return html if str(html).startswith(('<div class="highlight', '<div class=" highlight')) else clean_html(html)

    return clean


def render(out):
    site = {src.resolve(): page for src, page in pages().items()}
    exporter, entries = HTMLExporter(template_name='lab'), []
    exporter.register_filter('clean_html', unless_highlighted(exporter.environment.filters['clean_html']))
    for source, page in site.items():
        nb = nbformat.read(source, as_version=4)
        body, _ = exporter.from_notebook_node(for_readers(nb), resources={'metadata': {'name': title(nb, source)}})
        (out / page).parent.mkdir(parents=True, exist_ok=True)
        (out / page).write_text(rewrite_links(body, source, page, site), encoding='utf-8')
        entries.append((page, title(nb, source)))
    (out / 'index.html').write_text(contents(entries), encoding='utf-8')
    return entries


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', type=Path, default=ROOT / '_docs')
    out = parser.parse_args().out
    entries = render(out)
    print(f'{len(entries)} pages in {out}; open {out / "index.html"}')


if __name__ == '__main__':
    main()
