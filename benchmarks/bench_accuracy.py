"""Detection accuracy against exact models: abuse scores and dedup windows (no broker).

Scores: one partition's ``abuse_scores`` sketch at its defaults (4 levels x 100,000
cells, exponential decay 0.01/s, clamp [0, 1], bad +0.04 / good -0.001, raise at 0.5),
in both score modes (``split``, the default, and ``single``), beside an exact float64
per-key model with the same decay and clamp (``_exact_reference``). The stream:

- background keys (1e5, 1e6, 1e7 distinct), Zipf(1.0)-distributed activity, each key
  with its own bad rate drawn uniformly from 1-3%;
- 100 planted abusers: 50 blatant (2 events/s, 80% bad) and 50 low-and-slow
  (0.3 events/s, all bad), half of each stopping half way;
- at 1x (10,000 events/s into the partition) and 6x the rate, for --seconds of event time.

A key counts as raised by a model when its score after one of its events is at or above
raise_at. Reported per size, rate and mode: keys the exact model raises, recall of those,
innocents raised (raised by the sketch, never by the exact model), planted-abuser recall,
and the median / max detection delay (sketch's first raise minus the exact model's).
Hashes are random 64-bit values per key (SipHash under a secret key is indistinguishable
from that), so the run needs no key strings.

Dedup: a ForgettingBloom at the ``dedup`` topology's sizing (capacity C keys per period,
fp 0.1%, 2 generations, documented window one period) fed C x load new keys per period at
evenly spread times (loads 0.9, 1, 2, 5), each re-sent once after a random delay inside
the window. Reported: re-sent duplicates forwarded again (``add_if_absent`` said new) and
false drops (a key's first sighting said seen), per overload mode.

    .venv/bin/python benchmarks/bench_accuracy.py                  # the full table
    .venv/bin/python benchmarks/bench_accuracy.py --quick          # 1e5/1e6 keys, shorter
    .venv/bin/python benchmarks/bench_accuracy.py --plot docs/     # and the PNGs (matplotlib)
    .venv/bin/python benchmarks/bench_accuracy.py --schemes independent,km   # both index schemes

The score sketches use ``index_scheme="independent"`` (the default) unless --schemes says
otherwise; rows carry the scheme.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from grudge_stream import Exponential, ForgettingBloom, ScoreSketch
from grudge_stream._cyext._score import _exact_reference
from grudge_stream.sketches.split import SplitScoreSketch

BASE_RATE = 10_000  # events/s into one partition at 1x
LAMBDA = 0.01
BAD, GOOD = 0.04, -0.001
RAISE_AT = 0.5
LEVELS, CELLS = 4, 100_000
CHUNK = 2_000_000


def make_stream(n_background: int, rate: float, seconds: float, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    n_bg = int(rate * seconds)
    # Zipf(1.0) activity over the background keys, ranks shuffled over ids.
    weights = 1.0 / np.arange(1, n_background + 1, dtype=np.float64)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    bg_ids = rng.permutation(n_background)[np.minimum(np.searchsorted(cdf, rng.random(n_bg)), n_background - 1)]
    bad_rate = rng.uniform(0.01, 0.03, size=n_background)
    bg_bad = rng.random(n_bg) < bad_rate[bg_ids]
    bg_t = rng.uniform(0, seconds * 1000, size=n_bg)
    ids, bads, ts = [bg_ids], [bg_bad], [bg_t]
    planted = []
    a = n_background
    for kind, per_s, p_bad in (("blatant", 2.0, 0.8), ("low-and-slow", 0.3, 1.0)):
        for j in range(50):
            stop = seconds / 2 if j % 2 else seconds
            start = rng.uniform(0, seconds / 4)
            n = rng.poisson(per_s * (stop - start))
            ids.append(np.full(n, a, dtype=np.int64))
            bads.append(rng.random(n) < p_bad)
            ts.append(rng.uniform(start * 1000, stop * 1000, size=n))
            planted.append(a)
            a += 1
    ids_a = np.concatenate(ids).astype(np.int64)
    t_a = np.concatenate(ts)
    order = np.argsort(t_a, kind="stable")
    return {"ids": ids_a[order], "deltas": np.where(np.concatenate(bads)[order], BAD, GOOD),
            "t": t_a[order].astype(np.int64), "n_keys": a, "planted": np.array(planted),
            "hashes": rng.integers(0, 2 ** 64 - 1, size=a, dtype=np.uint64, endpoint=True)}


def first_raise(ids: np.ndarray, scores: np.ndarray, t: np.ndarray) -> dict[int, int]:
    hot = scores >= RAISE_AT
    keys, first = np.unique(ids[hot], return_index=True)
    return dict(zip(keys.tolist(), t[hot][first].tolist()))


def run_scores(s: dict, mode: str, cells: int = CELLS, scheme: str = "independent") -> np.ndarray:
    kw = dict(levels=LEVELS, cells_per_level=cells, decay=Exponential(LAMBDA), lo=0.0, hi=1.0,
              hasher="siphash", seed=1, index_scheme=scheme)
    sk = SplitScoreSketch(**kw) if mode == "split" else ScoreSketch(**kw)
    out = np.empty(len(s["ids"]))
    for a in range(0, len(out), CHUNK):
        b = a + CHUNK
        out[a:b] = sk.update_and_query_many(s["hashes"][s["ids"][a:b]], s["deltas"][a:b], now_ms=s["t"][a:b])
    return out


def score_rows(sizes: list[int], rates: list[float], seconds: float, cells_list: tuple = (CELLS,),
               schemes: tuple = ("independent",), draws: int = 1) -> list[dict]:
    rows = []
    for n in sizes:
        for r in rates:
            t0 = time.perf_counter()
            s = make_stream(n, BASE_RATE * r, seconds)
            exact = first_raise(s["ids"], _exact_reference(s["ids"], s["deltas"], s["t"], s["n_keys"],
                                                           LAMBDA, 0.0, 1.0), s["t"])
            planted = set(s["planted"].tolist())
            for draw, mode, cells, scheme in [(d, m, c, x) for d in range(draws) for c in cells_list
                                              for m in ("split", "single") for x in schemes]:
                if draw and mode == "split" and cells == cells_list[0] and scheme == schemes[0]:
                    # another hash key: the same stream under new random 64-bit hashes
                    s["hashes"] = np.random.default_rng(1000 + draw).integers(
                        0, 2 ** 64 - 1, size=s["n_keys"], dtype=np.uint64, endpoint=True)
                got = first_raise(s["ids"], run_scores(s, mode, cells, scheme), s["t"])
                both = exact.keys() & got.keys()
                delays = np.array([got[k] - exact[k] for k in both], dtype=np.float64) / 1000.0
                rows.append({
                    "background_keys": n, "rate_x": r, "mode": mode, "cells_per_level": cells,
                    "index_scheme": scheme, "hash_draw": draw,
                    "events": int(len(s["ids"])),
                    "exact_raised": len(exact), "recall": len(both) / len(exact) if exact else 1.0,
                    "innocents_raised": len(got.keys() - exact.keys()),
                    "planted_recall": len(planted & got.keys()) / len(planted & exact.keys() or {1}),
                    "delay_median_s": float(np.median(delays)) if len(delays) else 0.0,
                    "delay_max_s": float(delays.max()) if len(delays) else 0.0,
                    "delay_min_s": float(delays.min()) if len(delays) else 0.0,
                })
                _print_score_row(rows[-1])
            del s
            print(f"#   ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rows


def _print_score_row(x: dict) -> None:
    print(f"{x['background_keys']:>10,} {x['rate_x']:>4g}x {x['mode']:>6} {x.get('index_scheme', 'km'):>11} "
          f"{x.get('hash_draw', 0):>4} "
          f"{x['cells_per_level']:>8,} {x['events']:>11,} "
          f"{x['exact_raised']:>6} {x['recall']:>7.4f} {x['innocents_raised']:>9} {x['planted_recall']:>8.3f} "
          f"{x['delay_median_s']:>+8.3f} {x['delay_min_s']:>+8.3f} {x['delay_max_s']:>+8.3f}", flush=True)


def dedup_rows(capacity: int, loads: list[float], periods: int, seed: int = 3) -> list[dict]:
    period = 60_000
    rows = []
    for load in loads:
        for mode in _overload_modes():
            rng = np.random.default_rng(seed)
            n = int(capacity * load * periods)
            first_t = np.linspace(0, periods * period, n, endpoint=False).astype(np.int64)
            window = period  # (generations - 1) * period_ms
            dup_t = first_t + rng.integers(1, window, size=n)
            hashes = rng.integers(0, 2 ** 64 - 1, size=n, dtype=np.uint64, endpoint=True)
            t = np.concatenate([first_t, dup_t])
            h = np.concatenate([hashes, hashes])
            order = np.argsort(t, kind="stable")
            kw = dict(capacity=capacity, fp_rate=0.001, generations=2, period_ms=period, hasher="siphash", seed=1)
            kw["overload"] = mode
            bloom = ForgettingBloom(**kw)
            new = bloom.add_if_absent_many(h[order], now_ms=t[order])
            pos = np.empty(2 * n, dtype=np.int64)
            pos[order] = np.arange(2 * n)
            first_new, dup_new = new[pos[:n]], new[pos[n:]]
            # Forwarded twice: both sightings said new. A false drop: the first sighting said seen.
            forwarded_twice = int(np.count_nonzero(first_new & dup_new))
            false_drops = int(np.count_nonzero(~first_new))
            rows.append({"load_x": load, "overload": mode, "keys": n, "duplicates_forwarded": forwarded_twice,
                         "duplicates_forwarded_share": forwarded_twice / n, "false_drops": false_drops,
                         "false_drop_rate": false_drops / n, "fp_rate_estimate": float(bloom.fp_rate_estimate()),
                         "effective_window_s": float(bloom.effective_window_ms) / 1000.0})
            x = rows[-1]
            print(f"{load:>5g}x {mode:>14} {n:>10,} {forwarded_twice:>10,} {100 * x['duplicates_forwarded_share']:>7.2f}% "
                  f"{false_drops:>8,} {100 * x['false_drop_rate']:>7.3f}% {x['fp_rate_estimate']:>10.2e} "
                  f"{x['effective_window_s']:>9.0f}", flush=True)
    return rows


def _overload_modes() -> list[str]:
    return ["shrink_window", "raise_fp"]


def plot(rows: list[dict], drows: list[dict], outdir: str, sweep: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for mode, style in (("split", "o-"), ("single", "s--")):
        for r in sorted({x["rate_x"] for x in rows}):
            sel = [x for x in rows if x["mode"] == mode and x["rate_x"] == r]
            xs = [x["background_keys"] for x in sel]
            axes[0].plot(xs, [x["recall"] for x in sel], style, label=f"{mode}, {r:g}x rate")
            axes[1].plot(xs, [x["innocents_raised"] for x in sel], style, label=f"{mode}, {r:g}x rate")
            axes[2].plot(xs, [x["delay_median_s"] for x in sel], style, label=f"{mode}, {r:g}x rate")
    for ax, title in zip(axes, ("recall of exact-raised keys", "innocents raised", "median detection delay (s)")):
        ax.set_xscale("log")
        ax.set_xlabel("background keys in the partition")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"abuse_scores sketch ({LEVELS} x {CELLS:,} cells) against the exact model")
    fig.tight_layout()
    fig.savefig(f"{outdir}/accuracy-scores.png", dpi=110)
    plt.close(fig)
    if sweep:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for mode, style in (("split", "o-"), ("single", "s--")):
            sel = [x for x in sweep if x["mode"] == mode]
            xs = [x["cells_per_level"] for x in sel]
            axes[0].plot(xs, [x["recall"] for x in sel], style, label=mode)
            axes[1].plot(xs, [x["innocents_raised"] for x in sel], style, label=mode)
        for ax, title in zip(axes, ("recall of exact-raised keys", "innocents raised")):
            ax.set_xscale("log")
            ax.set_xlabel("cells per level (4 levels)")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend()
        x0 = sweep[0]
        fig.suptitle(f"{x0['background_keys']:,} background keys at {x0['rate_x']:g}x the default rate")
        fig.tight_layout()
        fig.savefig(f"{outdir}/accuracy-cells.png", dpi=110)
        plt.close(fig)
    if drows:
        fig, ax = plt.subplots(1, 3, figsize=(15, 4))
        for mode in sorted({x["overload"] for x in drows}):
            sel = [x for x in drows if x["overload"] == mode]
            ax[0].plot([x["load_x"] for x in sel], [100 * x["duplicates_forwarded_share"] for x in sel], "o-", label=mode)
            ax[1].plot([x["load_x"] for x in sel], [100 * x["false_drop_rate"] for x in sel], "o-", label=mode)
            ax[2].plot([x["load_x"] for x in sel], [x["effective_window_s"] for x in sel], "o-", label=mode)
        ax[0].set_title("re-sent duplicates forwarded (%)")
        ax[1].set_title("false drops (%) (target 0.1%)")
        ax[2].set_title("effective window at the end (s; promised 60)")
        for a in ax:
            a.set_xlabel("load (new keys per period / capacity)")
            a.grid(alpha=0.3)
            a.legend()
        fig.tight_layout()
        fig.savefig(f"{outdir}/accuracy-dedup.png", dpi=110)
        plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--rates", default="1,6")
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--loads", default="0.9,1,2,5")
    ap.add_argument("--periods", type=int, default=6)
    ap.add_argument("--cells-sweep", default="12500,25000,50000,100000",
                    help="cells per level to sweep at --sweep-keys and --sweep-rate ('' to skip)")
    ap.add_argument("--sweep-keys", type=float, default=1e6)
    ap.add_argument("--sweep-rate", type=float, default=6.0)
    ap.add_argument("--quick", action="store_true", help="1e5 and 1e6 keys, 120 s, capacity 20k")
    ap.add_argument("--schemes", default="independent",
                    help="index schemes of the score sketches, comma-separated (independent, km)")
    ap.add_argument("--no-dedup", action="store_true", help="skip the dedup rows")
    ap.add_argument("--hash-draws", type=int, default=1,
                    help="run each score row under this many hash draws (draw 0: the stream's own)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--plot", default=None, help="write accuracy-*.png into this directory (needs matplotlib)")
    ap.add_argument("--replot", default=None, metavar="JSON",
                    help="only draw the pictures (into --plot) from the rows of an earlier --json")
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as f:
            saved = json.load(f)
        plot(saved["scores"], saved["dedup"], args.plot or ".", saved.get("cells_sweep", []))
        return 0
    if args.quick:
        args.sizes, args.seconds, args.capacity, args.periods = "100000,1000000", 120.0, 20_000, 4
        args.cells_sweep = "25000,100000"
    sizes = [int(float(x)) for x in args.sizes.split(",")]
    rates = [float(x) for x in args.rates.split(",")]
    print(f"# scores: {LEVELS} x {CELLS:,} cells, decay {LAMBDA}/s, raise at {RAISE_AT}; 1x = {BASE_RATE:,} "
          f"events/s; {args.seconds:g} s of event time")
    schemes = tuple(args.schemes.split(","))
    print(f"{'background':>10} {'rate':>5} {'mode':>6} {'scheme':>11} {'draw':>4} {'cells':>8} {'events':>11} {'exact':>6} {'recall':>7} "
          f"{'innocents':>9} {'planted':>8} {'d_med_s':>8} {'d_min_s':>8} {'d_max_s':>8}")
    rows = score_rows(sizes, rates, args.seconds, schemes=schemes, draws=args.hash_draws)
    sweep = []
    if args.cells_sweep:
        print(f"\n# cells per level, {int(args.sweep_keys):,} background keys at {args.sweep_rate:g}x")
        sweep = score_rows([int(args.sweep_keys)], [args.sweep_rate], args.seconds,
                           tuple(int(float(c)) for c in args.cells_sweep.split(",")), schemes)
    print(f"\n# dedup: capacity {args.capacity:,} keys per 60 s period, fp 0.1%, 2 generations, "
          f"{args.periods} periods; each key re-sent once inside the window")
    print(f"{'load':>6} {'overload':>14} {'keys':>10} {'dup_fwd':>10} {'share':>8} {'fdrops':>8} {'rate':>8} "
          f"{'fp_est':>10} {'window_s':>9}")
    drows = [] if args.no_dedup else dedup_rows(args.capacity, [float(x) for x in args.loads.split(",")],
                                                 args.periods)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scores": rows, "cells_sweep": sweep, "dedup": drows}, f, indent=1)
    if args.plot:
        plot(rows, drows, args.plot, sweep)
        print(f"# pictures: {args.plot}/accuracy-scores.png, accuracy-cells.png, accuracy-dedup.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
