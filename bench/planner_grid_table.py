#!/usr/bin/env python3
"""Summarises bench/planner_grid.sh's CSVs as docs/planner.md's tables.

One row per grid point: auto's choice, its predicted and measured latency,
the best measured table row, one device, and the heterogeneity rows
(planned against equal split). Then the issue's figures: the median and
90th percentile of |predicted - measured| / measured over every table row
(the "... equal" / "... all" rows are comparisons, not table rows), how often
auto was within 5% of the best, its worst ratio, and how often it was more
than 5% slower than one device.

    bench/planner_grid_table.py OUT_DIR
"""
import csv
import statistics
import sys
from collections import OrderedDict


def members(text):
    return ", ".join(text.split(";"))


def p90(values):
    values = sorted(values)
    return values[int(0.9 * (len(values) - 1) + 0.5)]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "planner-grid"
    points = OrderedDict()
    for name in ["bert-base", "gpt2", "vit-base", "memory"]:
        try:
            with open(f"{out}/{name}.csv") as f:
                for row in csv.DictReader(f):
                    model = row["model"]
                    if row["memory_limit"]:
                        model += ", budgets " + row["memory_limit"].replace(";", "/")
                    points.setdefault((model, row["link"], row["speeds"]), []).append(row)
        except FileNotFoundError:
            pass
    errors, per_model, shared = [], {}, []
    within, worst, slower, total = 0, 0.0, 0, 0
    print("| model | link | speeds | auto chose | predicted ms | measured ms | best measured | one device | planned vs equal split |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, link, speeds), rows in points.items():
        table = [r for r in rows if " " not in r["label"] and float(r["measured_ms"]) > 0]
        if not table:
            continue
        for r in table:
            e = abs(float(r["error_rel"]))
            errors.append(e)
            if ";" in r["members"]:
                shared.append(e)
            per_model.setdefault(model.split(",")[0] if "budgets" not in model else "memory case", []).append(e)
        best = min(table, key=lambda r: float(r["measured_ms"]))
        single = next((r for r in table if r["strategy"] == "single"), None)
        chosen = next((r for r in table if r["chosen"] == "1"), None)
        total += 1
        hetero = []
        by_label = {r["label"]: r for r in rows}
        for r in rows:
            if r["label"].endswith(" equal"):
                planned = by_label.get(r["label"][: -len(" equal")])
                if planned and float(planned["measured_ms"]) > 0:
                    hetero.append(f"{planned['label']} {float(planned['measured_ms']):.1f} vs equal {float(r['measured_ms']):.1f}")
        if chosen is None:
            print(f"| {model} | {link} | {speeds.replace(';', ', ')} | (did not run) | | | | | |")
            continue
        m = float(chosen["measured_ms"])
        b = float(best["measured_ms"])
        within += m <= 1.05 * b
        worst = max(worst, m / b)
        if single and m > 1.05 * float(single["measured_ms"]):
            slower += 1
        print(
            f"| {model} | {link} | {speeds.replace(';', ', ')} | {chosen['strategy']} on {members(chosen['members'])} | "
            f"{float(chosen['predicted_ms']):.1f} | {m:.1f} | {b:.1f} ({best['strategy']} on {members(best['members'])}) | "
            f"{float(single['measured_ms']):.1f} | {'; '.join(hetero)} |"
            if single
            else f"| {model} | {link} | {speeds} | {chosen['strategy']} | {float(chosen['predicted_ms']):.1f} | {m:.1f} | {b:.1f} | | |"
        )
    print()
    print(f"table rows measured: {len(errors)}; |predicted - measured| / measured: median {100 * statistics.median(errors):.1f}%, "
          f"p90 {100 * p90(errors):.1f}%")
    if shared:
        print(f"  rows on two devices: median {100 * statistics.median(shared):.1f}%, p90 {100 * p90(shared):.1f}% ({len(shared)} rows)")
    for model, e in per_model.items():
        print(f"  {model}: median {100 * statistics.median(e):.1f}%, p90 {100 * p90(e):.1f}% ({len(e)} rows)")
    print(f"auto within 5% of the best measured: {within} of {total} points; worst {worst:.2f}x; "
          f"more than 5% slower than one device: {slower}")


if __name__ == "__main__":
    main()
