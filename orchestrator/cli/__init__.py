"""The `dfo` command line: parse, call the operation, render. Nothing else lives here.

Command functions take one parameter per option (typer's style): their signatures are long on purpose, their
bodies short.
"""
