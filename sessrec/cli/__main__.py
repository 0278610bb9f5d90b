"""``python -m sessrec.cli``: the ``sessrec`` command."""

from sessrec.cli import main

main()
