"""Open-loop load client for the peer benchmark (cohort_tools/peers/run.py).

Every request is sent at its scheduled time whatever the others are doing (open loop: a slow
router cannot slow the offered load down, which is how queueing shows up in TTFT). One asyncio
loop with raw HTTP/1.1 over loopback TCP (TCP_NODELAY, one connection per request, `Connection:
close`) rather than a thread per request: a thread per in-flight stream costs the GIL and two
cores' worth of context switches at ~200 req/s, which the engines and routers being measured
need. Responses are parsed as server-sent events (chunked or not); the client records

  ttft_ms          first data event that carries content (the first token), from the send
  e2e_ms           last byte of the response
  status, error    HTTP status; every failure (connect, timeout, non-200, truncated stream)
                   becomes a record with `error` set, never an exception or a lost request
  prompt_tokens, cached_tokens, completion_tokens
                   the engine's `usage` (cached from prompt_tokens_details; llama-server's
                   `timings.cache_n` when present)
  replica          which replica served: `x-sim-replica` (engine-sim), else the batch front's
                   `x-cohort-batch: role;replica=NAME`, else `x-served-by` (Envoy, see
                   cohort_tools.envoy_config) mapped through `replica_names`
  engine_ttft_ms   `x-sim-ttft-ms` (the simulated engine's own queue + prefill time)

Standard library only.
"""
import asyncio
import json
import socket
import time

CONNECT_TIMEOUT_S = 5.0


def _header_map(raw):
    headers = {}
    for line in raw.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return headers


class _Stream:
    """Incremental SSE parser: feed bytes, it notes the first content event and the usage."""

    def __init__(self):
        self.buffer = b""
        self.first_event = None
        self.first_content = None
        self.usage = None
        self.timings = None
        self.done = False
        self.events = 0

    def feed(self, data, now):
        self.buffer += data
        while True:
            cut = self.buffer.find(b"\n")
            if cut < 0:
                return
            line, self.buffer = self.buffer[:cut].strip(), self.buffer[cut + 1:]
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            self.events += 1
            if self.first_event is None:
                self.first_event = now
            # Parse only what is needed: events until the first content, and the usage event.
            if self.first_content is not None and b'"usage":{' not in payload \
                    and b'"usage": {' not in payload and b'"timings"' not in payload:
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            if self.first_content is None:
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content") or choice.get("text"):
                        self.first_content = now
                        break
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            if chunk.get("timings"):
                self.timings = chunk["timings"]


async def _read_body(reader, headers, on_data):
    """Reads the body (chunked, content-length or until close), handing each piece to on_data."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size + 2)
            on_data(data[:-2])
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(65536, remaining))
            if not data:
                raise ConnectionError("connection closed before content-length")
            remaining -= len(data)
            on_data(data)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            on_data(data)


def _replica_of(headers, replica_names):
    if headers.get("x-sim-replica"):
        return headers["x-sim-replica"]
    batch = headers.get("x-cohort-batch", "")
    if ";replica=" in batch:
        return batch.partition(";replica=")[2]
    served = headers.get("x-served-by", "")
    if served:
        return replica_names.get(served, served)
    return None


async def send(port, request, replica_names=None, timeout_s=120.0, path="/v1/chat/completions"):
    """Streams one request to 127.0.0.1:port; returns its record fields (never raises)."""
    replica_names = replica_names or {}
    body = json.dumps(request["body"]).encode()
    lines = [f"POST {path} HTTP/1.1", f"host: 127.0.0.1:{port}", "content-type: application/json",
             "accept: text/event-stream", f"content-length: {len(body)}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in (request.get("headers") or {}).items()]
    wire = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    record = {"status": None, "error": None, "ttft_ms": None, "e2e_ms": None, "replica": None,
              "prompt_tokens": None, "cached_tokens": None, "completion_tokens": None, "engine_ttft_ms": None}
    start = time.perf_counter()
    stream = _Stream()
    writer = None

    async def exchange():
        nonlocal writer
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT_S)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(wire)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].split()
        record["status"] = int(status_line[1]) if len(status_line) > 1 else None
        headers = _header_map(head[:-4])
        record["replica"] = _replica_of(headers, replica_names)
        if headers.get("x-sim-ttft-ms"):
            try:
                record["engine_ttft_ms"] = float(headers["x-sim-ttft-ms"])
            except ValueError:
                pass
        error_body = []

        def on_data(data):
            if record["status"] == 200:
                stream.feed(data, time.perf_counter())
            elif sum(map(len, error_body)) < 300:
                error_body.append(data)

        await _read_body(reader, headers, on_data)
        if record["status"] != 200:
            record["error"] = f"status {record['status']}: {b''.join(error_body)[:200]!r}"

    try:
        await asyncio.wait_for(exchange(), timeout_s)
    except asyncio.TimeoutError:
        record["error"] = f"timeout after {timeout_s:.0f} s"
    except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        record["error"] = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    end = time.perf_counter()
    record["e2e_ms"] = (end - start) * 1000
    first = stream.first_content or stream.first_event
    if first is not None:
        record["ttft_ms"] = (first - start) * 1000
    usage = stream.usage or {}
    if usage:
        record["prompt_tokens"] = usage.get("prompt_tokens")
        record["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        record["completion_tokens"] = usage.get("completion_tokens")
    if stream.timings and "cache_n" in stream.timings:
        record["cached_tokens"] = stream.timings["cache_n"]
        record["prompt_tokens"] = stream.timings["cache_n"] + stream.timings.get("prompt_n", 0)
    if record["error"] is None and record["status"] == 200 and not stream.done:
        record["error"] = "stream ended without [DONE]"
    return record


async def _replay(port, requests, replica_names, timeout_s, progress, max_in_flight):
    loop = asyncio.get_running_loop()
    start = loop.time()
    records = [None] * len(requests)
    gate = asyncio.Semaphore(max_in_flight)

    async def one(i, request):
        await asyncio.sleep(max(0.0, start + request["t"] - loop.time()))
        sent = loop.time() - start
        async with gate:
            record = await send(port, request, replica_names, timeout_s)
        record.update({"id": request["id"], "group": request.get("group"), "step": request.get("step"),
                       "t_sched": request["t"], "t_sent": sent})
        records[i] = record
        if progress is not None:
            progress.update()

    await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    return records, loop.time() - start


def replay(port, requests, replica_names=None, timeout_s=120.0, progress=None, max_in_flight=2048):
    """Sends `requests` ([{"id","t","body","headers",...}], t in seconds from now) to
    127.0.0.1:port open loop. Returns (records in request order, wall seconds). `max_in_flight`
    only guards the client's own file descriptors; a request waiting for it still keeps its
    scheduled t_sched, so any wait shows in its latency."""
    return asyncio.run(_replay(port, requests, replica_names or {}, timeout_s, progress, max_in_flight))
