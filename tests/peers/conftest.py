"""The entmax shim is run by test_entmax_suite in a subprocess, never imported here (collected as doctests it
would shadow the real package in this process)."""

collect_ignore = ["entmax_shim"]
