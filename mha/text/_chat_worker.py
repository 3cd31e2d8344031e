"""The chat-template worker (mha.text.chat): run as a script, `python -I _chat_worker.py`, never imported.

Reads one JSON job a line on stdin ({template, messages, variables, add_generation_prompt}) and writes one
JSON line back: {"ok": true, "text": ...} or {"ok": false, "kind": exception class, "message": ...}. It
imports only transformers' chat-template utilities (jinja2, no torch), then caps its own address space
at its size after start plus RENDER_BYTES, so a template that allocates without end fails here with a
MemoryError (or the kernel stops this process) instead of growing the server.
"""

import json
import os
import resource
import sys
from typing import Any

MAX_RENDERED_CHARS = 1_000_000  # mha.text.chat.MAX_RENDERED_CHARS


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    size = _vm_bytes()
    if size:  # Linux; elsewhere the time bound alone holds
        cap = size + int(os.environ.get("RENDER_BYTES", str(512 * 2**20)))
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            job = json.loads(line)
            # transformers annotates it `-> str`; it returns (rendered chats, generation indices)
            rendered: Any = render_jinja_template(
                conversations=[job["messages"]],
                chat_template=job["template"],
                add_generation_prompt=job["add_generation_prompt"],
                **job["variables"],
            )
            text = rendered[0][0]
            if len(text) > MAX_RENDERED_CHARS:
                reply = {"ok": False, "kind": "TooLong", "message": ""}
            else:
                reply = {"ok": True, "text": text}
            del rendered
        except BaseException as error:  # noqa: BLE001 - every failure is the template's, reported in a line
            if isinstance(error, KeyboardInterrupt):
                raise
            reply = {"ok": False, "kind": type(error).__name__, "message": str(error)}
        try:
            out.write(json.dumps(reply) + "\n")
            out.flush()
        except MemoryError:
            out.write('{"ok": false, "kind": "MemoryError", "message": ""}\n')
            out.flush()


if __name__ == "__main__":
    main()
