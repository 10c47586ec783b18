# Databricks notebook source
# ruff: noqa: D100, E402, F821  (a notebook: spark and dbutils are given; imports are per cell)
# MAGIC %md
# MAGIC # Score with tonight's best model
# MAGIC
# MAGIC The `score` task of the `cerebro-nightly` job: the best checkpoint of the experiment
# MAGIC the `tune` task ran (its id is tune's task value) as a Spark ML Transformer, scoring
# MAGIC the table on the executors into a managed table with `prediction` and `probability`.

# COMMAND ----------

dbutils.widgets.text("store", "/dbfs/cerebro", "cerebro-spark store")
dbutils.widgets.text("experiment_id", "", "experiment (the tune task's value)")
dbutils.widgets.text("table", "main.default.cerebro_wine", "table to score")
dbutils.widgets.text("scored_table", "main.default.cerebro_wine_scored", "output table")

# COMMAND ----------

import cerebro_spark as cs

experiment_id = dbutils.widgets.get("experiment_id")
if not experiment_id:
    raise ValueError("the experiment_id widget is empty: run the tune task first")
result = cs.TuningResult.load(dbutils.widgets.get("store"), experiment_id)
model = result.best_model()
scored = model.transform(spark.table(dbutils.widgets.get("table")))
scored.write.mode("overwrite").saveAsTable(dbutils.widgets.get("scored_table"))
print(f"scored {scored.count()} rows into {dbutils.widgets.get('scored_table')}")
