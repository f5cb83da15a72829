"""fedsketch.common.dp: where the sketch release's noise is calibrated and drawn, and its budget
traced (the bench's centralized mechanisms and :mod:`fedsketch.common.dp.lloyd` use its calibration
and draw their own noise).

* :mod:`.calibration`: budget checks, the sensitivity of each released quantity, the scale of each
  noise primitive, the discrete-Laplace tail and composition (MECHANISMS §0.4–0.6);
* :mod:`.budget`: :class:`~.budget.PrivacySpec`, the add/remove split and
  :class:`~.budget.NoiseTerm`, the trace of one draw;
* :mod:`.plan`: the noise terms of a sketch release, read by the release, the coordinator's
  payload check and secure aggregation;
* :mod:`.samplers`: the draws of a noise term and of a secure-aggregation share, and the
  CSPRNG-seeded generator of the bench's float mechanisms;
* :mod:`.exact`: exact integer samplers (geometric, discrete Laplace, discrete Gaussian, negative
  binomial, DLap shares) that read only OS random bits.
"""
