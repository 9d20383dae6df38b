"""``python -m benchmarks tuning``: how many trials each search needs to come within 2% of the
grid-search optimum, in the simulator (the spirit of the paper's Figure 14).

For each scenario (a model and an architecture on a simulated cluster) the true landscape is the
simulator's throughput at every point of the tuning lattice. A search then tries points one by
one; each trial "measures" the true throughput times ``1 + noise * N(0, 1)`` (the jitter of a
real measurement window) and the search learns only from that. Its cost is the number of the
first trial whose *true* throughput is within ``tolerance`` of the best point of the factor-2
grid (the optimum "as identified by grid search", as in the paper). Each search runs from every
seed; the table gives the mean and standard deviation over seeds.

Searches: ``bo`` (the tuner's own :class:`~bytesched.tuning.search.BayesianSearch`), ``bo-warm``
(the same, first trying the three best points predicted by the simulator on a *mis-measured*
cluster, see :data:`MIS_ESTIMATES`), ``random``, ``grid`` and ``sgd`` (momentum SGD with restarts,
the best of :data:`SGD_RATES` x :data:`SGD_MOMENTA` per scenario, as the paper reports each
alternative with its best hyper-parameters). The same runs also check the tuner's stop rule:
how many trials ``bo`` spends before it stops by itself, and how far its kept point is from the
grid optimum.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from bytesched.core.config import format_size
from bytesched.tuning.search import MIN_GAIN, MIN_TRIALS, MIN_TRIALS_PER_KNOB, XI, BayesianSearch
from bytesched.tuning.space import Point, SearchSpace, space_for
from bytesched.tuning.predicted_points import GRID_STRIDE, best_points, predicted_throughput

from . import REPO
from .docs_section import replace_section
from .provenance import command_line, revision
from .tuning_searchers import BOSearch, Exhausted, GridSearch, MomentumSearch, RandomSearch

TOLERANCE = 0.02
DEFAULT_SEEDS = 20
DEFAULT_NOISE = 0.02
CAP = 100
"""Trials after which a search that has not reached the target counts as a miss."""
STOP_RULE_MAX_TRIALS = 15
"""The tuner's default BYTESCHED_TUNING_MAX_TRIALS, used when checking the stop rule."""
SGD_RATES = (2.0, 5.0, 10.0, 20.0)
SGD_MOMENTA = (0.5, 0.9)
METHODS = ("bo", "bo-warm", "random", "grid", "sgd")


@dataclass(frozen=True)
class MisEstimate:
    """How the warm start's inputs differ from the truth: measured bandwidth, per-message
    overhead θ and compute times, each as a factor of the true value."""

    bandwidth: float
    overhead: float
    compute: float


MIS_ESTIMATES = (MisEstimate(bandwidth=0.75, overhead=2.0, compute=1.15),
                 MisEstimate(bandwidth=1.3, overhead=0.5, compute=0.85))
"""Seed s warm-starts from the prediction with ``MIS_ESTIMATES[s % 2]``: a bandwidth test off by
25-30%, θ (which nobody measures) off by a factor of 2, a profile measured 15% off."""


@dataclass(frozen=True)
class Scenario:
    """A model and an architecture on the simulator's default cluster at one bandwidth; with
    ``batches``, an all-reduce over torch.distributed (every collective alone, no fusion cycle),
    whose tuner searches the batching threshold too."""

    model: str
    arch: str
    bandwidth: str
    workers: int = 16
    batches: bool = False

    @property
    def label(self) -> str:
        backend = " over torch.distributed" if self.batches else ""
        return f"{self.model} {'PS' if self.arch == 'ps' else 'all-reduce'}{backend}"

    def space(self) -> SearchSpace:
        return space_for(self.arch, batches=self.batches)

    def cluster(self, error: MisEstimate | None = None) -> Any:
        from bytesched.sim import WorkerSpec, make_cluster

        cluster = make_cluster(arch=self.arch, workers=self.workers, bandwidth=self.bandwidth,
                               fusion_threshold=0 if self.batches else None)
        if error is None:
            return cluster
        spec = WorkerSpec(compute=error.compute)
        return replace(cluster, bandwidth=cluster.bandwidth * error.bandwidth,
                       overhead=cluster.overhead * error.overhead,
                       worker_specs=tuple((rank, spec) for rank in range(self.workers)))


# The simulator's all-reduce landscape is flat at 40 Gbps and above on this cluster (every point
# within 2%: any search succeeds at once), so all-reduce is studied at 25 Gbps and PS at 10 Gbps.
# Over torch.distributed ResNet50 and the Transformer gain from batching at 25 Gbps (VGG16's few
# large tensors do not: its landscape is flat along the batching axis).
SCENARIOS = (Scenario("vgg16", "ps", "10Gbps"), Scenario("transformer", "ps", "10Gbps"),
             Scenario("vgg16", "allreduce", "25Gbps"), Scenario("transformer", "allreduce", "25Gbps"),
             Scenario("resnet50", "allreduce", "25Gbps", batches=True),
             Scenario("transformer", "allreduce", "25Gbps", batches=True))
QUICK_SCENARIOS = (Scenario("vgg16", "allreduce", "25Gbps"),)


class Landscape:
    """True throughput (iterations/s) at every lattice point, and the study's target."""

    def __init__(self, space: SearchSpace, values: np.ndarray, tolerance: float = TOLERANCE) -> None:
        self.space = space
        self.values = values
        grid = list(space.points(GRID_STRIDE))
        self.grid_best: Point = max(grid, key=lambda p: values[p])
        self.target = (1 - tolerance) * values[self.grid_best]

    def hit(self, point: Point) -> bool:
        return bool(self.values[point] >= self.target)

    def gap(self, point: Point) -> float:
        """How much slower ``point`` is than the grid optimum (0.05 = 5% fewer iterations/s)."""
        return float(1 - self.values[point] / self.values[self.grid_best])

    def measure(self, point: Point, rng: np.random.Generator, noise: float) -> float:
        return float(self.values[point] * max(1e-3, 1 + noise * rng.standard_normal()))


def trials_to_target(search: Any, landscape: Landscape, rng: np.random.Generator, noise: float,
                     cap: int = CAP) -> int | None:
    """The number of the first trial within tolerance of the grid optimum (None: not by ``cap``)."""
    for trial in range(1, cap + 1):
        try:
            point = search.ask()
        except Exhausted:
            return None
        if landscape.hit(point):
            return trial
        try:
            search.tell(point, landscape.measure(point, rng, noise))
        except Exhausted:
            return None
    return None


@dataclass
class BORun:
    """One Bayesian-optimisation run: its search cost and what its own stop rule would keep."""

    hit: int | None
    stop_trials: int
    stop_gap: float


def bayesian_run(search: BayesianSearch, landscape: Landscape, rng: np.random.Generator, noise: float,
                 cap: int = CAP, max_trials: int = STOP_RULE_MAX_TRIALS) -> BORun:
    """Run until the target is reached and the stop rule (or ``max_trials``) has ended the
    search; report both."""
    hit = None
    stop: tuple[int, float] | None = None
    for trial in range(1, cap + 1):
        point, _ = search.ask()
        if hit is None and landscape.hit(point):
            hit = trial
        search.tell(point, landscape.measure(point, rng, noise))
        if stop is None and (trial >= max_trials or search.should_stop()):
            stop = (trial, landscape.gap(search.best()[0]))
        if hit is not None and stop is not None:
            break
    assert stop is not None
    return BORun(hit, *stop)


def _summary(costs: Sequence[int | None], cap: int) -> dict[str, Any]:
    """Mean, sd, median and max over seeds; a miss counts as ``cap`` (and is counted)."""
    values = [cap if c is None else c for c in costs]
    return {"mean": statistics.fmean(values), "sd": statistics.pstdev(values),
            "median": statistics.median(values), "max": max(values),
            "misses": sum(c is None for c in costs), "trials": list(costs)}


def study_scenario(scenario: Scenario, seeds: int, noise: float, cap: int = CAP,
                   sgd_grid: Sequence[tuple[float, float]] | None = None) -> dict[str, Any]:
    """Every search from every seed on one scenario (runs in a worker process)."""
    from bytesched.sim import load_profile

    space = scenario.space()
    profile = load_profile(scenario.model)
    started = time.perf_counter()
    true = predicted_throughput(profile, scenario.cluster(), space, points=list(space.points()))
    landscape = Landscape(space, _array(space, true))
    simulate_s = time.perf_counter() - started

    started = time.perf_counter()
    predictions = [predicted_throughput(profile, scenario.cluster(error), space) for error in MIS_ESTIMATES]
    warm_points = [best_points(p) for p in predictions]
    warm_s = (time.perf_counter() - started) / len(MIS_ESTIMATES)

    def choices(seed: int, method: str) -> np.random.Generator:
        """The search's own random choices (seeded per seed and method)."""
        return np.random.default_rng([seed, METHODS.index(method), 0])

    def noise_of(seed: int, method: str) -> np.random.Generator:
        """The measurement noise a search sees (a stream apart from its choices)."""
        return np.random.default_rng([seed, METHODS.index(method), 1])

    costs: dict[str, list[int | None]] = {}
    started = time.perf_counter()
    bo_runs = [bayesian_run(BayesianSearch(space, seed=s), landscape, noise_of(s, "bo"), noise, cap)
               for s in range(seeds)]
    costs["bo"] = [r.hit for r in bo_runs]
    bo_s = (time.perf_counter() - started) / max(1, sum(r.stop_trials for r in bo_runs))
    costs["bo-warm"] = [
        trials_to_target(BOSearch(BayesianSearch(space, seed=s, suggested=warm_points[s % len(warm_points)])),
                         landscape, noise_of(s, "bo-warm"), noise, cap) for s in range(seeds)]
    costs["random"] = [trials_to_target(RandomSearch(space, choices(s, "random")), landscape, noise_of(s, "random"),
                                        noise, cap) for s in range(seeds)]
    costs["grid"] = [trials_to_target(GridSearch(space, choices(s, "grid")), landscape, noise_of(s, "grid"), noise, cap)
                     for s in range(seeds)]
    sgd_best: tuple[float, list[int | None], tuple[float, float]] | None = None
    for rate, momentum in sgd_grid or [(r, m) for r in SGD_RATES for m in SGD_MOMENTA]:
        runs = [trials_to_target(MomentumSearch(space, choices(s, "sgd"), rate=rate, momentum=momentum), landscape,
                                 noise_of(s, "sgd"), noise, cap) for s in range(seeds)]
        mean = statistics.fmean(cap if c is None else c for c in runs)
        if sgd_best is None or mean < sgd_best[0]:
            sgd_best = (mean, runs, (rate, momentum))
    assert sgd_best is not None
    costs["sgd"] = sgd_best[1]

    lattice_best = max(space.points(), key=lambda p: landscape.values[p])
    return {
        "scenario": asdict(scenario), "label": scenario.label,
        "lattice": {"shape": list(space.shape),
                    **{f"{axis.name}_bytes": [axis.value(i) for i in range(axis.size)] for axis in space.axes}},
        "iterations_per_s": landscape.values.tolist(),
        "grid_optimum": _point_json(space, landscape.grid_best, landscape.values),
        "lattice_optimum": _point_json(space, lattice_best, landscape.values),
        "within_tolerance_fraction": float(np.mean(landscape.values >= landscape.target)),
        "methods": {name: _summary(costs[name], cap) for name in METHODS},
        "sgd_hyperparameters": {"rate": sgd_best[2][0], "momentum": sgd_best[2][1]},
        "warm_start": {"mis_estimates": [asdict(e) for e in MIS_ESTIMATES],
                       "predicted_points": [[_point_json(space, p, landscape.values) for p in pts]
                                            for pts in warm_points],
                       "simulation_seconds": warm_s},
        "stop_rule": {"trials": _summary([r.stop_trials for r in bo_runs], cap),
                      "gap_mean": statistics.fmean(r.stop_gap for r in bo_runs),
                      "gap_max": max(r.stop_gap for r in bo_runs),
                      "within_tolerance": sum(r.stop_gap <= TOLERANCE for r in bo_runs)},
        "seconds": {"landscape_simulation": simulate_s, "bo_per_trial": bo_s},
    }


def _array(space: SearchSpace, values: dict[Point, float]) -> np.ndarray:
    out = np.zeros(space.shape)
    for point, value in values.items():
        out[point] = value
    return out


def _point_json(space: SearchSpace, point: Point, values: np.ndarray) -> dict[str, Any]:
    params = space.params(point)
    return {"point": list(point), "partition_bytes": params.partition_bytes, "credit_bytes": params.credit_bytes,
            **({} if space.batch is None else {"batch_bytes": params.batch_bytes}),
            "iterations_per_s": float(values[point])}


def run_study(scenarios: Sequence[Scenario], seeds: int = DEFAULT_SEEDS, noise: float = DEFAULT_NOISE,
              cap: int = CAP, jobs: int | None = None,
              sgd_grid: Sequence[tuple[float, float]] | None = None) -> dict[str, Any]:
    """Every scenario (in ``jobs`` worker processes, one per core by default)."""
    started = time.perf_counter()
    jobs = max(1, min(len(scenarios), jobs or os.cpu_count() or 1))
    args = [(s, seeds, noise, cap, sgd_grid) for s in scenarios]
    if jobs == 1:
        results = [study_scenario(*a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_study_star, args))
    return {"settings": {"seeds": seeds, "noise": noise, "tolerance": TOLERANCE, "cap": cap,
                         "methods": list(METHODS), "xi": XI},
            "scenarios": results, "wall_seconds": time.perf_counter() - started}


def _study_star(args: tuple[Any, ...]) -> dict[str, Any]:
    return study_scenario(*args)


# -- the report ---------------------------------------------------------------------------------
def format_table(result: dict[str, Any]) -> str:
    """The human-readable report: search cost per scenario and method, then the stop rule."""
    settings = result["settings"]
    lines = [f"Trials to come within {settings['tolerance']:.0%} of the grid-search optimum "
             f"(mean ± sd over {settings['seeds']} seeds; noise {settings['noise']:.0%}; a miss counts as "
             f"{settings['cap']})", ""]
    header = f"{'scenario':<56}" + "".join(f"{m:>15}" for m in settings["methods"]) + f"{'warm saving':>13}"
    lines += [header, "-" * len(header)]
    for s in result["scenarios"]:
        m = s["methods"]
        cells = "".join(f"{_cell(m[name]):>15}" for name in settings["methods"])
        saving = 1 - m["bo-warm"]["mean"] / m["bo"]["mean"]
        lines.append(f"{s['label'] + ' @' + s['scenario']['bandwidth']:<56}{cells}{saving:>12.0%}")
    lines += ["", f"{'scenario':<44}{'grid optimum (partition, credit, batching)':>44}{'within 2%':>11}"
                  f"{'sgd (rate, momentum)':>22}"]
    for s in result["scenarios"]:
        sgd = s["sgd_hyperparameters"]
        lines.append(f"{s['label']:<44}{_size_pair(s['grid_optimum'])[1:-1]:>44}"
                     f"{s['within_tolerance_fraction']:>11.0%}{str((sgd['rate'], sgd['momentum'])):>22}")
    lines += ["", "Stop rule (bo, at most 15 trials): trials spent, and the kept point's gap to the grid optimum"]
    for s in result["scenarios"]:
        r = s["stop_rule"]
        lines.append(f"{s['label']:<44}{_cell(r['trials']):>12} trials   gap mean {r['gap_mean']:.1%}, max "
                     f"{r['gap_max']:.1%}; {r['within_tolerance']}/{settings['seeds']} within 2%")
    lines += ["", f"Simulator cost: warm-start prediction {_seconds(result, 'warm')}; BO {_seconds(result, 'bo')} "
              f"per trial; wall time {result['wall_seconds']:.0f} s"]
    return "\n".join(lines)


def _cell(summary: dict[str, Any]) -> str:
    miss = f" ({summary['misses']}x)" if summary["misses"] else ""
    return f"{summary['mean']:.1f} ± {summary['sd']:.1f}{miss}"


def _seconds(result: dict[str, Any], what: str) -> str:
    if what == "warm":
        values = [s["warm_start"]["simulation_seconds"] for s in result["scenarios"]]
    else:
        values = [s["seconds"]["bo_per_trial"] for s in result["scenarios"]]
    return f"{min(values):.2f}-{max(values):.2f} s"


BEGIN = "<!-- tuning:begin -->"
END = "<!-- tuning:end -->"
NAMES = {"bo": "BO", "bo-warm": "BO, warm start", "random": "random", "grid": "grid", "sgd": "SGD + momentum"}
COLD = ("bo", "random", "grid", "sgd")
"""The searches that start knowing nothing: BO must beat the others of them (warm start aside)."""


def docs_section(result: dict[str, Any]) -> str:
    """docs/tuning.md's section "Search cost in the simulator", every figure from ``result``."""
    settings, scenarios, meta = result["settings"], result["scenarios"], result.get("meta", {})
    seeds, methods = settings["seeds"], settings["methods"]
    header = "| scenario | " + " | ".join(NAMES[m] for m in methods) + " | warm-start saving |"
    lines = [BEGIN, f"Generated by `{meta.get('command', 'python -m benchmarks tuning --docs')}` (revision "
             f"{meta.get('revision')}, {meta.get('started', '')[:10]}; every seed's trials in "
             "[docs/data/tuning_study.json](data/tuning_study.json)). Mean ± standard deviation of the trials "
             f"to come within {settings['tolerance']:.0%} of the grid optimum over {seeds} seeds (median in "
             f"brackets), noise {settings['noise']:.0%}, xi = {settings['xi']:g}; "
             "in bold the fewest of the searches that "
             "start knowing nothing (all but the warm start).", "",
             header, "|---" * (len(methods) + 2) + "|"]
    ahead, medians, worst, within_ten, runs = 0, [], 0, 0, 0
    for scenario in scenarios:
        m = scenario["methods"]
        best = min(m[name]["mean"] for name in COLD)
        cells = [f"{'**' if m[n]['mean'] == best and n in COLD else ''}{m[n]['mean']:.1f} ± {m[n]['sd']:.1f} "
                 f"[{m[n]['median']:g}]{'**' if m[n]['mean'] == best and n in COLD else ''}"
                 + (f" ({m[n]['misses']} missed)" if m[n]["misses"] else "") for n in methods]
        saving = 1 - m["bo-warm"]["mean"] / m["bo"]["mean"]
        lines.append(f"| {scenario['label']}, {scenario['scenario']['bandwidth'].replace('Gbps', ' Gbit/s')} | "
                     + " | ".join(cells) + f" | {saving:.0%} |")
        ahead += all(m["bo"]["mean"] < m[n]["mean"] for n in COLD if n != "bo")
        medians.append(m["bo"]["median"])
        trials = [settings["cap"] if t is None else t for t in m["bo"]["trials"]]
        worst, within_ten, runs = max(worst, max(trials)), within_ten + sum(t <= 10 for t in trials), runs + len(trials)
    lines += ["", "![search cost](img/tuning_search_cost.png)", "",
              f"- **BO needs fewer trials on average than random search, grid search and SGD with momentum in {ahead} "
              f"of {len(scenarios)} scenarios**; its median is {min(medians):g}-{max(medians):g} trials, {within_ten} "
              f"of its {runs} runs reach the target within 10 trials, the worst after {worst}. SGD is the best of "
              f"{len(SGD_RATES) * len(SGD_MOMENTA)} settings per scenario "
              f"(learning rates {', '.join(f'{r:g}' for r in SGD_RATES)} "
              f"x momenta {', '.join(f'{m:g}' for m in SGD_MOMENTA)}), as the paper reports each alternative with its "
              "best hyper-parameters."]
    lines.append("- **Warm-started BO** (three predicted points first, from a cluster mis-measured on purpose: "
                 + "; ".join(f"seeds {i} mod {len(MIS_ESTIMATES)} with bandwidth x{e['bandwidth']:g}, "
                             f"θ x{e['overhead']:g}, compute x{e['compute']:g}"
                             for i, e in enumerate(scenarios[0]["warm_start"]["mis_estimates"]))
                 + "): " + ", ".join(f"{s['label']} {s['methods']['bo-warm']['mean']:.1f}" for s in scenarios)
                 + " trials on average.")
    stop = [s["stop_rule"] for s in scenarios]
    lines.append(f"- **The stop rule** (at least {MIN_TRIALS_PER_KNOB} trials per knob, {MIN_TRIALS} on the "
                 "(partition, credit) lattice, then two trials in a row with less than "
                 f"{MIN_GAIN:.0%} expected gain; at most {STOP_RULE_MAX_TRIALS}) ended the searches after "
                 + ", ".join(f"{s['label']} {r['trials']['mean']:.1f} ± {r['trials']['sd']:.1f}"
                             for s, r in zip(scenarios, stop))
                 + " trials, keeping a point within 2% of the grid optimum in "
                 + ", ".join(f"{r['within_tolerance']}" for r in stop) + f" of {seeds} runs (mean gap "
                 + ", ".join(f"{r['gap_mean']:.1%}" for r in stop) + "; worst "
                 + ", ".join(f"{r['gap_max']:.1%}" for r in stop) + ").")
    lines.append("- The landscapes (white outline: within 2% of the grid optimum; red circle: the grid optimum): "
                 + ", ".join(f"{s['label']} {s['within_tolerance_fraction']:.0%} of the lattice within 2% of "
                             f"{_size_pair(s['grid_optimum'])}" for s in scenarios) + ".")
    lines += ["", "![landscapes](img/tuning_landscapes.png)", "",
              f"Cost of this run: {result['wall_seconds']:.0f} s wall on {meta.get('cpus', '?')} cores; "
              "a landscape took "
              + ", ".join(f"{s['seconds']['landscape_simulation']:.1f}" for s in scenarios)
              + " s to simulate (" + ", ".join(f"{_count(s['lattice']['shape'], 1)}" for s in scenarios)
              + " points), a warm-start prediction "
              + ", ".join(f"{s['warm_start']['simulation_seconds']:.2f}" for s in scenarios)
              + " s (" + ", ".join(f"{_count(s['lattice']['shape'], GRID_STRIDE)}" for s in scenarios)
              + " points), a BO decision (fit, EI over the lattice, stop rule) "
              + ", ".join(f"{s['seconds']['bo_per_trial']:.3f}" for s in scenarios) + " s.", END]
    return "\n".join(lines)


def _size_pair(point: dict[str, Any]) -> str:
    """``(4MB, 16MB)``, with the batching threshold (or ``no batching``) where the lattice has it."""
    batch = point.get("batch_bytes")
    batching = "" if batch is None else f", {'batching under ' + format_size(batch) if batch else 'no batching'}"
    return f"({format_size(point['partition_bytes'])}, {format_size(point['credit_bytes'])}{batching})"


def _count(shape: Sequence[int], stride: int) -> int:
    """Lattice points of ``shape`` taking every ``stride``-th index per axis."""
    return int(np.prod([-(-size // stride) for size in shape]))



def write_docs(result: dict[str, Any], root: Path) -> None:
    """The study's JSON, its two plots and docs/tuning.md's section under ``root`` (the checkout)."""
    from .tuning_study_plot import plot_landscapes, plot_search_costs

    (root / "docs" / "data" / "tuning_study.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_search_costs(result, str(root / "docs" / "img" / "tuning_search_cost.png"))
    plot_landscapes(result, str(root / "docs" / "img" / "tuning_landscapes.png"))
    replace_section(root / "docs" / "tuning.md", BEGIN, END, docs_section(result))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tuning`` benchmark to ``python -m benchmarks``."""
    parser = subparsers.add_parser("tuning", help="search cost of BO vs. alternatives in the simulator (Figure 14)",
                                   description="How many trials each search (BO, BO warm-started from the simulator, "
                                               "random, grid, SGD with momentum) needs to come within 2% of the "
                                               "grid-search optimum, in the simulator (the paper's Figure 14).")
    parser.add_argument("--seeds", type=_positive_int, default=DEFAULT_SEEDS,
                        help=f"seeds per search (default {DEFAULT_SEEDS})")
    parser.add_argument("--noise", type=_noise, default=DEFAULT_NOISE,
                        help=f"relative sd of a trial's measurement (default {DEFAULT_NOISE})")
    parser.add_argument("--jobs", type=_positive_int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--quick", action="store_true",
                        help="one scenario (VGG16 all-reduce), 3 seeds, two SGD settings: a smoke run of seconds")
    parser.add_argument("--plot", metavar="PNG", help="draw the search costs (Figure 14 style) to this file")
    parser.add_argument("--landscape-plot", metavar="PNG", help="draw the simulated landscapes to this file")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--docs", action="store_true",
                        help="also write docs/data/tuning_study.json, both plots and docs/tuning.md's section")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="do not run: write the plots and docs/tuning.md's section from this result (with --docs)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the study and print the table (or JSON); draw the plots if asked."""
    if args.report is not None:
        result = json.loads(args.report.read_text())
        write_docs(result, REPO)
        print(format_table(result))
        return 0
    started = datetime.datetime.now().isoformat(timespec="seconds")
    if args.quick:
        result = run_study(QUICK_SCENARIOS, seeds=3, noise=args.noise, jobs=1,
                           sgd_grid=[(SGD_RATES[1], SGD_MOMENTA[0]), (SGD_RATES[2], SGD_MOMENTA[1])])
    else:
        result = run_study(SCENARIOS, seeds=args.seeds, noise=args.noise, jobs=args.jobs)
    result["meta"] = {"command": command_line("tuning"), "revision": revision(), "started": started,
                      "cpus": os.cpu_count()}
    if args.docs:
        write_docs(result, REPO)
    if args.plot or args.landscape_plot:
        from .tuning_study_plot import plot_landscapes, plot_search_costs

        if args.plot:
            plot_search_costs(result, args.plot)
        if args.landscape_plot:
            plot_landscapes(result, args.landscape_plot)
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _noise(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1): a relative standard deviation")
    return value
