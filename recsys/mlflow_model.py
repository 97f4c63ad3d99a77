"""The MLflow pyfunc face of a recsys model (MLflow "models from code": this file is copied
into the packaged model and run by ``mlflow.pyfunc.load_model``; nothing is unpickled).

``mlflow.pyfunc.load_model("models:/<name>@<alias>").predict(events_df, params={...})`` scores
a pandas event log (the columns the model was trained with) and returns the recommendations
as a pandas frame (the columns of :mod:`recsys.retrieval.recommend`). ``params`` are
:data:`recsys.tasks.score.PYFUNC_PARAMS` (``top_k``, ``exclude``, ``max_per_category``,
..., and ``bad_rows``: ``data.bad_rows``' policies as ``"unknown_behavior=drop,..."``, where a
message names ``data.bad_rows.<kind>``). recsys' own loader
(:func:`recsys.tracking.resolve_model`) reads the packaged checkpoint directly.
"""

from __future__ import annotations

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class RecsysModel(PythonModel):
    def load_context(self, context) -> None:
        from recsys.checkpoint import load_checkpoint

        self.model = load_checkpoint(context.artifacts["checkpoint"])

    # pd.DataFrame: what it takes, and a hint MLflow infers no schema from (the columns are
    # the user's own; recsys checks them), so it neither validates nor warns for lack of one
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from recsys.data.io import to_pandas
        from recsys.tasks.score import recommend_frame, recommend_kwargs_from_params

        kwargs = recommend_kwargs_from_params(params)
        # explanation item ids with nulls as nullable integers: float64 would round big ids
        return to_pandas(recommend_frame(self.model, model_input, **kwargs))


mlflow.models.set_model(RecsysModel())
