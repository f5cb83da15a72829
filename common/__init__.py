"""fedsketch.common: the math and types that devices and the coordinator share.

Frequencies, feature maps, streaming sketching, privacy calibration and noise (the ``dp``
package), secure aggregation (the ``secagg`` package), data loading and the sketch file format.
Imports neither ``fedsketch.client`` nor ``fedsketch.server``.
"""
