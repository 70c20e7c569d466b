"""Great Expectations run in memory: an ephemeral context (nothing written, no analytics), one DataFrame
validated with a suite, and GX's result as a ValidationSummary. GX is imported inside the functions: it takes
seconds to import."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .outcome import MAX_EXAMPLES, Outcome, add_gx_results, failures_of
from .suite import build_suite
from .summary import ValidationSummary

if TYPE_CHECKING:
    import pandas as pd

def gx_context() -> tuple[Any, Any]:
    """An ephemeral (in-memory, nothing written) GX context and a pandas batch definition in it."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (DataContextConfig, InMemoryStoreBackendDefaults,
                                                            ProgressBarsConfig)

    # GX logs its setup at INFO ("Loading 'datasources'..."): noise in every task log.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    # No analytics (workers may have no internet and must not phone home), no progress bars in task logs.
    config = DataContextConfig(analytics_enabled=False,
                               progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
                               store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False))
    context = gx.get_context(mode="ephemeral", project_config=config)
    batch_definition = (context.data_sources.add_pandas(name="ringflow")
                        .add_dataframe_asset(name="dataset")
                        .add_batch_definition_whole_dataframe("whole"))
    return context, batch_definition


RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": MAX_EXAMPLES}


def run_suite(df: pd.DataFrame, suite: Mapping[str, Any]) -> Any:
    """Validate one in-memory DataFrame with Great Expectations (GX expectations only). Returns GX's
    ExpectationSuiteValidationResult; validate_dataset is the streaming path the operator takes."""
    import great_expectations as gx

    context, batch_definition = gx_context()
    gx_suite = context.suites.add(build_suite(gx, suite))
    return batch_definition.get_batch(batch_parameters={"dataframe": df}).validate(gx_suite, result_format=RESULT_FORMAT)



def summarize(result: Any, suite_name: str, df: pd.DataFrame, target: str | None = None,
              features: Sequence[str] | None = None) -> ValidationSummary:
    """GX's result on one in-memory DataFrame as a ValidationSummary. With `target`, the feature and target
    columns (as sharding picks them: `features`, else every other column) are also checked to hold finite
    numbers (input_gate)."""
    from ..input_gate import find_problems

    outcomes: dict[str, Outcome] = {}
    add_gx_results(outcomes, result)
    failures = failures_of(outcomes, {}, 0)
    untrainable = tuple(find_problems(df, target, features)) if target is not None else ()
    return ValidationSummary(suite=suite_name, rows=len(df), columns=len(df.columns),
                             evaluated=len(result.results), failures=failures, untrainable=untrainable)
