"""From releases to centroids: CL-OMPR (:mod:`.clompr`) and the compressive k-means pipeline
that averages device sketches and decodes them (:mod:`.pipeline`), the check that decoded
centroids stand above the sketch's noise (:mod:`.identify`), the verdict on published centroids
from a sketch or a round's release (:mod:`.judge`), and a refinement round's next
centres from the devices' summed cell statistics (:mod:`.refine`, with the over-seeding steps of
:mod:`.overseed` and the weighted k-means of :mod:`.kmeans`). Reads no data."""
