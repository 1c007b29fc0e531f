import pathlib, sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent  # console scripts of the environment running pytest
