"""One run (the second floor, on `workbench.clinical` and `workbench.core`): ``workbench adapt``
(`workbench.run.adapting`), ``evaluate`` (`workbench.run.evaluating`), ``predict`` (`workbench.run.predicting`),
the run folder (`workbench.run.rundir`, `workbench.run.outputs`, `workbench.run.fingerprint`), its report and item
intervals, and the CPU-thread policy. A finished run read back is `workbench.core.finished.Run`.
"""

from workbench._forward import forwarder

__getattr__ = forwarder(
    __name__,
    ("workbench.run.adapting", "workbench.run.evaluating", "workbench.run.predicting", "workbench.core.finished"),
    {"Run": "workbench.core.finished", "adapt": "workbench.run.adapting", "evaluate": "workbench.run.evaluating",
     "predict": "workbench.run.predicting"},
)  # fmt: skip
