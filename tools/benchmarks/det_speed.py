"""Time of DET computation at a realistic size: 500 utterances x 400 frames, the default
1001-threshold grid, refractory period 100 frames. Prints seconds (fastest of 3).

  python tools/benchmarks/det_speed.py
"""
import time

import numpy as np

from toolkit.tasks.kws import scoring


def main() -> None:
    rng = np.random.default_rng(3)
    probs = [rng.beta(0.5, 20, size=(400, 1)).astype(np.float32) for _ in range(500)]
    for x in probs[:100]:
        x[200:230, 0] = rng.uniform(0.3, 1.0)
    labels, durations = [0] * 100 + [-1] * 400, [4.0] * 500
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        scoring.compute_det(probs, labels, durations, 1, refractory_frames=100)
        best = min(best, time.perf_counter() - start)
    print(f"compute_det: 500 utterances x 400 frames x {scoring.threshold_grid().size} "
          f"thresholds: {best:.3f} s")


if __name__ == "__main__":
    main()
