__version__ = "0.0.1"


def __getattr__(name):
    "`nbtrainer.launch`, imported on first use so that `import nbtrainer` stays light."
    if name == 'launch':
        from .distributed import launch
        return launch
    raise AttributeError(f"module 'nbtrainer' has no attribute {name!r}")
