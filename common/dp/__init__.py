"""fedsketch.common.dp: where the sketch release's noise is calibrated and drawn, and its budget
traced (the bench's centralized mechanisms and :mod:`fedsketch.common.lloyd` use its calibration
and draw their own noise).

* :mod:`.calibration`: budget checks, the sensitivity of each released quantity, the scale of each
  noise primitive, the discrete-Laplace tail and composition (MECHANISMS §0.4–0.6);
* :mod:`.budget`: :class:`~.budget.PrivacySpec`, the add/remove split and
  :class:`~.budget.NoiseTerm`, the trace of one draw;
* :mod:`.plan`: the noise terms of a sketch release, read by the release, the coordinator's
  payload check and secure aggregation;
* :mod:`.samplers`: the CSPRNG-seeded generator and the samplers (Laplace, Gaussian, discrete
  Laplace, negative-binomial shares).
"""
