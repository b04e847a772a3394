"""What a Spark Connect server must have for the pipeline, checked when the pipeline connects.

Through Spark Connect the pipeline process is only a client: the Python data sources (log_source.py,
table_batches.py) and the foreachBatch functions (batches.py) are pickled and run in the Connect server's Python
workers. They need there the Python minor version of this side (cloudpickle's bytecode is version-bound) and the
headrace package, the same version, importable by the server's Python (`pip install headrace` into the Python that
PYSPARK_PYTHON names on the Connect server). A probe UDF reports both; a mismatch is a BadSparkMaster with a
message saying what to install, raised before any query starts."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from headrace import __version__
from headrace.pipeline.spark_master import BadSparkMaster


def _probe_function() -> Any:
    """Built in a function so cloudpickle ships it by value: it must not need headrace to be unpickled."""

    def probe(_: Any) -> str:
        import sys as remote_sys

        python = f"{remote_sys.version_info[0]}.{remote_sys.version_info[1]}"
        try:
            import headrace
        except Exception as error:  # noqa: BLE001 - reported to the client
            return f"{python}|-|{type(error).__name__}: {error}|{remote_sys.executable}"
        return f"{python}|{headrace.__version__}||{remote_sys.executable}"

    return probe


def parse_probe(answer: str) -> tuple[str, str | None, str, str]:
    """(python minor, headrace version or None, import error, the server's python executable)."""
    python, version, error, executable = (answer.split("|", 3) + ["", "", ""])[:4]
    return python, (None if version == "-" else version), error, executable


def compatibility_problem(answer: str, local_python: str, local_version: str) -> str | None:
    """What is wrong with the Connect server's side, or None."""
    python, version, error, executable = parse_probe(answer)
    where = f"the Spark Connect server's Python ({executable or 'PYSPARK_PYTHON'})"
    if python != local_python:
        return (f"{where} is Python {python}, the pipeline's is {local_python}: they must be the same minor version "
                "(the data sources and foreachBatch functions are pickled across)")
    if version is None:
        return (f"{where} cannot import headrace ({error}): install headrace {local_version} there "
                f"(pip install headrace=={local_version}; docs/deploy.md)")
    if version != local_version:
        return f"{where} has headrace {version}, the pipeline {local_version}: install the same version on both sides"
    return None


def check_connect_server(spark: Any) -> None:
    from pyspark.sql.functions import lit, udf

    try:
        with warnings.catch_warnings():  # pyspark asks for type hints it could infer a pandas UDF from: a plain one
            warnings.simplefilter("ignore", UserWarning)
            probe = udf(_probe_function(), "string")
        answer = spark.range(1).select(probe(lit(1))).first()[0]
    except Exception as error:  # noqa: BLE001 - any failure to run Python on the server side is the same problem
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        raise BadSparkMaster(f"the Spark Connect server cannot run the pipeline's Python code: {first_line}") from error
    problem = compatibility_problem(str(answer), f"{sys.version_info[0]}.{sys.version_info[1]}", __version__)
    if problem:
        raise BadSparkMaster(problem)
