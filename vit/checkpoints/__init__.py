"""Every checkpoint format in and out: vit_jax / big_vision npz, Hugging Face and timm
safetensors, and our own orbax checkpoints (training writes them through here)."""
