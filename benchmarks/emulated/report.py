"""The report: a summary section for docs/benchmarks.md (between markers, so the rest of the page
is never touched), a generated page with every run (docs/benchmarks-emulated.md), and one PNG of
speedup against bandwidth per framework, model and rank count."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..docs_section import replace_section
from ..emulation import format_rate
from .cells import FRAMEWORKS
from .configs import BASELINE, CONFIGURATIONS, PROBES, PS_PROBES, TUNING_STEPS_PER_TRIAL
from .results import Spread, summarize

BEGIN = "<!-- emulated:begin -->"
END = "<!-- emulated:end -->"


def _spread(value: Spread | None, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "not run"
    if value.count == 1:
        return f"{value.median:.{digits}f}{suffix} (1 run)"
    return f"{value.median:.{digits}f}{suffix} [{value.low:.{digits}f}-{value.high:.{digits}f}]"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.0f}%"


def _number(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _median(value: Spread | None, scale: float, suffix: str) -> str:
    """A median alone, scaled to the unit of ``suffix`` (" ms", "%")."""
    return _number(None if value is None else value.median * scale, 0, suffix)


def _kib(nbytes: int) -> str:
    """Sizes as the configurations name them: 512 KB, 2 MB (binary units)."""
    return f"{nbytes / 2**20:g} MB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KB"


def group_title(group: dict[str, Any]) -> str:
    return (f"{group['framework']}, {group['model']}, {format_rate(group['bits_per_second'])}, "
            f"{group['ranks']} ranks")


def group_table(group: dict[str, Any]) -> list[str]:
    """The markdown table of one group, plus its ideal speedup and failures."""
    cells = summarize(group)
    usage = any(cell.cpu_per_step is not None for cell in cells)  # files that recorded CPU use
    header = ["configuration", "samples/s median [min-max]", "speedup over vanilla [min-max]",
              "predicted samples/s", "predicted speedup", "prediction error"]
    header += ["rank 0 CPU per step", "machine busy"] * usage
    lines = [f"**{group_title(group)}**", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for cell in cells:
        row = [cell.config, _spread(cell.throughput), _spread(cell.speedup, 2, "x"),
               _number(cell.predicted_throughput), _number(cell.predicted_speedup, 2, "x"), _percent(cell.error)]
        row += [_median(cell.cpu_per_step, 1e3, " ms"), _median(cell.machine_busy, 100, "%")] * usage
        lines.append("| " + " | ".join(row) + " |")
    lines += _calibration(group) + _prediction(group)
    retried = group.get("retried", [])
    if retried:
        lines += ["", f"{len(retried)} job(s) failed once and were run again (first failure: "
                      f"`{retried[0]['reason'].strip().splitlines()[-1][:160]}`)."]
    for failure in group.get("failures", []):
        reason = failure["reason"].strip().splitlines()
        lines += ["", f"Not measured: {', '.join(failure['configs'])}: `{reason[0][:200]}`"
                      + (f" (last line: `{reason[-1][:200]}`)" if len(reason) > 1 else "")]
    return lines


def _calibration(group: dict[str, Any]) -> list[str]:
    calibration = group.get("calibration")
    if not calibration:
        return []
    operation = "push+pull" if group["framework"] == "mxnet-ps" else "all-reduce"
    lines = ["", f"Calibration (measured on this network before the runs, medians): a 4-byte {operation} took "
                 f"{calibration['fixed_seconds'] * 1e3:.2f} ms, one of {calibration['large_bytes'] / 1e6:.1f} MB "
                 f"{calibration['large_seconds'] * 1e3:.0f} ms; the simulator predicted vanilla with these."]
    compute = calibration.get("compute_seconds")
    if compute:
        lines.append(f"A training step of the emulated model without communication took {compute * 1e3:.0f} ms; the "
                     f"simulator's layer times were stretched to that.")
    probes = calibration.get("probe_seconds")
    if probes:
        # by count, not by architecture: older PS files recorded two probes
        names = PS_PROBES if len(probes) == len(PS_PROBES) else PROBES
        sizes = [f"{_kib(p.partition_bytes)} / {_kib(p.credit_bytes)}"
                 for p in (CONFIGURATIONS[n].params for n in names)]
        sizes[0] = sizes[0].replace(" / ", " partitions / ") + " credit"
        parts = [f"{seconds * 1e3:.0f} ms with {size}" for seconds, size in zip(probes, sizes, strict=True)]
        took = ", ".join(parts[:-1]) + " and " + parts[-1]
        latency = calibration.get("scheduled_latency")
        if latency is not None:
            fits = f"a pipelined latency per message of {latency * 1e3:.2f} ms on bytesched's path"
        else:
            fits = f"bytesched's cost per message at {calibration['scheduled_overhead'] * 1e3:.2f} ms"
        baseline = calibration.get("probe_baseline_seconds")  # absent in older files: fitted to absolute times
        against = f" against {baseline * 1e3:.0f} ms on the plain path" if baseline else ""
        lines.append(f"Probes: a step took {took}{against}, which fits {fits}; the simulator predicted bytesched's "
                     f"configurations (and chose `bytescheduler-sim`'s sizes) with that.")
    tuned = calibration.get("tuned_sizes")
    if tuned:
        trials = [row for row in calibration["tuning_trials"] if row[0].isdigit()]
        lines.append(f"Tuning job ({calibration['tuning_seconds']:.0f} s, {len(trials)} trials of "
                     f"{TUNING_STEPS_PER_TRIAL} steps): "
                     f"bytesched's auto-tuner kept {_kib(tuned[0])} partitions and a {_kib(tuned[1])} credit for "
                     f"`bytescheduler-tuned`; it tried " + ", ".join(
                         f"{float(row[1]):g} / {float(row[2]):g} MB ({row[3]} steps/s)" for row in trials) + ".")
    return lines


def _as_run(prediction: dict[str, Any]) -> str:
    """Where the report recomputed the ideal speedup and it moved, the run's own figure."""
    recorded = prediction.get("ideal_speedup_at_run")
    if recorded is None or abs(recorded - prediction["ideal_speedup"]) < 0.005:
        return ""
    return f" (the run's simulator said {recorded:.2f}x)"


def _prediction(group: dict[str, Any]) -> list[str]:
    prediction = group.get("prediction")
    if not prediction:
        return []
    lines = ["", f"Simulator: compute {prediction['compute_time'] * 1e3:.0f} ms and communication "
                 f"{prediction['communication_time'] * 1e3:.0f} ms per iteration at full bandwidth; ideal speedup "
                 f"(bytescheduler with free messages and 64 KB partitions at its best credit) "
                 f"{prediction['ideal_speedup']:.2f}x{_as_run(prediction)}; bound of perfect overlap, "
                 f"max(compute, communication), {prediction['overlap_bound_speedup']:.2f}x."]
    for name, cell in prediction["configs"].items():
        if "partition_bytes" in cell:
            lines.append(f"`{name}` ran with {_kib(cell['partition_bytes'])} partitions and a "
                         f"{_kib(cell['credit_bytes'])} credit.")
    return lines


OFF_FLOOR = 0.99
"""Scheduling off must run at least this fast, relative to vanilla."""
IDEAL_SHARE = 0.9
"""bytesched must reach this share of the simulator's ideal speedup."""
PS_SPEEDUP = 1.5
"""bytesched must reach this speedup over plain dist_sync in the PS target's cell."""
PS_TARGET = ("vgg16", 1e9)
"""The PS target (>= 1.5x plain dist_sync) is stated for VGG16 at 1 Gbit/s; other PS cells are
held to the ideal speedup like every other framework."""
SCHEDULED = ("bytescheduler", "bytescheduler-sim", "bytescheduler-tuned", "bytescheduler-fit")
"""The bytesched configurations the speedup targets are checked for: the defaults, the sizes a
user gets from the simulator or from the auto-tuner, and (where a group runs it) the sizes a
sweep found by hand."""


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, checked against these numbers (met / missed, with the figures)."""
    lines = []
    errors: list[tuple[float, str]] = []
    for group in results["groups"]:
        cells = {c.config: c for c in summarize(group)}
        title = group_title(group)
        for cell in cells.values():
            if cell.error is not None:
                errors.append((abs(cell.error), f"{cell.config} in {title}"))
        off = cells.get("off")
        if off is not None and off.speedup is not None:
            verdict = "met" if off.speedup.median >= OFF_FLOOR else "missed"
            lines.append(f"- Scheduling off >= 0.99x vanilla, {title}: {off.speedup.median:.2f}x ({verdict}).")
        ideal = (group.get("prediction") or {}).get("ideal_speedup")
        for name in SCHEDULED:
            cell = cells.get(name)
            if cell is None or cell.speedup is None:
                continue
            if group["framework"] == "mxnet-ps" and (group["model"], group["bits_per_second"]) == PS_TARGET:
                verdict = "met" if cell.speedup.median >= PS_SPEEDUP else "missed"
                lines.append(f"- MXNet PS bytesched >= 1.5x plain KVStore, `{name}`, {title}: "
                             f"{cell.speedup.median:.2f}x ({verdict}).")
                continue
            if not ideal:
                continue
            share = cell.speedup.median / ideal
            others = [c for c in cells.values() if c.config != name and c.speedup]  # vanilla's is 1.0
            ahead = all(cell.speedup.median > c.speedup.median for c in others)
            lines.append(f"- bytesched >= 90% of the ideal speedup, `{name}`, {title}: {cell.speedup.median:.2f}x of "
                         f"{ideal:.2f}x = {share * 100:.1f}% ({'met' if share >= IDEAL_SHARE else 'missed'}); ahead of "
                         f"every other configuration: {'yes' if ahead else 'no'}.")
    if errors:
        worst = max(errors)
        median = statistics.median(e for e, _ in errors)
        lines.append(f"- Simulator median |prediction error| <= 10%: {median * 100:.1f}% over {len(errors)} cells "
                     f"({'met' if median <= 0.10 else 'missed'}); worst {worst[0] * 100:.0f}% ({worst[1]}).")
    return lines


BALANCED = (2 / 3, 3 / 2)
"""Where "communication is about equal to computation" (the first target): the simulator's
communication time per iteration, at full bandwidth, within this factor of the compute time."""
SHORT = {"bytescheduler": "defaults", "bytescheduler-sim": "sim", "bytescheduler-tuned": "tuned",
         "bytescheduler-fit": "fit"}


@dataclass(frozen=True)
class Cell:
    """Everything measured for one (framework, model, bandwidth, ranks), over all its groups."""

    key: tuple[str, str, float, int]
    speedups: dict[str, float]
    """Each configuration's median speedup over vanilla, from the latest group that ran it."""
    ideals: dict[str, float]
    """The ideal speedup predicted by the group each configuration came from."""
    balanced: bool

    def best(self) -> str | None:
        """The fastest of the bytesched configurations the speedup targets are checked for."""
        measured = [name for name in SCHEDULED if name in self.speedups]
        return max(measured, key=self.speedups.__getitem__) if measured else None

    @property
    def ps_target(self) -> bool:
        return self.key[0] == "mxnet-ps" and (self.key[1], self.key[2]) == PS_TARGET

    def title(self) -> str:
        framework, model, bits, ranks = self.key
        return f"{framework} {model} {format_rate(bits)} {ranks}r"


def cells(results: dict[str, Any]) -> list[Cell]:
    """The cells of ``results`` (as :func:`~.results.merge` makes it), in the order first measured."""
    found: dict[tuple[str, str, float, int], Cell] = {}
    for group in results["groups"]:
        key = (group["framework"], group["model"], group["bits_per_second"], group["ranks"])
        prediction = group.get("prediction") or {}
        compute, communication = prediction.get("compute_time"), prediction.get("communication_time")
        balanced = bool(compute and communication and BALANCED[0] <= communication / compute <= BALANCED[1])
        cell = found.setdefault(key, Cell(key, {}, {}, balanced))
        for summary in summarize(group):
            if summary.speedup is None:
                continue
            cell.speedups[summary.config] = summary.speedup.median
            if prediction.get("ideal_speedup"):
                cell.ideals[summary.config] = prediction["ideal_speedup"]
    return list(found.values())


REPORT_COMMAND = "python -m benchmarks emulated --report docs/data/emulated_*.json --docs"
NO_SETTINGS = "plan"
"""The configuration a user who sets nothing runs: the start-up plan."""


def _glance(cell: Cell | None) -> str:
    """``off / defaults / no settings / best (which) / ideal`` of one cell, ``-`` where not run."""
    if cell is None:
        return "not measured"
    best = cell.best()
    shown = [_number(cell.speedups.get("off"), 2), _number(cell.speedups.get("bytescheduler"), 2),
             _number(cell.speedups.get(NO_SETTINGS), 2),
             "-" if best is None else f"**{cell.speedups[best]:.2f}** {SHORT[best]}",
             _number(cell.ideals.get(best or "bytescheduler") or cell.ideals.get(NO_SETTINGS), 2)]
    return " / ".join(shown)


def _verdicts(name: str, checked: list[tuple[Cell, float, bool]]) -> str:
    """``name: met in N of M cells; missed: ...`` for (cell, figure, met) triples."""
    missed = [f"{cell.title()} {figure:.2f}x" for cell, figure, met in checked if not met]
    return (f"- {name}: met in {len(checked) - len(missed)} of {len(checked)} cells"
            + (f"; missed in {', '.join(missed)}." if missed else "."))


def overview(results: dict[str, Any]) -> list[str]:
    """The matrix at a glance: per model a table with a row per rank count and bandwidth and a
    column per framework, then how many cells meet each target and which miss (the list of
    :func:`targets` has every figure)."""
    every = cells(results)
    by_key = {cell.key: cell for cell in every}
    frameworks = [name for name in FRAMEWORKS if any(cell.key[0] == name for cell in every)]
    lines = ["Each cell: speedup over vanilla with scheduling `off` (the Core, unlimited sizes) / the "
             "`defaults` (4 MB partitions, 16 MB credit) / no settings (the start-up plan) / the best sized "
             "configuration, in bold, and which it was (`defaults`; `sim`: the simulator's sizes; `tuned`: the "
             "auto-tuner's; `fit`: a hand sweep's) / the simulator's ideal speedup for that cell (medians of the "
             "latest run of each; `-`: not run).", ""]
    for model in sorted({cell.key[1] for cell in every}):
        rows = sorted({(cell.key[3], cell.key[2]) for cell in every if cell.key[1] == model})
        lines += [f"**{model}**", "", "| ranks, bandwidth | " + " | ".join(frameworks) + " |",
                  "|---" * (len(frameworks) + 1) + "|"]
        for ranks, bits in rows:
            lines.append(f"| {ranks}, {format_rate(bits)} | "
                         + " | ".join(_glance(by_key.get((f, model, bits, ranks))) for f in frameworks) + " |")
        lines.append("")

    def share(cell: Cell, name: str) -> tuple[Cell, float, bool]:
        value = cell.speedups[name] / cell.ideals[name]
        return cell, value, value >= IDEAL_SHARE

    ranked = [(cell, best) for cell in every if (best := cell.best()) is not None]
    held = [(cell, best) for cell, best in ranked if not cell.ps_target and best in cell.ideals]  # to the ideal
    off = [(cell, cell.speedups["off"], cell.speedups["off"] >= OFF_FLOOR) for cell in every if "off" in cell.speedups]
    policy_off = [(cell, cell.speedups["policy-off"], cell.speedups["policy-off"] >= OFF_FLOOR)
                  for cell in every if "policy-off" in cell.speedups]
    planned = [cell for cell in every if NO_SETTINGS in cell.speedups]
    ahead = [(cell, cell.speedups[best], all(cell.speedups[best] > value for name, value in cell.speedups.items()
                                             if name not in (best, NO_SETTINGS)))
             for cell, best in ranked if cell.balanced]
    ps = [(cell, cell.speedups[best], cell.speedups[best] >= PS_SPEEDUP) for cell, best in ranked if cell.ps_target]
    lines += [_verdicts("No settings (the start-up plan) >= 0.99x vanilla",
                        [(cell, cell.speedups[NO_SETTINGS], cell.speedups[NO_SETTINGS] >= OFF_FLOOR)
                         for cell in planned]),
              _verdicts("No settings >= 90% of the ideal speedup (figure: the share of it)",
                        [share(cell, NO_SETTINGS) for cell in planned if NO_SETTINGS in cell.ideals])]
    if policy_off:
        lines.append(_verdicts("`BYTESCHED_POLICY=off` (the framework's own path) >= 0.99x vanilla", policy_off))
    lines += [_verdicts("Scheduling off (the Core, unlimited sizes) >= 0.99x vanilla", off),
              _verdicts("The best bytesched configuration (the defaults or a sized one) >= 90% of the ideal "
                        "speedup (figure: the share of it)", [share(cell, best) for cell, best in held]),
              _verdicts("The defaults >= 90% of the ideal speedup (figure: the share of it)",
                        [share(cell, "bytescheduler") for cell, _ in held if "bytescheduler" in cell.ideals]),
              _verdicts("Where communication is about equal to computation (the simulator's communication "
                        "within a factor 1.5 of compute), the best bytesched configuration ahead of every other "
                        "configuration of its cell, Horovod autotune and the other policies included (figure: "
                        "its speedup)", ahead),
              _verdicts("MXNet PS, VGG16, 1 Gbit/s: the best bytesched configuration >= 1.5x plain KVStore", ps)]
    return lines


def _source(meta: dict[str, Any]) -> list[str]:
    load = meta.get("loadavg", {})
    revision = f" at revision {meta['revision']}" if meta.get("revision") else ""
    return [f"    {meta['command']}", "",
            f"started {meta['started']}{revision} on {meta['cpus']} cores, 1-minute load average "
            f"{load.get('start', '?')} at the start and {load.get('end', '?')} at the end; {meta['repeats']} round(s) "
            f"of {meta['steps']} timed steps after {meta['warmup']} warm-up step(s); networks: "
            f"{'; '.join(meta['networks'])} (simulated as topology `{meta['sim_topology']}`; per-operation cost "
            f"and bandwidth from each group's calibration where one is shown, else the simulator's defaults).", ""]


DETAILS_TITLE = "# Every emulated run"


def summary(results: dict[str, Any], details: Path, docs: Path, others: Sequence[dict[str, Any]] = ()) -> str:
    """docs/benchmarks.md's generated section, markers included, under the page's hand-written
    heading and introduction: the matrix at a glance and the targets it meets (``results`` as
    :func:`~.results.merge` makes it), then the same for each of ``others``, runs whose models were
    scaled otherwise; ``details`` is the page :func:`details_page` writes."""
    link = Path(os.path.relpath(details, docs.parent)).as_posix()
    files = len(results["sources"]) + sum(len(other["sources"]) for other in others)
    lines = [BEGIN, "### The matrix at a glance", "", *overview(results), ""]
    for other in others:
        lines += [f"### {scaling_title(other)}", "", *overview(other), ""]
    lines += [f"Generated by `{REPORT_COMMAND}` from {files} result files; every run's table, the commands "
              f"that produced them, the machine's load, the emulated workloads and the plots are on "
              f"[every emulated run]({link}).", "", END]
    return "\n".join(lines)


def scaling_title(results: dict[str, Any]) -> str:
    """A heading for runs whose models were scaled otherwise than the matrix's: their ranks and
    compute per iteration, which is what differs (4-rank runs balance it at 4 ranks' all-reduce)."""
    computes = ", ".join(f"{name} {w['compute_seconds'] * 1e3:.0f} ms"
                         for name, w in sorted(results["workloads"].items()))
    ranks = sorted({group["ranks"] for group in results["groups"]})
    return f"{', '.join(map(str, ranks))} ranks, compute per iteration: {computes}"


def details_page(results: dict[str, Any], images: list[Path], page: Path,
                 others: Sequence[dict[str, Any]] = ()) -> str:
    """The generated page with everything measured: how, by which commands, every group's table,
    each target per group, and the plots; then each of ``others`` (runs whose models were scaled
    otherwise) the same way, without plots."""
    lines = [DETAILS_TITLE, "",
             f"Generated by `{REPORT_COMMAND}`; the summary is in "
             "[benchmarks](benchmarks.md#the-matrix-at-a-glance). The results come from", "",
             *_runs(results)]
    for image in images:
        lines += [f"![{image.stem}]({Path(os.path.relpath(image, page.parent)).as_posix()})", ""]
    for other in others:
        lines += [f"## {scaling_title(other)}", "", "The results come from", "", *_runs(other)]
    return "\n".join(lines)


def _runs(results: dict[str, Any]) -> list[str]:
    """The commands, the method, the workloads, every group's table and the targets of results
    files whose models share one scaling."""
    lines: list[str] = []
    for meta in results["sources"]:
        lines += _source(meta)
    lines += ["The load averages above say how busy the machine was (the benchmark's own jobs included): on a "
              "machine with few cores a figure taken at a higher load is noisier. "
              "Speedups are pairwise: each round ran every configuration once (in a rotating order), and a "
              "configuration's speedup in a round is its samples/s over vanilla's in the same round; cells show "
              "the median and range over the rounds. Tables of runs that recorded it add the CPU rank 0's "
              "process (all its threads) used per timed step and the share of the machine's cores busy meanwhile "
              "(medians): every emulated host shares the machine's cores, so a cell whose vanilla keeps them near "
              "100% busy is CPU-bound, not network-bound. The ideal speedups are computed when the report is "
              "generated, by the simulator of that revision from each group's calibration (groups without one keep "
              "their run's), so that every cell is held to the same yardstick.", "",
              "Compute is emulated: every layer of the simulator profile owns real float32 parameters and takes "
              "its forward and backward time (PyTorch: sleeping in an autograd Function; MXNet: "
              "one engine operation per layer and pass on an emulated device, csrc/emulated_device.cc, which "
              "holds neither the GIL nor an engine thread), so gradients go through the real hooks and transfers "
              "while the CPUs stay free. Profiles are scaled to fit the machine (sizes and times separately):", "",
              "| model | size scale | gradients per iteration | time scale | compute per iteration |",
              "|---|---|---|---|---|"]
    for name, w in results["workloads"].items():
        lines.append(f"| {name} | {w['size_scale']:.4g} | {w['gradient_bytes'] / 1e6:.1f} MB | "
                     f"{w['time_scale']:.4g} | {w['compute_seconds'] * 1e3:.0f} ms |")
    lines += ["", "Configurations: " + "; ".join(
        f"`{c.name}` {c.description}" for c in CONFIGURATIONS.values()
        if any(c.name in g["configs"] for g in results["groups"])) + ".", ""]
    measured = [g for g in results["groups"] if g["runs"] or g.get("failures")]
    for group in measured:
        lines += group_table(group) + [""]
    for group in results["groups"]:
        if group not in measured:
            lines.append(f"- Not measured: {group_title(group)} (the run was stopped before this group).")
    for item in results.get("not_run", []):
        lines.append(f"- Not run: `{item['config']}` on {item['framework']}: {item['reason']}")
    for item in results.get("superseded", []):
        again = "" if "configs" not in item else " (" + ", ".join(f"`{c}`" for c in item["configs"]) + ")"
        lines.append(f"- Measured again: {group_title(item['group'])}{again}; the table shows the later run, of "
                     f"`{item['by']}` (the earlier one stays in its file).")
    lines += ["", "## Targets, group by group", "", *targets(results), ""]
    return lines


def write_section(docs: Path, section: str) -> None:
    """Replace the text between the markers in ``docs`` (append the section if there are none)."""
    if not docs.exists():
        docs.write_text("# Benchmarks\n")
    replace_section(docs, BEGIN, END, section)


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """One PNG per (framework, model, ranks): measured speedup (median, min-max bars) against
    bandwidth, per configuration of any of the panel's groups, with the simulator's prediction
    in the same colour, dashed with crosses (a cross alone where one bandwidth was measured)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for group in results["groups"]:
        panels.setdefault((group["framework"], group["model"], group["ranks"]), []).append(group)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for (framework, model, ranks), groups in sorted(panels.items()):
        groups.sort(key=lambda g: g["bits_per_second"])
        figure, axes = plt.subplots(figsize=(6.4, 4.0))
        names = list(dict.fromkeys(n for group in groups for n in group["configs"] if n != BASELINE))
        for index, name in enumerate(names):
            colour = f"C{index}"
            xs, ys, lows, highs, predicted = [], [], [], [], []
            for group in groups:
                cell = next(c for c in summarize(group) if c.config == name) if name in group["configs"] else None
                if cell is None or cell.speedup is None:
                    continue
                xs.append(group["bits_per_second"] / 1e9)
                ys.append(cell.speedup.median)
                lows.append(cell.speedup.median - cell.speedup.low)
                highs.append(cell.speedup.high - cell.speedup.median)
                predicted.append(cell.predicted_speedup)
            if xs:
                axes.errorbar(xs, ys, yerr=[lows, highs], color=colour, marker="o", capsize=3, label=name)
                axes.plot(xs, predicted, color=colour, linestyle="--", marker="x", alpha=0.6)
        axes.axhline(1.0, color="grey", linewidth=0.8)
        axes.set_xscale("log")
        rates = sorted({g["bits_per_second"] / 1e9 for g in groups})  # a bandwidth may have several groups
        axes.set_xticks(rates, [f"{rate:g}" for rate in rates])
        axes.minorticks_off()
        axes.set_xlabel("bandwidth (Gbit/s)")
        axes.set_ylabel("speedup over vanilla")
        axes.set_title(f"{framework}, {model}, {ranks} ranks (x, dashed: simulator)")
        axes.legend(fontsize=8)
        figure.tight_layout()
        path = folder / f"bench_emulated_{framework}_{model}_{ranks}r.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        paths.append(path)
    return paths
