"""``python -m cli``: the same as the ``bench`` console script."""
from cli.app import main

main()
