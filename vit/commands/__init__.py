"""One module per `vit` subcommand: `add_arguments(parser)` and `run(args) -> int`."""
