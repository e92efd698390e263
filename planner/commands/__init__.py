"""One module per `plan` verb; each takes parsed arguments and returns an exit code."""
