"""Copy the browser tests' screenshots of each dashboard state into `nbs/images/ui/`, where the dashboard notebook
shows them (`nbs/17_dashboard.ipynb`, "Screenshots"; the study's live table in `nbs/19_study.ipynb`). Run the browser tests first, then:

    python -m pytest tests/test_ui.py tests/test_ui_live.py tests/test_ui_fork.py tests/test_ui_display.py tests/test_ui_study.py
    python tools/ui_screenshots.py && python tools/run_notebooks.py nbs/17_dashboard.ipynb

Each image is narrowed to 900 px at most and stored with 256 colours (no dithering), so that the notebook that embeds it
stays small."""

from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SOURCE, TARGET = ROOT / 'test-artifacts' / 'ui', ROOT / 'nbs' / 'images' / 'ui'
SHOTS = {
    'cell-running.png': 'running.png',
    'cell-paused.png': 'paused.png',
    'cell-stopped.png': 'stopped.png',
    'cell-failed.png': 'failed.png',
    'cell-lr-finder.png': 'lr-finder.png',
    'cell-reattached.png': 'reattached.png',
    'live-light-theme.png': 'light-theme.png',
    'fork-branch.png': 'fork-branch.png',
    'html-display.png': 'html-display.png',
    'live-long-fit.png': 'long-fit.png',
    'live-waiting.png': 'waiting.png',
    'fork-controls.png': 'fork-controls.png',
    'long-legend.png': 'long-legend.png',
    'study-live.png': 'study-live.png',
}


def main():
    TARGET.mkdir(parents=True, exist_ok=True)
    for source, target in SHOTS.items():
        if not (SOURCE / source).exists():
            print(f'missing {source}: run its browser test first (kept: {target})')
            continue
        image = Image.open(SOURCE / source).convert('RGB')
        if image.width > 900:
            image = image.resize((900, round(image.height * 900 / image.width)), Image.LANCZOS)
        image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
            TARGET / target, optimize=True
        )
        print(f'{target}: {(TARGET / target).stat().st_size // 1024} KB')


if __name__ == '__main__':
    main()
