"""Helpers the test areas share (cases, tolerances, tiny models, runners), imported as `support.<module>`."""
