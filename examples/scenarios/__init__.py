"""Training scripts that each plant one problem pardiag's lever advisor should name
(and healthy controls that should get no finding). Run them under `pardiag run` with
torchrun, 2 ranks, gloo on the CPU; see tests/jobs/test_scenarios.py."""
