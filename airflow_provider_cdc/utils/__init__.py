"""What the operators, sensors and captures use that is not an operator, as Airflow's providers
keep it under ``utils``: the outlet assets and their events (:mod:`.assets`), OpenLineage
(:mod:`.lineage`), the run a task stands for (:mod:`.runs`) and the times tasks are given
(:mod:`.times`). They import the engine (``cdc``) and Airflow, never the operators, sensors or
captures (a capture appears in annotations only)."""
