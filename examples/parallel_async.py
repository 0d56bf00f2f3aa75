"""Three Environments at once with the asynchronous client: an agent fanning work out.

Run against `adx up`: `python examples/parallel_async.py`.
"""

import asyncio

import adx


async def square(client: adx.AsyncClient, n: int) -> int:
    env = await client.environments.create(cpu="250m", memory="128Mi")
    try:
        result = await env.commands.run(["python3", "-c", f"print({n} * {n})"])
        return int(result.stdout)
    finally:
        await env.delete()


async def main() -> None:
    async with adx.AsyncClient() as client:
        squares = await asyncio.gather(*(square(client, n) for n in (2, 3, 4)))
    print("squares:", squares)
    assert squares == [4, 9, 16]


asyncio.run(main())
