"""Writing stores: packing files and huggingface_hub caches with hf_xet."""
