"""The plug-in contract (the ground floor): what tasks, models and methods are (`task`, `model`, `method`), how
they are found (`registry`) and configured (`options`, `settings`, `config`), and what every run is built from:
the trainer and its EMA, checkpoints, seals, placement on a device, random generators, metrics, data cards and the
bad-record policy. Plug-ins import this package and nothing else of the engine; nothing here imports the floors
above (`workbench.clinical`, `workbench.run`, `workbench.comparison`, `workbench.serve`, `workbench.cli`).
"""
