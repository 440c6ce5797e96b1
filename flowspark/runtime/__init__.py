"""Runtimes that execute a dataflow's core steps (`local`: the in-memory executor)."""
