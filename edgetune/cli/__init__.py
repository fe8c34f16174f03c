"""The typer CLI: a thin layer over edgetune.api, one module per noun."""
