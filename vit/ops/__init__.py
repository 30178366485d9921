"""Numerical kernels. Imports nothing from models, data, config or training stacks."""
