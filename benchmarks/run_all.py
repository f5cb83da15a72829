"""`make bench`: every benchmark in turn; paste the tables into benchmarks/RESULTS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    ["bench_sketch.py"],
    ["bench_decode.py"],
    ["bench_pipeline.py"],
    ["bench_accuracy.py", "nonprivate"],
    ["bench_accuracy.py", "private"],
    ["bench_scale.py"],
    ["bench_scale_real.py", "--json", "out/scale_real.json"],
]

if __name__ == "__main__":
    for script, *args in SCRIPTS:
        print(f"\n=== {script} {' '.join(args)} ===", flush=True)
        subprocess.run([sys.executable, str(HERE / script), *args], check=True, cwd=HERE)
