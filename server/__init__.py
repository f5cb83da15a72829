"""fedsketch.server: the coordinator side, in rooms by concern.

* :mod:`~fedsketch.server.service`: the coordinator product: gRPC services, the study lifecycle,
  the secure-aggregation round (never imports ``bench``, ``sim`` or ``cli``);
* :mod:`~fedsketch.server.store`: where the coordinator keeps its state (SQLite);
* :mod:`~fedsketch.server.decode`: CL-OMPR and the compressive k-means pipeline from sketches
  to centroids;
* :mod:`~fedsketch.server.bench`: the research bench: the trusted curator's mechanisms (k-means,
  PCA, subspace clustering), their metrics and ``compare``;
* :mod:`~fedsketch.server.sim`: the multi-device simulator (a real coordinator, real devices);
* :mod:`~fedsketch.server.cli`: the ``fedsketch`` command line (device commands come from
  :mod:`fedsketch.client.cli`).
"""
