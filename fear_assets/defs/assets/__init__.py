"""Thin Dagster asset modules, one per protocol stage (group name = stage)."""
