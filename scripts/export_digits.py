#!/usr/bin/env python3
"""Writes scikit-learn's bundled 8x8 digits data set (1797 images, 64 pixels + label per row) as
plain CSV for the C++ example. The data ships inside the scikit-learn wheel; nothing is downloaded."""
import gzip
import os
import sys

import sklearn.datasets

source = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
target = sys.argv[1] if len(sys.argv) > 1 else "digits.csv"
os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
with gzip.open(source, "rt") as src, open(target, "w") as dst:
    dst.write(src.read())
print(f"digits data set ({source}) written to {target}")
