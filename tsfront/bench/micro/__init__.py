"""``tsfront.bench.micro``: pytest-benchmark micro-benchmarks of the hot paths, in-process.

The end-to-end suite (processes, sockets, CPU from /proc) is ``tsfront bench``; these time
its building blocks one call at a time, for quick regressions: the native ingest and poll
(``bench_core``), the wire codecs (``bench_wire``), routing (``bench_routing``), the
submission queue and wake-up candidates (``bench_queue``), detokenization and stop matching
(``bench_text``), the tool-call and reasoning parsers (``bench_tools``). Run them with
``.venv/bin/python -m pytest tsfront/bench/micro`` (``conftest.py`` collects the
``bench_*.py`` files); they need the ``test`` and ``bench`` extras.
"""
