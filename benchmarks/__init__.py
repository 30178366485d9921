"""The benchmarks: `python -m benchmarks MODE` measures one thing against its peer and writes
`benchmarks/records/NAME.json`; `python -m benchmarks tables` writes the docs' tables from the
records (`benchmarks/common.py` says how a mode is built)."""
