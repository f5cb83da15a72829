"""fedsketch.common: the math and types that devices and the coordinator share.

It imports neither ``fedsketch.client`` nor ``fedsketch.server``. Its rooms, lowest first (a room
imports only its own modules and the rooms below it; tests/test_contract.py keeps the order):

* the ground floor, the modules directly here: ``choices`` (public names and defaults),
  ``features`` (the feature maps and their integer encoding), ``exactmath``, ``spec_fields``,
  ``atomicfile``, ``text`` and ``helptext`` (the command line's tidy help pages), and the
  generated gRPC code ``pb``;
* ``net``: TLS, coordinator addresses and links, Ed25519 signing, signed device reads;
* ``data``: data readers and formats, synthetic data;
* ``dp``: calibration, exact samplers and budgets of every release, the noisy Lloyd step;
* ``sketch``: frequencies, feature sums, the private release, its scale and box, spec and file;
* ``secagg``: secure aggregation (protocol, crypto, Shamir sharing, parameters, wire);
* ``study``: the study and round specs, their fields and payloads, round 0, refinement rounds,
  the planner;
* ``cli``: what every command shares (errors in words, coordinator and data options).
"""
