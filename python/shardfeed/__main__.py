"""``python -m shardfeed``: the ``shardfeed`` command."""

from .cli import main

main()
