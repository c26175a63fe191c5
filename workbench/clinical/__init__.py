"""Clinical use of a finished classification run (the floor above `workbench.core`, below `workbench.run`, which
fits and applies it): calibrated probabilities (`calibration`), conformal prediction sets, weighted under covariate
shift (`conformal`), a shift alarm on the model's features (`shift_alarm`), what an adapt run fits and keeps for them
(`fit`), the predictor that answers with all three (`predictor`) and the run's model card (`card`).

Example::

    >>> from workbench.clinical.predictor import ClinicalPredictor        # doctest: +SKIP
    >>> predictor = ClinicalPredictor.load("runs/x")                      # doctest: +SKIP
    >>> predictor.answer(Path("new_records"))[0]["conformal_set"]         # doctest: +SKIP
"""
