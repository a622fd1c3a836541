"""mlops-gpu's MLflow plugins, registered through entry points (DESIGN.md, "Packaging").

MLflow loads every plugin module at ``import mlflow``: these modules stay tiny and import
nothing of mlops_gpu's scheduler.
"""
