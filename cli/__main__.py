"""``python -m surgery.cli``: the same as the ``surgery`` console script."""

from __future__ import annotations

from surgery.cli import main

if __name__ == "__main__":
    main()
