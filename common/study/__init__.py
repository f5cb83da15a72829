"""The study contract: study and round specs, their fields, payload encoding and round-0/refinement rounds;
the planner, the verdict on published centroids (verdict) and its forecast (forecast)."""
