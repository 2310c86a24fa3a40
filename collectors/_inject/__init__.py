"""Holds the sitecustomize.py that pardiag puts first on PYTHONPATH of every rank."""
