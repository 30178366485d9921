"""`python -m benchmarks MODE` measures one thing against its peer into
`benchmarks/records/NAME.json`; `... tables` makes the docs' tables from the records."""
