#!/usr/bin/env python3
"""A load and abuse test of `llmq serve` (CPU backend, the seeded default model; standard library only).

200 streaming clients at once, 20 of them (10%) closing their connection mid-stream, while other
threads send malformed requests: invalid JSON, fields of the wrong type, numbers past every integer
(1e309, 2^63, 2^64), a 10 MB body (past the prompt bound), a 17 MB body (past the body limit),
invalid UTF-8 in the prompt text, Content-Lengths that are short, negative, not a number, past
2^64 or given twice, no Content-Length, a chunked upload, a garbage request line, an over-long URI,
a body shorter than its Content-Length (the client waiting, and the client half-closing). Asserts:

  - the server never exits, and /health answers throughout;
  - every well-formed stream is answered completely: its token count, finish_reason "length", the
    usage chunk and [DONE];
  - every malformed request gets a 4xx with OpenAI's error object ({"error": {message, type, param,
    code}}), but for a body cut short by a client that half-closes: cpp-httplib takes a socket with
    nothing left to read for a client that left and closes it unanswered (RFC 9112 allows either);
    the same cut body from a client that waits is answered 400 when the server's 30 s read timeout
    ends, which is what makes this test take about 35 s;
  - afterwards (/metrics polled until nothing runs or waits): no KV block in use, exactly the 20
    disconnected requests counted as aborted and the 180 others (plus the warm-up) as ended by length;
  - the process's threads are exactly as many as before the load: cpp-httplib's pool is fixed when
    the server starts and the engine has one thread, so one more is a leak or a stuck handler;
  - its open descriptors are at most 2 above what they were before: the last of this test's own
    probe connections may still be open on the server's side when /proc is read (the server closes
    a connection on its next read of it, on its own thread), so the count is polled for 15 s and
    held to that bound, not to equality;
  - SIGTERM then ends it with status 0.

Usage: serve_load.py LLMQ [--sanitized]. --sanitized (the ASan build) runs 60 streams and one round
of malformed requests instead. Prints one line per check and "serve_load: N passed, M failed".
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

STREAMS = 200
DISCONNECTS = STREAMS // 10  # every 10th stream closes its connection after a few events
KEY = "sk-load"
DISCONNECT_MAX_TOKENS = 900  # long enough that the close always comes before the end
ABUSERS, ROUNDS = 4, 2       # threads sending malformed requests, and how many times each sends them all

results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else ": " + str(detail)[:2000]), flush=True)


def start_server(llmq):
    # Threads: every stream holds one while it generates, and 4 are kept for the rest; 300 leaves
    # room for the malformed requests and probes beside the 200 streams.
    proc = subprocess.Popen([llmq, "serve", "--model", "default", "--port", "0", "--api-key", KEY, "--max-num-seqs", "64",
                             "--http-threads", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if not m:
        print("FAIL llmq serve did not start:", line, proc.stderr.read())
        sys.exit(1)
    return proc, int(m.group(1))


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + KEY})
        r = conn.getresponse()
        text = r.read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        m = re.match(r'llmq:([a-z_]+)\{model_name="default"(?:,([a-z_]+)="([^"]*)")?\} (\S+)$', line)
        if m:
            out[m.group(1) + (f"[{m.group(3)}]" if m.group(2) else "")] = float(m.group(4))
    return out


def proc_counts(pid):
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


# ---- Well-formed streams.
def stream(port, index, barrier, outcomes):
    disconnect = index % 10 == 9
    max_tokens = DISCONNECT_MAX_TOKENS if disconnect else 8 + index % 41
    prompt = [1] + [2 + (index * 7 + k) % 400 for k in range(1 + index % 13)]
    # ignore_eos: the random default model may sample its EOS, which ends a reply (generation_end_ids);
    # every stream here is to run to max_tokens.
    body = json.dumps({"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0 if index % 2 else 0.8,
                       "seed": index + 1, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True})
    outcome = {"index": index, "disconnect": disconnect, "max_tokens": max_tokens, "prompt": len(prompt)}
    barrier.wait()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
        r = conn.getresponse()
        outcome["status"] = r.status
        ids, finish, usage, done, events = [], [], None, False, 0
        leave_after = 3 + index % 5
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            events += 1
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                outcome["error"] = chunk
                continue
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                ids.extend(c.get("token_ids", []))
                if c.get("finish_reason"):
                    finish.append(c["finish_reason"])
            if disconnect and events >= leave_after:
                conn.sock.shutdown(socket.SHUT_RDWR)
                break
        outcome.update(ids=len(ids), finish=finish, usage=usage, done=done)
    except Exception as e:  # noqa: BLE001 - any failure of a stream is reported as that stream's
        outcome["exception"] = repr(e)
    finally:
        conn.close()
    outcomes[index] = outcome


def stream_complete(o):
    return (o.get("status") == 200 and "exception" not in o and "error" not in o and o.get("done") and o["ids"] == o["max_tokens"]
            and o["finish"] == ["length"] and o["usage"] == {"prompt_tokens": o["prompt"], "completion_tokens": o["max_tokens"],
                                                           "total_tokens": o["prompt"] + o["max_tokens"]})


# ---- Malformed requests, over raw sockets (http.client would refuse to send most of them).
def post_raw(body, length="auto", extra_headers="", path="/v1/completions"):
    """A POST as bytes; length: "auto" (the body's), None (no Content-Length header) or what to declare."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nConnection: close\r\n")
    if length is not None:
        head += f"Content-Length: {len(body) if length == 'auto' else length}\r\n"
    return head.encode() + extra_headers.encode() + b"\r\n" + body


def bad_json(obj):
    return json.dumps(obj).encode()


def cases():
    """(name, the request's bytes) of each malformed request."""
    ok_body = bad_json({"model": "default", "prompt": [1, 2, 3], "max_tokens": 4})
    big_prompt = b'{"model":"default","prompt":[' + b"5," * (5 << 20) + b'5]}'  # 10 MB: 5M token ids, past the 1M bound
    huge = b'{"model":"default","prompt":"' + b"a" * (17 << 20) + b'"}'       # 17 MB: past the 16 MB body limit
    # Bodies sent as they are, each with its own length.
    bodies = [
        ("invalid JSON", b'{"model":"default","prompt":[1,2'),
        ("not an object", b"[1,2,3]"),
        ("max_tokens a string", bad_json({"model": "default", "prompt": [1], "max_tokens": "ten"})),
        ("model a number", bad_json({"model": 5, "prompt": [1]})),
        ("stream a string", bad_json({"model": "default", "prompt": [1], "stream": "yes"})),
        ("a fractional token id", b'{"model":"default","prompt":[1.5]}'),
        ("a negative token id", b'{"model":"default","prompt":[-1]}'),
        ("a token id past the vocabulary", b'{"model":"default","prompt":[99999999]}'),
        ("max_tokens 1e309", b'{"model":"default","prompt":[1],"max_tokens":1e309}'),
        ("max_tokens 2^63", b'{"model":"default","prompt":[1],"max_tokens":9223372036854775808}'),
        ("max_tokens 2^64", b'{"model":"default","prompt":[1],"max_tokens":18446744073709551616}'),
        ("temperature 1e309", b'{"model":"default","prompt":[1],"temperature":1e309}'),
        ("seed -2^63-1", b'{"model":"default","prompt":[1],"seed":-9223372036854775809}'),
        ("a token id 2^63", b'{"model":"default","prompt":[9223372036854775808]}'),
        ("top_k 2^63", b'{"model":"default","prompt":[1],"top_k":9223372036854775808}'),
        ("invalid UTF-8 in the prompt text", b'{"model":"default","prompt":"caf\xc3 \xff\xfe\x80"}'),
        ("a lone surrogate in the prompt text", b'{"model":"default","prompt":"\\ud800 x"}'),
        ("a 10 MB body (past the prompt bound)", big_prompt),
        ("a 17 MB body (past the body limit: 413)", huge),
    ]
    return [(name, post_raw(body)) for name, body in bodies] + [
        ("invalid UTF-8 in a chat message",
         post_raw(b'{"model":"default","messages":[{"role":"user","content":"\xed\xa0\x80"}]}', path="/v1/chat/completions")),
        ("a Content-Length shorter than the body", post_raw(ok_body, 10)),
        ("Content-Length not a number", post_raw(ok_body, "abc")),
        ("Content-Length negative", post_raw(ok_body, -5)),
        ("Content-Length past 2^64", post_raw(ok_body, "99999999999999999999999")),
        ("two Content-Lengths", post_raw(ok_body, extra_headers="Content-Length: 3\r\n")),
        ("no Content-Length (411)", post_raw(ok_body, None)),
        ("a chunked upload (411)", post_raw(b"5\r\nhello\r\n0\r\n\r\n", None, extra_headers="Transfer-Encoding: chunked\r\n")),
        ("a garbage request line", b"BLAH\r\n\r\n"),
        ("an 8 KB URI", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("an unknown endpoint", post_raw(ok_body, path="/v1/nothing")),
        ("a wrong key", post_raw(ok_body).replace(b"Bearer " + KEY.encode(), b"Bearer nope")),
    ]


def read_response(sock):
    """(status, body bytes) of the first response on the socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response: %r" % data[:200])
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
    want = int(m.group(1)) if m else None
    while want is None or len(rest) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest[:want] if want is not None else rest


def is_error_object(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and e["message"] != "" and isinstance(e["type"], str) and "param" in e and "code" in e
    except (ValueError, KeyError, TypeError):
        return False


def send_case(port, request):
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(request)
        status, body = read_response(sock)
        return 400 <= status < 500 and is_error_object(body), (status, body[:300])
    except OSError as e:
        return False, repr(e)
    finally:
        sock.close()


def truncated_body(port, half_close, out):
    """A body that ends before its Content-Length. A client that waits is answered 400 when the
    server's read timeout (30 s) ends; one that half-closes has, to cpp-httplib, left (it takes a
    socket with nothing more to read for a closed one), and its connection is closed unanswered, as
    RFC 9112 allows for an incomplete request: either way no thread or descriptor is kept."""
    body = bad_json({"model": "default", "prompt": [1, 2, 3], "max_tokens": 4})
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(post_raw(body[:20], len(body)))
        if half_close:
            sock.shutdown(socket.SHUT_WR)
            out["closed"] = sock.recv(65536) == b""
        else:
            status, answer = read_response(sock)
            out["answer"] = (status, answer[:300])
            out["ok"] = 400 <= status < 500 and is_error_object(answer)
    except OSError as e:
        out["error"] = repr(e)
    finally:
        sock.close()


HEAVY = ("a 10 MB body (past the prompt bound)", "a 17 MB body (past the body limit: 413)")


def abuse(port, rounds, seed, failures, counter):
    """Sends every case `rounds` times in a shuffled order; the two heavy bodies only from seed 0."""
    rng = random.Random(seed)
    all_cases = [c for c in cases() if seed == 0 or c[0] not in HEAVY]
    for _ in range(rounds):
        order = list(all_cases)
        rng.shuffle(order)
        for name, request in order:
            ok, detail = send_case(port, request)
            counter.append(name)
            if not ok:
                failures.append((name, detail))


def main():
    global STREAMS, DISCONNECTS, ROUNDS
    llmq = sys.argv[1]
    if "--sanitized" in sys.argv[2:]:
        # Under ASan + UBSan every request costs several times more CPU and the 300 threads share
        # CI's two cores: 60 streams (6 leaving) and one round of abuse keep the same assertions
        # (every path taken, nothing held afterwards) in a quarter of the time, and leave /health's
        # 30 s bound measuring the server rather than the scheduler of an overloaded machine.
        STREAMS, ROUNDS = 60, 1
        DISCONNECTS = STREAMS // 10
    proc, port = start_server(llmq)
    try:
        run(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"serve_load: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


def run(proc, port):
    # Warm-up (lazily made things made), then the baseline once the warm-up's connections closed.
    warm = {}
    stream(port, 0, threading.Barrier(1), warm)
    check("warm-up stream complete", stream_complete(warm[0]), warm[0])
    time.sleep(0.5)
    threads0, fds0 = proc_counts(proc.pid)

    barrier = threading.Barrier(STREAMS)
    outcomes = {}
    clients = [threading.Thread(target=stream, args=(port, i, barrier, outcomes)) for i in range(STREAMS)]
    failures, sent = [], []
    abusers = [threading.Thread(target=abuse, args=(port, ROUNDS, s, failures, sent)) for s in range(ABUSERS)]
    health = {"bad": 0, "probes": 0}
    stop_probe = threading.Event()

    def probe():  # /health answers throughout
        while not stop_probe.is_set():
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c.request("GET", "/health")
                status = c.getresponse().status
                if status != 200:
                    health["bad"] += 1
                    health.setdefault("errors", []).append(f"{time.monotonic() - started:.1f} s: status {status}")
                c.close()
            except OSError as e:
                health["bad"] += 1
                health.setdefault("errors", []).append(f"{time.monotonic() - started:.1f} s: {e!r}")
            health["probes"] += 1
            stop_probe.wait(0.2)

    prober = threading.Thread(target=probe)
    waited, half_closed = {}, {}
    truncated = [threading.Thread(target=truncated_body, args=(port, False, waited)),
                 threading.Thread(target=truncated_body, args=(port, True, half_closed))]
    started = time.monotonic()
    for t in clients + abusers + truncated + [prober]:
        t.start()
    for t in clients + abusers + truncated:
        t.join()
    stop_probe.set()
    prober.join()
    print(f"load: {STREAMS} streams and {len(sent)} malformed requests in {time.monotonic() - started:.1f} s", flush=True)

    check("the server is still running", proc.poll() is None, proc.poll())
    check(f"/health answered all {health['probes']} probes", health["bad"] == 0 and health["probes"] > 0, health)
    complete = [o for o in outcomes.values() if not o["disconnect"]]
    bad = [o for o in complete if not stream_complete(o)]
    check(f"{len(complete)} streams answered completely (tokens, length, usage, [DONE])",
          len(complete) == STREAMS - DISCONNECTS and not bad, bad[:3])
    left = [o for o in outcomes.values() if o["disconnect"]]
    check(f"{len(left)} streams left mid-stream", len(left) == DISCONNECTS and all("exception" not in o and o["status"] == 200 for o in left),
          [o for o in left if "exception" in o][:3])
    check(f"{len(sent)} malformed requests: each a 4xx with an error object", not failures and len(sent) == ROUNDS * (ABUSERS * len(cases()) - (ABUSERS - 1) * len(HEAVY)),
          failures[:5])

    check("a body shorter than its Content-Length, the client waiting: a 4xx with an error object", waited.get("ok"), waited)
    check("a body shorter than its Content-Length, the client half-closing: the connection closed", half_closed.get("closed"),
          half_closed)

    # Afterwards: nothing running or waiting, every block free.
    deadline, m = time.monotonic() + 30, {}
    while time.monotonic() < deadline:
        m = metrics(port)
        if m.get("num_requests_running") == 0 and m.get("num_requests_waiting") == 0:
            break
        time.sleep(0.2)
    check("/metrics: nothing running or waiting", m.get("num_requests_running") == 0 and m.get("num_requests_waiting") == 0, m)
    check("/metrics: no KV block in use", m.get("kv_cache_blocks_used") == 0 and m.get("kv_cache_blocks_total", 0) > 0, m)
    check(f"/metrics: {DISCONNECTS} requests aborted, {STREAMS - DISCONNECTS + 1} ended by length",
          m.get("request_success_total[abort]") == DISCONNECTS and m.get("request_success_total[length]") == STREAMS - DISCONNECTS + 1
          and m.get("request_success_total[error]") == 0, {k: v for k, v in m.items() if k.startswith("request_success")})
    check("/metrics: the malformed requests counted as 4xx", m.get("http_requests_total[4xx]", 0) >= len(sent), m.get("http_requests_total[4xx]"))

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        threads, fds = proc_counts(proc.pid)
        if threads == threads0 and fds <= fds0:
            break
        time.sleep(0.25)
    check(f"threads back to the baseline ({threads} now, {threads0} before)", threads == threads0)
    check(f"open descriptors back to the baseline ({fds} now, {fds0} before; 2 allowed)", fds <= fds0 + 2)

    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = "no exit in 30 s"
    check("SIGTERM: exit 0", rc == 0, rc)


if __name__ == "__main__":
    main()
