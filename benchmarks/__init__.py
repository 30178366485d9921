"""The benchmarks: `python -m benchmarks MODE [options]` measures one thing against its peer and
writes `benchmarks/records/MODE.json`; `python -m benchmarks tables` writes the docs' tables
from the records. See `benchmarks/common.py` for how a mode is built and `__main__.py` for the
list of modes."""
