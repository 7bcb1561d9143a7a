"""``python -m worker.cli``: the taskhook command without its console script."""

from worker.cli import main

main()
