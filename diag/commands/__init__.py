"""One module per `pardiag` subcommand: `add_arguments(parser)` and `execute(args) -> int`."""
