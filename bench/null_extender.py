"""The lightest extender the throughput benchmark can be driven through: the bound of what HTTP costs.

    python -m bench.null_extender --port PORT --kubeconfig FILE

Served by uvicorn on the same HTTP stack as the extender, it keeps no cache and watches nothing: filter passes
the first node name it is sent (the loop's own checks already passed it), bind makes the plain Binding through
``gpushare.kube`` in a thread, as the extender does. A row driven through it measures what the round trips and
the Binding cost the loop, so the gap between it and the extender's row is the extender's own work.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from starlette.types import Receive, Scope, Send

from gpushare.kube.api import Kube, KubeError
from gpushare.kube.client import connect


class NullExtender:
    """ASGI app: filter and bind answered with no state of its own."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._binds = ThreadPoolExecutor(64, thread_name_prefix="bind")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        args = orjson.loads(await _body(receive))
        if scope["path"].endswith("/filter"):
            answer: dict[str, Any] = {"NodeNames": (args.get("NodeNames") or [])[:1], "FailedNodes": {},
                                      "FailedAndUnresolvableNodes": {}, "Error": ""}
        elif scope["path"].endswith("/bind"):
            answer = {"Error": await asyncio.get_running_loop().run_in_executor(self._binds, self._bind, args)}
        else:
            answer = {"Error": f"the null extender answers only filter and bind, not {scope['path']}"}
        body = orjson.dumps(answer)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _bind(self, args: dict[str, Any]) -> str:
        try:
            self._kube.pods.bind(args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"])
        except KubeError as exc:
            return str(exc)
        return ""


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    args = parser.parse_args(argv)
    server = uvicorn.Server(uvicorn.Config(NullExtender(connect(args.kubeconfig)), host="127.0.0.1",
                                           port=args.port, log_config=None, access_log=False))
    server.run()


if __name__ == "__main__":
    main()
