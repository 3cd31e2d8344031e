#!/usr/bin/env bash
# benchmarks/gpu.py on a lent GPU machine, in one call (../shared/GPU.md says how to spend it).
#
# Here, once:  .venv/bin/python benchmarks/gpu.py --prepare --wheels .whl   (and .whl/ in .git/info/exclude)
# The call:    run(command="bash benchmarks/gpu.sh", carry=[".whl", ".gpu/minilm"], timeout_s=510)
#
# The machine has python3 with torch and an older transformers, and no network: the carried wheels
# (the service's packages, transformers at the tests' version) go into /tmp/site; MiniLM is a stand-in
# made from the carried tokenizer files (gpu.py --standin). Extra arguments go to gpu.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
site=/tmp/site
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .whl/*.whl || exit 1
    export PYTHONPATH="$site"
    # A carried transformers that does not import beside this machine's tokenizers or hub: use the machine's.
    if ! python3 -c "import transformers" 2>/dev/null; then
        echo "the carried transformers does not import here: the machine's own is used"
        rm -rf "$site"/transformers "$site"/transformers-*.dist-info
    fi
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 benchmarks/gpu.py --device cuda --standin .gpu/minilm "$@" 2>&1 | tee "${OUT:-/tmp}/gpu.log"
