"""What an endpoint token (SEC-4) costs on the data plane, on a real ``adx up`` cluster, beside the tenant API key
in the same run.

    uv run python bench/bench_endpoint_tokens.py [--rounds 200]

The request: ``POST /v1/environments/{id}/commands {"command": "true"}`` (HTTP -> API/Ingress -> Relay (mTLS) ->
execd), the whole NDJSON answer read. Each round sends it three ways, in a rotating order (drift and position in
the round hit all three alike):
- ``with_api_key``: ``Authorization: Bearer <tenant key>`` (the key's tenant cached, as in production): the baseline.
- ``with_token_cached``: one token, checked once before the rounds, then served from the Ingress's token cache.
- ``with_token_first_use``: a token made just before (not timed) and used for the first time: the Ingress asks the
  Coordinator (CheckToken: one Redis read of the token, one of its tenant's flag) before forwarding.
``token_overhead_*_ms`` are the p50 differences to the baseline.

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx
from _harness import emit, progress, summarize, time_calls
from bench_api import start_cluster, stop_cluster, wait_deleted

import adx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="adx-bench-tokens-", dir="/tmp") as tmp:
        progress("starting adx up")
        proc, url, key = start_cluster(Path(tmp))
        try:
            with adx.Client(api_url=url, api_key=key) as client, httpx.Client(base_url=url, timeout=30) as http:
                env = client.environments.create(cpu=1, memory="128Mi")
                path = f"/v1/environments/{env.id}/commands"
                body = {"command": "true"}

                def send(credential: str) -> None:
                    answer = http.post(path, json=body, headers={"Authorization": f"Bearer {credential}"})
                    assert answer.status_code == 200 and '"exitCode":0' in answer.text.replace(" ", ""), answer.text

                cached = env.tokens.create()
                for _ in range(10):  # warm: connections, the key's and the token's cache entries
                    send(key)
                    send(cached.token)
                progress(f"{args.rounds} rounds: API key, cached token, first use of a new token")
                with_key: list[float] = []
                with_cached: list[float] = []
                first_use: list[float] = []
                for i in range(args.rounds):
                    fresh = env.tokens.create()  # not timed
                    runs = [
                        (with_key, lambda: send(key)),
                        (with_cached, lambda: send(cached.token)),
                        (first_use, lambda t=fresh.token: send(t)),
                    ]
                    # The three in a rotating order: none always follows the untimed create.
                    for samples, call in runs[i % 3 :] + runs[: i % 3]:
                        samples += time_calls(call, 1)
                    env.tokens.revoke(fresh)  # not timed; keeps the Environment's token count bounded
                env.delete()
                wait_deleted(env)
        finally:
            stop_cluster(proc)
    figures = {
        "with_api_key": summarize(with_key),
        "with_token_cached": summarize(with_cached),
        "with_token_first_use": summarize(first_use),
    }
    base = figures["with_api_key"]["p50_ms"]
    figures["token_overhead_cached_p50_ms"] = round(figures["with_token_cached"]["p50_ms"] - base, 3)
    figures["token_overhead_first_use_p50_ms"] = round(figures["with_token_first_use"]["p50_ms"] - base, 3)
    emit("endpoint_tokens", figures)


if __name__ == "__main__":
    main()
