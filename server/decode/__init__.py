"""From sketches to centroids: CL-OMPR (:mod:`.clompr`) and the compressive k-means pipeline
that averages device sketches and decodes them (:mod:`.pipeline`). Reads no data."""
