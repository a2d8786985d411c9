"""``python -m gpscale``: the command line (what torchrun launches with ``-m gpscale``)."""
from .cli import main

raise SystemExit(main())
