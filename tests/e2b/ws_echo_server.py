"""A WebSocket echo server run inside the sandbox by tests/e2b/test_e2b_port_websocket.py (stdlib only: the
sandbox image has no WebSocket library). Test code, not a framer for ADX: ADX's proxy uses wsproto.

``python3 ws_echo_server.py PORT LOG``: echoes text and binary messages; ``path?`` answers the request target
as the server received it; ``big:N`` answers a binary message of N bytes; ``stall:S`` stops reading for S
seconds; ``close-me`` makes the server close (4001 "bye"); a path under ``/deny`` is refused with 403; the
close code each connection ended with is appended to LOG. Plain HTTP GET answers its target too.
"""

import asyncio
import base64
import hashlib
import struct
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def frame(opcode: int, payload: bytes) -> bytes:
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[bool, int, bytes]:
    b1, b2 = await reader.readexactly(2)
    n = b2 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    mask = await reader.readexactly(4) if b2 & 0x80 else b""
    data = await reader.readexactly(n)
    if mask and n:
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        data = (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")
    return bool(b1 & 0x80), b1 & 0x0F, data


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: str) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    target = lines[0].split(" ")[1]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("upgrade", "").lower() != "websocket":
        body = target.encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()
        return
    if target.startswith("/deny"):
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\nX-Why: test\r\n\r\ndenied")
        await writer.drain()
        writer.close()
        return
    accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest())
    answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    answer += b"Sec-WebSocket-Accept: " + accept + b"\r\nX-Echo: yes\r\n"
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    if offered:
        answer += b"Sec-WebSocket-Protocol: " + offered[-1].encode() + b"\r\n"
    writer.write(answer + b"\r\n")
    code = 1006
    parts: list[bytes] = []
    kind = 1
    try:
        while True:
            fin, opcode, data = await read_frame(reader)
            if opcode == 8:
                code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1005
                writer.write(frame(8, data[:2]))
                break
            if opcode == 9:
                writer.write(frame(10, data))
                continue
            if opcode in (1, 2):
                kind, parts = opcode, [data]
            elif opcode == 0:
                parts.append(data)
            else:
                continue
            if not fin:
                continue
            message = b"".join(parts)
            if kind == 1 and message == b"path?":
                writer.write(frame(1, target.encode()))
            elif kind == 1 and message.startswith(b"stall:"):
                await asyncio.sleep(float(message[6:]))  # reads nothing meanwhile: a slow consumer
            elif kind == 1 and message.startswith(b"big:"):
                writer.write(frame(2, bytes(int(message[4:]))))
            elif kind == 1 and message == b"close-me":
                writer.write(frame(8, struct.pack("!H", 4001) + b"bye"))
                await writer.drain()
                code = 4001
                while (await read_frame(reader))[1] != 8:
                    pass
                break
            else:
                writer.write(frame(kind, message))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        with open(log, "a") as out:  # noqa: ASYNC230 (a line per connection, in a test's server)
            out.write(f"{target} {code}\n")
        writer.close()


async def main() -> None:
    port, log = int(sys.argv[1]), sys.argv[2]
    server = await asyncio.start_server(lambda r, w: handle(r, w, log), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


asyncio.run(main())
