#!/usr/bin/env python3
"""dgplot.py - a roofline of one dgbench run: each case's arithmetic intensity (FLOPs per byte
of its counted traffic) against the GFLOPS it reached, under this machine's measured limits
(the compute peaks as horizontal lines, the DRAM read bandwidth as the sloped one).

    python3 tools/dgplot.py RESULTS.json OUT.png [--title TEXT]
    dgbench --quick --plot OUT.png            (dgbench writes the JSON and runs this script)

RESULTS.json is what `dgbench --json` writes. Needs matplotlib (optional: only this script
uses it). Cases without FLOPs (the quantisation casts, memory-bound by definition) have no
place on a roofline and are listed under the plot instead. A run with --no-peaks has no limits
to draw: the points are plotted alone.
"""
import argparse
import json
import sys

FAMILY_STYLE = {  # first part of the case name -> (colour, marker)
    "gemm": ("tab:blue", "o"),
    "grouped": ("tab:orange", "s"),
    "mqa": ("tab:green", "^"),
    "hc": ("tab:red", "D"),
    "einsum": ("tab:purple", "v"),
    "mega_moe": ("tab:brown", "P"),
}

LIMITS = [  # JSON key, label, line style
    ("amx_bf16_gflops", "AMX BF16 tiles", "-"),
    ("amx_int8_gops", "AMX INT8 tiles (GOPS)", "-."),
    ("bf16_gflops", "VDPBF16PS", "--"),
    ("fp32_gflops", "FP32 FMA", "-"),
    ("int8_gops", "VPDPBUSD (GOPS)", ":"),
]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="dgbench --json output")
    ap.add_argument("out", help="image to write (PNG, SVG, PDF: by extension)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("dgplot: needs matplotlib (python3 -m pip install matplotlib)\n")
        return 3
    with open(args.results) as f:
        run = json.load(f)
    if run.get("digest"):
        sys.stderr.write("dgplot: %s is a --digest listing, not timed results\n" % args.results)
        return 2
    cases = [c for c in run.get("cases", []) if c.get("ok")]
    plotted = [c for c in cases if c.get("flops", 0) > 0 and c.get("bytes", 0) > 0 and c.get("seconds", 0) > 0]
    no_flops = [c["name"] for c in cases if c.get("flops", 0) <= 0]
    if not plotted:
        sys.stderr.write("dgplot: no timed case with FLOPs in %s\n" % args.results)
        return 1

    fig, ax = plt.subplots(figsize=(10, 6.2), dpi=100)
    ai = [c["flops"] / c["bytes"] for c in plotted]
    lo, hi = min(ai) / 2, max(ai) * 2
    limits = run.get("limits", {})
    bw = limits.get("dram_gbps", 0) or 0
    peaks = [(limits.get(k, 0) or 0, label, ls) for k, label, ls in LIMITS]
    peaks = [p for p in peaks if p[0] > 0]
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for value, label, ls in peaks:
        ys = [min(value, x * bw) if bw > 0 else value for x in xs]
        ax.plot(xs, ys, ls, color="0.35", lw=1.2, label="%s %.0f" % (label, value))
        ax.annotate(label, (hi, value), xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=8,
                    color="0.3")
    if bw > 0:
        top = max([p[0] for p in peaks] + [max(c["gflops"] for c in plotted)])
        xb = [x for x in xs if x * bw <= top * 1.2]
        ax.plot(xb, [x * bw for x in xb], color="black", lw=1.5, label="DRAM read %.1f GB/s" % bw)

    seen = set()
    for c in plotted:
        fam = c["name"].split("/")[0]
        colour, marker = FAMILY_STYLE.get(fam, ("tab:gray", "x"))
        ax.scatter(c["flops"] / c["bytes"], c["gflops"], s=28, color=colour, marker=marker, alpha=0.85,
                   edgecolors="none", label=fam if fam not in seen else None, zorder=3)
        seen.add(fam)
    # Name the fastest case and the one that reaches the least of its limit.
    named = [max(plotted, key=lambda c: c["gflops"])]
    rated = [c for c in plotted if c.get("limit_pct") is not None]
    if rated:
        named.append(min(rated, key=lambda c: c["limit_pct"]))
    for c in named:
        share = " (%.0f%% of %s)" % (c["limit_pct"], c.get("limit", "")) if c.get("limit_pct") is not None else ""
        ax.annotate("%s %.1f%s" % (c["name"], c["gflops"], share), (c["flops"] / c["bytes"], c["gflops"]),
                    xytext=(6, -12), textcoords="offset points", fontsize=7, color="0.2")
    above = [c for c in plotted if bw > 0 and c["gflops"] > 1.05 * bw * c["flops"] / c["bytes"]]

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of counted traffic)")
    ax.set_ylabel("achieved GFLOPS (GOPS for integer cases)")
    title = args.title or "dgbench roofline: %s, isa %s, %d threads%s" % (
        run.get("cpu", "?").strip(), run.get("isa", "?"), run.get("threads", 0), ", --quick" if run.get("quick") else "")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    note = "%d cases plotted" % len(plotted)
    if above:
        note += "; %d above the DRAM line (operands stayed in cache between repetitions)" % len(above)
    if no_flops:
        note += "; without FLOPs (not shown): " + ", ".join(no_flops)
    if not peaks and not bw:
        note += "; no limits measured (--no-peaks)"
    fig.text(0.01, 0.005, note, fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(args.out)
    print("dgplot: wrote %s (%s)" % (args.out, note))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
