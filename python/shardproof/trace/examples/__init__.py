"""Example programs traced by the tests and the demo: a small GPT, single-device and Megatron-style parallel."""
