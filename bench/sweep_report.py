#!/usr/bin/env python3
"""Makes the report of a serving sweep from its results.json alone: summary.md (a table) and
plot.png (TTFT and ITL percentiles against output token throughput, through gnuplot).

    bench/sweep_report.py bench/results/NAME/results.json [--no-plot]

serve_sweep.py calls it after a sweep; run it by hand where the sweep ran without gnuplot (the GPU
machine) once the results are here. Standard library only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def _point_label(point):
    return point.get("label") or point.get("result", {}).get("label", "")


def _fmt(value, digits=1):
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def summary_markdown(results):
    """The results as a Markdown document: provenance, then one table row per sweep point."""
    machine = results.get("machine", {})
    lines = [f"# Serving sweep: {results.get('name', '')}", ""]
    lines.append(f"- date: {results.get('date', '')}")
    lines.append(f"- commit: {results.get('commit', '')}")
    cpu = machine.get("cpu_model", "?")
    lines.append(f"- machine: {cpu}, {machine.get('cpu_cores', '?')} cores, "
                 f"{machine.get('memory_gib', '?')} GiB; GPU: {machine.get('gpus') or 'none'}")
    if machine.get("load_average_before"):
        lines.append(f"- load average before the sweep: {machine['load_average_before']}")
    lines.append(f"- server: `{results.get('server_command', '')}`")
    lines.append(f"- client: `{results.get('client_command', '')}` (per point below)")
    if results.get("notes"):
        lines.append(f"- notes: {results['notes']}")
    lines.append("")
    lines.append("| point | ok/issued | req/s | out tok/s | TTFT mean | TTFT p50 | TTFT p99 | "
                 "ITL p50 | ITL p99 | TPOT mean | E2EL p50 | server TTFT mean | client vs server |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for point in results.get("points", []):
        r = point.get("result")
        if not r:
            lines.append(f"| {_point_label(point)} | failed: {point.get('error', '?')} |"
                         + " |" * 11)
            continue
        server = r.get("server_ttft", {})
        diff = server.get("relative_difference")
        lines.append("| {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            _point_label(point), r["completed"], r["num_issued"],
            _fmt(r["request_throughput"], 3), _fmt(r["output_throughput"]),
            _fmt(r["ttft_ms"]["mean"]), _fmt(r["ttft_ms"].get("p50")),
            _fmt(r["ttft_ms"].get("p99")),
            _fmt(r["itl_ms"].get("p50")), _fmt(r["itl_ms"].get("p99")), _fmt(r["tpot_ms"]["mean"]),
            _fmt(r["e2el_ms"].get("p50")), _fmt(server.get("server_ttft_mean_ms")),
            "-" if diff is None else f"{diff * 100:+.2f} %"))
    lines.append("")
    lines.append("Latencies in ms. TTFT from request send to the first streamed token; ITL the "
                 "gaps between tokens; TPOT (e2e - TTFT) / (tokens - 1); server TTFT mean from the "
                 "lmserve_time_to_first_token_seconds histogram's _sum/_count deltas over the run "
                 "(warm-up excluded on both sides).")
    failed = [p for p in results.get("points", []) if p.get("result", {}).get("failed")]
    for point in failed:
        lines.append(f"- {_point_label(point)}: {point['result']['failed']} failed requests: "
                     f"{json.dumps(point['result'].get('errors', {}))}")
    return "\n".join(lines) + "\n"


def write_plot(results, png_path):
    """Plots TTFT and ITL p50/p99 against output token throughput. Returns False without gnuplot."""
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("sweep_report: gnuplot not found; no plot (run this script where it is installed)",
              file=sys.stderr)
        return False
    rows = []
    for point in results.get("points", []):
        r = point.get("result")
        if not r or not r.get("completed"):
            continue
        label = _point_label(point).replace("concurrency ", "c=").replace("rate ", "r=")
        label = label.replace(" ", "_").replace('"', "")
        rows.append((r["output_throughput"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"],
                     r["itl_ms"]["p50"], r["itl_ms"]["p99"], label))
    if not rows:
        print("sweep_report: no successful points to plot", file=sys.stderr)
        return False
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "points.dat")
        with open(data, "w") as f:
            f.write("# out_tok_s ttft_p50 ttft_p99 itl_p50 itl_p99 label\n")
            for row in rows:
                f.write("{} {} {} {} {} \"{}\"\n".format(*row))
        title = f"{results.get('name', '')} ({results.get('commit', '')[:10]})".replace('"', "")
        script = f"""
set terminal pngcairo size 1400,560 font ",10"
set output "{png_path}"
set multiplot layout 1,2 title "{title}"
set grid
set key below
set offsets graph 0.05, graph 0.05, graph 0.12, graph 0.02
set xlabel "output token throughput (tokens/s)"
set ylabel "milliseconds"
set title "time to first token"
plot "{data}" using 1:2 with linespoints pt 7 title "TTFT p50", \\
     "{data}" using 1:3 with linespoints pt 5 title "TTFT p99", \\
     "{data}" using 1:3:6 with labels offset 0,1 font ",8" notitle
set title "inter-token latency"
plot "{data}" using 1:4 with linespoints pt 7 title "ITL p50", \\
     "{data}" using 1:5 with linespoints pt 5 title "ITL p99", \\
     "{data}" using 1:5:6 with labels offset 0,1 font ",8" notitle
unset multiplot
"""
        result = subprocess.run([gnuplot], input=script, text=True, capture_output=True)
        if result.returncode != 0:
            print(f"sweep_report: gnuplot failed:\n{result.stderr}", file=sys.stderr)
            return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a sweep's results.json")
    parser.add_argument("--no-plot", action="store_true", help="write summary.md only")
    args = parser.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    out_dir = os.path.dirname(os.path.abspath(args.results))
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(results))
    print(f"sweep_report: wrote {os.path.join(out_dir, 'summary.md')}")
    if not args.no_plot:
        png = os.path.join(out_dir, "plot.png")
        if write_plot(results, png):
            print(f"sweep_report: wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
