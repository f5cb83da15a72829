"""examples/quickstart.py runs as a user would run it, and says what it should."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The example's relative SSE (private fit at ε = 1 over k-means, n_init = 3), measured over 40
#: fits (the noise is from OS bits): median 1.133, sd 0.007, max 1.155. The limit is above every
#: run, 9 sd above the mean.
LIMIT = 1.2


def test_quickstart_fits_predicts_and_scores(tmp_path):
    script = ROOT / "examples" / "quickstart.py"
    code = [line for line in script.read_text().split('"""', 2)[2].splitlines()
            if line.strip() and not line.startswith(("import ", "from ", "#"))]
    assert len(code) < 10, code  # the user's code, imports aside
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    centroids = re.findall(r"\[\s*([\d.]+)\s+([\d.]+)\s*\]", res.stdout)  # numpy may print "2432. ]"
    assert len(centroids) == 4, res.stdout
    assert "verdict on the centroids: usable, with caveats" in res.stdout  # a sketch alone is never "good"
    assert re.search(r"cluster of a 3-hour, 1,000-mile flight: [0-3]\n", res.stdout)
    relative = float(re.search(r"relative SSE against non-private k-means: ([\d.]+)", res.stdout).group(1))
    assert 0.95 < relative < LIMIT, res.stdout
