import os

# Tests run on the CPU unless a caller (the GPU check) says otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
