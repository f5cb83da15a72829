"""The operator guide's blocks run, as :mod:`tests.test_doc_blocks` runs every other document's
(its docstring says how); a file of its own because it is the longest, so that ``--dist
loadfile`` runs it beside the other documents rather than after them."""

from __future__ import annotations

import pytest
from test_doc_blocks import OPERATOR_GUIDE, run_document, runnable


@pytest.mark.slow
def test_the_operator_guide_blocks_run(tmp_path, request):
    assert runnable(OPERATOR_GUIDE)
    run_document(OPERATOR_GUIDE, tmp_path, request)
