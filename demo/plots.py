"""PNG plots of a run, drawn with matplotlib's Agg backend (no display needed).

matplotlib is the optional ``demo`` extra (``pip install -e '.[demo]'``; ``make demo`` installs
it); without it :func:`write_plots` returns no files and says why.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

from demo.stats import SMALL
from demo.summary import Snapshot


def plotting_available() -> bool:
    """True when matplotlib is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def write_plots(snapshot: Snapshot, directory: Path) -> list[Path]:
    """Write ``wait.png`` (p99 wait over time) and ``throughput.png``; return their paths."""
    if not plotting_available():
        return []
    import matplotlib as mpl  # noqa: PLC0415 - optional dependency

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the backend

    c = snapshot.collector
    written = []

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for group, color in ((SMALL, "tab:green"), ("flooder", "tab:red")):
        for q, style in ((0.99, "-"), (0.5, ":")):
            xs, ys = c.wait_series(group, q)
            axes.plot(xs, ys, style, color=color, label=f"{group} p{int(q * 100)}")
    axes.set_xlabel("seconds since start")
    axes.set_yscale("symlog", linthresh=10)  # tens of ms and minutes on one plot
    axes.set_ylabel("wait before the handler (ms, log scale)")
    axes.set_title("per-tenant wait: small tenants vs the flooder")
    axes.legend()
    axes.grid(alpha=0.3)
    path = directory / "wait.png"
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)

    figure, axes = plt.subplots(figsize=(9, 4.5))
    handled_x, handled_y = c.throughput_series()
    axes.plot(handled_x, handled_y, color="tab:blue", label="handled messages/s")
    accepted = snapshot.accepted_series
    if len(accepted) > 1:
        rate_x = [t for t, _ in accepted[1:]]
        rate_y = [
            (n1 - n0) / max(t1 - t0, 1e-3) for (t0, n0), (t1, n1) in itertools.pairwise(accepted)
        ]
        axes.plot(rate_x, rate_y, color="tab:orange", label="accepted webhooks/s")
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("per second")
    axes.set_title("throughput")
    axes.legend()
    axes.grid(alpha=0.3)
    path = directory / "throughput.png"
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)
    return written
