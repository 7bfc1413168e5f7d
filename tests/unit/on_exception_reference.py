"""Lightning's OnExceptionCheckpoint, as on_exception_tests.cpp compares fulgur's with it: the file name
it writes (default and given filename), its extension, and its error for an empty filename.

usage: on_exception_reference.py OUT  (writes key=value lines)
"""
import sys

from lightning.pytorch.callbacks import OnExceptionCheckpoint

default = OnExceptionCheckpoint(dirpath="some/dir")
named = OnExceptionCheckpoint(dirpath="some/dir", filename="crash")
try:
    OnExceptionCheckpoint(dirpath="d", filename="")
    error = "<none>"
except ValueError as e:
    error = str(e)
with open(sys.argv[1], "w") as out:
    out.write(f"default_path={default.ckpt_path}\n")
    out.write(f"named_path={named.ckpt_path}\n")
    out.write(f"extension={OnExceptionCheckpoint.FILE_EXTENSION}\n")
    out.write(f"empty_filename_error={error}\n")
