"""Benchmarks: each runs as ``python -m benchmarks.NAME`` (``--quick`` for a short run).

Run that way, a benchmark's process is put under jemalloc first where the machine has it, as
the ``sstore`` command's is (``sstore.base.allocator``; ``SSTORE_MALLOC=system`` measures the C
library's malloc instead): the numbers are those a user of the command gets. While Python
locates the module of ``-m``, ``sys.argv[0]`` is ``"-m"``: that is how a run as a program is
told from an import by a test.
"""

import sys

if sys.argv[:1] == ["-m"]:
    from sstore.base.allocator import use_jemalloc

    use_jemalloc()
