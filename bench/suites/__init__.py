"""The registered benchmark suites: one module per suite, each with ``run(quick) -> payload``
(``marlbuf bench SUITE``; :data:`marlbuf.bench.cli.SUITES` lists them)."""
