"""The coordinator service: gRPC wiring, validation of every message, the study lifecycle and the
secure-aggregation round. Imports the store and the decoder, never the bench, the simulator or
the CLI (``tests/test_contract.py`` keeps it so)."""
