"""The operator's console of a coordinator: Prometheus metrics (:mod:`.metrics`, :mod:`.instrument`),
the standard gRPC health service (:mod:`.health`) and a read-only web page (:mod:`.page`, drawn by
:mod:`.html` and :mod:`.svg`). ``coordinator serve --metrics`` and ``--console`` start them;
docs/operator-console.md is the operator's guide."""
