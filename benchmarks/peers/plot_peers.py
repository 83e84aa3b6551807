"""Draw run_peers.py's results: throughput, peak memory and restart time against distinct keys.

    .cache/peers/quix-venv/bin/python benchmarks/peers/plot_peers.py [--results .cache/peers/results.json]

Writes docs/peers-throughput.png, docs/peers-memory.png and docs/peers-restore.png (one line
per system, log-scaled key axis; a point per size measured, the median of its runs).
matplotlib comes from the peers' own venv (run_peers.py creates it), not the project's.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LABELS = {
    "grudge-batch": "grudge-stream, batch runtime",
    "grudge-lean": "grudge-stream, Faust lean drain",
    "ks": "Kafka Streams 4.4 (at-least-once)",
    "ks-eos": "Kafka Streams 4.4 (exactly-once v2)",
    "quix": "Quix Streams 3.28",
    "faust-table": "Faust Table (exact)",
}
COLORS: dict = {}
STYLE = {"grudge-batch": "o-", "grudge-lean": "o--", "ks": "s-", "ks-eos": "s--", "quix": "^-",
         "faust-table": "v-"}


def restart(size: dict, system: str, phase: str):
    """Median over the runs of process start -> first processed record after kill -9."""
    v = sorted(r[f"restart_{phase}_from_spawn_s"] for r in size["raw"].get(system, [])
               if r.get(f"restart_{phase}_from_spawn_s") is not None)
    return statistics.median(v) if v else None


def sized(doc: dict) -> list[tuple[str, dict]]:
    """The sizes in order of keys, then events (entries are "keys:events"; older files "keys")."""
    return sorted(doc["sizes"].items(), key=lambda kv: (kv[1]["keys"], kv[1]["events"]))


def series(doc: dict, metric, systems) -> dict:
    out: dict = {}
    for sk, size in sized(doc):
        for s, m in size["summary"].items():
            if s in systems and isinstance(m, dict):
                v = metric(m) if not callable(getattr(metric, "by_size", None)) else metric.by_size(size, s)
                if v is not None:
                    out.setdefault(s, []).append((size["keys"], size["events"], v))
    return out


def draw(doc: dict, metric, ylabel: str, title: str, path: Path, logy: bool = True, extra=None) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    hollow = False
    for s, pts in series(doc, metric, LABELS).items():
        # One line through the first size of each key count; a second size with the same keys
        # (more events per key) is a hollow marker above it.
        first: dict[int, float] = {}
        more: list[tuple[int, float]] = []
        for k, _, v in pts:
            (more.append((k, v)) if k in first else first.__setitem__(k, v))
        line, = ax.plot(list(first), list(first.values()), STYLE.get(s, "o-"), label=LABELS[s])
        COLORS[s] = line.get_color()
        if more:
            ax.plot(*zip(*more), STYLE.get(s, "o-")[0], mfc="none", ms=9, linestyle="none", color=COLORS[s])
            hollow = True
    if hollow:
        ax.plot([], [], "o", mfc="none", color="gray", linestyle="none", label="hollow: same keys, more events")
    if extra:
        extra(ax)
    ax.set_xscale("log")
    ticks: dict[int, list[float]] = {}
    for _, size in sized(doc):
        ticks.setdefault(size["keys"], []).append(size["events"] / 1e6)
    ax.set_xticks(list(ticks))
    ax.set_xticklabels([f"{k:,} keys\n{' / '.join(f'{e:g}' for e in ev)}M events" for k, ev in ticks.items()],
                       fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("key universe of the topic (and its event count)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}")


def fmt(x, spec=",.0f") -> str:
    return "–" if x is None else format(x, spec)


def table(doc: dict) -> None:
    """The results as one markdown table (what docs/benchmarks.md shows)."""
    print("| distinct keys (events) | system | runs | events/s | CPU-s / M events | events / CPU-s | "
          "peak RSS MiB | local state MiB | changelog / snapshot MiB | restart, state kept (s) | "
          "restart, state lost (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for sk, size in sized(doc):
        for s in LABELS:
            m = size["summary"].get(s)
            if not m:
                continue
            ev = f" ({m['events']:,} events)" if m["events"] != size["events"] else ""
            print(f"| {size['distinct_expected']:,} ({size['events']:,}) | {LABELS[s]}{ev} | {m['runs']} | "
                  f"{fmt(m['rate'])} | {fmt(m['cpu_s_per_M'], '.1f')} | {fmt(m['events_per_cpu_s'])} | "
                  f"{fmt(m['hwm_kb'] and m['hwm_kb'] / 1024)} | {fmt(m['state_dir_bytes'] / 2**20, '.1f')} | "
                  f"{fmt(m['state_topic_bytes'] / 2**20, '.1f')} | {fmt(restart(size, s, 'kept'), '.1f')} | "
                  f"{fmt(restart(size, s, 'lost'), '.1f')} |")
    print()
    print("| distinct keys | system | raised | exact raised | common | precision | recall | extra | missed | "
          "delay, source offsets (median / max) | delay, event-time ms (median / max) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for sk, size in sized(doc):
        ref = size["summary"].get("agreement_vs")
        for s in LABELS:
            a = (size["summary"].get(s) or {}).get("agreement")
            if not a or s == ref:
                continue
            print(f"| {size['distinct_expected']:,} | {LABELS[s]} vs {LABELS[ref]} | {a['raised']} | "
                  f"{a['exact_raised']} | {a['common']} | {a['precision']:.3f} | {a['recall']:.3f} | {a['extra']} | "
                  f"{a['missed']} | {fmt(a['delay_offsets_median'], 'g')} / {fmt(a['delay_offsets_max'], 'g')} | "
                  f"{fmt(a['delay_ms_median'], 'g')} / {fmt(a['delay_ms_max'], 'g')} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=ROOT / ".cache" / "peers" / "results.json")
    ap.add_argument("--outdir", type=Path, default=ROOT / "docs")
    ap.add_argument("--same-events", type=Path, default=ROOT / ".cache" / "peers" / "results-10k-10M.json",
                    help="results of a run with the largest size's event count over fewer keys (drawn as "
                         "hollow markers on the memory plot, if the file exists)")
    ap.add_argument("--table", action="store_true", help="also print the results as markdown tables")
    args = ap.parse_args()
    doc = json.loads(args.results.read_text())
    if args.table:
        table(doc)
    runs = sorted({size["runs"] for size in doc["sizes"].values()})
    note = f"median of {'/'.join(map(str, runs))} interleaved run(s) per size, 8 partitions, 2 shared cores"
    draw(doc, lambda m: m.get("events_per_cpu_s"), "events per CPU-second (worker process)",
         f"Throughput per CPU-second, abuse_scores job\n{note}", args.outdir / "peers-throughput.png")
    same = json.loads(args.same_events.read_text()) if args.same_events.exists() else None

    def hollow(ax):
        if not same:
            return
        for sk, size in same["sizes"].items():
            for s, m in size["summary"].items():
                if s in LABELS and isinstance(m, dict) and m.get("hwm_kb"):
                    ax.plot([size["keys"]], [m["hwm_kb"] / 1024], STYLE[s][0], mfc="none", ms=10,
                            color=COLORS.get(s), label=f"{LABELS[s]}, {size['events'] / 1e6:g}M events")

    draw(doc, lambda m: m["hwm_kb"] / 1024 if m.get("hwm_kb") else None, "peak RSS (MiB)",
         "Peak resident memory of the worker process" + (" (hollow: same keys, 10M events)" if same else "")
         + f"\n{note}",
         args.outdir / "peers-memory.png", extra=hollow)
    class Lost:
        @staticmethod
        def by_size(size, s):
            return restart(size, s, "lost")

    draw(doc, Lost, "seconds, restarted process start to first record",
         f"Restart with the local state directory lost\n{note}", args.outdir / "peers-restore.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
