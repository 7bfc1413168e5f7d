"""The learning-rate finder's plot, as Lightning's _LRFinder.plot(suggest=True) draws it.

usage: plot_lr_find.py RESULT.csv OUT.png

RESULT.csv is what fulgur::LRFinderResult::write_csv (or plot) writes: a "# mode=... suggestion_index=..."
line, then "lr,loss" rows (the smoothed losses). The curve is loss over learning rate, the x axis
logarithmic for the exponential mode, the suggestion a red point.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path, png_path):
    mode, index = "exponential", None
    lrs, losses = [], []
    with open(csv_path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("#"):
                fields = dict(item.split("=", 1) for item in line[1:].split())
                mode = fields.get("mode", mode)
                index = None if fields.get("suggestion_index", "none") == "none" else int(fields["suggestion_index"])
            elif line and line != "lr,loss":
                lr, loss = line.split(",")
                lrs.append(float(lr))
                losses.append(float(loss))
    fig, ax = plt.subplots()
    ax.plot(lrs, losses)
    if mode == "exponential":
        ax.set_xscale("log")
    ax.set_xlabel("Learning rate")
    ax.set_ylabel("Loss")
    if index:  # Lightning marks it only when _optimal_idx is truthy
        ax.plot(lrs[index], losses[index], markersize=10, marker="o", color="red")
    fig.savefig(png_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
