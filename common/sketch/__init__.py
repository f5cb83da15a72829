"""The sketch: frequencies, feature sums, the private release, its scale and box, its spec and file."""
