"""The ServerApp's grid in a deployment (its own module: importing it costs ~4 s, which a ClientApp
process or the CLI does not pay)."""

# The Runtime API's grid: reply_pull replaces its pull_messages with one that inflates each reply on its own.
from flwr.superlink.grid.http_grid import HttpGrid
