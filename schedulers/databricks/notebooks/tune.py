# Databricks notebook source
# ruff: noqa: D100, E402, F821  (a notebook: spark and dbutils are given; imports are per cell)
# MAGIC %md
# MAGIC # Nightly model selection
# MAGIC
# MAGIC The `tune` task of the `cerebro-nightly` job (`schedulers/databricks/databricks.yml`):
# MAGIC successive halving over MLPs on the table the ETL task wrote, trained on this
# MAGIC cluster's executors with model hopper parallelism. The experiment id comes from the
# MAGIC run's date, so a retry of this task resumes the search it started instead of
# MAGIC starting another; it is handed to the `report` and `score` tasks as a task value.

# COMMAND ----------

dbutils.widgets.text("table", "main.default.cerebro_wine", "table to train on")
dbutils.widgets.text("label", "label", "label column")
dbutils.widgets.text("store", "/dbfs/cerebro", "cerebro-spark store")
dbutils.widgets.text("partitions", "4", "partitions per split")
dbutils.widgets.text("workers", "4", "workers (one per executor)")
dbutils.widgets.text("trials", "8", "trials of successive halving")
dbutils.widgets.text("eta", "2", "reduction factor")
dbutils.widgets.text("epochs", "4", "most epochs of a trial")
dbutils.widgets.text("run_date", "", "the job run's date (YYYY-MM-DD)")

# COMMAND ----------

import datetime

import cerebro_spark as cs
from cerebro_spark.engine import resume_experiment
from cerebro_spark.errors import ConfigError

table = dbutils.widgets.get("table")
label = dbutils.widgets.get("label")
store = dbutils.widgets.get("store")
run_date = dbutils.widgets.get("run_date") or datetime.date.today().isoformat()
experiment_id = "nightly-" + run_date.replace("-", "")

tuner = cs.Tuner(
    space={
        "model": "cerebro_spark.training:MLPSpec",
        "hidden_units": cs.Choice([[32], [64, 32], [128, 64]]),
        "lr": cs.LogUniform(1e-3, 3e-2),
        "batch_size": 16,
    },
    procedure=cs.Procedure(
        "sha", num_trials=int(dbutils.widgets.get("trials")), eta=int(dbutils.widgets.get("eta"))
    ),
    epochs=int(dbutils.widgets.get("epochs")),
    store=store,
    workers=int(dbutils.widgets.get("workers")),
    partitions=int(dbutils.widgets.get("partitions")),
    name="nightly",
    progress=False,  # job logs: the search logs its rounds
)

# COMMAND ----------

try:
    cs.TuningResult.load(store, experiment_id)  # a try before this one started it
    started = True
except ConfigError:
    started = False
if started:
    resume_experiment(store, experiment_id)
    result = cs.TuningResult.load(store, experiment_id)
else:
    result = tuner.fit(spark.table(table), label=label, experiment_id=experiment_id)

# COMMAND ----------

leaderboard = result.leaderboard()
print(leaderboard.head(10).to_string())
print(f"best: trial {result.best.trial_id}, epoch {result.best.best_epoch}")
dbutils.jobs.taskValues.set(key="experiment_id", value=experiment_id)
