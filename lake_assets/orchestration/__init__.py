"""Thin Dagster modules (resources, IO managers, assets, checks, sensors) over the pure logic."""
