"""Figures shared by the Python benchmarks (bench_python.py, bench_loop.py).

Both scripts are run by path, so this module is found beside them, in the
source tree and where `unimem bench pyloop`'s script is installed.
"""
import statistics


def spread(samples, method="exclusive"):
    """Interquartile range of the samples (0 for fewer than two).

    method is statistics.quantiles' method: "exclusive" (its default) or
    "inclusive", which treats the samples as the whole population and so
    stays inside their range for the few repetitions of a quick run.
    """
    if len(samples) < 2:
        return 0.0
    q = statistics.quantiles(samples, n=4, method=method)
    return q[2] - q[0]
