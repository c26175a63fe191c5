"""Comparisons of methods (the third floor, on `workbench.run`): the design (`workbench.comparison.design`: spec,
folds, cells), one cell (`workbench.comparison.cells`), ``workbench compare`` (`workbench.comparison.execute`),
``--rerun-cell`` (`workbench.comparison.rerun`), the statistics of a verdict (`workbench.comparison.statistics`) and
the report (`workbench.comparison.report`).
"""

from workbench._forward import forwarder

__getattr__ = forwarder(
    __name__,
    ("workbench.comparison.design", "workbench.comparison.cells", "workbench.comparison.execute",
     "workbench.comparison.rerun"),
    {"CompareSpec": "workbench.comparison.design", "compare": "workbench.comparison.execute",
     "rerun_cell": "workbench.comparison.rerun"},
)  # fmt: skip
