"""Run the nightly DAG with Airflow's own ``dag.test()``; print the outcome as JSON.

Runs inside the Airflow virtual environment the test builds (never the project's):

    python airflow_runner.py DAG_FILE YYYY-MM-DD

The last line of stdout is ``{"state": ..., "tasks": {task_id: {"state", "try_number"}},
"xcom": {task_id: value}}``.
"""

import importlib.util
import json
import sys

import pendulum
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session


def main() -> None:
    dag_file, day = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_file_location("cerebro_nightly", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.dag.test(logical_date=pendulum.parse(day, tz="UTC"))
    tasks = {
        ti.task_id: {"state": str(ti.state), "try_number": ti.try_number}
        for ti in run.get_task_instances()
    }
    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=module.dag.dag_id, run_id=run.run_id)
        xcom = {row.task_id: row.value for row in rows if row.key == "return_value"}
    print(json.dumps({"state": str(run.state), "tasks": tasks, "xcom": xcom}, default=str))


if __name__ == "__main__":
    main()
