"""The coordinator service: :mod:`.coordinator` (the study lifecycle and the validation of every
message, free of any transport), :mod:`.rounds` (a study's refinement rounds), :mod:`.secure_round`
(the secure-aggregation round), :mod:`.messages` (the signed messages devices send) and
:mod:`.api` (the gRPC edge: servicers, messages, operator credentials, refusal codes to statuses).
Imports the store and the decoder, never the bench, the simulator or the CLI
(``tests/test_contract.py`` keeps it so)."""
