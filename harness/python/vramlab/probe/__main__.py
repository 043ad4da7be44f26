"""`python3 harness/python/vramlab/probe ...` (a directory run as a script) or
`python -m vramlab.probe`."""
import sys

if __package__:
    from .cli import main
else:
    # Run as a directory: Python put the package's own directory first on sys.path and runs
    # this file outside any package. Import the package from its parent directory instead, so
    # that its modules import one another relatively (and none shadows a standard module).
    import importlib
    from pathlib import Path

    _pkg = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _pkg]
    sys.path.insert(0, str(_pkg.parent))
    main = importlib.import_module(f"{_pkg.name}.cli").main

if __name__ == "__main__":
    sys.exit(main())
