"""`python -m wavefront <verb>` (also what `torchrun -m wavefront train ...` runs)."""

from wavefront.cli import main

main()
