"""fedsketch: federated, differentially private compressive k-means, as a Python library.

The three steps of the ``fedsketch`` command line, as functions (:mod:`fedsketch.steps`):

* :func:`sketch`: records (an array, a ``.npy``/CSV path, or chunks) → a private :class:`Sketch`;
* :func:`decode`: a sketch → k centroids, their weights and the identifiability verdict
  (:class:`Decoding`);
* :func:`evaluate`: SSE/n of centroids on records, and relative SSE against scikit-learn's k-means
  (:class:`Evaluation`).

And :class:`CompressiveKMeans` (:mod:`fedsketch.estimator`), a scikit-learn estimator that sketches
and decodes in one ``fit``. ``__version__`` is the installed distribution's version.

Every name is imported on first use (PEP 562): ``import fedsketch.client`` on a device loads
neither the decoder nor scikit-learn, and the functions work without scikit-learn, which only
:class:`CompressiveKMeans` and the k-means reference of :func:`evaluate` need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsketch.estimator import CompressiveKMeans
    from fedsketch.steps import (
        Decoding,
        Evaluation,
        Identifiability,
        NotIdentifiableWarning,
        Sketch,
        decode,
        evaluate,
        load_sketch,
        sketch,
    )

#: Each public name and the module that defines it.
_EXPORTS = {
    "sketch": "fedsketch.steps",
    "decode": "fedsketch.steps",
    "evaluate": "fedsketch.steps",
    "load_sketch": "fedsketch.steps",
    "Sketch": "fedsketch.steps",
    "Decoding": "fedsketch.steps",
    "Evaluation": "fedsketch.steps",
    "Identifiability": "fedsketch.steps",
    "NotIdentifiableWarning": "fedsketch.steps",
    "CompressiveKMeans": "fedsketch.estimator",
}

__all__ = ["CompressiveKMeans", "Decoding", "Evaluation", "Identifiability", "NotIdentifiableWarning",
           "Sketch", "__version__", "decode", "evaluate", "load_sketch", "sketch"]


def __getattr__(name: str) -> Any:
    """A public name, imported on first use and kept (module docstring)."""
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("fedsketch")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'fedsketch' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
