"""headscope's web service: FastAPI over the `mha` library."""
