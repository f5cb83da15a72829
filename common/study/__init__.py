"""The study contract: study and round specs, their fields, payload encoding and round 0/refinement rounds.

Also the planner, the sketch's size (sizing), the aggregate's range check (aggregate), the private
box read across devices (box_round), the verdict on published centroids (verdict) and its
forecast (forecast).
"""
