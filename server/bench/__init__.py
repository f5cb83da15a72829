"""The research bench: the trusted curator's private mechanisms (k-means, PCA, subspace
clustering) on one dataset, their metrics, and the comparison behind ``fedsketch compare``.
Nothing in the coordinator service imports it."""
